"""Flow `train`: one GRPO run with an allocator, resumable, tracked in MLflow (reads params `train`, `prepare.task`).

    python -m flows.train --allocator sara [--steps 50] [--seed 1] [--set lr=1e-4 --set k=4]

Writes runs/<allocator>-s<seed>/ (pipeline/paths.run_dir; a deployment's run: runs/deployments/<flow run
name>/), or the folder given by --out: checkpoints/, metrics.jsonl, final_model/, summary.json as DVC
metrics, curve.csv as a DVC plot; and, outside DVC's hashes (.dvcignore), timings.jsonl (each step's
seconds), train_timings.json (their totals) and tracking.json with the MLflow run id. The `experiment`
stage of dvc.yaml trains train.allocator into experiment/, so that `dvc exp run -S train.allocator=vigor`
is an experiment whose metrics are that allocator's run.


Params, data, the base model and a checkpoint to resume are checked before anything is tracked or
generated. Started again after a crash, the flow resumes the checkpoints and continues the same MLflow
run (one metric entry per step); an unreachable MLflow spools metrics to <run folder>/mlflow_spool.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import warnings
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from prefect import flow

from flows.common import fix_cpu, flow_run_id, load, parse_set, refuse_launch_options, tie_children, write_json
from pipeline import remote, tracking, untrusted
from pipeline.curves import write_curve
from pipeline.lineage import dvc_md5, git_commit
from pipeline.paths import data_dir, root, run_dir, warmstart_dir
from rlvr_core.checkpoint import list_checkpoints, verify
from rlvr_core.config import TrainConfig
from rlvr_core.errors import ConfigError, short_repr
from rlvr_core.models.integrity import require_policy_record
from rlvr_core.runlock import hold_run_folder
from rlvr_core.training import TIMING_KEYS, CheckedInputs, TrainingStopped, preflight
from rlvr_core.types import step_updated
from tasks.data import load_split
from tasks.models import export_policy
from tasks.training import run_training

DVC_OUTS = ("checkpoints", "final_model", "metrics.jsonl")  # the run folder's outputs in dvc.yaml (persist: true)


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
        "updates": sum(1 for r in steps if step_updated(r)),
        "final_eval": final_eval,
    }


def check_trained(history: list[dict[str, Any]], out: Path, allow_no_update: bool = False) -> None:
    """TrainingStopped when steps ran but none of them updated the policy (every update skipped or
    non-finite): such a run must end FAILED, without a summary that looks like a result. With
    ``train.allow_no_update`` it ends, and its summary says ``updates: 0``."""
    steps = [r for r in history if "rollouts" in r]
    if steps and not allow_no_update and not any(step_updated(r) for r in steps):
        errors = steps[-1].get("verifier_errors", 0) + steps[-1].get("verifier_timeouts", 0)
        raise TrainingStopped(f"{out}: {len(steps)} step(s) ran and none updated the policy (every step had no "
                              f"effective group or a non-finite loss; {errors} verifier errors/timeouts); "
                              "the run is marked failed and writes no summary: check the verifier, the data "
                              "and train.lr (train.allow_no_update: true lets such a run end)")


def check_inputs(cfg: TrainConfig, task: str, data: Path, base: Path, out: Path) -> CheckedInputs:
    """Refuse, before any tracking or rollout: missing data or base model folders, a base model without its
    sha256.json (the warmstart flow writes one), then every check of ``rlvr_core.preflight.preflight`` (data,
    base model and its files' sha256, device, allocator parameters, checkpoints in ``out``, the base model the
    run started from). Returns the checked inputs, which the training task trains on without checking them
    again."""
    for path, how in ((data, "python -m flows.prepare"), (base, "python -m flows.warmstart")):
        if not path.is_dir():
            raise ConfigError(f"{path}: missing; run `{how}` (or `dvc repro`) first")
    require_policy_record(base)  # PolicyFilesMismatch: a warm start whose files cannot be checked
    return preflight(cfg, task, load_split(str(data), "train"), load_split(str(data), "test"), str(base), str(out),
                     source=str(data))


def _quiet(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a tracking call; if MLflow fails, warn and go on (training never depends on tracking)."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"MLflow {what} failed ({e.__class__.__name__}: {str(e)[:300]}); continuing without it",
                      RuntimeWarning, stacklevel=2)
        return None


def open_run(cfg: TrainConfig, task: str, out: Path, tags: dict[str, str]) -> str | None:
    """The MLflow run of this training: the previous one when resuming ``out``, else a new one (also when the
    previous one was started from another base model: ``base_model_sha256``; its lineage tags are never
    overwritten, ``tracking.resume_run``).

    None when MLflow is unreachable (metrics are spooled and given to a run created at the end).
    """
    previous = json.loads((out / "tracking.json").read_text()) if (out / "tracking.json").is_file() else {}
    resuming = bool(list_checkpoints(out / "checkpoints")) or (out / "metrics.jsonl").is_file()
    if resuming and previous.get("run_id") and previous.get("tracking_uri") == tracking.tracking_uri():
        # a run folder restarted without a checkpoint on another warm start: its own MLflow run, not the old one
        if _quiet("resume_run", tracking.resume_run, previous["run_id"], tags, must_match=("base_model_sha256",)):
            return previous["run_id"]
    params = {"train": asdict(cfg), "prepare.task": task}
    return _quiet("start_run", tracking.start_run, f"train-{cfg.allocator}", params,
                  {**tags, "previous_run_id": previous.get("run_id") or ""})


@flow(name="train", log_prints=True)
def train(allocator: str | None = None, steps: int | None = None, seed: int | None = None,
          overrides: dict[str, Any] | None = None, params_file: str | None = None,
          out_dir: str | None = None) -> dict[str, Any]:
    """Train ``allocator`` (default train.allocator) for ``steps``; ``overrides`` replace train-section keys.

    ``out_dir`` (relative to the project root) replaces the run folder: by default runs/<allocator>-s<seed>
    (a DVC stage's output), or runs/deployments/<flow run name>/ for a run of a deployment (``deployment_dir``)
    unless $RLVR_DVC_REMOTE makes it a worker that runs and commits the stage itself (pipeline/remote.py).
    A deployment's parameters are untrusted (pipeline/untrusted.py): its ``out_dir`` must lie under
    runs/deployments/, its ``params_file`` inside the project, and its overrides name no program, URL or token.
    """
    # a deployment's parameters come from whoever may submit flow runs: checked before anything reads them
    deployed = untrusted.deployment_id()
    checked, deployed_out = (untrusted.check_train_parameters(overrides, params_file, out_dir) if deployed
                             else (None, None))
    ov = dict(overrides or {})
    options = {k: v for k, v in (("allocator", allocator), ("steps", steps), ("seed", seed)) if v is not None}
    if both := [k for k in options if k in ov]:  # the option would win over --set silently
        raise ConfigError(f"train.{both[0]} is given twice, by --{both[0]} {short_repr(options[both[0]])} and --set "
                          f"{both[0]}={short_repr(ov[both[0]])}; give it once")
    ov.update(options)
    # None unless $RLVR_DVC_REMOTE (a worker): remote, tracking server, params file (the checked one, by its path)
    sync = remote.setup(str(checked.path) if checked else params_file)
    # ConfigError here: nothing has been generated yet; a deployment's params file is the text its checks read
    params = load(params_file, overrides={"train": ov}, checked=checked)
    cfg = params.train
    fix_cpu(cfg.threads)  # before any computation: results must not depend on the machine
    refuse_launch_options(cfg.engine_options, worker=sync is not None)  # a params file must not pick the program
    task, data, base = params.prepare.task, data_dir(params.prepare.task), warmstart_dir()
    # a worker with a DVC remote runs the stage itself and commits it (dvc.lock): its folder stays the stage's
    out = (deployed_out or (root() / out_dir if out_dir else None) or (None if sync else deployment_dir())
           or run_dir(cfg.allocator, cfg.seed))
    stage = remote.prepare_training(sync, out, params) if sync else None  # dvc pull: data, warm start, checkpoints
    with ExitStack() as held:
        if os.environ.get("DVC_STAGE"):  # in `dvc repro`: its outputs are cleared under the lock (clear_dvc_outputs)
            held.enter_context(hold_run_folder(out))
            clear_dvc_outputs(out)
        checked = check_inputs(cfg, task, data, base, out)  # ConfigError / DataError / ...: nothing generated yet
        with hold_run_folder(out):  # one writer per run folder: RunFolderBusy before anything is written or tracked
            result = _train_in(checked, data)
    summary = result["summary"]
    if stage:  # dvc commit + push of the stage, dvc.lock to git
        sync.publish(stage, [out / "summary.json", out / "tracking.json"])
    print(f"train[{cfg.allocator}]: {summary['steps']} steps, final {summary['final_eval']} -> {out}")
    return result


def clear_dvc_outputs(out: Path) -> None:
    """A `dvc repro` stage starts from nothing: DVC deletes a stage's outputs before its command runs, but the
    training stages' outputs are `persist: true` so that DVC never deletes what a live writer holds; the flow
    deletes them here instead, once it holds the run folder's lock."""
    for name in DVC_OUTS:
        p = out / name
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)


