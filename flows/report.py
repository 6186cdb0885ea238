"""Flow `report`: where allocation pays, over train.allocators x train.seeds (reads params `train.allocators`,
`train.seeds`).

Writes reports/accuracy_vs_rollouts.png and reports/accuracy_vs_tokens.png (median over seeds, the seed
spread shaded), reports/curves.csv (every run's evaluations), reports/comparison.md (rollouts to a target
set on the grpo runs, medians with bootstrap intervals over seeds, unreached runs counted) and
reports/metrics.json (tasks/report.py).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from prefect import flow

from flows.common import load, tie_children
from pipeline.paths import reports_dir, run_dir
from rlvr_core.errors import ConfigError
from tasks.report import write_report


@flow(name="report", log_prints=True)
def report(params_file: str | None = None) -> dict[str, Any]:
    """Compare the allocators' runs; returns the target and the per-allocator metrics."""
    cfg = load(params_file).train
    runs = {a: {s: str(run_dir(a, s)) for s in cfg.seeds} for a in cfg.allocators}
    missing = [f"{a} seed {s}" for a in cfg.allocators for s in cfg.seeds
               if not (run_dir(a, s) / "metrics.jsonl").is_file()]
    if missing:
        raise ConfigError(f"report: no metrics.jsonl for {missing}; "
                          "train them first (python -m flows.train --allocator ... --seed ...)")
    ev_path = reports_dir() / "evaluation.json"
    evaluation = json.loads(ev_path.read_text()) if ev_path.is_file() else {}
    metrics = write_report(runs, evaluation, str(reports_dir()))
    print((reports_dir() / "comparison.md").read_text())
    return metrics


if __name__ == "__main__":
    tie_children()  # its temporary Prefect server and every other child end with it, also on SIGKILL
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    report(params_file=ap.parse_args().params)
