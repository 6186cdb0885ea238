"""Reading a run's rollout log for the advisor (docs/advisor.md): four formats, one per-(step, prompt) frame.

- ``.parquet``: a per-(step, prompt) log, as ``rlvr_core.training`` writes it (``rollouts.parquet``,
  ``rlvr_core.rollout_log``) and as ``rlvr_core.integrations.trl.RolloutLogCallback`` writes it: columns
  ``step, prompt_id, rollouts, passes`` and optionally ``reward_sum, tokens``. Rows of the same (step, prompt)
  are summed into one log row, as in the text formats.
- ``.csv`` / ``.jsonl``: one row per completion, as any trainer can write it: ``step, prompt_id, reward`` and
  optionally ``tokens``. Rows of the same (step, prompt) are summed into one log row.
- a TRL completion log: ``GRPOConfig(log_completions=True)``'s ``completions/completions_<step>.parquet`` files
  (a folder of them, one of them, or a ``.jsonl`` of the same columns: ``step, prompt, completion``, a column
  per reward function, ``advantage``), read by ``rlvr_core.advise.trl_log`` into per-completion rows;
- a verl rollout dump: ``trainer.rollout_data_dir``'s ``<step>.jsonl`` files (the folder, or one of them:
  ``input, output, score, step``), read by ``rlvr_core.advise.trl_log`` the same way.

The advisor models pass/fail rewards: a reward must lie in [0, 1] and a reward above 0 counts as a pass (as in
``rollouts.parquet``). Every error is a ``LogError`` naming the file, the row (1-based, data rows; a CSV's
header is line 1) and the column.

A log is capped before it is decoded (``Limits``, docs/advisor.md "Size limits"): at most ``max_rows`` rows,
``max_bytes`` of decoded column data (a parquet file's footer says both before any page is read; a text file's
decoded bytes are its bytes), ``max_line_bytes`` per line of a text log and ``max_columns`` columns (a JSONL log's
distinct keys; only the columns the advisor reads are kept, never back-filled). A log past a cap is refused with a
``LogTooLarge`` naming its size, the cap and the flag that raises it; running out of memory while reading is a
``LogTooLarge`` too, never "not a readable file".
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_core.advise.checks import (  # noqa: F401 - re-exported: the advisor's errors, caps and checks
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_COLUMNS,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_ROWS,
    MAX_TOKENS_PER_COMPLETION,
    MAX_WHOLE,
    Limits,
    LogError,
    LogTooLarge,
    _clip,
    _first_bad,
    _numeric,
    _out_of_memory,
    _parquet_decoded_bytes,
    _quote,
    _read_jsonl,
    _size_flag,
    _tokens,
    _too_large,
    _too_many_columns,
    format_size,
)
from rlvr_core.advise.trl_log import is_trl, is_verl, read_trl, trl_files

AGG_REQUIRED = ("step", "prompt_id", "rollouts", "passes")
ROW_REQUIRED = ("step", "prompt_id", "reward")
AGG_OPTIONAL = ("reward_sum", "tokens")
ROW_OPTIONAL = ("tokens",)
FORMATS = {".parquet": "per (step, prompt)", ".csv": "per completion", ".jsonl": "per completion"}

_CHUNK = 8 * 2**20  # bytes read at a time when scanning a text log


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """A byte count from ``"4GiB"``, ``"500MB"``, ``"1.5G"`` or ``"123"`` (k/M/G/T are powers of 1000, KiB... of
    1024); raises ValueError for anything else or for less than one byte."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (write e.g. 4GiB, 500MB or a number of bytes)")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n < 1:
        raise ValueError(f"not a size of at least one byte: {text!r}")
    return n


def _scan_text(path: Path, limits: Limits) -> int:
    """Lines of a text log (newlines, plus a last unterminated line), refusing one longer than the line cap; reads
    ``_CHUNK`` bytes at a time, never a whole line."""
    cap = limits.max_line_bytes
    lines, start, pos = 0, 0, 0  # start: offset of the current line's first byte
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            nl = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + pos
            ends = np.concatenate(([start - 1], nl)) if len(nl) else np.asarray([start - 1])
            lengths = np.diff(ends) - 1  # bytes of each line that ended in this chunk, without its newline
            long = np.flatnonzero(lengths > cap)
            pos += len(chunk)
            open_len = pos - (int(nl[-1]) + 1 if len(nl) else start)  # bytes of the line still open
            if len(long) or open_len > cap:
                n = lines + (int(long[0]) + 1 if len(long) else len(nl) + 1)
                at = f"more than {format_size(cap)}" if not len(long) else format_size(int(lengths[long[0]]))
                raise _too_large(path, f"line {n} is {at} long", f"{format_size(cap)} per line",
                                 "--max-line-bytes SIZE")
            lines += len(nl)
            if len(nl):
                start = int(nl[-1]) + 1
    return lines + (pos > start)


