"""The fair training study: regimes x protocols x allocators x seeds, with intervals and a cost ledger.

    python -m benchmarks.study --regime hard --protocol equal-batch [--seeds 5] [--quick] [--out DIR]
    python -m benchmarks.study --summarize-only            # rebuild every output from the run files
    python -m benchmarks.study --round-price --regime hard # the price of synchronous rounds (HF engine)

Protocols (each named in every output):

- ``reference``: uniform GRPO, the regime's params; sets the target (below). Run first by every protocol.
- ``equal-batch``: every update holds B effective groups (dapo, greso, sara, sara[carry], sara+dps).
- ``equal-rollouts``: every update spends B x k rollouts (grpo, vigor, pods at B*k/n_generate prompts of
  n_generate rollouts, sara[budget]). Its grpo runs are the reference runs (the same configuration).
- ``tuned``: every allocator at its best point of one grid, batch size x lr (GRID); the point is chosen on the
  validation split (rows the test split does not hold) by the median rollouts-to-target of GRID_SEEDS seeds,
  then reported on the test split with the study's seeds.

Configurations are params.yaml plus the regime's overrides (benchmarks/regimes.py) plus the protocol's
settings, read through ``rlvr_core.config.load_params``. Allocator parameters are params.yaml's
``train.allocator_params`` plus the variant's (benchmarks/common.py VARIANTS, the allocation benchmark's table too).

Target: after the reference runs of a regime, target = median start accuracy + 0.8 x the median gain at the
end of the budget (the mean of each run's last three evaluations), written to
``<out>/study/<regime>/target.json`` before any other allocator of that regime runs, and never recomputed.

Statistics: per run, rollouts (and seconds, tokens, updates) until the held-out greedy accuracy first reaches
the target, interpolated between evaluations. A run that never reaches it counts as infinitely late: the
median and the bootstrap bounds (95%, percentile, 5,000 resamples of the seeds) are reported as null where
they fall on such a run, and every cell says how many of its runs reached the target. Seconds are training
wall-clock (generate + verify + allocate + update), evaluations excluded.

Resumable: one result file per (regime, protocol, variant, seed[, grid point]) under
``<out>/study/<regime>/<protocol>/``, skipped when present; a run killed midway resumes from its own
checkpoints in ``--work``. Every aggregate is rebuilt from whatever run files exist.

Outputs under ``--out`` (the results root, default benchmarks/results), in its ``study/`` beside the run folders:
``training_<regime>_<protocol>.{csv,md,png}``, ``training_protocols.json``, ``training_study.md``, and with
``--round-price`` ``training_round_price.{json,md}``. Every summary also rewrites the root's ``floor/``,
``study_targets/`` and ``warmstarts/`` (benchmarks/floor.py, study_targets.py, warmstarts.py).
``--quick`` trains a short warm start, two seeds and a small budget into a temporary folder (or ``--out``),
never into benchmarks/results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from benchmarks import regimes as R
from benchmarks.common import (
    LENGTH_AWARE,
    MATCHED,
    PROTOCOLS,
    RESULTS,
    VARIANTS,
    output_dir,
    save_figure,
    slug,
    study_cell_dir,
)
from benchmarks.common import default_out as _default_out
from rlvr_core.stats import (
    TARGET_FRACTION,
    accuracy_at,
    accuracy_se,
    area_under_curve,
    fitted_reach,
    gain_target,
    median_ci,
    median_interval,
    rank_test,
)
from rlvr_core.stats import reach as _reach

# variant label -> Variant (benchmarks/common.py): allocator, parameters on top of params.yaml's
# train.allocator_params[allocator], train settings on top of the regime's; the same table as the allocation
# benchmark's
# added after the step-grid regimes' warm starts were lost (check_policy refuses new runs there): these run on the
# pool and warm-start regimes only
STEP_GRID_EXCLUDE = frozenset({"pilot-commit", "reinforce-ada", "reinforce-ada[pos]", "ar3po", "ar3po[no-reuse]"})
# cells that hold the runs of another protocol too: (protocol, [(protocol of the runs, allocators or None: all)])
SHARED: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "equal-rollouts": (("reference", ("grpo",)),),
    "matched-updates": (("equal-batch", MATCHED),),
    "matched-updates-small": (("reference", ("grpo",)),),
}
EVAL_GRID = 1536  # rollouts between evaluations of every regime but the step-grid ones (6 GRPO steps at B=32, k=8)
GRID: tuple[tuple[int, float], ...] = tuple((b, lr) for b in (16, 32, 64) for lr in (1e-4, 2e-4))
GRID_SEEDS = (100, 101)  # tuned: seeds of the selection runs on the validation split (not the reported seeds)
# per regime: rollouts per run, steps between evaluations (the study's sizing: one (regime, protocol) of
# 5 seeds in about two hours on one core)
BUDGET: dict[str, dict[str, int]] = {"easy": {"rollouts": 30000, "eval_every": 6},
                                     "hard": {"rollouts": 40000, "eval_every": 6},
                                     "pool": {"rollouts": 40000}, "pool-k16": {"rollouts": 40000},
                                     "steps": {"rollouts": 24576}}  # 96 GRPO steps: about 5 minutes a run
QUICK = {"rollouts": 512, "eval_every": 1, "eval_size": 100, "seeds": 2, "variants": 1}


# ----- statistics (rlvr_core.stats: the pipeline's report uses the same functions) -----------------------
def reach(curve: Sequence[Mapping[str, float]], target: float, *, fit: bool = False) -> dict[str, float]:
    """x at which a run reaches ``target`` for each x axis (NaN if never), interpolated: the raw first crossing, or
    with ``fit`` the first crossing of the run's isotonic fit (the study's primary statistic)."""
    return _reach(curve, target, fit=fit)


# ----- configurations ------------------------------------------------------------------------------------
def sizing(regime: str, quick: bool) -> dict[str, int]:
    """Budget and evaluation schedule of a regime: the step-grid regimes (whose runs predate the rollout grid)
    evaluate every ``eval_every`` steps, every other regime (warm-start variants included) each EVAL_GRID
    rollouts."""
    base = R.base_regime(regime)[0]
    b = {"eval_every_rollouts": 0, **BUDGET.get(base, BUDGET["easy"])}
    if regime not in R.STEP_GRID_REGIMES:
        b.update(eval_every=0, eval_every_rollouts=EVAL_GRID)
    b["eval_size"] = R.TEST_ROWS
    if quick:
        b.update({k: QUICK[k] for k in ("rollouts", "eval_every", "eval_size")}, eval_every_rollouts=0)
    return b


def run_params(regime: str, label: str, seed: int, *, quick: bool = False, grid: tuple[int, float] | None = None,
               protocol: str = "reference", params_file: Path = R.PARAMS_FILE, batch: int | None = None) -> Any:
    """The Params of one run: params.yaml + regime + the protocol's train settings (``batch``: the prompt batch
    of a matched-updates run, from matched_sizes)."""
    size = sizing(regime, quick)
    base = R.regime_params(regime, params_file=params_file)
    variant = VARIANTS[label]
    alloc, vparams = variant.allocator, variant.params
    aparams = {**base.train.allocator_params.get(alloc, {}), **vparams}
    if alloc == "vigor" and protocol == "equal-rollouts" and regime not in R.STEP_GRID_REGIMES:
        aparams["fill"] = True  # B x k rollouts per update, as grpo's (the step-grid regimes' runs predate it)
    train: dict[str, Any] = {**variant.train, "allocator": alloc, "seed": seed, "steps": 100000,
                             "max_rollouts": size["rollouts"], "eval_every": size["eval_every"],
                             "eval_every_rollouts": size["eval_every_rollouts"], "eval_size": size["eval_size"],
                             "eval_samples": 0, "checkpoint_every": 5, "keep_last": 1}
    if grid is not None:
        train["batch_size"], train["lr"] = int(grid[0]), float(grid[1])
    if batch is not None:
        train["batch_size"] = int(batch)
    batch = train.get("batch_size", base.train.batch_size)
    if alloc == "pods" and protocol in ("equal-rollouts", "tuned"):
        # equal rollouts per update: PODS generates n_generate per prompt, so B*k/n_generate prompts
        n_gen = int(aparams.get("n_generate") or 2 * base.train.k)
        train["batch_size"] = batch = max(1, batch * base.train.k // n_gen)
    train["allocator_params"] = {**base.train.allocator_params, alloc: aparams} if aparams else \
        dict(base.train.allocator_params)
    return R.regime_params(regime, {"train": train}, params_file=params_file)


def grid_tag(grid: tuple[int, float] | None) -> str:
    return "" if grid is None else f"-b{grid[0]}-lr{grid[1]:g}"


# ----- one run -------------------------------------------------------------------------------------------
def run_file(out: Path, regime: str, protocol: str, label: str, seed: int, grid: tuple[int, float] | None = None,
             split: str = "test") -> Path:
    proto_dir = "reference" if (protocol == "equal-rollouts" and label == "grpo") else protocol
    cell = study_cell_dir(out, regime, proto_dir, label)
    return cell.with_name(f"{cell.name}{grid_tag(grid)}{'-val' if split == 'validation' else ''}") / f"s{seed}.json"


def run_one(regime: str, protocol: str, label: str, seed: int, *, out: Path, work: Path, quick: bool,
            grid: tuple[int, float] | None = None, split: str = "test", data: dict[str, Any] | None = None,
            params_file: Path = R.PARAMS_FILE) -> tuple[dict[str, Any], bool]:
    """Train one run unless its result file exists; returns (result, trained)."""
    path = run_file(out, regime, protocol, label, seed, grid, split)
    if path.exists():
        return json.loads(path.read_text()), False
    if not _claim(path):
        return {}, False  # another study process is training this run
    try:
        return _train_one(path, regime, protocol, label, seed, out=out, work=work, quick=quick, grid=grid, split=split,
                          data=data, params_file=params_file), True
    finally:
        path.with_suffix(".lock").unlink(missing_ok=True)


def _claim(path: Path) -> bool:
    """Claim a run for this process (a lock file holding its pid); a lock whose process is gone is taken over."""
    lock = path.with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
                os.kill(pid, 0)
                return False  # held by a live process
            except (ValueError, ProcessLookupError, FileNotFoundError):
                lock.unlink(missing_ok=True)  # stale: its process was killed
                continue
            except PermissionError:
                return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _train_one(path: Path, regime: str, protocol: str, label: str, seed: int, *, out: Path, work: Path, quick: bool,
               grid: tuple[int, float] | None, split: str, data: dict[str, Any] | None,
               params_file: Path) -> dict[str, Any]:
    from rlvr_core.training import train

    batch = matched_sizes(out, regime, protocol) if protocol.startswith("matched-updates") else None
    params = run_params(regime, label, seed, quick=quick, grid=grid, protocol=protocol, params_file=params_file,
                        batch=batch)
    d = data if data is not None else load_data(regime, work, quick, params_file)
    rows = d["test"] if split == "test" else d["validation"]
    cfg = params.train
    if quick:
        cfg = type(cfg)(**{**asdict(cfg), "eval_size": min(cfg.eval_size, len(rows))})
    run_dir = work / "runs" / path.relative_to(out / "study").with_suffix("")
    t0, started = time.perf_counter(), _now()
    res = train(cfg, policy_dir=d["policy"], train_rows=d["train"], test_rows=rows, run_dir=run_dir, resume=True,
                task=params.prepare.task)
    wall = time.perf_counter() - t0
    result = summarize_run(res.metrics, params=d["n_params"])
    result["ledger"].update(recurrence(run_dir / "rollouts.parquet"))
    tp = target_path(out, regime)
    result.update({"regime": regime, "protocol": protocol, "variant": label, "allocator": cfg.allocator,
                   "seed": seed, "grid": list(grid) if grid else None, "split": split, "eval_size": cfg.eval_size,
                   "batch_size": cfg.batch_size, "lr": cfg.lr, "k": cfg.k, "group_weight": cfg.group_weight,
                   "eval_every": cfg.eval_every, "eval_every_rollouts": cfg.eval_every_rollouts,
                   "allocator_params": cfg.allocator_params.get(cfg.allocator, {}), "wall_s": wall,
                   "resumed_from": res.resumed_from, "quick": quick, "started_at": started, "ended_at": _now(),
                   "commit": _commit(), "policy_sha256": d["policy_sha256"],
                   "warm_start": params.warmstart.seed, "train_prompts": len(d["train"]),
                   "target_sha256": hashlib.sha256(tp.read_bytes()).hexdigest() if tp.exists() else None})
    if protocol == "reference" and (run_dir / "rollouts.parquet").exists():  # the GRPO trace, for replay
        shutil.copyfile(run_dir / "rollouts.parquet", path.with_suffix(".rollouts.parquet"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=_json_default) + "\n")
    os.replace(tmp, path)
    return result


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _commit() -> str | None:
    """The code's git commit, with ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=R.ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=R.ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) if head else None


