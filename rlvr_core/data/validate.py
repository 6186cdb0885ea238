"""Check task data before training: every problem is refused up front, with the row and field named.

The training loop and the train flow call ``validate_splits`` before any
rollout is generated. It checks, per split:

- the split is not empty;
- every row is a mapping with the fields the task's verifier reads, of the
  right Python type (the task's ``schema`` in ``rlvr_core.tasks``; extra fields
  are allowed), a non-empty prompt, and field values the verifier can use
  (the task's ``check_row``: for arithmetic an answer written as a decimal integer);
- row ids are unique;
- synthetic rows agree with their own fields (``check_consistent``): an
  arithmetic prompt ``0377+0012=`` with the answer of ``a op b``, a Countdown
  prompt with its numbers and target, and the recorded expression reaching it;

and across splits that no prompt of the held-out split also appears in the
training split (a leak that would inflate held-out accuracy).

``check_prompts_fit`` checks the rows against the policy that will read them:
every prompt (through the chat template when the tokenizer has one) encodes
with the tokenizer, characters outside the tiny policy's vocabulary included,
and prompt + ``max_new_tokens`` fits the model's positions. The train flow
calls it before MLflow opens a run, the training loop before any rollout.

Type and id checks reuse ``rlvr_core.data.splits.validate_rows`` on the
required fields, and the overlap check compares prompts after ``normalize_prompt``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlvr_core.data.splits import FieldType, normalize_prompt
from rlvr_core.data.splits import validate_rows as _validate_schema
from rlvr_core.errors import ConfigError

# Any name that is not a registered task (a verifier registered elsewhere) needs at least these.
DEFAULT_REQUIRED: dict[str, FieldType] = {"id": str, "prompt": str}


def _task(name: str) -> Any:
    from rlvr_core.tasks import TASKS

    return TASKS.get(name) if name in TASKS else None


class DataError(ConfigError):
    """A dataset that training cannot use; the message names the source, split, row and field."""


def _where(source: str | None) -> str:
    return f"{source}: " if source else ""


def validate_rows(rows: Sequence[Mapping[str, Any]], task: str, split: str, *, source: str | None = None) -> None:
    """Raise DataError unless ``rows`` is a usable, non-empty ``split`` of ``task``.

    Args:
        rows: (N,) row mappings (a list, or anything indexable with len)
        task: task name; selects the required fields and checks (``rlvr_core.tasks``; any other
            name, a verifier registered elsewhere: ``DEFAULT_REQUIRED`` only)
        split: split name used in messages ("train", "test")
        source: where the rows came from (a path), prefixed to messages
    """
    where = _where(source)
    if len(rows) == 0:
        raise DataError(f"{where}{split} split is empty; prepare the data first (python -m flows.prepare)")
    spec = _task(task)
    schema = dict(spec.schema) if spec is not None else DEFAULT_REQUIRED
    projected = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{where}{split} row {i}: expected a mapping of fields, got {type(row).__name__}")
        missing = [f for f in schema if f not in row]
        if missing:
            raise DataError(f"{where}{split} row {i} ({row.get('id')!r}): missing field(s) {missing}; "
                            f"the {task!r} task needs {_describe(schema)}")
        projected.append({f: row[f] for f in schema})
        for group in spec.one_of if spec is not None else ():
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
        problem = spec.check_row(rows[i]) if spec is not None and spec.check_row is not None else None
        if problem:
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): {problem}")
        problem = check_consistent(rows[i], task)
        if problem:
            raise DataError(f"{where}{split} row {i} ({row['id']!r}): {problem}; the row contradicts itself "
                            "(an edited or corrupted data file?): regenerate the data (python -m flows.prepare)")


def check_consistent(row: Mapping[str, Any], task: str) -> str | None:
    """Why a generated row contradicts itself, or None when it agrees (or carries nothing to compare):
    the task's ``check_consistent`` (``rlvr_core.tasks``), e.g. an arithmetic prompt ``0377+0012=``
    with an answer other than 389, or a Countdown answer that misses its target."""
    spec = _task(task)
    return spec.check_consistent(row) if spec is not None and spec.check_consistent is not None else None


def validate_splits(train_rows: Sequence[Mapping[str, Any]], test_rows: Sequence[Mapping[str, Any]], task: str,
                    *, source: str | None = None) -> None:
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
        near = "" if prompt == theirs else f" (as {theirs!r}: the same text up to whitespace, NBSP or CRLF)"
        raise DataError(f"{_where(source)}problem {prompt!r} appears in both 'train'{near} and split 'test'; "
                        f"splits must be disjoint ({len(shared)} of {len(test_prompts)} held-out prompts are in "
                        "the training split); regenerate the splits")


def _describe(schema: Mapping[str, FieldType]) -> str:
    def name(t: FieldType) -> str:
        return f"list[{t[1].__name__}]" if isinstance(t, tuple) else t.__name__

    return ", ".join(f"{k}: {name(t)}" for k, t in schema.items())


# --------------------------------------------------------------------------- against the policy

_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def position_limit(model_config: Any, tokenizer: Any) -> int | None:
    """Most tokens (prompt + completion) the policy handles: the smaller of the model config's
    position limit and the tokenizer's ``model_max_length`` (ignored when it is the "unset" huge value)."""
    limits = []
    for key in _POSITION_KEYS:
        v = model_config.get(key) if isinstance(model_config, Mapping) else getattr(model_config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            limits.append(v)
            break
    v = getattr(tokenizer, "model_max_length", None)
    if isinstance(v, int) and 0 < v < 10**7:
        limits.append(v)
    return min(limits) if limits else None


def check_prompts_fit(rows: Sequence[Mapping[str, Any]], tokenizer: Any, task: str, split: str, *,
                      max_new_tokens: int, max_positions: int | None, source: str | None = None) -> None:
    """Raise DataError unless every row's prompt can be given to the policy and completed.

    The prompt is what the policy reads (``policy_prompts``: the chat template when the tokenizer
    has one). For the tiny character-level policy each character must be in its vocabulary
    (``check_text``); any tokenizer must encode it; and its tokens plus ``max_new_tokens`` must fit
    ``max_positions`` (None: no limit known). A prompt too long for the model would otherwise be a
    deterministic out-of-memory or garbage far past the trained positions.
    """
    from rlvr_core.models.policy import policy_prompts
    from rlvr_core.models.tokenizer import check_text, vocabulary_problems
    from rlvr_core.rollout.base import encode_prompt_pool

    where = _where(source)
    texts = policy_prompts(tokenizer, rows, task)
    if not vocabulary_problems(tokenizer):  # the tiny character tokenizer: it fails opaquely on other characters
        for i, text in enumerate(texts):
            try:
                check_text(text, what="prompt")
            except (TypeError, ValueError) as e:
                raise DataError(f"{where}{split} row {i} ({rows[i].get('id')!r}): {str(e)[:400]}") from None
    try:
        ids = encode_prompt_pool(tokenizer, texts)
    except Exception:  # noqa: BLE001 - find the row that does not encode
        for i, text in enumerate(texts):
            try:
                encode_prompt_pool(tokenizer, [text])
            except Exception as e:  # noqa: BLE001
                raise DataError(f"{where}{split} row {i} ({rows[i].get('id')!r}): the prompt does not encode with "
                                f"the policy's tokenizer ({e.__class__.__name__}: {str(e)[:300]})") from None
        raise
    if max_positions is None:
        return
    for i, prompt_ids in enumerate(ids):
        if len(prompt_ids) + max_new_tokens > max_positions:
            longest = max(len(p) for p in ids)
            too_long = sum(len(p) + max_new_tokens > max_positions for p in ids)
            raise DataError(
                f"{where}{split} row {i} ({rows[i].get('id')!r}): the prompt is {len(prompt_ids)} tokens "
                f"({len(texts[i])} characters); with train.max_new_tokens={max_new_tokens} it needs "
                f"{len(prompt_ids) + max_new_tokens} positions, but the policy holds {max_positions} "
                f"({too_long} of {len(ids)} {split} rows are too long, the longest {longest} tokens): shorten or "
                "drop those rows, or lower train.max_new_tokens")


def check_against_policy(train_rows: Sequence[Mapping[str, Any]], test_rows: Sequence[Mapping[str, Any]],
                         policy_dir: str | Path, task: str, *, max_new_tokens: int, source: str | None = None) -> None:
    """``check_prompts_fit`` on both splits with the tokenizer and position limit of the policy folder
    (the tokenizer and config.json only: no weights are loaded for a pretrained model)."""
    from transformers import AutoTokenizer

    from rlvr_core.models.policy import is_tiny_policy
    from rlvr_core.models.tiny import PolicyLoadError
    from rlvr_core.models.tiny import load_policy as load_tiny

    path = Path(policy_dir)
    try:
        config = json.loads((path / "config.json").read_text())
        tok = load_tiny(path)[1] if is_tiny_policy(path) else AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - check_policy_folder names folder problems; this is a fallback
        raise PolicyLoadError(f"policy folder {str(path)!r}: could not read its tokenizer or config "
                              f"({e.__class__.__name__}: {str(e)[:300]})") from e
    limit = position_limit(config, tok)
    check_prompts_fit(train_rows, tok, task, "train", max_new_tokens=max_new_tokens, max_positions=limit,
                      source=source)
    check_prompts_fit(test_rows, tok, task, "test", max_new_tokens=max_new_tokens, max_positions=limit, source=source)
