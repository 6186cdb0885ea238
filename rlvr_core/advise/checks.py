"""What every reader of the advisor's logs shares (``rlvr_core.advise.logs``, ``rlvr_core.advise.trl_log``): the
errors, the size caps (``Limits``) and the row-by-row checks whose messages name the file, the row and the column.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Default caps (docs/advisor.md "Size limits"): 5M rows is a per-completion log of 1,000 steps x 625 prompts x 8
# rollouts (the whole advice took 97 s and 1.4 GB RSS on such a CSV); 1 GiB of decoded column data (reading a text
# log peaks at about 2.6x its size, so about 3 GB); 1 MiB per line of a text log (a prompt's text as its key fits).
DEFAULT_MAX_ROWS = 5_000_000
DEFAULT_MAX_BYTES = 2**30
DEFAULT_MAX_LINE_BYTES = 2**20
# The most tokens one completion may have generated (docs/advisor.md "Inputs"): 10M is past the context window of
# any model an RL run trains; a count past it (1e30, an overflowed counter, a running total) is a broken log.
MAX_TOKENS_PER_COMPLETION = 10**7


class LogError(ValueError):
    """A log the advisor cannot use; the message names the file, row and column and the fix."""


class LogTooLarge(LogError):
    """A log past the advisor's size caps (or one that ran out of memory while it was read)."""


@dataclass(frozen=True)
class Limits:
    """The most the advisor reads from a log: rows, decoded bytes of the columns it uses, bytes per text line."""

    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes", "max_line_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")


def format_size(n: int) -> str:
    """``n`` bytes for a message: 1.4 GiB, 512.0 KiB, 37 B."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _size_flag(n: int) -> str:
    """A ``--max-bytes`` value that admits ``n`` bytes (rounded up, so that it is never a little short)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"--max-bytes {math.ceil(n * 10 / scale) / 10:g}{unit}"
    return f"--max-bytes {n}"


def _too_large(path: Path, what: str, cap: str, flag: str) -> LogTooLarge:
    return LogTooLarge(f"{path}: {what}, past the advisor's cap of {cap}; raise the cap with {flag} "
                       "(docs/advisor.md, Size limits)")


def _out_of_memory(path: Path, e: BaseException, size: str) -> LogTooLarge:
    return LogTooLarge(f"{path}: ran out of memory while reading the log ({size}; {e.__class__.__name__}): the "
                       "file may be well formed, but it does not fit in this machine's free memory; free memory or "
                       "split the log")


def _first_bad(path: Path, what: str, bad: np.ndarray, column: str, values: Any, fix: str,
               lines: Any = None) -> None:
    """Raise LogError at the first true entry of ``bad`` (data row numbers are 1-based), with its physical line:
    ``lines`` (a JSONL's, ``_read_jsonl``), else a CSV's row + 1 (the header is line 1)."""
    idx = np.flatnonzero(bad)
    if len(idx):
        i = int(idx[0])
        value = values[i].item() if isinstance(values[i], np.generic) else values[i]
        line = (f" (line {int(lines[i])})" if lines is not None else f" (line {i + 2})" if path.suffix == ".csv"
                else "")
        raise LogError(f"{path}: row {i + 1}{line}, column {column!r}: {what} (value {value!r}; {len(idx)} such "
                       f"row(s)); {fix}")


def _as_float(value: Any) -> float:
    """One cell as a float; NaN (refused by the caller, naming row and column) where it is not one."""
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return float("nan")


def _numeric(path: Path, df: Any, column: str, *, integer: bool) -> np.ndarray:
    """A column as float64, refusing non-numbers, non-finite values and (``integer``) fractions."""
    import pandas as pd

    raw = df[column].to_numpy()
    try:
        vals = pd.to_numeric(df[column], errors="coerce").to_numpy(np.float64)
    except (OverflowError, ValueError, TypeError):  # an integer past float64 (a 4,000-digit number) in the column
        vals = np.array([_as_float(v) for v in raw], np.float64)
    lines = df.attrs.get("lines")
    _first_bad(path, "not a finite number", ~np.isfinite(vals), column, raw, "write plain numbers", lines)
    if integer:
        _first_bad(path, "not a whole number", vals != np.round(vals), column, raw, "write integers", lines)
    return vals


