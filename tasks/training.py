"""Task: one training run (rlvr_core.training.train), resumable, with per-step progress and tracking."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rlvr_core.config import TrainConfig
from rlvr_core.training import train
from tasks.data import load_split
from tasks.tracking import StepLogger


def progress_line(rec: dict[str, Any]) -> str:
    """One human line per step: step, rollouts, effective groups, reward, loss, eval accuracy."""
    parts = [f"step {rec['step']:>4}"]
    if "rollouts" in rec:
        parts += [f"rollouts {rec['rollouts']:>4} (cum {rec['cum_rollouts']})",
                  f"effective {rec['effective_groups']}/{rec['groups']}",
                  f"reward {rec['reward_mean']:.3f}", f"loss {rec['loss']:+.4f}"]
    if "eval/greedy_acc" in rec:
        parts.append(f"eval acc {rec['eval/greedy_acc']:.3f}")
    return " | ".join(parts)


# retried once: the run resumes from its newest checkpoint, so a retry never repeats finished steps
@task(retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE)
def run_training(cfg: TrainConfig, policy_dir: str, data_dir: str, task_name: str, run_dir: str,
                 mlflow_run_id: str | None) -> dict[str, Any]:
    """Train (resuming from ``run_dir``) and return {history, final_eval, resumed_from, tracking_seconds, step_seconds}."""
    log = get_run_logger()
    tracker = StepLogger(mlflow_run_id) if mlflow_run_id else None

    def on_step(rec: dict[str, Any]) -> None:
        log.info(progress_line(rec))
        if tracker is not None:
            tracker(rec)

    t0 = time.perf_counter()
    result = train(cfg, policy_dir=policy_dir, train_rows=load_split(data_dir, "train"),
                   test_rows=load_split(data_dir, "test"), run_dir=run_dir, task=task_name, on_step=on_step)
    return {"history": result.metrics, "final_eval": result.final_eval, "resumed_from": result.resumed_from,
            "steps": result.steps_done, "seconds": time.perf_counter() - t0,
            "tracking_seconds": tracker.seconds if tracker else 0.0}