def recurrence(log: Path) -> dict[str, Any]:
    """How often prompts recur in a run, from its rollout log: prompts rolled out, those rolled out in more than
    one step, and the most steps any one prompt was rolled out in."""
    if not log.exists():
        return {}
    import pandas as pd

    steps = pd.read_parquet(log, columns=["step", "prompt_id"]).groupby("prompt_id")["step"].nunique()
    return {"prompts_rolled_out": int(len(steps)), "prompts_in_several_steps": int((steps > 1).sum()),
            "max_steps_per_prompt": int(steps.max()) if len(steps) else 0}


def policy_sha256(policy: Path) -> str:
    """One digest of a policy folder: every file's name and bytes, in name order."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(policy).rglob("*") if p.is_file()):
        h.update(f.relative_to(policy).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _json_default(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    return str(v)


def summarize_run(metrics: Sequence[Mapping[str, Any]], *, params: int) -> dict[str, Any]:
    """A run's evaluation curve (with its cost axes) and its ledger, from the trainer's per-step metrics."""
    cum = {"seconds": 0.0, "trained": 0.0, "updates": 0}
    led = {k: 0.0 for k in ("generate_s", "verify_s", "allocate_s", "update_s", "eval_s")}
    curve = []
    for r in metrics:
        if r["step"] > 0:
            cum["seconds"] += r["generate_s"] + r["verify_s"] + r["allocate_s"] + r["update_s"]
            cum["trained"] += r.get("trained_tokens", 0.0)
            cum["updates"] += int(not r.get("update_skipped", 0) and not r.get("nonfinite", 0))
            for k in ("generate_s", "verify_s", "allocate_s", "update_s"):
                led[k] += r[k]
        led["eval_s"] += r.get("eval_s", 0.0)
        if "eval/greedy_acc" in r:
            curve.append({"step": r["step"], "updates": cum["updates"], "cum_rollouts": r["cum_rollouts"],
                          "cum_tokens": r["cum_tokens"], "cum_trained_tokens": cum["trained"],
                          "seconds": cum["seconds"], "greedy_acc": r["eval/greedy_acc"],
                          **{k[5:]: v for k, v in r.items() if k.startswith("eval/greedy_acc_d")}})
    last = metrics[-1] if metrics else {}
    steps = [r for r in metrics if r["step"] > 0]
    ledger = {"rollouts": int(last.get("cum_rollouts", 0)), "generated_tokens": int(last.get("cum_tokens", 0)),
              "trained_tokens": int(cum["trained"]), "steps": len(steps), "updates": cum["updates"], **led,
              "train_s": cum["seconds"], "params": params,
              "flops_generate": 2.0 * params * float(last.get("cum_tokens", 0)),
              "flops_train": 6.0 * params * cum["trained"],
              "effective_groups_per_step": float(np.mean([r["effective_groups"] for r in steps])) if steps else 0.0,
              "rollouts_per_step": float(np.mean([r["rollouts"] for r in steps])) if steps else 0.0,
              "rounds_per_step": float(np.mean([r["rounds"] for r in steps])) if steps else 0.0,
              "hit_cap_steps": int(sum(bool(r.get("hit_cap")) for r in steps))}
    ledger["flops"] = ledger["flops_generate"] + ledger["flops_train"]
    return {"curve": curve, "ledger": ledger}


_DATA: dict[tuple, dict[str, Any]] = {}


def load_data(regime: str, work: Path, quick: bool, params_file: Path = R.PARAMS_FILE) -> dict[str, Any]:
    """The regime's splits and warm-started policy (warm-started under ``work`` on first use)."""
    key = (regime, str(work), quick, str(params_file))
    if key not in _DATA:
        from rlvr_core.models.policy import load_any_policy
        from rlvr_core.models.tiny import num_parameters

        params = R.regime_params(regime, params_file=params_file)
        ds = R.dataset(params)
        train_rows, test_rows, val_rows = R.splits(ds)
        policy = R.policy_dir(params, work, train_rows, quick=quick)  # warm-started on the whole train split
        if (pool := R.POOL_PROMPTS.get(R.base_regime(regime)[0])) is not None:
            train_rows = R.pool_rows(train_rows, pool)  # RL draws from the finite pool only
        model, _ = load_any_policy(policy, device="cpu")
        _DATA[key] = {"train": train_rows, "test": test_rows, "validation": val_rows, "policy": policy,
                      "n_params": int(num_parameters(model)), "policy_sha256": policy_sha256(policy)}
    return _DATA[key]


