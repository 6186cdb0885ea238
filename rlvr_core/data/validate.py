"""Check task data before training: every problem is refused up front, with the row and field named.

The training loop and the train flow call ``validate_splits`` before any
rollout is generated. It checks, per split:

- the split is not empty;
- every row is a mapping with the fields the task's verifier reads, of the
  right Python type (the task's ``schema``; extra fields are allowed), a
  non-empty prompt, and field values the verifier can use (the task's
  ``check_row``: for arithmetic an answer written as a decimal integer);
- row ids are unique;
- synthetic rows agree with their own fields (``check_consistent``): an
  arithmetic prompt ``0377+0012=`` with the answer of ``a op b``, a Countdown
  prompt with its numbers and target, and the recorded expression reaching it;

and across splits that no prompt of the held-out split also appears in the
training split (a leak that would inflate held-out accuracy).

The checks take the task itself (a ``rlvr_core.tasks.Task``, or any object with its
``name``, ``schema``, ``one_of``, ``check_row`` and ``check_consistent``: ``RowSpec``), not its
name: this module sits on the data floor, below the task registry (docs/design.md §2.1), so the
caller looks the task up (``rlvr_core.tasks.get_task``). None stands for a verifier registered
outside the task registry: its rows need ``DEFAULT_REQUIRED`` only.

The rows' fit to a policy (its tokenizer and positions) is checked by the training preflight
(``rlvr_core.preflight.check_prompts_fit``). Type and id checks reuse
``rlvr_core.data.splits.validate_rows`` on the required fields, and the overlap check compares
prompts after ``normalize_prompt``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

from rlvr_core.data.splits import FieldType, normalize_prompt
from rlvr_core.data.splits import validate_rows as _validate_schema
from rlvr_core.errors import ConfigError

# Any name that is not a registered task (a verifier registered elsewhere) needs at least these.
DEFAULT_REQUIRED: dict[str, FieldType] = {"id": str, "prompt": str}




class RowSpec(Protocol):
    """What the checks read of a task (``rlvr_core.tasks.Task`` has it all)."""

    name: str
    schema: Mapping[str, FieldType]
    one_of: tuple[tuple[str, ...], ...]
    check_row: Callable[[Mapping[str, Any]], str | None] | None
    check_consistent: Callable[[Mapping[str, Any]], str | None] | None


def _spec(task: RowSpec | None, caller: str) -> RowSpec | None:
    if isinstance(task, str):
        raise TypeError(f"{caller}: takes the task, not its name: pass rlvr_core.tasks.get_task({task!r}) "
                        "(or None for a verifier registered outside the task registry)")
    return task


class DataError(ConfigError):
    """A dataset that training cannot use; the message names the source, split, row and field."""


def _where(source: str | None) -> str:
    return f"{source}: " if source else ""


def validate_rows(rows: Sequence[Mapping[str, Any]], task: RowSpec | None, split: str, *,
                  source: str | None = None) -> None:
    """Raise DataError unless ``rows`` is a usable, non-empty ``split`` of ``task``.

    Args:
        rows: (N,) row mappings (a list, or anything indexable with len)
        task: the task (``rlvr_core.tasks.get_task(name)``); selects the required fields and checks.
            None: a verifier registered outside the task registry, ``DEFAULT_REQUIRED`` only
        split: split name used in messages ("train", "test")
        source: where the rows came from (a path), prefixed to messages
    """
    spec = _spec(task, "validate_rows")
    where = _where(source)
    if len(rows) == 0:
        raise DataError(f"{where}{split} split is empty; prepare the data first (python -m flows.prepare)")
    named = f"the {spec.name!r} task" if spec is not None else "a task"
    schema = dict(spec.schema) if spec is not None else DEFAULT_REQUIRED
    projected = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{where}{split} row {i}: expected a mapping of fields, got {type(row).__name__}")
        missing = [f for f in schema if f not in row]
        if missing:
            raise DataError(f"{where}{split} row {i} ({row.get('id')!r}): missing field(s) {missing}; "
                            f"{named} needs {_describe(schema)}")
        projected.append({f: row[f] for f in schema})
        for group in spec.one_of if spec is not None else ():
            if not any(row.get(f) is not None for f in group):
                raise DataError(f"{where}{split} row {i} ({row.get('id')!r}): needs one of the fields "
                                f"{list(group)} for the {spec.name!r} verifier; row has {sorted(row)}")
    try:
        _validate_schema(projected, schema, split)
    except ValueError as e:
        raise DataError(f"{where}{e}") from None
    for i, row in enumerate(projected):
        if not row["prompt"].strip():
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): field 'prompt' is empty")
        problem = spec.check_row(rows[i]) if spec is not None and spec.check_row is not None else None
        if problem:
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): {problem}")
        problem = check_consistent(rows[i], spec)
        if problem:
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): {problem}; the row contradicts itself "
                            "(an edited or corrupted data file?): regenerate the data (python -m flows.prepare)")


def check_consistent(row: Mapping[str, Any], task: RowSpec | None) -> str | None:
    """Why a generated row contradicts itself, or None when it agrees (or carries nothing to compare):
    the task's ``check_consistent`` (``rlvr_core.tasks``), e.g. an arithmetic prompt ``0377+0012=``
    with an answer other than 389, or a Countdown answer that misses its target."""
    spec = _spec(task, "check_consistent")
    return spec.check_consistent(row) if spec is not None and spec.check_consistent is not None else None


def validate_splits(train_rows: Sequence[Mapping[str, Any]], test_rows: Sequence[Mapping[str, Any]],
                    task: RowSpec | None, *, source: str | None = None) -> None:
    """``validate_rows`` on both splits, then refuse held-out prompts that also occur in training.

    Raises:
        DataError naming the split, row and field (or the shared prompt).
    """
    validate_rows(train_rows, task, "train", source=source)
    validate_rows(test_rows, task, "test", source=source)
    # duplicates inside one split are allowed (hub sets have some); only the overlap is an error, compared
    # after normalize_prompt (a trailing space, NBSP or CRLF does not make a held-out problem new)
    train_prompts = {normalize_prompt(r["prompt"]): r["prompt"] for r in train_rows}
    test_prompts = {normalize_prompt(r["prompt"]): r["prompt"] for r in test_rows}
    shared = [k for k in test_prompts if k in train_prompts]
    if shared:
        prompt, theirs = test_prompts[shared[0]], train_prompts[shared[0]]
        near = "" if prompt == theirs else (f" (as {theirs!r}: the same text up to whitespace, NBSP, CRLF or "
                                            "invisible characters)")
        raise DataError(f"{_where(source)}problem {prompt!r} appears in both 'train'{near} and split 'test'; "
                        f"splits must be disjoint ({len(shared)} of {len(test_prompts)} held-out prompts are in "
                        "the training split); regenerate the splits")


def _describe(schema: Mapping[str, FieldType]) -> str:
    def name(t: FieldType) -> str:
        return f"list[{t[1].__name__}]" if isinstance(t, tuple) else t.__name__

    return ", ".join(f"{k}: {name(t)}" for k, t in schema.items())
