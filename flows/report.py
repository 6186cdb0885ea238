"""Flow `report`: plots, comparison table and metrics over train.allocators (reads params `train.allocators`).

Writes reports/accuracy_vs_rollouts.png, reports/accuracy_vs_tokens.png, reports/curves.csv,
reports/comparison.md and reports/metrics.json.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from prefect import flow

from flows.common import load
from rlvr_core.errors import ConfigError
from tasks.paths import reports_dir, run_dir
from tasks.report import write_report


@flow(name="report", log_prints=True)
def report(params_file: str | None = None) -> dict[str, Any]:
    """Compare the allocators' runs; returns the per-allocator metrics."""
    allocators = load(params_file).train.allocators
    runs = {a: str(run_dir(a)) for a in allocators}
    missing = [a for a, d in runs.items() if not (run_dir(a) / "metrics.jsonl").is_file()]
    if missing:
        raise ConfigError(f"report: no metrics.jsonl for {missing}; "
                          "train them first (python -m flows.train --allocator ...)")
    ev_path = reports_dir() / "evaluation.json"
    evaluation = json.loads(ev_path.read_text()) if ev_path.is_file() else {}
    metrics = write_report(runs, evaluation, str(reports_dir()))
    print((reports_dir() / "comparison.md").read_text())
    return metrics


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    report(params_file=ap.parse_args().params)