# ----- target --------------------------------------------------------------------------------------------
def target_path(out: Path, regime: str) -> Path:
    return out / "study" / regime / "target.json"


def set_target(out: Path, regime: str, refs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Freeze the regime's target from its reference (uniform GRPO) runs; an existing target is kept. It records
    the warm-started policy's digest: later runs of the regime must start from the same policy."""
    path = target_path(out, regime)
    if path.exists():
        return json.loads(path.read_text())
    g = gain_target([r["curve"] for r in refs], TARGET_FRACTION)
    start, gain = g["start"], g["gain"]
    t = {"regime": regime, "target": g["target"], "rule": f"median start + {TARGET_FRACTION} x "
         "median gain at the end of the budget (mean of the last three evaluations) of the reference runs",
         "reference_seeds": sorted(int(r["seed"]) for r in refs), "start": start, "gain": gain,
         "budget_rollouts": int(np.median([r["ledger"]["rollouts"] for r in refs])),
         "policy_sha256": refs[0].get("policy_sha256"), "eval_every_rollouts": refs[0].get("eval_every_rollouts"),
         "set_at": _now()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(t, indent=1) + "\n")
    return t


def reference_runs(out: Path, regime: str) -> list[dict[str, Any]]:
    """Every finished reference (uniform GRPO) run file of ``regime``, in seed-file order."""
    return [json.loads(p.read_text()) for p in sorted((out / "study" / regime / "reference" / "grpo").glob("s*.json"))]


def check_policy(out: Path, regime: str, digest: str) -> None:
    """Refuse to add runs to a regime whose target was frozen from another warm-started policy (or from one
    it did not record: the step-grid regimes' policy was built on another machine and is not recoverable)."""
    tp = target_path(out, regime)
    if not tp.exists():
        return
    frozen = json.loads(tp.read_text()).get("policy_sha256")
    if frozen != digest:
        why = "recorded no policy digest (its warm start was built on another machine)" if frozen is None else \
            f"was frozen from policy {frozen[:12]}"
        raise SystemExit(f"regime {regime!r}: its target {why}, and this machine's warm start is {digest[:12]}; "
                         f"new runs would not be comparable. Use a warm-start variant (--warm-start J: regime "
                         f"{R.base_regime(regime)[0]}{R.WS_SEP}J) with its own reference runs and target.")


def matched_sizes(out: Path, regime: str, protocol: str) -> int:
    """The prompt batch of a matched-updates run, frozen in ``<out>/study/<regime>/matched.json`` from the reference
    (uniform GRPO) runs before any matched run: E = their median effective groups per update at batch B.
    ``matched-updates`` (grpo): round(B x B / E) prompts, whose expected effective groups equal the equal-batch
    allocators' B. ``matched-updates-small``: round(E) effective groups per update for the equal-batch allocators,
    what GRPO at B carries."""
    path = out / "study" / regime / "matched.json"
    if not path.exists():
        runs = reference_runs(out, regime)
        if not runs:
            raise RuntimeError(f"regime {regime}: matched-updates needs the reference runs first")
        e = float(np.median([r["ledger"]["effective_groups_per_step"] for r in runs]))
        b = int(runs[0]["batch_size"])
        if e <= 0:
            raise RuntimeError(f"regime {regime}: the reference runs trained no effective group, so no batch matches "
                               "their effective groups per update")
        m = {"reference_batch": b, "effective_groups_per_update": e, "reference_seeds": [r["seed"] for r in runs],
             "matched-updates": max(1, round(b * b / e)), "matched-updates-small": max(1, round(e)), "set_at": _now()}
        path.write_text(json.dumps(m, indent=1) + "\n")
    return int(json.loads(path.read_text())[protocol])


def preregister(out: Path, regime: str, work: Path, quick: bool, params_file: Path = R.PARAMS_FILE) -> dict[str, Any]:
    """The hard regime's criteria (benchmarks/regimes.py CRITERIA) on a regime's reference runs, written once to
    ``<out>/study/<regime>/preregistration.json`` before any other allocator of the regime runs: the zero-variance
    share of k-groups at the start of RL (1,000 training prompts), and per reference run the evaluations below the
    frozen target before its fitted reach and the fitted reach itself."""
    path = out / "study" / regime / "preregistration.json"
    if path.exists():
        return json.loads(path.read_text())
    t = json.loads(target_path(out, regime).read_text())
    d = load_data(regime, work, quick, params_file)
    params = R.regime_params(regime, params_file=params_file)
    k = params.train.k
    shares = R.start_shares(d["policy"], d["train"], k=k, n=50 if quick else 1000, task=params.prepare.task,
                            max_new_tokens=params.train.max_new_tokens)
    refs = reference_runs(out, regime)
    per_run = []
    for r in refs:
        x = reach(r["curve"], t["target"], fit=True)["cum_rollouts"]
        below = sum(1 for c in r["curve"][1:] if not c["cum_rollouts"] >= x)
        per_run.append({"seed": r["seed"], "fit_rollouts_to_target": x if math.isfinite(x) else None,
                        "evals_below_target": below})
    c = R.CRITERIA
    med_x = median_interval([p["fit_rollouts_to_target"] for p in per_run])["median"]
    med_below = float(np.median([p["evals_below_target"] for p in per_run]))
    zv = shares["zero_variance_share"]
    pre = {"regime": regime, "criteria": c, "zero_variance_share": zv, "k": k, "train_prompts": len(d["train"]),
           "runs": per_run, "median_fit_rollouts_to_target": med_x, "median_evals_below_target": med_below,
           "meets": bool(zv >= c["min_zero_variance_share"] and med_below >= c["min_evals_below_target"]
                         and med_x is not None and med_x >= c["min_rise_rollouts"]), "set_at": _now()}
    if (extra := R.EXTRA_CRITERIA.get(R.base_regime(regime)[0])) is not None:
        pre["extra"] = cost_structure(refs, d, params, extra, quick)
        pre["meets"] = bool(pre["meets"] and pre["extra"]["meets"])
    path.write_text(json.dumps(pre, indent=1) + "\n")
    return pre


def cost_structure(refs: Sequence[Mapping[str, Any]], d: Mapping[str, Any], params: Any, extra: Mapping[str, float],
                   quick: bool) -> dict[str, Any]:
    """A regime's EXTRA_CRITERIA (benchmarks/regimes.py) on its reference runs: each run's generation share of its
    training wall-clock (generate_s over generate + verify + allocate + update, evaluations excluded) and their
    median; and the failing and passing completions' median lengths at the start of RL (``R.start_lengths``:
    k samples on 1,000 training prompts, at the training temperature and max_new_tokens)."""
    shares = []
    for r in refs:
        led = r["ledger"]
        spent = sum(led[key] for key in ("generate_s", "verify_s", "allocate_s", "update_s"))
        shares.append({"seed": r["seed"], "generate_share": led["generate_s"] / spent if spent else None,
                       "generate_s": led["generate_s"], "update_s": led["update_s"], "train_s": spent,
                       "generated_tokens": led["generated_tokens"], "rollouts": led["rollouts"]})
    med_share = _median_or_none([s["generate_share"] for s in shares])
    tr = params.train
    lengths = R.start_lengths(d["policy"], d["train"], task=params.prepare.task, k=tr.k, n=50 if quick else 1000,
                              max_new_tokens=tr.max_new_tokens, temperature=tr.temperature)
    ratio = lengths["fail_pass_length_ratio"]
    return {"criteria": dict(extra), "runs": shares, "median_generate_share": med_share, "start_lengths": lengths,
            "meets": bool(med_share is not None and med_share >= extra["min_generate_share"]
                          and ratio is not None and ratio >= extra["min_fail_pass_length_ratio"])}


# ----- the protocol driver -------------------------------------------------------------------------------
def run_protocol(regime: str, protocol: str, seeds: Sequence[int], *, out: Path, work: Path, quick: bool,
                 params_file: Path = R.PARAMS_FILE, log: Any = print, variants: Sequence[str] | None = None) -> None:
    """Reference runs, the frozen target, then the protocol's runs (each skipped when its file exists).

    ``variants`` restricts the protocol to some of its allocators, run in the order given. ``tuned`` goes one
    allocator at a time: its grid on the validation split, its choice, then its test runs, so that a partial
    study already reports finished allocators.
    """
    data = load_data(regime, work, quick, params_file)
    check_policy(out, regime, data["policy_sha256"])
    labels = _labels(protocol, quick, variants, regime)
    ctx = {"n": 0, "total": 0}

    def go(proto: str, lab: str, s: int, g: tuple[int, float] | None, split: str) -> None:
        ctx["n"] += 1
        if proto != "reference" and not target_path(out, regime).exists():
            refs = wait_for_references(out, regime, seeds, log)
            t = set_target(out, regime, refs)
            log(f"[{regime}] target frozen at {t['target']:.4f} from {len(refs)} reference runs")
            if regime not in R.STEP_GRID_REGIMES:
                _log_preregistration(preregister(out, regime, work, quick, params_file), log)
        t0 = time.perf_counter()
        res, trained = run_one(regime, proto, lab, s, out=out, work=work, quick=quick, grid=g, split=split, data=data,
                               params_file=params_file)
        tag = f"[{regime}/{proto} {ctx['n']}/{ctx['total']}] {lab}{grid_tag(g)} seed {s} ({split})"
        if not res:
            log(f"{tag}: running in another study process")
            return
        c = res["curve"]
        log(f"{tag}: {'trained' if trained else 'skipped (done)'}; acc {c[0]['greedy_acc']:.3f} -> "
            f"{c[-1]['greedy_acc']:.3f}, {res['ledger']['rollouts']} rollouts, {res['ledger']['updates']} updates"
            + (f", {time.perf_counter() - t0:.0f} s" if trained else ""))

    refs = [("reference", "grpo", s, None, "test") for s in seeds]
    if protocol != "tuned":
        todo = refs + ([(protocol, lab, s, None, "test") for lab in labels for s in seeds]
                       if protocol != "reference" else [])
        ctx["total"] = len(todo)
        for item in todo:
            go(*item)
    else:
        ctx["total"] = len(refs) + len(labels) * (len(_grid(quick)) * len(_grid_seeds(quick)) + len(seeds))
        for item in refs:
            go(*item)
        for lab in labels:
            for g in _grid(quick):
                for s in _grid_seeds(quick):
                    go("tuned", lab, s, g, "validation")
            while locks := list((out / "study" / regime / "tuned").glob(f"{slug(lab)}-b*-val/s*.lock")):
                log(f"[{regime}/tuned] {lab}: waiting for {len(locks)} validation run(s) of another study process")
                time.sleep(15)
            choice = record_choice(regime, out, quick, lab)
            g = tuple(choice["grid"]) if choice["grid"] else None
            log(f"[{regime}/tuned] {lab}: chose {grid_tag(g) or 'nothing'} on the validation split")
            for s in seeds:
                go("tuned", lab, s, g, "test")
    if protocol == "reference" and not target_path(out, regime).exists():
        set_target(out, regime, reference_runs(out, regime))
    if regime not in R.STEP_GRID_REGIMES and target_path(out, regime).exists():
        _log_preregistration(preregister(out, regime, work, quick, params_file), log)


def _log_preregistration(pre: Mapping[str, Any], log: Any) -> None:
    extra = pre.get("extra")

    def two(v: float | None) -> str:
        return "none" if v is None else f"{v:.2f}"

    more = "" if extra is None else (
        f", median generation share {two(extra['median_generate_share'])}, failing/passing median length "
        f"{two(extra['start_lengths']['fail_pass_length_ratio'])}")
    log(f"[{pre['regime']}] pre-registration (uniform GRPO only): meets the criteria: {pre['meets']} (zero-variance "
        f"share {pre['zero_variance_share']:.2f}, median {pre['median_evals_below_target']:.0f} evaluations below the "
        f"target, median fitted reach {_rollouts(pre['median_fit_rollouts_to_target'])}{more})")


def _rollouts(v: float | None) -> str:
    return "never" if v is None or not math.isfinite(v) else f"{v:,.0f} rollouts"


def wait_for_references(out: Path, regime: str, seeds: Sequence[int], log: Any, poll_s: float = 15.0) -> list[dict]:
    """The reference runs of ``seeds``, waiting while another study process still trains some of them."""
    ref_dir = out / "study" / regime / "reference" / "grpo"
    while True:
        missing = [s for s in seeds if not (ref_dir / f"s{s}.json").exists()]
        if not missing:
            return [json.loads((ref_dir / f"s{s}.json").read_text()) for s in seeds]
        held = [s for s in missing if (ref_dir / f"s{s}.lock").exists()]
        if len(held) < len(missing):
            raise RuntimeError(f"reference runs {missing} of regime {regime} are missing; run the reference first")
        log(f"[{regime}] waiting for reference seeds {held} (another study process)")
        time.sleep(poll_s)


def _labels(protocol: str, quick: bool, variants: Sequence[str] | None = None, regime: str = "hard") -> tuple[str, ...]:
    labels = PROTOCOLS[protocol]
    if protocol == "equal-batch" and regime not in R.STEP_GRID_REGIMES:
        labels = MATCHED  # the new regimes (pool, warm-start variants) run the measurement issue's list
        if R.base_regime(regime)[0] == "steps":
            labels += LENGTH_AWARE
    if regime in R.STEP_GRID_REGIMES:
        labels = tuple(lab for lab in labels if lab not in STEP_GRID_EXCLUDE)
    if variants:
        unknown = sorted(set(variants) - set(labels))
        if unknown:
            raise ValueError(f"protocol {protocol!r} has no allocator(s) {unknown}; it has {list(labels)}")
        labels = tuple(dict.fromkeys(variants))  # the order given, each once
    return labels[: QUICK["variants"]] if quick else labels


def _grid(quick: bool) -> tuple[tuple[int, float], ...]:
    return GRID[:2] if quick else GRID


def _grid_seeds(quick: bool) -> tuple[int, ...]:
    return GRID_SEEDS[:1] if quick else GRID_SEEDS


def choose_grid(regime: str, out: Path, quick: bool, label: str) -> dict[str, Any]:
    """The grid point of ``label`` with the lowest median validation rollouts-to-target (unreached: infinite);
    ties and all-unreached broken by the highest mean validation accuracy over the run."""
    target = json.loads(target_path(out, regime).read_text())["target"]
    best = None
    for g in _grid(quick):
        runs = [json.loads(p.read_text()) for p in
                sorted(run_file(out, regime, "tuned", label, 0, g, "validation").parent.glob("s*.json"))]
        if not runs:
            continue
        r2t = [reach(r["curve"], target)["cum_rollouts"] for r in runs]
        med = median_ci(r2t, n_boot=1)["median"]
        mean_acc = float(np.mean([np.mean([c["greedy_acc"] for c in r["curve"]]) for r in runs]))
        key = (math.inf if med is None else med, -mean_acc)
        if best is None or key < best[0]:
            best = (key, g, med, mean_acc, len(runs))
    return {"grid": list(best[1]) if best else None,
            "validation_rollouts_to_target": best[2] if best else None,
            "validation_mean_accuracy": best[3] if best else None, "runs": best[4] if best else 0}


def record_choice(regime: str, out: Path, quick: bool, label: str) -> dict[str, Any]:
    """Choose ``label``'s grid point and add it to ``<out>/study/<regime>/tuned/choice.json``."""
    choice = choose_grid(regime, out, quick, label)
    save = out / "study" / regime / "tuned" / "choice.json"
    save.parent.mkdir(parents=True, exist_ok=True)
    known = json.loads(save.read_text()) if save.exists() else {}
    known[label] = choice
    save.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return choice


# ----- aggregation and outputs ---------------------------------------------------------------------------
def load_runs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "study").glob("*/*/*/s*.json"))]


