"""TRL's completion logs as advisor input (docs/advisor.md, "TRL completion logs").

``GRPOTrainer(args=GRPOConfig(log_completions=True, ...))`` (TRL 1.16, ``GRPOTrainer.log``) writes, at every
logging step, ``<output_dir>/completions/completions_<global step, 5 digits>.parquet``: one row per completion of
the latest generation batch, with the columns ``step`` (the global step), ``prompt`` and ``completion`` (text, or
a conversation: a list of ``{"role", "content"}`` messages), one column per reward function, named after it (its
raw, unweighted reward; NaN where the function returned None), any column logged with ``log_extra`` and
``advantage``. The advisor reads such a file, a folder of them, or a ``.jsonl`` of the same columns (one object
per line):

- ``prompt`` -> ``prompt_id``: the prompt's text (a conversation as its canonical JSON), numbered later;
- reward: the chosen reward columns (``reward_columns``; by default every column holding numbers that is none
  of ``step, advantage, tokens``; a text-only column is not), summed over the columns as TRL sums them with its
  default weights of 1, a NaN counting as 0 (``nansum``). A completion whose every reward is NaN is unscorable
  (TRL leaves it out of its group's baseline, advantage 0): it is dropped, and counted in
  ``df.attrs["unscorable"]``;
- tokens: a ``tokens`` column where there is one (e.g. ``log_extra("tokens", ...)``), else an estimate from the
  completion's length: ceil(characters / 4) of its text (of its messages' contents for a conversation).

verl's rollout dumps are read the same way (docs/advisor.md, "verl rollout dumps"). With
``trainer.rollout_data_dir=DIR``, verl 0.9.1's PPO trainer (``verl/trainer/ppo/ray_trainer.py``,
``RayPPOTrainer._log_rollout_data`` -> ``_write_generations``) writes ``DIR/<global step>.jsonl`` after each
training step: one object per generated sample, ``input`` (the decoded prompt), ``output`` (the decoded
response), ``gts`` (the ground truth), ``score`` (the sum of the sample's token-level scores: its reward), ``step``
(the global step), and every reward-extra-info list of the batch's length (e.g. ``acc``, ``pred``; the v1
trainer adds ``uid``). ``input`` is the prompt, ``output`` the completion (tokens: the estimate above), and the
reward is ``score`` unless ``reward_columns`` names others (a DAPO-style score of -1/1 is refused as outside
[0, 1]: name the pass/fail column, e.g. ``acc``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlvr_core.advise.checks import (
    Limits,
    LogError,
    _first_bad,
    _numeric,
    _parquet_decoded_bytes,
    _quote,
    _read_jsonl,
    _tokens,
    _too_large,
    _too_many_columns,
    format_size,
)

NOT_REWARD = ("step", "prompt", "completion", "advantage", "tokens", "image")
CHARS_PER_TOKEN = 4  # the token estimate of a completion without a tokens column: ceil(characters / 4)
VERL_COLUMNS = ("input", "output", "step")  # what marks a verl rollout dump (its reward: VERL_REWARD)
VERL_TEXT = ("input", "output")  # a verl dump's prompt and completion columns
VERL_REWARD = ("score",)  # a verl dump's default reward column: the sum of the sample's token-level scores


def is_verl(columns: Sequence[str]) -> bool:
    """Whether a log with these columns is a verl rollout dump (``trainer.rollout_data_dir``: input, output and
    step; its reward column, score, is checked with the others)."""
    return all(c in columns for c in VERL_COLUMNS) and "prompt_id" not in columns


def is_trl(columns: Sequence[str]) -> bool:
    """Whether a log with these columns is a TRL completion log (prompt and completion, no prompt_id)."""
    return "prompt" in columns and "completion" in columns and "prompt_id" not in columns


def trl_files(folder: Path) -> list[Path]:
    """The logs of a folder: TRL's ``completions_*.parquet`` if any, else every ``.parquet`` and ``.jsonl``."""
    files = sorted(folder.glob("completions_*.parquet")) or sorted(
        p for p in folder.iterdir() if p.suffix in (".parquet", ".jsonl") and p.is_file())
    if not files:
        raise LogError(f"{folder}: a folder with no completions_*.parquet (TRL's completion logs) nor any .parquet "
                       "or .jsonl file; give GRPOTrainer's <output_dir>/completions folder or one log file")
    return files


