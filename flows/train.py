"""Flow `train`: one GRPO run with an allocator, resumable, tracked in MLflow (reads params `train`, `prepare.task`).

    python -m flows.train --allocator sara [--steps 50] [--seed 1] [--set lr=1e-4 --set k=4]

Writes runs/<allocator>/ (checkpoints/, metrics.jsonl, final_model/, summary.json as DVC metrics,
train_timings.json, tracking.json with the MLflow run id).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

import yaml
from prefect import flow

from flows.common import flow_run_id, load, write_json
from rlvr_core.checkpoint import list_checkpoints
from rlvr_core.errors import ConfigError
from tasks import tracking
from tasks.lineage import dvc_md5, git_commit
from tasks.models import export_policy
from tasks.paths import data_dir, run_dir, warmstart_dir
from tasks.training import run_training

TIMING_KEYS = ("step_s", "generate_s", "verify_s", "allocate_s", "update_s", "eval_s")


def summarize(allocator: str, history: list[dict[str, Any]], final_eval: dict[str, float]) -> dict[str, Any]:
    """Reproducible run summary (no timings): final eval, totals, mean effective ratio."""
    steps = [r for r in history if "rollouts" in r]
    last = history[-1] if history else {}
    return {
        "allocator": allocator,
        "steps": len(steps),
        "cum_rollouts": last.get("cum_rollouts", 0),
        "cum_tokens": last.get("cum_tokens", 0),
        "mean_effective_ratio": sum(r["effective_ratio"] for r in steps) / max(len(steps), 1),
        "final_eval": final_eval,
    }


@flow(name="train", log_prints=True)
def train(allocator: str | None = None, steps: int | None = None, seed: int | None = None,
          overrides: dict[str, Any] | None = None, params_file: str | None = None) -> dict[str, Any]:
    """Train ``allocator`` (default train.allocator) for ``steps``; ``overrides`` replace train-section keys."""
    ov = dict(overrides or {})
    ov.update({k: v for k, v in (("allocator", allocator), ("steps", steps), ("seed", seed)) if v is not None})
    params = load(params_file, overrides={"train": ov})  # ConfigError here: nothing has been generated yet
    cfg = params.train
    task, data, base = params.prepare.task, data_dir(params.prepare.task), warmstart_dir()
    for path, how in ((data, "python -m flows.prepare"), (base, "python -m flows.warmstart")):
        if not path.is_dir():
            raise ConfigError(f"{path}: missing; run `{how}` (or `dvc repro`) first")
    out = run_dir(cfg.allocator)
    resumed_from = list_checkpoints(out / "checkpoints")
    previous = json.loads((out / "tracking.json").read_text()) if (out / "tracking.json").is_file() and resumed_from else {}

    data_md5, base_md5 = dvc_md5(data), dvc_md5(base)
    tags = {"allocator": cfg.allocator, "git_commit": git_commit(), "mlflow.source.git.commit": git_commit(),
            "data_md5": data_md5, "base_model_md5": base_md5, "prefect_flow_run_id": flow_run_id(),
            "run_dir": str(out), "previous_run_id": previous.get("run_id", "")}
    run_id = tracking.start_run(f"train-{cfg.allocator}", {"train": asdict(cfg), "prepare.task": task}, tags)
    write_json(out / "tracking.json", {"run_id": run_id, "tracking_uri": tracking.tracking_uri()})
    try:
        tracking.log_dataset(run_id, str(data), "train", data_md5)
        res = run_training(cfg, str(base), str(data), task, str(out), run_id)
        final_ckpt = list_checkpoints(out / "checkpoints")[-1]
        model_dir = export_policy(str(final_ckpt), str(base), str(out / "final_model"))
        tracking.log_artifacts(run_id, model_dir, "final_model")
        summary = summarize(cfg.allocator, res["history"], res["final_eval"])
        timings = {k: sum(r.get(k, 0.0) for r in res["history"]) for k in TIMING_KEYS}
        timings.update(seconds=res["seconds"], mlflow_step_seconds=res["tracking_seconds"],
                       resumed_from=res["resumed_from"])
        write_json(out / "summary.json", summary)
        write_json(out / "train_timings.json", timings)
        tracking.log_metrics(run_id, {f"final/{k}": v for k, v in summary["final_eval"].items()}, step=cfg.steps)
        tracking.end_run(run_id)
    except BaseException:
        tracking.end_run(run_id, "FAILED")
        raise
    print(f"train[{cfg.allocator}]: {summary['steps']} steps, final {summary['final_eval']} -> {out}")
    return {"run_id": run_id, "summary": summary, "timings": timings}


def parse_set(items: list[str]) -> dict[str, Any]:
    """['lr=1e-4', 'k=4'] -> {'lr': 0.0001, 'k': 4} (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set {item!r}: use key=value, e.g. --set lr=1e-4")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocator", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], help="train-section override key=value (repeatable)")
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    a = ap.parse_args()
    train(allocator=a.allocator, steps=a.steps, seed=a.seed, overrides=parse_set(a.set) or None, params_file=a.params)