BUDGETS = (10000, 20000, 30000, 40000)  # accuracy at fixed rollout budgets (the isotonic fit's)
FRACTIONS = (0.6, 0.7, 0.8)  # reach at these fractions of the reference's gain (the fitted statistic)


def cell_rows(runs: Sequence[Mapping[str, Any]], target: float, *, start: float | None = None,
              gain: float | None = None, budget: float | None = None) -> dict[str, Any]:
    """A cell's statistics over its runs. Primary: ``fit_rollouts_to_target``, the first crossing of each run's
    isotonic fit (median and its order-statistic interval, with coverage); the raw first crossing
    (``rollouts_to_target``, bootstrap interval) stays beside it. With the target's ``start`` and ``gain``, the
    fitted reach at 60/70/80% of the gain; with ``budget``, the area under the accuracy-rollouts curve to it."""
    hits = [reach(r["curve"], target) for r in runs]
    fits = [reach(r["curve"], target, fit=True) for r in runs]
    rec = {"seeds": len(runs), "reached": int(sum(math.isfinite(h["cum_rollouts"]) for h in hits)),
           "reached_fit": int(sum(math.isfinite(h["cum_rollouts"]) for h in fits)),
           "rollouts_to_target": median_ci([h["cum_rollouts"] for h in hits]),
           "seconds_to_target": median_ci([h["seconds"] for h in hits]),
           "tokens_to_target": median_ci([h["cum_tokens"] for h in hits]),
           "trained_tokens_to_target": median_ci([h["cum_trained_tokens"] for h in hits]),
           "updates_to_target": median_ci([h["updates"] for h in hits]),
           **{f"fit_{ax}_to_target": median_interval([h[key] for h in fits]) for ax, key in
              (("rollouts", "cum_rollouts"), ("seconds", "seconds"), ("tokens", "cum_tokens"),
               ("updates", "updates"))},
           "final_accuracy": float(np.median([r["curve"][-1]["greedy_acc"] for r in runs])),
           "final_accuracy_iqr": [float(np.percentile([r["curve"][-1]["greedy_acc"] for r in runs], q))
                                  for q in (25, 75)],
           "start_accuracy": float(np.median([r["curve"][0]["greedy_acc"] for r in runs])),
           "eval_size": int(runs[0]["eval_size"]),
           "evaluations_per_run": float(np.median([len(r["curve"]) for r in runs])),
           "acc_at_budget": {str(b): _median_or_none([accuracy_at(r["curve"], b) for r in runs]) for b in BUDGETS}}
    if start is not None and gain is not None:
        rec["fit_rollouts_to_fraction"] = {
            f"{f:g}": median_interval([fitted_reach([c["cum_rollouts"] for c in r["curve"]],
                                                    [c["greedy_acc"] for c in r["curve"]], start + f * gain)
                                       for r in runs]) for f in FRACTIONS}
    if budget is not None:
        rec["auc"] = {"upto": budget, **median_interval([area_under_curve(r["curve"], budget) for r in runs])}
    rec["final_accuracy_se"] = accuracy_se(rec["final_accuracy"], rec["eval_size"])
    led = [r["ledger"] for r in runs]
    rec["ledger"] = {k: float(np.median([x[k] for x in led])) for k in led[0] if isinstance(led[0][k], (int, float))}
    rec["decomposition"] = decomposition(runs, [h["cum_rollouts"] for h in fits])
    return rec