def _read_csv(path: Path, limits: Limits) -> tuple[Any, list[str]]:
    """A CSV of per-completion rows as a DataFrame of the columns the advisor uses, with the header's columns."""
    import pandas as pd

    lines = _scan_text(path, limits)
    try:
        header = [str(c) for c in pd.read_csv(path, nrows=0).columns]
    except pd.errors.EmptyDataError:
        return pd.DataFrame(), []
    if len(header) > limits.max_columns:
        raise _too_many_columns(path, f"its header (line 1) has {len(header):,} columns", limits)
    want = set(ROW_REQUIRED + ROW_OPTIONAL)
    df = pd.read_csv(path, usecols=lambda c: c in want, nrows=limits.max_rows + 1)
    if len(df) > limits.max_rows:
        raise _too_large(path, f"more than {limits.max_rows:,} rows ({lines - 1:,} lines after the header)",
                         f"{limits.max_rows:,} rows", "--max-rows N")
    return df, header


def _read_parquet(path: Path, limits: Limits) -> tuple[Any, list[str]]:
    """A parquet log as a DataFrame of the columns the advisor uses, with every column's name. Its footer's row
    count and decoded size are checked against the caps before any data page is read; while reading, row group
    by row group, the decoded table is checked again (a footer that understates is caught within a row group)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as pf:
        meta, schema = pf.metadata, pf.schema_arrow
    names = [n for n in schema.names if not n.startswith("__index_level_")]
    if len(names) > limits.max_columns:
        raise _too_many_columns(path, f"{len(names):,} columns", limits)
    use = [n for n in names if n in AGG_REQUIRED + AGG_OPTIONAL]
    rows, decoded = int(meta.num_rows), _parquet_decoded_bytes(meta, set(use))
    size = f"{rows:,} rows, {format_size(decoded)} decoded, from {format_size(path.stat().st_size)} on disk"
    if rows > limits.max_rows:
        raise _too_large(path, f"{size}", f"{limits.max_rows:,} rows", f"--max-rows {rows}")
    if decoded > limits.max_bytes:
        raise _too_large(path, f"{size}", f"{format_size(limits.max_bytes)} decoded",
                         _size_flag(decoded))

    def text(t: Any) -> bool:
        return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t))

    tables, got_rows, got_bytes = [], 0, 0
    try:
        with pq.ParquetFile(path, read_dictionary=[n for n in use if text(schema.field(n).type)]) as pf:
            for g in range(meta.num_row_groups):
                t = pf.read_row_group(g, columns=use)
                got_rows, got_bytes = got_rows + t.num_rows, got_bytes + t.nbytes
                if got_rows > limits.max_rows or got_bytes > limits.max_bytes:
                    raise _too_large(path, f"its footer understates its size: {got_rows:,} rows, "
                                     f"{format_size(got_bytes)} decoded by row group {g + 1} of "
                                     f"{meta.num_row_groups}", f"{limits.max_rows:,} rows and "
                                     f"{format_size(limits.max_bytes)} decoded", "--max-rows N / --max-bytes SIZE")
                tables.append(t)
        table = pa.concat_tables(tables) if tables else schema.empty_table().select(use)
        df = table.to_pandas()
    except MemoryError as e:
        raise _out_of_memory(path, e, size) from e
    return df, names


def _require_columns(path: Path, columns: list[str], required: tuple[str, ...], kind: str) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        where = "header (line 1)" if path.suffix == ".csv" else "every row"
        raise LogError(f"{path}: {where}: missing column(s) {missing}; a log {kind} needs {list(required)} "
                       f"(has {_quote(columns)}); see docs/advisor.md")


def _read_rows_jsonl(path: Path, limits: Limits) -> tuple[Any, list[str]]:
    return _read_jsonl(path, limits, ROW_REQUIRED + ROW_OPTIONAL)


def _prompt_codes(df: Any) -> np.ndarray:
    """Prompt ids as int64: whole numbers up to 2**53 kept, anything else (strings, a 64-bit hash that int64 would
    wrap or float64 would round into another) numbered in order of first appearance. A categorical column (a
    parquet string column, read as a dictionary) is numbered by its codes, so that its strings are never copied
    once per row."""
    import pandas as pd

    ids = df["prompt_id"]
    if isinstance(ids.dtype, pd.CategoricalDtype):
        cats = _as_numbers(pd.Series(ids.cat.categories))
        codes = ids.cat.codes.to_numpy()
        num = np.where(codes >= 0, cats[codes], np.nan) if len(cats) else np.full(len(codes), np.nan)
        if _whole_ids(num):
            return num.astype(np.int64)
        return pd.factorize(codes)[0].astype(np.int64)
    num = _as_numbers(ids)
    if _whole_ids(num):
        return num.astype(np.int64)
    return pd.factorize(ids.astype(str))[0].astype(np.int64)


def _whole_ids(num: np.ndarray) -> bool:
    """Whether prompt keys read as numbers are ids kept as they are: finite whole numbers in [0, 2**53]."""
    return bool(np.all(np.isfinite(num)) and np.all(num == np.round(num)) and np.all(num >= 0)
                and np.all(num <= MAX_WHOLE))


def _as_numbers(ids: Any) -> np.ndarray:
    """Prompt keys as float64, NaN where one is not a number; all NaN when a key is an integer past a float (a
    4,000-digit id is a label like any string, so the keys are then factorized as text)."""
    import pandas as pd

    try:
        return pd.to_numeric(ids, errors="coerce").to_numpy(np.float64)
    except (OverflowError, ValueError, TypeError):
        return np.full(len(ids), np.nan)


def _aggregate(path: Path, df: Any, columns: list[str]) -> Any:
    """Per-completion rows -> one row per (step, prompt): rollouts, passes, reward_sum (and tokens)."""
    import pandas as pd

    _require_columns(path, columns, ROW_REQUIRED, "of one row per completion")
    step = _numeric(path, df, "step", integer=True)
    reward = _numeric(path, df, "reward", integer=False)
    _first_bad(path, "reward outside [0, 1]", (reward < 0) | (reward > 1), "reward", df["reward"].to_numpy(),
               "the advisor models pass/fail tasks: scale rewards to [0, 1] (a reward above 0 is a pass)",
               df.attrs.get("lines"))
    cols = {"step": step.astype(np.int64), "prompt_id": _prompt_codes(df), "rollouts": np.ones(len(df), np.int64),
            "passes": (reward > 0).astype(np.int64), "reward_sum": reward}
    if "tokens" in df.columns:
        cols["tokens"] = _tokens(path, df, np.ones(len(df)))
    return _sum_groups(pd.DataFrame(cols))


def _sum_groups(df: Any) -> Any:
    """One row per (step, prompt): rows of the same (step, prompt) summed, in every format alike (a log written by
    several ranks or appended to by a resumed run holds a group in several rows)."""
    return df.groupby(["step", "prompt_id"], as_index=False, sort=True).sum()


def _check_aggregated(path: Path, df: Any, columns: list[str]) -> Any:
    """A per-(step, prompt) log checked row by row; returns it with numeric columns, one row per (step, prompt)."""
    import pandas as pd

    _require_columns(path, columns, AGG_REQUIRED, "of one row per (step, prompt)")
    n = _numeric(path, df, "rollouts", integer=True)
    s = _numeric(path, df, "passes", integer=True)
    lines = df.attrs.get("lines")
    _first_bad(path, "fewer than 1 rollout", n < 1, "rollouts", df["rollouts"].to_numpy(), "drop empty rows", lines)
    _first_bad(path, "passes outside [0, rollouts]", (s < 0) | (s > n), "passes", df["passes"].to_numpy(),
               "passes counts the rollouts with reward > 0", lines)
    out = pd.DataFrame({"step": _numeric(path, df, "step", integer=True).astype(np.int64),
                        "prompt_id": _prompt_codes(df), "rollouts": n.astype(np.int64), "passes": s.astype(np.int64)})
    if "reward_sum" in df.columns:
        r = _numeric(path, df, "reward_sum", integer=False)
        _first_bad(path, "reward outside [0, 1] (reward_sum outside [0, rollouts])", (r < 0) | (r > n),
                   "reward_sum", df["reward_sum"].to_numpy(),
                   "the advisor models pass/fail tasks: scale rewards to [0, 1]", lines)
        out["reward_sum"] = r
    if "tokens" in df.columns:
        out["tokens"] = _tokens(path, df, n)
    return _sum_groups(out)


def load_log(path: str | os.PathLike, limits: Limits | None = None,
             reward_columns: list[str] | tuple[str, ...] | None = None) -> Any:
    """The log at ``path`` as a DataFrame with one row per (step, prompt), sorted: ``step, prompt_id, rollouts,
    passes`` (int64), ``reward_sum`` and ``tokens`` where the log has them. Only those columns are read. A TRL
    completion log (a ``.parquet`` or ``.jsonl`` with ``prompt`` and ``completion`` columns, or a folder of them:
    ``rlvr_core.advise.trl_log``) is read too; ``reward_columns`` names its reward columns (default: every numeric
    column but step, advantage and tokens); ``attrs["unscorable"]`` counts its completions dropped as unscorable.

    Raises:
        FileNotFoundError when there is no file; LogTooLarge for a log past ``limits`` (default ``Limits()``),
        refused before its data is decoded, or one that runs out of memory; LogError for an unknown format, an
        unreadable file, a missing column, a bad value (naming its row and column), an empty log or a log of one
        step only.
    """
    path = Path(path)
    limits = limits or Limits()
    if path.is_dir():
        df = _load_trl(path, trl_files(path), limits, reward_columns)
    elif not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    else:
        df = _load_file(path, limits, reward_columns)
    steps = np.unique(df["step"].to_numpy())
    if len(steps) < 2:
        raise LogError(f"{path}: column 'step': every row is from step {int(steps[0])}; the advisor replays how "
                       "the pass rates move over a run and needs at least two steps")
    out = df.sort_values(["step", "prompt_id"], kind="stable").reset_index(drop=True)
    out.attrs["unscorable"] = int(df.attrs.get("unscorable", 0))
    return out


def _load_trl(path: Path, files: list[Path], limits: Limits, reward_columns: Any) -> Any:
    """TRL completion logs -> one row per (step, prompt), as a per-completion log is (``_aggregate``)."""
    try:
        rows = read_trl(files, limits, reward_columns)
    except LogError:
        raise
    except MemoryError as e:
        raise _out_of_memory(path, e, f"{len(files)} file(s)") from e
    except Exception as e:  # noqa: BLE001 - any reader failure means a file is not a usable log
        raise LogError(f"{path}: not a readable TRL completion log ({e.__class__.__name__}: {_clip(str(e))})") from e
    if not len(rows):
        raise LogError(f"{path}: the log is empty (no scorable completion); record at least two training steps")
    df = _aggregate(path, rows, list(rows.columns))
    df.attrs["unscorable"] = rows.attrs.get("unscorable", 0)
    return df


def _columns_of(path: Path, limits: Limits) -> list[str]:
    """A parquet file's column names (its footer), or the keys of a JSONL file's first object (none on error)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            with pq.ParquetFile(path) as pf:
                return list(pf.schema_arrow.names)
        with open(path, "rb") as f:
            while line := f.readline(limits.max_line_bytes + 1):
                if line.strip():
                    rec = json.loads(line)
                    return list(rec) if isinstance(rec, dict) else []
    except Exception:  # noqa: BLE001 - the format's own reader reports what is wrong
        return []
    return []


