"""Check task data before training: every problem is refused up front, with the row and field named.

The training loop and the train flow call ``validate_splits`` before any
rollout is generated. It checks, per split:

- the split is not empty;
- every row is a mapping with the fields the task's verifier reads, of the
  right Python type (``REQUIRED``; extra fields are allowed), a non-empty
  prompt, and for arithmetic an answer written as a decimal integer;
- row ids are unique;

and across splits that no prompt of the held-out split also appears in the
training split (a leak that would inflate held-out accuracy).

Type and id checks reuse ``rlvr_core.data.splits.validate_rows`` on the
required fields, and the overlap check reuses ``check_disjoint``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rlvr_core.data.splits import FieldType, check_disjoint
from rlvr_core.data.splits import validate_rows as _validate_schema
from rlvr_core.errors import ConfigError

# Fields (and their Python types) each verifier needs in a row.
REQUIRED: dict[str, dict[str, FieldType]] = {
    "arithmetic": {"id": str, "prompt": str, "answer": str},
    "countdown": {"id": str, "prompt": str, "numbers": ("list", int), "target": int},
    "math": {"id": str, "prompt": str, "answer": str},
    "code": {"id": str, "prompt": str},
}
# Tasks whose rows need at least one field of each group (any type; the verifier parses it).
ONE_OF: dict[str, tuple[tuple[str, ...], ...]] = {"code": (("tests", "public_test_cases"),)}
# Any other task (a verifier registered elsewhere) needs at least these.
DEFAULT_REQUIRED: dict[str, FieldType] = {"id": str, "prompt": str}


class DataError(ConfigError):
    """A dataset that training cannot use; the message names the source, split, row and field."""


def _where(source: str | None) -> str:
    return f"{source}: " if source else ""


def validate_rows(rows: Sequence[Mapping[str, Any]], task: str, split: str, *, source: str | None = None) -> None:
    """Raise DataError unless ``rows`` is a usable, non-empty ``split`` of ``task``.

    Args:
        rows: (N,) row mappings (a list, or anything indexable with len)
        task: verifier name; selects the required fields (``REQUIRED``)
        split: split name used in messages ("train", "test")
        source: where the rows came from (a path), prefixed to messages
    """
    where = _where(source)
    if len(rows) == 0:
        raise DataError(f"{where}{split} split is empty; prepare the data first (python -m flows.prepare)")
    schema = REQUIRED.get(task, DEFAULT_REQUIRED)
    projected = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{where}{split} row {i}: expected a mapping of fields, got {type(row).__name__}")
        missing = [f for f in schema if f not in row]
        if missing:
            raise DataError(f"{where}{split} row {i} ({row.get('id')!r}): missing field(s) {missing}; "
                            f"the {task!r} task needs {_describe(schema)}")
        projected.append({f: row[f] for f in schema})
        for group in ONE_OF.get(task, ()):
            if not any(row.get(f) is not None for f in group):
                raise DataError(f"{where}{split} row {i} ({row.get('id')!r}): needs one of the fields "
                                f"{list(group)} for the {task!r} verifier; row has {sorted(row)}")
    try:
        _validate_schema(projected, schema, split)
    except ValueError as e:
        raise DataError(f"{where}{e}") from None
    for i, row in enumerate(projected):
        if not row["prompt"].strip():
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): field 'prompt' is empty")
        if task == "arithmetic" and not row["answer"].lstrip("-").isdecimal():
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): field 'answer' must be a decimal integer "
                            f"such as '130', got {row['answer']!r}")
        if task == "math" and not row["answer"].strip():
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): field 'answer' is empty")


def validate_splits(train_rows: Sequence[Mapping[str, Any]], test_rows: Sequence[Mapping[str, Any]], task: str,
                    *, source: str | None = None) -> None:
    """``validate_rows`` on both splits, then refuse held-out prompts that also occur in training.

    Raises:
        DataError naming the split, row and field (or the shared prompt).
    """
    validate_rows(train_rows, task, "train", source=source)
    validate_rows(test_rows, task, "test", source=source)
    # duplicates inside one split are allowed (hub sets have some); only the overlap is an error
    train_prompts = dict.fromkeys(r["prompt"] for r in train_rows)
    test_prompts = dict.fromkeys(r["prompt"] for r in test_rows)
    try:
        check_disjoint({"train": train_prompts, "test": test_prompts})
    except ValueError as e:
        shared = sum(p in train_prompts for p in test_prompts)
        raise DataError(f"{_where(source)}{e} ({shared} of {len(test_prompts)} held-out prompts are in the "
                        "training split); regenerate the splits") from None


def _describe(schema: Mapping[str, FieldType]) -> str:
    def name(t: FieldType) -> str:
        return f"list[{t[1].__name__}]" if isinstance(t, tuple) else t.__name__

    return ", ".join(f"{k}: {name(t)}" for k, t in schema.items())
