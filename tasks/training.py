"""Task: one training run (rlvr_core.training.train), resumable, with per-step progress and tracking.

The Prefect task around the training loop (rlvr_core/training.py); benchmarks/training.py is the superseded training
benchmark."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipeline.retry import retry_if_transient
from pipeline.tracking import SPOOL, StepLogger
from rlvr_core.config import TrainConfig
from rlvr_core.training import CheckedInputs, check_and_train, train
from rlvr_core.types import StepRecord, step_updated
from tasks.data import load_split

# What a retry cannot fix (bad settings or data, a bad policy folder, a run stopped on purpose, out of memory, a
# full disk) is not retried: pipeline.retry decides; the hint names what lowers this task's memory.
OOM_HINT = ("train.micro_batch, train.max_new_tokens, train.engine_options.micro_batch, train.eval_size or "
            "train.eval_samples (the error names the part that did not fit)")
should_retry = retry_if_transient(OOM_HINT)


def progress_line(rec: StepRecord) -> str:
    """One human line per step: step, rollouts, effective groups, reward, loss, eval accuracy, faults."""
    parts = [f"step {rec['step']:>4}"]
    if "rollouts" in rec:
        parts += [f"rollouts {rec['rollouts']:>4} (cum {rec['cum_rollouts']})",
                  f"effective {rec['effective_groups']}/{rec['groups']}",
                  f"reward {rec['reward_mean']:.3f}", f"loss {rec['loss']:+.4f}"]
    if "eval/greedy_acc" in rec:
        parts.append(f"eval acc {rec['eval/greedy_acc']:.3f}")
    parts += fault_notes(rec)
    return " | ".join(parts)


def fault_notes(rec: StepRecord) -> list[str]:
    """What went wrong in a step, in words (empty for a normal step)."""
    notes = []
    if rec.get("nonfinite"):
        notes.append("NON-FINITE loss/gradient: update skipped")
    elif rec.get("update_skipped"):
        notes.append("no effective group: update skipped")
    if rec.get("engine_retries"):
        notes.append(f"{rec['engine_retries']} engine retries")
    return notes


# retried: the run resumes from its newest checkpoint, so a retry never repeats finished steps
@task(retries=2, retry_delay_seconds=5, retry_condition_fn=should_retry, cache_policy=NO_CACHE)
def run_training(cfg: TrainConfig, policy_dir: str, data_dir: str, task_name: str, run_dir: str,
                 mlflow_run_id: str | None, track: bool | None = None,
                 checked: CheckedInputs | None = None) -> dict[str, Any]:
    """Train (resuming from ``run_dir``) and return {history, final_eval, resumed_from, tracking_seconds,
    step_seconds, ...}.

    Step metrics go to MLflow run ``mlflow_run_id``, through the spool <run_dir>/mlflow_spool.jsonl when
    MLflow is unreachable (``track=True`` with no run id: everything is spooled for a run created later).
    ``checked``: what ``rlvr_core.preflight.preflight`` returned for these inputs (the flow checks them before
    MLflow opens a run); ``train`` then trains on them and checks nothing again (``cfg``, ``policy_dir``,
    ``data_dir``, ``task_name`` and ``run_dir`` are those ``checked`` holds). None: the splits are read from
    ``data_dir`` and ``check_and_train`` checks them (a ConfigError, e.g. CUDA asked for but absent, is not
    retried).
    """
    log = get_run_logger()
    track = bool(mlflow_run_id) if track is None else track
    tracker = StepLogger(mlflow_run_id, Path(run_dir) / SPOOL) if track else None
    counts: dict[str, int] = {}  # cumulative verifier failures at the previous step record

    def on_step(rec: StepRecord) -> None:
        log.info(progress_line(rec))
        if "rollouts" in rec and not step_updated(rec):
            log.warning(f"step {rec['step']}: {fault_notes(rec)[0]}")
        if "verifier_errors" in rec:
            now = {k: int(rec.get(k, 0)) for k in ("verifier_errors", "verifier_timeouts")}
            new = {k: v - counts[k] for k, v in now.items() if counts and v > counts[k]}
            if new:
                log.warning(f"step {rec['step']}: verifier failures scored 0.0: {new}")
            counts.update(now)
        if tracker is not None:
            tracker(rec)

    t0 = time.perf_counter()
    if checked is not None:
        result = train(checked, on_step=on_step)
    else:
        result = check_and_train(cfg, policy_dir=policy_dir, train_rows=load_split(data_dir, "train"),
                                 test_rows=load_split(data_dir, "test"), run_dir=run_dir, task=task_name,
                                 on_step=on_step)
    left = tracker.flush() if tracker is not None else 0
    if left:
        log.warning(f"{left} step record(s) stay spooled in {Path(run_dir) / SPOOL}; MLflow is unreachable")
    return {"history": result.metrics, "final_eval": result.final_eval, "resumed_from": result.resumed_from,
            "steps": result.steps_done, "seconds": time.perf_counter() - t0,
            "tracking_seconds": tracker.seconds if tracker else 0.0, "spooled": left}