def deployment_dir() -> Path | None:
    """runs/deployments/<flow run name>/ when this flow run belongs to a deployment (flows/serve.py,
    flows/deploy.py), else None. A served or deployed run thus never writes into a DVC stage's output
    (runs/<allocator>-s<seed>/), and .dvcignore keeps runs/deployments/ out of the stages' dependencies;
    a retry of the same flow run resumes its own folder."""
    from prefect.runtime import deployment, flow_run

    if not deployment.id:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(flow_run.name or flow_run.id)).strip(".-") or str(flow_run.id)
    return root() / "runs" / "deployments" / name


def _train_in(checked: CheckedInputs, data: Path) -> dict[str, Any]:
    """The body of the train flow, run while this process holds the run folder ``checked.run_dir``."""
    cfg, task, base, out = checked.cfg, checked.task, checked.policy_dir, checked.run_dir
    for stale in ("summary.json", "train_timings.json", "curve.csv"):  # a crashed rerun must not look complete
        (out / stale).unlink(missing_ok=True)
    shutil.rmtree(out / "final_model", ignore_errors=True)

    data_md5, base_md5 = dvc_md5(data), dvc_md5(base)
    tags = {"allocator": cfg.allocator, "git_commit": git_commit(), "mlflow.source.git.commit": git_commit(),
            "data_md5": data_md5, "base_model_md5": base_md5, "base_model_sha256": checked.policy_digest,
            "prefect_flow_run_id": flow_run_id(),
            "run_dir": str(out)}
    run_id = open_run(cfg, task, out, tags)
    write_json(out / "tracking.json", {"run_id": run_id, "tracking_uri": tracking.tracking_uri()})
    spool = out / tracking.SPOOL
    if run_id:
        tracking.adopt_spool(spool, run_id)  # records spooled while an earlier attempt had no run
    try:
        if run_id:
            _quiet("log_dataset", tracking.log_dataset, run_id, str(data), "train", data_md5)
        res = run_training(cfg, str(base), str(data), task, str(out), run_id, track=True,
                           checked=checked)  # check_inputs checked them: trained on as they are
        check_trained(res["history"], out, cfg.allow_no_update)  # no update: FAILED, no summary
        final_ckpt = next(f for f in reversed(list_checkpoints(out / "checkpoints")) if verify(f) is None)
        model_dir = export_policy(str(final_ckpt), str(base), str(out / "final_model"))
        summary = summarize(cfg.allocator, res["history"], res["final_eval"])
        timings = {k: sum(r.get(k, 0.0) for r in res["history"]) for k in TIMING_KEYS}
        timings.update(seconds=res["seconds"], mlflow_step_seconds=res["tracking_seconds"],
                       resumed_from=res["resumed_from"], threads=torch.get_num_threads())
        if run_id is None and (run_id := open_run(cfg, task, out, tags)):  # MLflow back: the spool gets its run
            tracking.adopt_spool(spool, run_id)
            write_json(out / "tracking.json", {"run_id": run_id, "tracking_uri": tracking.tracking_uri()})
        if run_id:
            _quiet("log_artifacts", tracking.log_artifacts, run_id, model_dir, "final_model")
            _quiet("log_metrics", tracking.log_metrics, run_id,
                   {f"final/{k}": v for k, v in summary["final_eval"].items()}, step=cfg.steps, spool=spool)
            if tracking.StepLogger(run_id, spool).flush():
                warnings.warn(f"MLflow metrics stay spooled in {spool}; the next run of this flow replays them",
                              RuntimeWarning, stacklevel=1)
        write_json(out / "summary.json", summary)
        write_curve(res["history"], out / "curve.csv")
        write_json(out / "train_timings.json", timings)
        if run_id:
            _quiet("end_run", tracking.end_run, run_id)
    except BaseException:
        if run_id:
            _quiet("end_run", tracking.end_run, run_id, "FAILED")
        raise
    return {"run_id": run_id, "summary": summary, "timings": timings}


if __name__ == "__main__":
    tie_children()  # its temporary Prefect server and every other child end with it, also on SIGKILL
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--allocator", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], help="train-section override key=value (repeatable)")
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    ap.add_argument("--out", default=None,
                    help="run folder, relative to the project root (default runs/<allocator>-s<seed>)")
    a = ap.parse_args()
    train(allocator=a.allocator, steps=a.steps, seed=a.seed, overrides=parse_set(a.set, a.params) or None,
          params_file=a.params, out_dir=a.out)
