"""What every reader of the advisor's logs shares (``rlvr_core.advise.logs``, ``rlvr_core.advise.trl_log``): the
errors, the size caps (``Limits``) and the row-by-row checks whose messages name the file, the row and the column.
"""

from __future__ import annotations

import json
import math
from array import array
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
# 1,000 columns (distinct keys of a JSONL log): a TRL log has a handful (step, prompt, completion, a column per
# reward function, advantage, log_extra's), a verl dump a dozen; a log whose every line adds a key is refused at
# its 1,001st, where each new key used to be back-filled into every earlier row (quadratic in the rows).
DEFAULT_MAX_COLUMNS = 1_000
# The most tokens one completion may have generated (docs/advisor.md "Inputs"): 10M is past the context window of
# any model an RL run trains; a count past it (1e30, an overflowed counter, a running total) is a broken log.
MAX_TOKENS_PER_COMPLETION = 10**7
# The largest whole number an integer column (step, rollouts, passes, tokens) may hold: 2**53, the last integer
# float64 holds exactly (past it two steps can read as one, and past 2**63 a step wrapped to -2**63 in int64).
MAX_WHOLE = 2**53
# Characters of a value, a key or a reader's message quoted in an error; the rest is elided with its length.
MAX_QUOTED = 200


class LogError(ValueError):
    """A log the advisor cannot use; the message names the file, row and column and the fix."""


class LogTooLarge(LogError):
    """A log past the advisor's size caps (or one that ran out of memory while it was read)."""


@dataclass(frozen=True)
class Limits:
    """The most the advisor reads from a log: rows, decoded bytes of the columns it uses, bytes per text line,
    columns (a parquet file's, a CSV header's, a JSONL file's distinct keys)."""

    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_columns: int = DEFAULT_MAX_COLUMNS

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes", "max_line_bytes", "max_columns"):
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


def _clip(text: str, n: int = MAX_QUOTED) -> str:
    """``text`` for an error message, cut to ``n`` characters (a 1 MiB completion or key is never echoed whole)."""
    return text if len(text) <= n else f"{text[:n]}... ({len(text):,} characters)"


def _quote(value: Any, n: int = MAX_QUOTED) -> str:
    """``repr(value)`` for an error message, cut to ``n`` characters (``_clip``)."""
    return _clip(repr(value), n)


def _too_many_columns(path: Path, what: str, limits: Limits) -> LogTooLarge:
    return _too_large(path, what, f"{limits.max_columns:,} columns", "--max-columns N")


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
        raise LogError(f"{path}: row {i + 1}{line}, column {_quote(column)}: {what} (value {_quote(value)}; "
                       f"{len(idx)} such row(s)); {fix}")


def _as_float(value: Any) -> float:
    """One cell as a float; NaN (refused by the caller, naming row and column) where it is not one."""
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return float("nan")


def _numeric(path: Path, df: Any, column: str, *, integer: bool, bounded: bool = True) -> np.ndarray:
    """A column as float64, refusing non-numbers, non-finite values and (``integer``) fractions and (``bounded``)
    whole numbers past ``MAX_WHOLE``, which the int64 the caller makes of them would not hold exactly or would
    wrap (2**63 read as -2**63); ``_tokens`` applies its own, lower cap."""
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
    if integer and bounded:
        _first_bad(path, f"a whole number past 2**53 ({MAX_WHOLE:,})", np.abs(vals) > MAX_WHOLE, column, raw,
                   "write counts and steps as plain integers (past 2**53 a float64 no longer tells them apart)",
                   lines)
    return vals