def _median_or_none(values: Sequence[float | None]) -> float | None:
    """Median of ``values``; None when any is missing (a run that ended before the point)."""
    return None if not values or any(v is None for v in values) else float(np.median(values))


def decomposition(runs: Sequence[Mapping[str, Any]], fit_reach: Sequence[float]) -> dict[str, Any]:
    """Rollouts to target = (rollouts per effective group) x (effective groups to target), medians over runs.

    Rollouts per effective group is the run's whole ledger (rollouts / effective groups trained); effective groups
    to target is the fitted rollouts to target divided by it (None for a run that never reaches). Separates what
    allocation buys (the first factor) from what the update count and batch buy (the second)."""
    per, groups = [], []
    for r, x in zip(runs, fit_reach):
        lg = r["ledger"]
        eff = lg.get("effective_groups_per_step", 0.0) * lg.get("steps", 0)
        rpeg = lg["rollouts"] / eff if eff else math.inf
        per.append(rpeg)
        groups.append(x / rpeg if math.isfinite(x) and math.isfinite(rpeg) else math.inf)
    return {"rollouts_per_effective_group": median_interval(per),
            "effective_groups_to_target": median_interval(groups),
            "effective_groups_per_update": float(np.median([r["ledger"].get("effective_groups_per_step", 0.0)
                                                            for r in runs]))}