def _load_file(path: Path, limits: Limits, reward_columns: Any) -> Any:
    """One log file -> one row per (step, prompt)."""
    if path.suffix not in FORMATS:
        raise LogError(f"{path}: unknown format {path.suffix!r}; give a .parquet rollout log, a .csv / .jsonl "
                       "file of (step, prompt_id, reward[, tokens]) rows, one per completion, or a TRL completion "
                       "log (.parquet / .jsonl, or its folder)")
    if path.suffix != ".csv" and (is_trl(_columns_of(path, limits)) or is_verl(_columns_of(path, limits))):
        return _load_trl(path, [path], limits, reward_columns)
    on_disk = path.stat().st_size
    if path.suffix != ".parquet" and on_disk > limits.max_bytes:  # a text log's decoded bytes are its bytes
        raise _too_large(path, f"{format_size(on_disk)}", f"{format_size(limits.max_bytes)} decoded",
                         _size_flag(on_disk))
    reader = {".parquet": _read_parquet, ".csv": _read_csv, ".jsonl": _read_rows_jsonl}[path.suffix]
    try:
        raw, columns = reader(path, limits)
    except LogError:
        raise
    except MemoryError as e:
        raise _out_of_memory(path, e, f"{format_size(on_disk)} on disk") from e
    except Exception as e:  # noqa: BLE001 - any reader failure means the file is not a usable log
        raise LogError(f"{path}: not a readable {path.suffix} file ({e.__class__.__name__}: {_clip(str(e))})") from e
    if not len(raw):
        raise LogError(f"{path}: the log is empty (no rows); record at least two training steps")
    try:
        return (_check_aggregated(path, raw, columns) if path.suffix == ".parquet"
                else _aggregate(path, raw, columns))
    except MemoryError as e:
        raise _out_of_memory(path, e, f"{len(raw):,} rows") from e


