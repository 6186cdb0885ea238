"""Reading a run's rollout log for the advisor (docs/advisor.md): three formats, one per-(step, prompt) frame.

- ``.parquet``: a per-(step, prompt) log, as ``rlvr_core.training`` writes it (``rollouts.parquet``,
  ``rlvr_core.rollout_log``) and as ``rlvr_core.integrations.trl.RolloutLogCallback`` writes it: columns
  ``step, prompt_id, rollouts, passes`` and optionally ``reward_sum, tokens``.
- ``.csv`` / ``.jsonl``: one row per completion, as any trainer can write it: ``step, prompt_id, reward`` and
  optionally ``tokens``. Rows of the same (step, prompt) are summed into one log row.

The advisor models pass/fail rewards: a reward must lie in [0, 1] and a reward above 0 counts as a pass (as in
``rollouts.parquet``). Every error is a ``LogError`` naming the file, the row (1-based, data rows; a CSV's
header is line 1) and the column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

AGG_REQUIRED = ("step", "prompt_id", "rollouts", "passes")
ROW_REQUIRED = ("step", "prompt_id", "reward")
FORMATS = {".parquet": "per (step, prompt)", ".csv": "per completion", ".jsonl": "per completion"}


class LogError(ValueError):
    """A log the advisor cannot use; the message names the file, row and column and the fix."""


def _first_bad(path: Path, what: str, bad: np.ndarray, column: str, values: Any, fix: str) -> None:
    """Raise LogError at the first true entry of ``bad`` (data row numbers are 1-based)."""
    idx = np.flatnonzero(bad)
    if len(idx):
        i = int(idx[0])
        value = values[i].item() if isinstance(values[i], np.generic) else values[i]
        line = f" (line {i + 2})" if path.suffix == ".csv" else ""
        raise LogError(f"{path}: row {i + 1}{line}, column {column!r}: {what} (value {value!r}; {len(idx)} such "
                       f"row(s)); {fix}")


def _numeric(path: Path, df: Any, column: str, *, integer: bool) -> np.ndarray:
    """A column as float64, refusing non-numbers, non-finite values and (``integer``) fractions."""
    import pandas as pd

    raw = df[column].to_numpy()
    vals = pd.to_numeric(df[column], errors="coerce").to_numpy(np.float64)
    _first_bad(path, "not a finite number", ~np.isfinite(vals), column, raw, "write plain numbers")
    if integer:
        _first_bad(path, "not a whole number", vals != np.round(vals), column, raw, "write integers")
    return vals


def _read_rows(path: Path) -> Any:
    """A CSV or JSONL file of per-completion rows as a DataFrame."""
    import pandas as pd

    if path.suffix == ".csv":
        try:
            return pd.read_csv(path)
        except pd.errors.EmptyDataError:
            return pd.DataFrame()
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise LogError(f"{path}: row {n}: not a JSON object ({e.msg}); write one object per line") from e
            if not isinstance(rec, dict):
                raise LogError(f"{path}: row {n}: not a JSON object; write one object per line")
            records.append(rec)
    return pd.DataFrame.from_records(records)


def _require_columns(path: Path, df: Any, required: tuple[str, ...], kind: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        where = "header (line 1)" if path.suffix == ".csv" else "every row"
        raise LogError(f"{path}: {where}: missing column(s) {missing}; a log {kind} needs {list(required)} "
                       f"(has {list(df.columns)}); see docs/advisor.md")


def _prompt_codes(df: Any) -> np.ndarray:
    """Prompt ids as int64: whole numbers kept, anything else (strings) numbered in order of first appearance."""
    import pandas as pd

    num = pd.to_numeric(df["prompt_id"], errors="coerce").to_numpy(np.float64)
    if np.all(np.isfinite(num)) and np.all(num == np.round(num)) and np.all(num >= 0):
        return num.astype(np.int64)
    return pd.factorize(df["prompt_id"].astype(str))[0].astype(np.int64)


def _aggregate(path: Path, df: Any) -> Any:
    """Per-completion rows -> one row per (step, prompt): rollouts, passes, reward_sum (and tokens)."""
    import pandas as pd

    _require_columns(path, df, ROW_REQUIRED, "of one row per completion")
    step = _numeric(path, df, "step", integer=True)
    reward = _numeric(path, df, "reward", integer=False)
    _first_bad(path, "reward outside [0, 1]", (reward < 0) | (reward > 1), "reward", df["reward"].to_numpy(),
               "the advisor models pass/fail tasks: scale rewards to [0, 1] (a reward above 0 is a pass)")
    cols = {"step": step.astype(np.int64), "prompt_id": _prompt_codes(df), "rollouts": np.ones(len(df), np.int64),
            "passes": (reward > 0).astype(np.int64), "reward_sum": reward}
    if "tokens" in df.columns:
        tok = _numeric(path, df, "tokens", integer=True)
        _first_bad(path, "negative token count", tok < 0, "tokens", df["tokens"].to_numpy(), "count tokens >= 0")
        cols["tokens"] = tok.astype(np.int64)
    flat = pd.DataFrame(cols)
    return flat.groupby(["step", "prompt_id"], as_index=False, sort=True).sum()


def _check_aggregated(path: Path, df: Any) -> Any:
    """A per-(step, prompt) log checked row by row; returns it with numeric columns."""
    import pandas as pd

    _require_columns(path, df, AGG_REQUIRED, "of one row per (step, prompt)")
    n = _numeric(path, df, "rollouts", integer=True)
    s = _numeric(path, df, "passes", integer=True)
    _first_bad(path, "fewer than 1 rollout", n < 1, "rollouts", df["rollouts"].to_numpy(), "drop empty rows")
    _first_bad(path, "passes outside [0, rollouts]", (s < 0) | (s > n), "passes", df["passes"].to_numpy(),
               "passes counts the rollouts with reward > 0")
    out = pd.DataFrame({"step": _numeric(path, df, "step", integer=True).astype(np.int64),
                        "prompt_id": _prompt_codes(df), "rollouts": n.astype(np.int64), "passes": s.astype(np.int64)})
    if "reward_sum" in df.columns:
        r = _numeric(path, df, "reward_sum", integer=False)
        _first_bad(path, "reward outside [0, 1] (reward_sum outside [0, rollouts])", (r < 0) | (r > n),
                   "reward_sum", df["reward_sum"].to_numpy(),
                   "the advisor models pass/fail tasks: scale rewards to [0, 1]")
        out["reward_sum"] = r
    if "tokens" in df.columns:
        out["tokens"] = _numeric(path, df, "tokens", integer=True).astype(np.int64)
    return out


def load_log(path: str | os.PathLike) -> Any:
    """The log at ``path`` as a DataFrame with one row per (step, prompt), sorted: ``step, prompt_id, rollouts,
    passes`` (int64), ``reward_sum`` and ``tokens`` where the log has them.

    Raises:
        FileNotFoundError when there is no file; LogError for an unknown format, an unreadable file, a missing
        column, a bad value (naming its row and column), an empty log or a log of one step only.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix not in FORMATS:
        raise LogError(f"{path}: unknown format {path.suffix!r}; give a .parquet rollout log or a .csv / .jsonl "
                       "file of (step, prompt_id, reward[, tokens]) rows, one per completion")
    try:
        raw = pd.read_parquet(path) if path.suffix == ".parquet" else _read_rows(path)
    except LogError:
        raise
    except Exception as e:  # noqa: BLE001 - any reader failure means the file is not a usable log
        raise LogError(f"{path}: not a readable {path.suffix} file ({e.__class__.__name__}: {e})") from e
    if not len(raw):
        raise LogError(f"{path}: the log is empty (no rows); record at least two training steps")
    df = _check_aggregated(path, raw) if path.suffix == ".parquet" else _aggregate(path, raw)
    steps = np.unique(df["step"].to_numpy())
    if len(steps) < 2:
        raise LogError(f"{path}: column 'step': every row is from step {int(steps[0])}; the advisor replays how "
                       "the pass rates move over a run and needs at least two steps")
    return df.sort_values(["step", "prompt_id"], kind="stable").reset_index(drop=True)
