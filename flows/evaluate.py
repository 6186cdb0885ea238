"""Flow `evaluate`: held-out greedy accuracy and pass@k of checkpoints (reads params `evaluate`, `train.allocators`,
`train.seeds`, `train.seed`, `train.device`, `train.dtype`, `train.threads`,
`prepare.task`).

    python -m flows.evaluate                      # newest checkpoint of every (train.allocators, train.seeds) run
                                                  #   -> reports/evaluation.json {allocator: {seed: metrics}}
    python -m flows.evaluate --run sara-s0        # every kept checkpoint of runs/sara-s0
    python -m flows.evaluate --checkpoint runs/sara-s0/checkpoints/step_000040
    python -m flows.evaluate --nightly            # newest checkpoint of every run not yet evaluated, logged to MLflow

The nightly pass covers runs/*/, the deployments' runs/deployments/*/ and experiment/. It keeps its index,
keyed by each run folder's path under the project root (runs/sara-s0, runs/deployments/sara-s0, experiment),
and one JSON per evaluation (reports/nightly/<that path>-step<N>.json) under reports/nightly/, outside every
DVC stage's dependencies, so a nightly pass never makes `dvc status` stale. A folder whose own files cannot
be read (tracking.json, its checkpoint) is skipped with a warning and listed under the index's "skipped";
the others are evaluated and indexed all the same.
"""

from __future__ import annotations

import argparse
import json
import warnings
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
from rlvr_core.safefs import set_aside
from tasks.evaluation import evaluate_checkpoint

NIGHTLY = Path("reports") / "nightly"
INDEX = "index.json"
INDEX_FORMAT = 2  # 1 (no "format" key): {run folder name: [steps]}, which two folders could share
MAX_INDEX_BYTES = 64 << 20
MAX_TRACKING_BYTES = 64 << 10  # {"run_id", "tracking_uri"}: a hundred bytes


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


def run_key(run: Path) -> str:
    """A run folder's key in the nightly index: its path relative to the project root (``runs/sara-s0``,
    ``runs/deployments/sara-s0``, ``experiment``), which no two folders share and every machine agrees on."""
    return run.relative_to(root()).as_posix()


def _empty_index() -> dict[str, Any]:
    return {"format": INDEX_FORMAT, "evaluated": {}, "skipped": {}}


def _read_json(path: Path, limit: int) -> Any:
    """``path``'s JSON, reading at most ``limit`` bytes; ValueError (or OSError) when it is larger or not JSON."""
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"more than {limit:,} bytes")
    return json.loads(raw)  # JSONDecodeError and UnicodeDecodeError are ValueErrors


def _is_index(raw: Any) -> bool:
    return (isinstance(raw, dict) and raw.get("format") == INDEX_FORMAT and isinstance(raw.get("evaluated"), dict)
            and isinstance(raw.get("skipped", {}), dict)
            and all(isinstance(v, list) and all(type(s) is int for s in v) for v in raw["evaluated"].values()))


def read_index(path: Path) -> dict[str, Any]:
    """The nightly index at ``path``: {"format": 2, "evaluated": {run key: [steps]}, "skipped": {run key:
    {"step", "reason"}}}; missing, an empty one. An index of the earlier format, keyed by folder name (which
    runs/sara-s0 and runs/deployments/sara-s0 share, so it cannot say which of the two was evaluated), is stale:
    it is dropped with a warning and each run's newest checkpoint is evaluated once more. One that cannot be
    read is set aside (index.json.damaged) with a warning, and the pass starts from an empty index."""
    if not path.is_file():
        return _empty_index()
    try:
        raw = _read_json(path, MAX_INDEX_BYTES)
    except (OSError, ValueError) as e:
        raw, why = None, f"{e.__class__.__name__}: {str(e)[:200]}"
    else:
        why = "" if _is_index(raw) else f"not a nightly index of format {INDEX_FORMAT}"
    if isinstance(raw, dict) and "format" not in raw and all(isinstance(v, list) for v in raw.values()):
        if raw:
            warnings.warn(f"nightly: {path} is keyed by run folder name, which two folders can share (runs/<name>/, "
                          "runs/deployments/<name>/): its entries are stale, and each run's newest checkpoint is "
                          "evaluated once more", RuntimeWarning, stacklevel=2)
        return _empty_index()
    if why:
        aside = set_aside(path)
        warnings.warn(f"nightly: {path} cannot be read ({why}); set aside as {aside.name}, the pass starts from an "
                      "empty index", RuntimeWarning, stacklevel=2)
        return _empty_index()
    return {"format": INDEX_FORMAT, "evaluated": raw["evaluated"], "skipped": raw.get("skipped", {})}