def _plain(x: Any) -> Any:
    """A value read from parquet (numpy arrays of dicts) as plain Python, for JSON."""
    if isinstance(x, np.ndarray):
        return [_plain(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    return x.item() if isinstance(x, np.generic) else x


def _message_text(x: Any) -> str:
    """A completion's text: the string, or its messages' contents joined (image blocks count nothing)."""
    if isinstance(x, str):
        return x
    parts = []
    for m in x:
        c = m.get("content") if isinstance(m, dict) else m
        if isinstance(c, list):
            c = "".join(str(b.get("text", "")) for b in c if isinstance(b, dict))
        parts.append("" if c is None else str(c))
    return "".join(parts)


def _texts(path: Path, df: Any, column: str) -> list[Any]:
    """A prompt or completion column as plain values, refusing a row that is neither text nor a conversation."""
    vals = [_plain(v) for v in df[column].tolist()]
    bad = np.asarray([not (isinstance(v, str) or (isinstance(v, list) and all(isinstance(m, (dict, str))
                                                                             for m in v))) for v in vals], bool)
    shown = np.empty(len(vals), dtype=object)
    shown[:] = vals
    _first_bad(path, "neither text nor a conversation (a list of messages)", bad, column, shown,
               "log the prompt and completion as TRL's log_completions writes them", df.attrs.get("lines"))
    return vals


def _numeric_column(col: Any) -> bool:
    """Whether a column holds numbers (a reward column, where any other value is an error), not only text (a
    ``log_extra`` column such as a data source's name)."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(col.dtype):
        return False
    if pd.api.types.is_numeric_dtype(col.dtype):
        return True
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in col.tolist())


def _reward(path: Path, df: Any, columns: list[str], chosen: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray]:
    """(reward per row, scorable mask): the reward columns summed with NaN as 0; a row with every reward NaN is
    unscorable."""
    import pandas as pd

    names = list(chosen) if chosen else [c for c in columns if c not in NOT_REWARD and c in df.columns
                                         and _numeric_column(df[c])]
    missing = [c for c in names if c not in columns]
    if missing or not names:
        what = (f"no reward column {_quote(missing)}" if missing else
                "no reward column (a numeric column other than step, advantage and tokens)")
        raise LogError(f"{path}: every row: {what} (has {_quote(columns)}); TRL writes one column per reward "
                       "function, name them with --reward-column NAME (docs/advisor.md, TRL completion logs)")
    vals, lines = [], df.attrs.get("lines")
    for c in names:
        raw = df[c].to_numpy(dtype=object)
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64)
        given = np.asarray([x is not None and not (isinstance(x, float) and math.isnan(x)) for x in raw], bool)
        _first_bad(path, "not a number", given & np.isnan(v), c, raw,
                   "a reward column holds numbers (NaN where the reward function returned None); choose the reward "
                   "columns with --reward-column NAME", lines)
        _first_bad(path, "not a finite number", np.isinf(v), c, raw, "write finite rewards", lines)
        vals.append(v)
    stack = np.column_stack(vals)
    scorable = ~np.all(np.isnan(stack), axis=1)
    total = np.nansum(stack, axis=1)
    label = names[0] if len(names) == 1 else f"sum of {names}"
    _first_bad(path, f"reward ({label}) outside [0, 1]", scorable & ((total < 0) | (total > 1)), names[0],
               df[names[0]].to_numpy(), "the advisor models pass/fail rewards in [0, 1] (a reward above 0 is a pass); "
               "choose the pass/fail reward function's column with --reward-column NAME", lines)
    return total, scorable


def completion_rows(path: Path, df: Any, columns: list[str], reward_columns: Sequence[str] | None,
                    prompt: str = "prompt", completion: str = "completion") -> Any:
    """One TRL log's rows as per-completion rows ``step, prompt_id (text), reward, tokens``, checked row by row
    (``prompt``, ``completion``: the columns that hold them; a verl dump's are ``input`` and ``output``)."""
    import pandas as pd

    missing = [c for c in ("step", prompt, completion) if c not in columns]
    if missing:
        raise LogError(f"{path}: every row: missing column(s) {missing}; a TRL completion log has step, prompt, "
                       f"completion and one column per reward function (has {_quote(columns)})")
    step = _numeric(path, df, "step", integer=True).astype(np.int64)
    prompts = [p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in _texts(path, df, prompt)]
    reward, ok = _reward(path, df, columns, reward_columns)
    if "tokens" in columns:
        tokens = _tokens(path, df, np.ones(len(df)))
    else:
        tokens = np.asarray([math.ceil(len(_message_text(c)) / CHARS_PER_TOKEN)
                             for c in _texts(path, df, completion)], np.int64)
    out = pd.DataFrame({"step": step, "prompt_id": prompts, "reward": reward, "tokens": tokens})
    return out[ok].reset_index(drop=True), int((~ok).sum())


def _wanted(columns: Sequence[str], numeric: set[str], reward_columns: Sequence[str] | None) -> list[str]:
    """The columns of a TRL log or verl dump that the advisor reads: ``step``, the prompt, the completion (for its
    length, unless a ``tokens`` column counts it), ``tokens`` and the reward columns (``reward_columns``, else
    verl's ``score``, else TRL's every column in ``numeric`` but ``NOT_REWARD``). No other column is decoded."""
    verl = is_verl(columns)
    prompt, completion = VERL_TEXT if verl else ("prompt", "completion")
    rewards = set(reward_columns or (VERL_REWARD if verl else [c for c in numeric if c not in NOT_REWARD]))
    core = {"step", prompt, "tokens"} | (set() if "tokens" in columns else {completion})
    return [c for c in columns if c in core or c in rewards]


def _decoded(a: Any) -> int:
    """Bytes an Arrow array takes once its dictionaries are expanded, every row's value copied (what the rows
    cost as Python values), counted from the dictionary's value lengths and the indices: nothing is expanded."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = a.type
    if pa.types.is_dictionary(t):
        lengths = pc.binary_length(a.dictionary) if _is_text(t.value_type) else None
        if lengths is None:
            return int(a.nbytes)
        return int(pc.sum(pc.take(lengths, a.indices)).as_py() or 0) + 4 * len(a)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _decoded(a.flatten()) + 4 * (len(a) + 1)
    if pa.types.is_struct(t):
        return sum(_decoded(f) for f in a.flatten())
    return int(a.nbytes)


def _is_text(t: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def _read_parquet(path: Path, limits: Limits, before: int, reward_columns: Sequence[str] | None
                  ) -> tuple[Any, list[str], int]:
    """A TRL parquet log's columns the advisor reads (``_wanted``), with every column's name and their decoded
    bytes. The footer's row count and decoded size are checked first; then the file is read in batches with every
    text value (a string column, a conversation's strings) as a dictionary, and each batch's size with its
    dictionaries expanded (``_decoded``) is added up before the next is read: a string the footer counts once, in
    its dictionary, that every row repeats (a few KB on disk, GBs decoded) is refused at the batch that crosses
    the cap, before any of it is expanded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as pf:
        meta, schema, leaves = pf.metadata, pf.schema_arrow, pf.schema
    names = [n for n in schema.names if not n.startswith("__index_level_")]
    if len(names) > limits.max_columns:
        raise _too_many_columns(path, f"{len(names):,} columns", limits)
    numeric = {n for n in names if pa.types.is_integer(schema.field(n).type)
               or pa.types.is_floating(schema.field(n).type)}
    use = _wanted(names, numeric, reward_columns)
    rows, decoded = int(meta.num_rows), _parquet_decoded_bytes(meta, set(use))
    if rows > limits.max_rows or before + decoded > limits.max_bytes:
        raise _too_large(path, f"{rows:,} rows, {format_size(decoded)} decoded ({format_size(before)} before "
                         "it)", f"{limits.max_rows:,} rows and {format_size(limits.max_bytes)} decoded",
                         "--max-rows N / --max-bytes SIZE")
    text = [leaves.column(i).path for i in range(len(leaves)) if leaves.column(i).physical_type == "BYTE_ARRAY"
            and leaves.column(i).path.split(".")[0] in use]
    batches, got, done = [], 0, 0
    with pq.ParquetFile(path, read_dictionary=text) as pf:
        for batch in pf.iter_batches(columns=use, use_pandas_metadata=False):
            got, done = got + sum(_decoded(c) for c in batch.columns), done + batch.num_rows
            if done > limits.max_rows:  # a footer that understates its rows
                raise _too_large(path, f"{done:,} rows read, its footer said {rows:,}", f"{limits.max_rows:,} rows",
                                 "--max-rows N")
            if before + got > limits.max_bytes:
                raise _too_large(path, f"its columns {_quote(use)} decode to {format_size(got)} by row {done:,} of "
                                 f"{rows:,} ({format_size(before)} before it; its footer said "
                                 f"{format_size(decoded)}: a dictionary counts a repeated value once)",
                                 f"{format_size(limits.max_bytes)} decoded", "--max-bytes SIZE")
            batches.append(batch)
    table = pa.Table.from_batches(batches) if batches else schema.empty_table().select(use)
    return table.to_pandas(), names, got


def _read_one(path: Path, limits: Limits, before: int, reward_columns: Sequence[str] | None = None
              ) -> tuple[Any, list[str], int]:
    """A TRL log file's columns the advisor reads (``_wanted``), with every column's name and its decoded bytes;
    its size, with the ``before`` bytes of the files before it, is checked against the caps before and while it is
    decoded."""
    if path.suffix == ".jsonl":
        size = path.stat().st_size
        if before + size > limits.max_bytes:
            raise _too_large(path, f"{format_size(before + size)} with the files before it",
                             f"{format_size(limits.max_bytes)} decoded", "--max-bytes SIZE")
        return (*_read_jsonl(path, limits, lambda keys, numeric: _wanted(keys, numeric, reward_columns)), size)
    return _read_parquet(path, limits, before, reward_columns)


def read_trl(files: list[Path], limits: Limits, reward_columns: Sequence[str] | None) -> Any:
    """TRL completion logs (one file, or a folder's files) as per-completion rows of every file, the caps applied
    to the files together; ``attrs["unscorable"]``: completions dropped as unscorable."""
    import pandas as pd

    parts, rows, decoded, dropped = [], 0, 0, 0
    for f in files:
        raw, columns, size = _read_one(f, limits, decoded, reward_columns)
        rows, decoded = rows + len(raw), decoded + size
        if rows > limits.max_rows:
            raise _too_large(f, f"more than {limits.max_rows:,} rows with the files before it",
                             f"{limits.max_rows:,} rows", "--max-rows N")
        if not len(raw):
            continue
        if is_verl(columns):
            part, n = completion_rows(f, raw, columns, reward_columns or VERL_REWARD, *VERL_TEXT)
        elif is_trl(columns):
            part, n = completion_rows(f, raw, columns, reward_columns)
        else:
            raise LogError(f"{f}: every row: neither a TRL completion log nor a verl rollout dump (columns "
                           f"{_quote(columns)}); a folder of logs holds TRL completion logs (step, prompt, completion, "
                           "reward columns) or verl's <step>.jsonl dumps (input, output, score, step) only")
        parts.append(part)
        dropped += n
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    df.attrs["unscorable"] = dropped
    return df