def aggregate(out: Path, results: Path) -> list[dict[str, Any]]:
    """Rebuild training_protocols.json and every training_<regime>_<protocol>.* (in the results root ``results``'s
    study/) from the run files under ``out``/study, then the floor, the targets, the warm starts and
    training_study.md."""
    runs = load_runs(out)
    present = {(r["regime"], r["protocol"]) for r in runs}
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("split", "test") != "test":
            continue
        protos = [r["protocol"]]
        for proto, sources in SHARED.items():  # e.g. the reference runs are equal-rollouts' grpo
            if (r["regime"], proto) in present and any(r["protocol"] == src and (labs is None or r["variant"] in labs)
                                                       for src, labs in sources):
                protos.append(proto)
        for p in protos:
            cells.setdefault((r["regime"], p, r["variant"]), []).append(r)
    records = []
    for (regime, proto, lab), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], list(PROTOCOLS).index(kv[0][1]),
                                                                         list(VARIANTS).index(kv[0][2]))):
        tp = target_path(out, regime)
        if not tp.exists():
            continue
        target = json.loads(tp.read_text())
        rec = {"regime": regime, "protocol": proto, "allocator": lab,
               **cell_rows(rs, target["target"], start=target.get("start"), gain=target.get("gain"),
                           budget=BUDGET.get(regime, {}).get("rollouts", target.get("budget_rollouts"))),
               "target": target["target"], "budget_rollouts": int(np.median([r["ledger"]["rollouts"] for r in rs])),
               "seed_list": sorted(int(r["seed"]) for r in rs), "quick": any(r.get("quick") for r in rs),
               **against_baseline(cells, regime, proto, lab, target["target"])}
        if proto == "tuned":
            rec["grid"] = rs[0]["grid"]
        records.append(rec)
    summary = output_dir(results, "study")
    (summary / "training_protocols.json").write_text(json.dumps(records, indent=1) + "\n")
    for regime, proto in sorted({(r["regime"], r["protocol"]) for r in records}):
        if proto == "reference":
            continue
        sub = [r for r in records if r["regime"] == regime and r["protocol"] == proto]
        rs = {lab: cells[(regime, proto, lab)] for lab in [r["allocator"] for r in sub]}
        if proto == "equal-batch" and (regime, "reference", "grpo") in cells:
            rs = {"grpo (reference)": cells[(regime, "reference", "grpo")], **rs}
        write_cell_outputs(summary, regime, proto, sub, rs, json.loads(target_path(out, regime).read_text()))
    from benchmarks import floor, study_targets, warmstarts  # they read the same run files

    floor.write(results, study_out=out)
    study_targets.write(study_targets.measure(out, results), results)
    warmstarts.write(warmstarts.measure(out), results, warmstarts.measure_costs(out))
    write_study_doc(out, results, records)
    if results.resolve() == RESULTS.resolve():  # the committed folder: its index lists the files just written
        from benchmarks import results_index

        results_index.write(results)
    return records


def baseline_of(protocol: str) -> str:
    """The allocator each protocol's cells are tested against: dapo at equal batch (the same B effective groups
    per update), uniform grpo elsewhere."""
    return "dapo" if protocol == "equal-batch" else "grpo"


def against_baseline(cells: Mapping[tuple[str, str, str], Sequence[Mapping[str, Any]]], regime: str, proto: str,
                     label: str, target: float) -> dict[str, Any]:
    """The one-sided rank test of a cell's fitted rollouts to target against its protocol's baseline cell (misses
    ranked last), stratified by warm start where the runs record one; {} for the baseline itself."""
    base_label = baseline_of(proto)
    base = cells.get((regime, proto, base_label)) or (cells.get((regime, "reference", "grpo"))
                                                      if base_label == "grpo" else None)
    if label == base_label or not base:
        return {}
    ours = cells[(regime, proto, label)]

    def fit(rs: Sequence[Mapping[str, Any]]) -> list[float]:
        return [reach(r["curve"], target, fit=True)["cum_rollouts"] for r in rs]

    strata = all("warm_start" in r for r in [*ours, *base])
    test = rank_test(fit(ours), fit(base), strata_ours=[r["warm_start"] for r in ours] if strata else None,
                     strata_base=[r["warm_start"] for r in base] if strata else None)
    return {"baseline": base_label, "p_value": test["p_value"], "p_exact": test["exact"]}


def expected_runs(regime: str, protocol: str, seeds: int = 5) -> int:
    """Runs of the full plan of a (regime, protocol), reference included (tuned: grid plus the chosen points)."""
    n = len(_labels(protocol, False, regime=regime)) * seeds
    if protocol == "tuned":
        n += len(PROTOCOLS[protocol]) * len(GRID) * len(GRID_SEEDS)
    return n + (0 if protocol in ("reference", "equal-rollouts") else seeds)