def training_run_id(run: Path) -> str:
    """The MLflow run id of ``run``'s tracking.json ('' when it has none); ConfigError naming the file when it
    is not a tracking record ({"run_id": ...}). Never quotes the file."""
    path = run / "tracking.json"
    if not path.is_file():
        return ""
    try:
        record = _read_json(path, MAX_TRACKING_BYTES)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a tracking record ({e.__class__.__name__}: {str(e)[:200]})") from None
    run_id = record.get("run_id") if isinstance(record, dict) else 0
    if run_id is not None and not isinstance(run_id, str):
        raise ConfigError(f"{path}: not a tracking record (need an object with a string run_id)")
    return run_id or ""


def nightly_pass(params: Params) -> dict[str, Any]:
    """Evaluate every run's newest checkpoint not yet evaluated at that step; one MLflow run each.

    The index (reports/nightly/index.json, ``read_index``) is keyed by ``run_key``, and written after every
    folder. A folder whose own files stop its evaluation (an unreadable tracking.json, checked before the
    evaluation; a checkpoint or data that will not load: ConfigError and its kin) is skipped with a warning
    naming it and why, recorded under the index's ``skipped``, and tried again by the next pass; the other
    folders are evaluated all the same. Returns {"evaluated": {run key: result}, "skipped": {run key: ...}}.
    """
    out = root() / NIGHTLY
    index_path = out / INDEX
    index = read_index(index_path)
    evaluated: dict[str, list[int]] = index["evaluated"]
    if remote.remote_name():  # a worker's fresh clone has no index: the tracking server knows what was evaluated
        for k, v in tracking.nightly_evaluated().items():
            evaluated[k] = sorted({*evaluated.get(k, []), *v})
    done: dict[str, Any] = {}
    skipped: dict[str, Any] = {}
    runs = training_runs()
    for run in runs:
        key, step = run_key(run), None
        try:
            ckpt = newest_intact(run / "checkpoints")
            if ckpt is None:
                continue
            step = manifest_step(ckpt)
            if step in evaluated.get(key, []):
                continue
            parent = training_run_id(run)  # before the evaluation: a bad record costs no work
            meta = checkpoint_meta(ckpt)
            result = _eval(params, ckpt)
        except ConfigError as e:  # this folder's own files (DataError, CheckpointError): the others go on
            reason = str(e) if len(str(e)) <= 500 else str(e)[:497] + "..."
            warnings.warn(f"nightly: {run} skipped: {reason}", RuntimeWarning, stacklevel=2)
            skipped[key] = index["skipped"][key] = {"step": step, "reason": reason}
            write_json(index_path, index)
            continue
        allocator = meta.get("config", {}).get("allocator", run.name)  # experiment/ holds train.allocator's run
        tags = {"mlflow.parentRunId": parent, "training_run_id": parent, "allocator": allocator, "run": run.name,
                "run_path": key, "checkpoint": str(ckpt), "kind": "nightly-eval"}
        run_id = tracking.start_run(f"eval-{key}-step{step}", {"evaluate": asdict(params.evaluate)}, tags)
        tracking.log_metrics(run_id, {f"heldout/{k}": v for k, v in result.items() if k != "step"}, step=step)
        tracking.end_run(run_id)
        done[key] = {"step": step, "allocator": allocator, "mlflow_run_id": run_id, "checkpoint": str(ckpt),
                     **result}
        write_json(out / f"{key}-step{step:06d}.json", done[key])
        evaluated.setdefault(key, []).append(step)
        index["skipped"].pop(key, None)
        write_json(index_path, index)  # after each run: a crash never loses finished evaluations
        print(f"nightly: {key} step {step} greedy_acc {result.get('greedy_acc', float('nan')):.3f}")
    keys = {run_key(r) for r in runs}
    index["skipped"] = {k: v for k, v in index["skipped"].items() if k in keys}  # a folder since removed
    write_json(index_path, index)  # also when nothing was new: an index of the earlier format is replaced
    if skipped:
        print(f"nightly: {len(skipped)} run folder(s) skipped: {', '.join(skipped)} (see reports/nightly/index.json)")
    return {"evaluated": done, "skipped": skipped}


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