def _tokens(path: Path, df: Any, rollouts: np.ndarray) -> np.ndarray:
    """The tokens column as int64, refusing a count no completion can have: not a finite whole number, negative, or
    more than ``MAX_TOKENS_PER_COMPLETION`` per rollout of the row."""
    tok = _numeric(path, df, "tokens", integer=True)
    raw = df["tokens"].to_numpy()
    lines = df.attrs.get("lines")
    _first_bad(path, "negative token count", tok < 0, "tokens", raw, "count generated tokens, 0 or more", lines)
    cap = np.minimum(MAX_TOKENS_PER_COMPLETION * rollouts, 2.0**53)  # 2**53: the last integer float64 holds exactly
    _first_bad(path, f"more than {MAX_TOKENS_PER_COMPLETION:,} tokens per completion", tok > cap, "tokens", raw,
               "log generated tokens (a count per completion, or per row's rollouts), not bytes or a running total",
               lines)
    return tok.astype(np.int64)


def _parquet_decoded_bytes(meta: Any, columns: set[str]) -> int:
    """Bytes the advisor's columns take once decoded, from the footer alone: a fixed-width value as 8 bytes (or
    its uncompressed size where larger), a string as its uncompressed bytes plus a 4-byte dictionary index (it is
    read as a dictionary, so repeated strings are not copied)."""
    total = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if col.path_in_schema.split(".")[0] not in columns:
                continue
            size, n = int(col.total_uncompressed_size), int(col.num_values)
            fixed = col.physical_type not in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")
            total += max(size, 8 * n) if fixed else size + 4 * n
    return total


def _read_jsonl(path: Path, limits: Limits, want: tuple[str, ...] | None) -> tuple[Any, list[str]]:
    """A JSONL file of per-completion rows, streamed line by line (no line past the line cap is read whole), as a
    DataFrame of the ``want`` columns (None: every key), with every key that occurs; ``attrs["lines"]``: each row's
    physical line (blank lines are skipped), which the row checks name (``_first_bad``)."""
    import pandas as pd

    cols: dict[str, list[Any]] = defaultdict(list) if want is None else {c: [] for c in want}
    keys: dict[str, None] = {}
    rows, cap, where = 0, limits.max_line_bytes, []
    with open(path, "rb") as f:
        n = 0
        while line := f.readline(cap + 1):
            n += 1
            body = line.rstrip(b"\r\n")
            if len(body) > cap:
                raise _too_large(path, f"line {n} is more than {format_size(cap)} long",
                                 f"{format_size(cap)} per line", "--max-line-bytes SIZE")
            if not body.strip():
                continue
            try:
                rec = json.loads(body)
            except json.JSONDecodeError as e:
                raise LogError(f"{path}: row {rows + 1} (line {n}): not a JSON object ({e.msg}); write one object "
                               "per line") from e
            if not isinstance(rec, dict):
                raise LogError(f"{path}: row {rows + 1} (line {n}): not a JSON object; write one object per line")
            rows += 1
            where.append(n)
            if rows > limits.max_rows:
                raise _too_large(path, f"more than {limits.max_rows:,} rows", f"{limits.max_rows:,} rows",
                                 "--max-rows N")
            for c in [c for c in rec if c not in keys] if want is None else ():
                cols[c].extend([None] * (rows - 1))  # a key first met at this row: absent from the rows before
            keys.update(dict.fromkeys(rec))
            for c in want if want is not None else keys:
                cols[c].append(rec.get(c))
    df = pd.DataFrame({c: cols[c] for c in keys if c in cols})
    df.attrs["lines"] = np.asarray(where, np.int64)
    return df, list(keys)