def write_study_doc(out: Path, results: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """study/training_study.md under the results root ``results``: every cell with its interval and seed count, the
    targets (from study_targets/), and what remains to run."""
    lines = ["# Training study: status and results (generated by `python -m benchmarks.study --summarize-only`)", "",
             "How the regime, the targets and the grid were chosen: benchmarks/regimes.py, benchmarks/study.py "
             "(module docstrings) and benchmarks/results/regimes/regimes.md.", "",
             "Tuned grid (batch size x lr, the same for every allocator): "
             f"{', '.join(f'{b}x{lr:g}' for b, lr in GRID)}; "
             f"selection seeds {list(GRID_SEEDS)} on the validation split ({R.VALIDATION_ROWS} rows), report on the "
             f"test split ({R.TEST_ROWS} rows).", ""]
    for regime in study_regimes(out):
        tp = target_path(out, regime)
        if tp.exists():
            t = json.loads(tp.read_text())
            lines.append(f"- `{regime}` target: {t['target']:.4f} = {t['rule']} (start {t['start']:.3f}, gain "
                         f"{t['gain']:+.3f}, seeds {t['reference_seeds']}, frozen {t['set_at']}"
                         + (f", policy {t['policy_sha256'][:12]}" if t.get("policy_sha256") else
                            ", warm start not recorded") + ").")
        pre = out / "study" / regime / "preregistration.json"
        if pre.exists():
            p = json.loads(pre.read_text())
            lines.append(f"  Pre-registration on uniform GRPO alone: {'meets' if p['meets'] else '**misses**'} the "
                         f"criteria (zero-variance share at the start {p['zero_variance_share']:.2f} at k = {p['k']}; "
                         f"median {p['median_evals_below_target']:.0f} evaluations below the target; median fitted "
                         f"reach {_num(p['median_fit_rollouts_to_target'])} rollouts; {p['train_prompts']} training "
                         "prompts" + _cost_note(p.get("extra")) + ").")
    lines += ["", "Rollouts to target: the first crossing of each run's isotonic fit (primary; median [order-statistic "
              "interval] (coverage)) and the raw first crossing (median [95% bootstrap]); p: one-sided rank test "
              "against the protocol's baseline (dapo at equal batch, grpo elsewhere), misses ranked last.", "",
              "| regime | protocol | allocator | seeds | reached (fit) | rollouts to target (fit) | p | raw first "
              "crossing | seconds to target (fit) | final acc (SE) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        p = r.get("p_value")
        lines.append(f"| {r['regime']} | {r['protocol']} | {r['allocator']} | {r['seeds']} | "
                     f"{r['reached_fit']}/{r['seeds']} | {_fmt(r['fit_rollouts_to_target'])}"
                     f"{_cov(r['fit_rollouts_to_target'])} | {'-' if p is None else f'{p:.3f}'} | "
                     f"{_fmt(r['rollouts_to_target'])} | {_fmt(r['fit_seconds_to_target'], digits=1)} | "
                     f"{r['final_accuracy']:.3f} ({r['final_accuracy_se']:.3f}) |")
    targets = results / "study_targets" / "training_targets.md"
    if targets.exists():
        lines += ["", "## Targets", "", "Measured by benchmarks/study_targets.py (its docstring gives the rules: "
                  "a baseline run that misses counts at its whole budget, ours as never).", "",
                  targets.read_text().rstrip()]
    candidates = results / "study_targets" / "training_candidates.md"
    if candidates.exists():
        lines += ["", "Candidates measured the same way, without a target of their own:", "",
                  candidates.read_text().rstrip()]
    done = load_runs(out)
    lines += ["", "## What has run and what remains", "",
              "| regime | protocol | run files | of the full plan (5 seeds) | resume with |", "|---|---|---|---|---|"]
    for regime in study_regimes(out):
        base, ws = R.base_regime(regime)
        protos = ("equal-batch", "equal-rollouts", "tuned") if regime in R.STEP_GRID_REGIMES else \
            ("reference", "equal-batch", "matched-updates", "matched-updates-small")
        for proto in protos:
            have = sum(1 for r in done if r["regime"] == regime and (r["protocol"] == proto or
                       (r["protocol"] == "reference" and proto != "equal-rollouts") or
                       (proto == "equal-rollouts" and r["protocol"] == "reference")))
            flag = f" --warm-start {ws}" if ws is not None else ""
            lines.append(f"| {regime} | {proto} | {have} | {expected_runs(regime, proto)} | "
                         f"`python -m benchmarks.study --regime {base}{flag} --protocol {proto} --seeds 5` |")
    lines += ["", "Finished runs are skipped; a run killed midway resumes from its checkpoints under runs/study. Two "
              "processes may share a (regime, protocol): each run is claimed by a lock file."]
    (output_dir(results, "study") / "training_study.md").write_text("\n".join(lines) + "\n")


def study_regimes(out: Path) -> list[str]:
    """The regimes with a folder under ``<out>/study``, step-grid ones first."""
    names = [p.name for p in (out / "study").glob("*") if p.is_dir()] if (out / "study").exists() else []
    return sorted(names, key=lambda n: (n not in R.STEP_GRID_REGIMES, n))


def _cost_note(extra: Mapping[str, Any] | None) -> str:
    """The EXTRA_CRITERIA figures of a pre-registration, for training_study.md ("" for a regime without them)."""
    if extra is None:
        return ""
    share, ratio = extra["median_generate_share"], extra["start_lengths"]["fail_pass_length_ratio"]
    return (f"; median generation share of a step {'none' if share is None else f'{share:.2f}'}; failing/passing "
            f"median tokens at the start {'none' if ratio is None else f'{ratio:.2f}'}")


def _num(v: float | None) -> str:
    return "never" if v is None else f"{v:,.0f}"


def _fmt(ci: Mapping[str, Any], scale: float = 1.0, digits: int = 0) -> str:
    def f(v: Any) -> str:
        return "never" if v is None else f"{v / scale:,.{digits}f}"

    return f"{f(ci['median'])} [{f(ci['lo'])}, {f(ci['hi'])}]"


def write_cell_outputs(dest: Path, regime: str, proto: str, records: Sequence[Mapping[str, Any]],
                       runs: Mapping[str, Sequence[Mapping[str, Any]]], target: Mapping[str, Any]) -> None:
    """training_<regime>_<protocol>.{csv,md,png} of one (regime, protocol) in ``dest`` (the results root's study/)."""
    stem = dest / f"training_{regime}_{proto}"
    lines_csv = ["regime,protocol,allocator,seed,step,updates,cum_rollouts,cum_tokens,cum_trained_tokens,seconds,"
                 "greedy_acc"]
    for lab, rs in runs.items():
        for r in rs:
            for c in r["curve"]:
                lines_csv.append(f"{regime},{proto},{lab},{r['seed']},{c['step']},{c['updates']},{c['cum_rollouts']},"
                                 f"{c['cum_tokens']},{c['cum_trained_tokens']:.0f},{c['seconds']:.3f},{c['greedy_acc']:.4f}")
    stem.with_suffix(".csv").write_text("\n".join(lines_csv) + "\n")
    lines = _cell_tables(regime, proto, records, target)
    lines += ["", "Ledger (median per run over the whole budget): rollouts, generated and trained tokens, "
              "wall-clock by phase, compute estimate (2 x params per generated token + 6 x params per trained "
              "token).", "",
              "| allocator | rollouts | generated tokens | trained tokens | updates | generate s | verify s | "
              "allocate s | update s | eval s | TFLOPs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lg = r["ledger"]
        lines.append(f"| {r['allocator']} | {lg['rollouts']:,.0f} | {lg['generated_tokens']:,.0f} | "
                     f"{lg['trained_tokens']:,.0f} | {lg['updates']:.0f} | {lg['generate_s']:.1f} | "
                     f"{lg['verify_s']:.1f} | {lg['allocate_s']:.1f} | "
                     f"{lg['update_s']:.1f} | {lg['eval_s']:.1f} | {lg['flops'] / 1e12:.2f} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot_cell(stem.with_suffix(".png"), regime, proto, runs, target["target"])


def _cov(ci: Mapping[str, Any]) -> str:
    return "" if ci.get("coverage") is None else f" ({ci['coverage']:.0%})"


def _cell_tables(regime: str, proto: str, records: Sequence[Mapping[str, Any]],
                 target: Mapping[str, Any]) -> list[str]:
    """The markdown of a cell's reach, budget and cost tables (the ledger follows)."""
    n_eval = records[0]["eval_size"] if records else 0
    se = accuracy_se(target["target"], n_eval)
    base = baseline_of(proto)
    lines = [f"# Training study: regime `{regime}`, protocol `{proto}`", "",
             f"Target: held-out greedy accuracy {target['target']:.3f} ({target['rule']}; "
             f"set at {target['set_at']} from reference seeds {target['reference_seeds']}, "
             f"start {target['start']:.3f}, gain {target['gain']:+.3f}). "
             f"Held-out set: {n_eval} problems, standard error {se * 100:.1f} points at the target.", "",
             "Primary statistic: rollouts until each run's isotonic (monotone least-squares) fit first reaches the "
             "target; the raw first crossing beside it favours the allocator evaluated most often per rollout. "
             "Fitted cells: median [order-statistic interval] (its exact coverage); 'never' where the median or a "
             f"bound falls on a run that did not reach. p: one-sided rank test against {base} (misses ranked last). "
             "Seconds: training wall-clock (generate + verify + allocate + update).", "",
             "| allocator | seeds | reached (fit) | rollouts to target (fit) | raw first crossing [bootstrap] | "
             f"p vs {base} | rollouts / eff. group | eff. groups to target | evaluations / run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        d, p = r["decomposition"], r.get("p_value")
        lines.append(f"| {r['allocator']} | {r['seeds']} | {r['reached_fit']}/{r['seeds']} | "
                     f"{_fmt(r['fit_rollouts_to_target'])}{_cov(r['fit_rollouts_to_target'])} | "
                     f"{_fmt(r['rollouts_to_target'])} | {'-' if p is None else f'{p:.3f}'} | "
                     f"{_fmt(d['rollouts_per_effective_group'], digits=1)} | "
                     f"{_fmt(d['effective_groups_to_target'])} | {r['evaluations_per_run']:.0f} |")
    fr = [f"{float(f):.0%}" for f in (records[0].get("fit_rollouts_to_fraction") or {})] if records else []
    lines += ["", "Accuracy of the fitted curve at fixed rollout budgets (median; '-' where a run ended before), the "
              "area under the accuracy-rollouts curve to the reference budget (mean accuracy), and the fitted reach "
              "at fractions of the reference's gain:", "",
              "| allocator | " + " | ".join(f"acc @ {int(b) // 1000}k" for b in BUDGETS) + " | AUC | "
              + " | ".join(f"reach {f} of gain" for f in fr) + " |",
              "|---|" + "---|" * (len(BUDGETS) + 1 + len(fr))]
    for r in records:
        acc = " | ".join("-" if v is None else f"{v:.3f}" for v in r["acc_at_budget"].values())
        auc = r.get("auc") or {}
        auc_s = "-" if auc.get("median") is None else f"{auc['median']:.3f}"
        reach_f = " | ".join(_fmt(ci) for ci in (r.get("fit_rollouts_to_fraction") or {}).values())
        lines.append(f"| {r['allocator']} | {acc} | {auc_s} | {reach_f} |")
    lines += ["", "Other cost axes (fitted reach), final accuracy and the per-step ledger:", "",
              "| allocator | seconds to target | updates to target | generated tokens to target | final acc | "
              "rollouts/step | eff. groups/step | rounds/step |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lg = r["ledger"]
        lines.append(f"| {r['allocator']} | {_fmt(r['fit_seconds_to_target'], digits=1)} | "
                     f"{_fmt(r['fit_updates_to_target'])} | {_fmt(r['fit_tokens_to_target'])} | "
                     f"{r['final_accuracy']:.3f} | {lg['rollouts_per_step']:.0f} | "
                     f"{lg['effective_groups_per_step']:.1f} | {lg['rounds_per_step']:.1f} |")
    return lines


def plot_cell(path: Path, regime: str, proto: str, runs: Mapping[str, Sequence[Mapping[str, Any]]],
              target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_x = (("cum_rollouts", "cumulative rollouts"), ("seconds", "training seconds"),
              ("updates", "optimizer updates"))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    rng = np.random.default_rng(0)
    for ax, (x, name) in zip(axes, axes_x):
        for i, (lab, rs) in enumerate(runs.items()):
            top = min(max(c[x] for c in r["curve"]) for r in rs)
            grid = np.linspace(0, top, 60)
            ys = np.vstack([np.interp(grid, [c[x] for c in r["curve"]], [c["greedy_acc"] for c in r["curve"]])
                            for r in rs])
            med = np.median(ys, 0)
            if len(rs) > 1:
                boots = np.median(ys[rng.integers(0, len(rs), size=(1000, len(rs)))], axis=1)
                lo, hi = np.percentile(boots, [2.5, 97.5], axis=0)
                ax.fill_between(grid, lo, hi, alpha=0.18, color=f"C{i}")
            ax.plot(grid, med, color=f"C{i}", label=f"{lab} ({len(rs)} seeds)")
        ax.axhline(target, color="k", ls=":", lw=1, label=f"target {target:.3f}")
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out greedy accuracy (median, 95% bootstrap band)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"training study: regime {regime}, protocol {proto}")
    save_figure(fig, path, dpi=100)


# ----- the price of synchronous rounds -------------------------------------------------------------------
ROUND_VARIANTS = ("grpo", "dapo", "sara", "sara[carry]", "sara+dps", "vigor", "sara[budget]")


def round_price(regime: str, *, out: Path, work: Path, results: Path, steps: int, quick: bool,
                params_file: Path = R.PARAMS_FILE) -> dict[str, Any]:
    """Rollouts per second at each allocator's round sizes against one batched call of the same total.

    Each allocator runs ``steps`` allocation steps on the warm-started policy (no updates: the policy is
    fixed, so every allocator sees the same pass rates); every generate call's requests are recorded. Then
    the recorded rounds of each step are replayed on a fresh engine, one call per round, and the same
    requests merged into one call, and both are timed.
    """
    from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
    from rlvr_core.models.policy import load_any_policy, policy_prompts
    from rlvr_core.rollout.hf import HFEngine
    from rlvr_core.training import Scorer

    d = load_data(regime, work, quick, params_file)
    model, tok = load_any_policy(d["policy"], device="cpu")
    prompts = policy_prompts(tok, d["train"], "arithmetic")
    rows = []
    for lab in ROUND_VARIANTS[:2] if quick else ROUND_VARIANTS:
        cfg = run_params(regime, lab, 0, quick=quick, params_file=params_file).train
        alloc = make_allocator(cfg.allocator, **cfg.allocator_kwargs())
        source = PromptSource(len(d["train"]), seed=0)
        eng = HFEngine(model, tok, prompts, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=0)
        calls: list[list[dict[int, int]]] = []
        orig = eng.generate

        def rec(requests: Mapping[int, int], _c: list = calls, _gen: Any = orig) -> Any:
            _c[-1].append(dict(requests))
            return _gen(requests)

        eng.generate = rec  # type: ignore[method-assign]
        scorer = Scorer("arithmetic", d["train"])
        for _ in range(steps):
            calls.append([])
            run_allocation_step(alloc, eng, source, score=scorer)
        eng.generate = orig  # type: ignore[method-assign]
        timed = HFEngine(model, tok, prompts, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=1)
        timed.generate({0: 8})  # warm-up
        t_rounds = t_one = 0.0
        n_roll = n_rounds = 0
        for step_calls in calls:
            t0 = time.perf_counter()
            for req in step_calls:
                timed.generate(req)
            t_rounds += time.perf_counter() - t0
            merged: dict[int, int] = {}
            for req in step_calls:
                for p, n in req.items():
                    merged[p] = merged.get(p, 0) + n
            t0 = time.perf_counter()
            timed.generate(merged)
            t_one += time.perf_counter() - t0
            n_roll += sum(sum(r.values()) for r in step_calls)
            n_rounds += len(step_calls)
        sizes = [sum(r.values()) for sc in calls for r in sc]
        rows.append({"allocator": lab, "steps": steps, "rounds_per_step": n_rounds / steps,
                     "rollouts_per_step": n_roll / steps, "median_round_size": float(np.median(sizes)),
                     "min_round_size": int(min(sizes)), "rounds_rollouts_per_s": n_roll / t_rounds,
                     "batched_rollouts_per_s": n_roll / t_one, "slowdown": t_rounds / t_one})
    res = {"regime": regime, "engine": "hf", "device": "cpu", "threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
           "rows": rows}
    summary = output_dir(results, "study")
    (summary / "training_round_price.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"Price of synchronous rounds on the HF engine (regime `{regime}`, CPU, fixed warm-started policy, "
             f"{steps} allocation steps per allocator): rollouts per second when each step's rounds are generated one "
             "call per round, against the same requests merged into one batched call.", "",
             "| allocator | rounds/step | rollouts/step | median round size | rollouts/s in rounds | "
             "rollouts/s in one call | slowdown |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['allocator']} | {r['rounds_per_step']:.1f} | {r['rollouts_per_step']:.0f} | "
                     f"{r['median_round_size']:.0f} | {r['rounds_rollouts_per_s']:,.0f} | "
                     f"{r['batched_rollouts_per_s']:,.0f} | {r['slowdown']:.2f}x |")
    (summary / "training_round_price.md").write_text("\n".join(lines) + "\n")
    return res


# ----- command line --------------------------------------------------------------------------------------
def default_out(out: Path | None, quick: bool) -> Path:
    """``out`` when given, else a fresh temporary folder for --quick (never benchmarks/results), else RESULTS."""
    return _default_out(out, quick, "study")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regime", default="hard", choices=sorted(R.REGIMES))
    ap.add_argument("--warm-start", type=int, default=None, metavar="J",
                    help=f"the regime from warm-start seed J (regime <regime>{R.WS_SEP}J: its own policy, reference "
                    "runs and target)")
    ap.add_argument("--protocol", default="equal-batch", choices=list(PROTOCOLS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=None, metavar="LABEL",
                    help="only these allocators of the protocol, in this order (default: all, in the protocol's order)")
    ap.add_argument("--quick", action="store_true", help="short warm start, 2 seeds, tiny budget, temporary --out")
    ap.add_argument("--out", type=Path, default=None, help="results root: run files and summaries in its study/ "
                    "(default benchmarks/results; --quick: a temporary folder)")
    ap.add_argument("--work", type=Path, default=None, help="run folders and policies (default runs/study)")
    ap.add_argument("--summarize-only", action="store_true", help="rebuild the outputs from the run files")
    ap.add_argument("--round-price", action="store_true", help="measure the price of synchronous rounds")
    ap.add_argument("--round-steps", type=int, default=6)
    args = ap.parse_args(argv)
    if args.warm_start is not None:
        args.regime = f"{args.regime}{R.WS_SEP}{args.warm_start}"
    args.out = default_out(args.out, args.quick)
    if args.work is None:
        args.work = args.out / "work" if args.quick else Path("runs/study")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    seeds = list(range(QUICK["seeds"] if args.quick else args.seeds))
    if args.round_price:
        round_price(args.regime, out=args.out, work=args.work, results=args.out, quick=args.quick,
                    steps=2 if args.quick else args.round_steps)
        print((args.out / "study" / "training_round_price.md").read_text())
        return 0
    if not args.summarize_only:
        t0 = time.perf_counter()
        run_protocol(args.regime, args.protocol, seeds, out=args.out, work=args.work, quick=args.quick,
                     variants=args.variants, log=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True))
        print(f"{args.regime}/{args.protocol}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    records = aggregate(args.out, args.out)
    print(f"{len(records)} cells -> {args.out / 'study' / 'training_protocols.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
