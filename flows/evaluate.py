"""Flow `evaluate`: held-out greedy accuracy and pass@k of checkpoints (reads params `evaluate`, `train.allocators`,
`train.seeds`, `train.seed`, `train.device`, `train.dtype`, `train.threads`,
`prepare.task`).

    python -m flows.evaluate                      # newest checkpoint of every (train.allocators, train.seeds) run
                                                  #   -> reports/evaluation.json {allocator: {seed: metrics}}
    python -m flows.evaluate --run sara-s0        # every kept checkpoint of runs/sara-s0
    python -m flows.evaluate --checkpoint runs/sara-s0/checkpoints/step_000040
    python -m flows.evaluate --nightly            # newest checkpoint of every run not yet evaluated, logged to MLflow

The nightly pass covers runs/*/, the deployments' runs/deployments/*/ and experiment/. It keeps its index
and one JSON per evaluation under reports/nightly/, outside every DVC stage's dependencies, so a nightly
pass never makes `dvc status` stale.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import fix_cpu, load, tie_children, write_json
from pipeline import remote, tracking, untrusted
from pipeline.paths import data_dir, experiment_dir, reports_dir, root, run_dir, warmstart_dir
from rlvr_core.checkpoint import checkpoint_digest, checkpoint_meta, list_checkpoints, manifest_step, newest_intact
from rlvr_core.config import Params
from rlvr_core.errors import ConfigError
from tasks.evaluation import evaluate_checkpoint

NIGHTLY = Path("reports") / "nightly"
INDEX = "index.json"


def _eval(params: Params, ckpt: Path) -> dict[str, Any]:
    return evaluate_checkpoint(str(ckpt), checkpoint_digest(ckpt), str(warmstart_dir()),
                               str(data_dir(params.prepare.task)), params.prepare.task, params.evaluate,
                               seed=params.train.seed, device=params.train.device, dtype=params.train.dtype)


def training_runs() -> list[Path]:
    """Every training run folder: runs/<name>/, the deployments' runs/deployments/<flow run name>/ and the DVC
    experiment's experiment/."""
    runs = sorted(p for p in (root() / "runs").glob("*") if p.is_dir() and p.name != "deployments")
    runs += sorted(p for p in (root() / "runs" / "deployments").glob("*") if p.is_dir())
    return runs + ([experiment_dir()] if experiment_dir().is_dir() else [])


def nightly_pass(params: Params) -> dict[str, Any]:
    """Evaluate every run's newest checkpoint not yet evaluated at that step; one MLflow run each."""
    out = root() / NIGHTLY
    index_path = out / INDEX
    index: dict[str, list[int]] = json.loads(index_path.read_text()) if index_path.is_file() else {}
    if remote.remote_name():  # a worker's fresh clone has no index: the tracking server knows what was evaluated
        index = {k: sorted({*index.get(k, []), *v}) for k, v in {**index, **tracking.nightly_evaluated()}.items()}
    done: dict[str, Any] = {}
    for run in training_runs():
        ckpt = newest_intact(run / "checkpoints")
        if ckpt is None:
            continue
        step = manifest_step(ckpt)
        if step in index.get(run.name, []):
            continue
        result = _eval(params, ckpt)
        parent = json.loads((run / "tracking.json").read_text())["run_id"] if (run / "tracking.json").is_file() else ""
        meta = checkpoint_meta(ckpt)
        allocator = meta.get("config", {}).get("allocator", run.name)  # experiment/ holds train.allocator's run
        tags = {"mlflow.parentRunId": parent, "training_run_id": parent, "allocator": allocator, "run": run.name,
                "checkpoint": str(ckpt), "kind": "nightly-eval"}
        run_id = tracking.start_run(f"eval-{run.name}-step{step}", {"evaluate": asdict(params.evaluate)}, tags)
        tracking.log_metrics(run_id, {f"heldout/{k}": v for k, v in result.items() if k != "step"}, step=step)
        tracking.end_run(run_id)
        done[run.name] = {"step": step, "allocator": allocator, "mlflow_run_id": run_id, "checkpoint": str(ckpt),
                          **result}
        write_json(out / f"{run.name}-step{step:06d}.json", done[run.name])
        index.setdefault(run.name, []).append(step)
        write_json(index_path, index)  # after each run: a crash never loses finished evaluations
        print(f"nightly: {run.name} step {step} greedy_acc {result.get('greedy_acc', float('nan')):.3f}")
    return done


@flow(name="evaluate", log_prints=True)
def evaluate(checkpoint: str | None = None, run: str | None = None, nightly: bool = False,
             params_file: str | None = None) -> dict[str, Any]:
    """Evaluate one checkpoint, every checkpoint of one run, the nightly pass, or (default) every final checkpoint."""
    checked, ckpt = None, Path(checkpoint) if checkpoint else None
    if untrusted.deployment_id():  # its parameters come from whoever may submit flow runs (pipeline/untrusted.py)
        # what is read from here on is what was checked: the params file's text, the resolved checkpoint folder
        checked, ckpt = untrusted.check_evaluate_parameters(checkpoint, run, nightly, params_file)
    sync = remote.setup(str(checked.path) if checked else params_file)  # None unless $RLVR_DVC_REMOTE (a worker)
    params = load(params_file, checked=checked)
    fix_cpu(params.train.threads)  # before any computation: results must not depend on the machine
    if sync:  # dvc pull: data, warm start and every training stage's outputs
        sync.pull(sync.training_stages())
    if nightly:
        return nightly_pass(params)
    if ckpt is not None:
        return _eval(params, ckpt)
    if run:
        folder = root() / "runs" / run
        ckpts = list_checkpoints(folder / "checkpoints")
        if not ckpts:
            raise ConfigError(f"run {run!r}: no checkpoints under {folder}; train it first")
        return {c.name: _eval(params, c) for c in ckpts}
    results: dict[str, Any] = {}
    for alloc in params.train.allocators:
        for seed in params.train.seeds:
            ckpt = newest_intact(run_dir(alloc, seed) / "checkpoints")
            if ckpt is None:
                raise ConfigError(f"train.allocators lists {alloc!r} and train.seeds {seed} but {run_dir(alloc, seed)} "
                                  f"has no intact checkpoint; run `python -m flows.train --allocator {alloc} "
                                  f"--seed {seed}`")
            results.setdefault(alloc, {})[str(seed)] = ev = _eval(params, ckpt)
            print(f"evaluate: {alloc} seed {seed} {ckpt.name} greedy_acc {ev['greedy_acc']:.3f}")
    write_json(reports_dir() / "evaluation.json", results)
    return results


if __name__ == "__main__":
    tie_children()  # its temporary Prefect server and every other child end with it, also on SIGKILL
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--checkpoint", default=None)
    g.add_argument("--run", default=None, help="a run folder under runs/ (<allocator>-s<seed>)")
    g.add_argument("--nightly", action="store_true")
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    a = ap.parse_args()
    out = evaluate(checkpoint=a.checkpoint, run=a.run, nightly=a.nightly, params_file=a.params)
    print(json.dumps(out, indent=1, sort_keys=True, default=float))
