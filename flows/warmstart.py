"""Flow `warmstart`: the policy RL starts from -> models/warmstart/ + reports/warmstart.json (reads params
`warmstart`, `prepare.task`, `train.threads`).

warmstart.base_model null: the policy recorded for these prepare and warmstart settings under
artifacts/warmstart/ (rlvr_core.models.recorded; its sha256 verified, a mismatch refused), else a supervised
warm start of the tiny policy on the train split, with the task's teacher (arithmetic, countdown;
rlvr_core.tasks). Set (a hub id
such as Qwen/Qwen2.5-1.5B-Instruct, or a local model folder): no training, a snapshot of that model and
its tokenizer (offline when HF_HUB_OFFLINE is set; a local folder is always read offline).
"""

from __future__ import annotations

import argparse
from typing import Any

from prefect import flow

from flows.common import fix_cpu, load, tie_children, write_json
from pipeline.paths import data_dir, recorded_dir, reports_dir, warmstart_dir
from rlvr_core.models.recorded import copy_recorded, policy_key
from tasks.models import run_warm_start

TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds")


@flow(name="warmstart", log_prints=True)
def warmstart(params_file: str | None = None) -> dict[str, Any]:
    """Warm start the tiny policy on the prepared train split, or snapshot warmstart.base_model;
    writes reports/warmstart.json (+ _timings)."""
    params = load(params_file)
    fix_cpu(params.train.threads)  # before any computation: results must not depend on the machine
    task = params.prepare.task
    key = policy_key(params.prepare, params.warmstart)
    # a recorded warm start of these settings (artifacts/warmstart/): its files verified against their sha256
    entry = None if params.warmstart.base_model else copy_recorded(recorded_dir(), key, warmstart_dir())
    if entry is not None:
        print(f"warmstart: the recorded policy {key} (sha256 verified, built on {entry['built_on']}) -> "
              f"{warmstart_dir()}")
        write_json(reports_dir() / "warmstart.json", entry["metrics"])
        write_json(reports_dir() / "warmstart_timings.json", {"recorded": key})
        return entry["metrics"]
    metrics = run_warm_start(params.warmstart, str(data_dir(task)), str(warmstart_dir()), task)
    write_json(reports_dir() / "warmstart.json", {k: v for k, v in metrics.items() if k not in TIMING_KEYS})
    write_json(reports_dir() / "warmstart_timings.json", {k: metrics[k] for k in TIMING_KEYS if k in metrics})
    if params.warmstart.base_model is not None:
        print(f"warmstart: snapshot of {params.warmstart.base_model} ({metrics['model_type']}, {metrics['params']:,} "
              f"parameters) in {metrics['seconds']:.1f}s -> {warmstart_dir()}")
    else:
        print(f"warmstart: final loss {metrics['final_loss']:.4f} in {metrics['seconds']:.1f}s -> {warmstart_dir()}")
    return metrics


if __name__ == "__main__":
    tie_children()  # its temporary Prefect server and every other child end with it, also on SIGKILL
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    warmstart(params_file=ap.parse_args().params)