def _tokens(path: Path, df: Any, rollouts: np.ndarray) -> np.ndarray:
    """The tokens column as int64, refusing a count no completion can have: not a finite whole number, negative, or
    more than ``MAX_TOKENS_PER_COMPLETION`` per rollout of the row."""
    tok = _numeric(path, df, "tokens", integer=True, bounded=False)
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


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice (``json.loads`` would keep the last silently)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def _read_jsonl(path: Path, limits: Limits, want: Any) -> tuple[Any, list[str]]:
    """A JSONL file of per-completion rows, streamed line by line (no line past the line cap is read whole), as a
    DataFrame of the columns the advisor uses, with every key that occurs; ``attrs["lines"]``: each row's physical
    line (blank lines are skipped), which the row checks name (``_first_bad``).

    ``want`` names those columns: a tuple of names, or a function of (every key, in order of first appearance; the
    keys that hold a number somewhere) called once the file is read. Only their values are kept, as (row, value)
    pairs, and only their columns are built, so memory is linear in the file: a key first met at row N is never
    back-filled into the N - 1 rows before it while reading. More than ``limits.max_columns`` distinct keys, or a
    built table of more than ``limits.max_bytes`` (8 bytes a cell), is refused; so is a key given twice in one
    object (json would keep its last value silently), naming the row, the line and the key."""
    import pandas as pd

    keys: dict[str, None] = {}
    kept: dict[str, tuple[array, list[Any]]] = {}  # key -> (the rows where it occurs, its values there)
    fixed = want if isinstance(want, tuple) else None
    numeric: set[str] = set()
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
            rec = _json_row(path, body, rows + 1, n)
            rows += 1
            where.append(n)
            if rows > limits.max_rows:
                raise _too_large(path, f"more than {limits.max_rows:,} rows", f"{limits.max_rows:,} rows",
                                 "--max-rows N")
            for c, v in rec.items():
                if c not in keys:
                    if len(keys) >= limits.max_columns:
                        raise _too_many_columns(path, f"row {rows} (line {n}) brings its distinct keys past "
                                                f"{limits.max_columns:,} (key {_quote(c)})", limits)
                    keys[c] = None
                    if fixed is None or c in fixed:
                        kept[c] = (array("q"), [])
                cell = kept.get(c)
                if cell is not None:
                    cell[0].append(rows - 1)
                    cell[1].append(v)
                    if fixed is None and isinstance(v, (int, float)) and not isinstance(v, bool):
                        numeric.add(c)
    names = list(keys)
    build = [c for c in names if c in kept] if fixed is not None else [c for c in want(names, numeric) if c in kept]
    if 8 * rows * len(build) > limits.max_bytes:
        size = 8 * rows * len(build)
        raise _too_large(path, f"{rows:,} rows x {len(build):,} columns read ({format_size(size)} once built)",
                         f"{format_size(limits.max_bytes)} decoded", _size_flag(size))
    df = pd.DataFrame(_columns(kept, build, rows))
    df.attrs["lines"] = np.asarray(where, np.int64)
    return df, names


def _json_row(path: Path, body: bytes, row: int, n: int) -> dict[str, Any]:
    """Line ``n`` (row ``row``) of a JSONL log as a JSON object; LogError naming both if it is not one, or if it
    gives a key twice."""
    try:
        rec = json.loads(body, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise LogError(f"{path}: row {row} (line {n}): not a JSON object ({e.msg}); write one object "
                       "per line") from e
    except _DuplicateKey as e:
        raise LogError(f"{path}: row {row} (line {n}): key {_quote(e.key)} given twice in one object; "
                       "write each key once (which value is meant is not known)") from None
    if not isinstance(rec, dict):
        raise LogError(f"{path}: row {row} (line {n}): not a JSON object; write one object per line")
    return rec


def _columns(kept: dict[str, tuple[Any, list[Any]]], build: list[str], rows: int) -> dict[str, list[Any]]:
    """The columns ``build`` of ``rows`` rows from the (row, value) pairs kept of each, None where a row lacks
    the key (a column is built once, after the file is read, never back-filled per new key)."""
    data = {}
    for c in build:
        at, vals = kept.pop(c)
        if len(at) == rows:
            data[c] = vals
        else:
            col: list[Any] = [None] * rows
            for i, v in zip(at, vals):
                col[i] = v
            data[c] = col
    return data
