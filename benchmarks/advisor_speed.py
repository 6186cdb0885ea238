"""How long the advisor takes on a large log: ``python -m benchmarks.advisor_speed [--rows 50000] [--out DIR]``.

The log: the committed hard GRPO replay log (benchmarks/replay/hard_grpo_s0.parquet, 5,024 rows) repeated with
its steps shifted until it holds at least ``--rows`` rows (50,240 rows over 1,570 steps for 50,000): the shape of
a long real run. It is written as a per-completion CSV too (one row per rollout, over 400,000 rows), the
format any trainer can write, and both are advised with the advisor's defaults (k = 8, batch = 32, 5 replay
seeds, 60 simulated steps, every registered allocator). Wall-clock and process CPU seconds go to
``advisor_speed.json`` under benchmarks/results/advisor_speed/ (only with the default --rows; otherwise a temporary
folder, or ``--out DIR``: DIR/advisor_speed/).
The issue's target: under 30 s for a 50k-row log on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # a run sets its environment before numpy loads; an import leaves the caller's alone
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pandas as pd

from benchmarks.common import output_dir, results_dir
from rlvr_core.advise import advise
from rlvr_core.advise.report import write
from rlvr_core.rollout.simulated import REPLAY_FILE

ROWS = 50_000


def big_log(rows: int) -> pd.DataFrame:
    """The committed replay log repeated, steps shifted, to at least ``rows`` rows."""
    base = pd.read_parquet(REPLAY_FILE)
    span = int(base["step"].max())
    parts = []
    while sum(len(p) for p in parts) < rows:
        part = base.copy()
        part["step"] += span * len(parts)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def per_completion(df: pd.DataFrame) -> pd.DataFrame:
    """One row per rollout: the passes first, tokens split evenly (rounded) over the rollouts of a row."""
    n = df["rollouts"].to_numpy()
    idx = np.repeat(np.arange(len(df)), n)
    pos = np.arange(len(idx)) - np.repeat(np.cumsum(n) - n, n)
    reward = (pos < df["passes"].to_numpy()[idx]).astype(float)
    tokens = np.rint(df["tokens"].to_numpy()[idx] / n[idx]).astype(np.int64)
    return pd.DataFrame({"step": df["step"].to_numpy()[idx], "prompt_id": df["prompt_id"].to_numpy()[idx],
                         "reward": reward, "tokens": tokens})


def timed(path: Path, out: Path) -> dict[str, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    adv = advise(path)
    write(adv, out)
    return {"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, "log_rows": adv.rows,
            "steps": adv.steps, "allocators": len(adv.allocators)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=ROWS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = output_dir(results_dir(args.out, args.rows == ROWS, "advisor_speed"), "advisor_speed")
    df = big_log(args.rows)
    res: dict[str, object] = {"rows": len(df), "target_s": 30.0, "cpus": os.cpu_count(),
                              "load_avg_1m": os.getloadavg()[0], "python": platform.python_version()}
    with tempfile.TemporaryDirectory() as tmp:
        pq, csv = Path(tmp) / "rollouts.parquet", Path(tmp) / "completions.csv"
        df.to_parquet(pq, index=False)
        per_completion(df).to_csv(csv, index=False)
        res["csv_rows"] = int(df["rollouts"].sum())
        res["parquet"] = timed(pq, Path(tmp) / "a")
        res["csv"] = timed(csv, Path(tmp) / "b")
    res["met"] = bool(res["parquet"]["wall_s"] < 30.0)
    (out / "advisor_speed.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
