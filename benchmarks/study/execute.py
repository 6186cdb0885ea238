"""Running the study: one run's configuration, one run trained into its file, the frozen files, a protocol's runs.

- ``run_params``: params.yaml + the regime's overrides + the protocol's and the variant's settings;
- ``run_one``: train one run unless its file exists, under a claim (RunStore.claim);
- ``set_target``, ``matched_sizes``, ``preregister``, ``record_choice``: the frozen files, each written once
  before the runs that depend on it;
- ``run_protocol``: reference runs, the frozen target, then the protocol's runs (``tuned``: one allocator at a
  time, its grid on the validation split, its choice, then its test runs).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from benchmarks.study import data as D
from benchmarks.study import tuning as T
from benchmarks.study.plan import (
    PARAMS_FILE,
    PROTOCOLS,
    ROOT,
    VARIANTS,
    WS_SEP,
    base_regime,
    grid_points,
    grid_seeds,
    grid_tag,
    labels,
    matched_entry,
    regime,
    regime_params,
    select,
    sizing,
    step_grid,
    tune_label,
)
from benchmarks.study.stats import conditioning, median_or_none, reach
from benchmarks.study.store import RunStore
from rlvr_core.safefs import write_atomic, write_text_atomic
from rlvr_core.stats import TARGET_FRACTION, gain_target, median_ci, median_interval
from rlvr_core.types import step_updated

Log = Callable[[str], Any]


# ----- configurations ------------------------------------------------------------------------------------
def run_params(regime_name: str, label: str, seed: int, *, quick: bool = False,
               grid: tuple[int, float] | None = None, protocol: str = "reference", params_file: Path = PARAMS_FILE,
               batch: int | None = None) -> Any:
    """The Params of one run: params.yaml + regime + the protocol's train settings (``batch``: the prompt batch
    of a matched-updates run, from matched_sizes)."""
    size = sizing(regime_name, quick)
    base = regime_params(regime_name, params_file=params_file)
    variant = VARIANTS[label]
    alloc, vparams = variant.allocator, variant.params
    aparams = {**base.train.allocator_params.get(alloc, {}), **vparams}
    if alloc == "vigor" and protocol == "equal-rollouts" and not step_grid(regime_name):
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
    return regime_params(regime_name, {"train": train}, params_file=params_file)


# ----- one run -------------------------------------------------------------------------------------------
def run_one(store: RunStore, regime_name: str, protocol: str, label: str, seed: int, *, work: Path, quick: bool,
            grid: tuple[int, float] | None = None, split: str = "test", data: dict[str, Any] | None = None,
            params_file: Path = PARAMS_FILE) -> tuple[dict[str, Any], bool]:
    """Train one run unless its result file exists; returns (result, trained)."""
    path = store.run_file(regime_name, protocol, label, seed, grid, split)
    if path.exists():
        return json.loads(path.read_text()), False
    if not store.claim(path):
        return {}, False  # another study process is training this run
    try:
        d = data if data is not None else D.load_data(regime_name, work, quick, params_file)
        return train_run(store, path, regime_name, protocol, label, seed, work=work, quick=quick, grid=grid,
                         split=split, data=d, params_file=params_file), True
    finally:
        store.release(path)


def train_run(store: RunStore, path: Path, regime_name: str, protocol: str, label: str, seed: int, *, work: Path,
              quick: bool, grid: tuple[int, float] | None, split: str, data: Mapping[str, Any],
              params_file: Path) -> dict[str, Any]:
    """Train one run and write its result file (atomically) at ``path``."""
    from rlvr_core.training import check_and_train

    entry = matched_entry(protocol, label)
    batch = matched_sizes(store, regime_name, entry) if entry else None
    params = run_params(regime_name, label, seed, quick=quick, grid=grid, protocol=protocol, params_file=params_file,
                        batch=batch)
    rows = data["test"] if split == "test" else data["validation"]
    # the evaluation covers min(eval_size, rows) problems (rlvr_core.training): the run records what it evaluates
    cfg = replace(params.train, eval_size=min(params.train.eval_size, len(rows)))
    run_dir = work / "runs" / path.relative_to(store.root).with_suffix("")
    t0, started = time.perf_counter(), _now()
    res = check_and_train(cfg, policy_dir=data["policy"], train_rows=data["train"], test_rows=rows, run_dir=run_dir,
                          resume=True, task=params.prepare.task)
    wall = time.perf_counter() - t0
    result = summarize_run(res.metrics, params=data["n_params"])
    result["ledger"].update(recurrence(run_dir / "rollouts.parquet"))
    tp = store.target_path(regime_name)
    result.update({"regime": regime_name, "protocol": protocol, "variant": label, "allocator": cfg.allocator,
                   "seed": seed, "grid": list(grid) if grid else None, "split": split, "eval_size": cfg.eval_size,
                   "batch_size": cfg.batch_size, "lr": cfg.lr, "k": cfg.k, "group_weight": cfg.group_weight,
                   "eval_every": cfg.eval_every, "eval_every_rollouts": cfg.eval_every_rollouts,
                   "allocator_params": cfg.allocator_params.get(cfg.allocator, {}), "wall_s": wall,
                   "resumed_from": res.resumed_from, "quick": quick, "started_at": started, "ended_at": _now(),
                   "commit": _commit(), "policy_sha256": data["policy_sha256"],
                   "warm_start": params.warmstart.seed, "train_prompts": len(data["train"]),
                   "target_sha256": hashlib.sha256(tp.read_bytes()).hexdigest() if tp.exists() else None})
    # the run's files are written atomically through fresh temporary names, replacing a link planted at their
    # names, never writing through it (rlvr_core.safefs)
    if (run_dir / "rollouts.parquet").exists():  # every run's decision log (a reference run's: the replayed trace)
        log, data = path.with_suffix(".rollouts.parquet"), (run_dir / "rollouts.parquet").read_bytes()
        write_atomic(log, data)
        result["decision_log"] = {"file": log.name, "sha256": hashlib.sha256(data).hexdigest()}
    write_text_atomic(path, json.dumps(result, default=_json_default) + "\n")
    return result


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _commit() -> str | None:
    """The code's git commit, with ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
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
            cum["updates"] += int(step_updated(r))
            for k in ("generate_s", "verify_s", "allocate_s", "update_s"):
                led[k] += r[k]
        led["eval_s"] += r.get("eval_s", 0.0)
        if "eval/greedy_acc" in r:
            curve.append({"step": r["step"], "updates": cum["updates"], "cum_rollouts": r["cum_rollouts"],
                          "cum_tokens": r["cum_tokens"], "cum_trained_tokens": cum["trained"],
                          "seconds": cum["seconds"], "greedy_acc": r["eval/greedy_acc"],
                          **{k[5:]: v for k, v in r.items() if k.startswith("eval/greedy_acc_d")}})
    return {"curve": curve, "ledger": _ledger(metrics, cum, led, params)}


def _ledger(metrics: Sequence[Mapping[str, Any]], cum: Mapping[str, Any], led: Mapping[str, float],
            params: int) -> dict[str, Any]:
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
    return ledger


# ----- the frozen files ----------------------------------------------------------------------------------
def set_target(store: RunStore, regime_name: str, refs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Freeze the regime's target from its reference (uniform GRPO) runs; an existing target is kept. It records
    the warm-started policy's digest: later runs of the regime must start from the same policy."""
    if (t := store.target(regime_name)) is not None:
        return t
    g = gain_target([r["curve"] for r in refs], TARGET_FRACTION)
    t = {"regime": regime_name, "target": g["target"], "rule": f"median start + {TARGET_FRACTION} x "
         "median gain at the end of the budget (mean of the last three evaluations) of the reference runs",
         "reference_seeds": sorted(int(r["seed"]) for r in refs), "start": g["start"], "gain": g["gain"],
         "budget_rollouts": int(np.median([r["ledger"]["rollouts"] for r in refs])),
         "policy_sha256": refs[0].get("policy_sha256"), "eval_every_rollouts": refs[0].get("eval_every_rollouts"),
         "set_at": _now()}
    return store.freeze(store.target_path(regime_name), t)


def check_policy(store: RunStore, regime_name: str, digest: str) -> None:
    """Refuse to add runs to a regime whose target was frozen from another warm-started policy (or from one
    it did not record: the step-grid regimes' policy was built on another machine and is not recoverable), unless
    ``verify_policy`` showed this one trains exactly as that one did."""
    t = store.target(regime_name)
    if t is None or digest in store.accepted_policies(regime_name):
        return
    frozen = t.get("policy_sha256")
    why = "recorded no policy digest (its warm start was built on another machine)" if frozen is None else \
        f"was frozen from policy {frozen[:12]}"
    raise SystemExit(f"regime {regime_name!r}: its target {why}, and this machine's warm start is {digest[:12]}; "
                     f"new runs would not be comparable. If the warm start was rebuilt from the same settings, "
                     f"--verify-policy reruns reference seed 0 and accepts it when the curve is identical; else use a "
                     f"warm-start variant (--warm-start J: regime {base_regime(regime_name)[0]}{WS_SEP}J) with its "
                     "own reference runs and target.")


# the fields of a curve point a rerun must reproduce exactly (wall-clock seconds differ from run to run)
TIMED = frozenset({"seconds"})


def curve_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *,
                     recorded_only: bool = False) -> str | None:
    """Where two runs' curves first differ, ignoring wall-clock time (None: identical); ``recorded_only``: on the
    fields ``b`` (the recorded run) holds only, so a field a later version added to ``a`` is not a difference."""
    if len(a) != len(b):
        return f"{len(a)} evaluations against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        keys = (set(y) if recorded_only else set(x) | set(y)) - TIMED
        if diff := sorted(k for k in keys if x.get(k) != y.get(k)):
            return f"evaluation {i} (step {x.get('step')}): {', '.join(f'{k} {x.get(k)} != {y.get(k)}' for k in diff)}"
    return None


def verify_policy(store: RunStore, regime_name: str, *, work: Path, params_file: Path = PARAMS_FILE,
                  log: Log = print) -> dict[str, Any]:
    """Accept this machine's warm start of ``regime_name`` when its digest differs from the one the target was
    frozen from (a file beside the weights changed: the transformers version in config.json, the sha256.json
    policy folders gained) but it trains the same: reference seed 0 is rerun from it in a scratch store, and
    ``policy.json`` is frozen only if the curve equals the recorded one at every evaluation (time aside)."""
    t = store.target(regime_name)
    recorded = store.run_file(regime_name, "reference", "grpo", 0)
    if t is None or not recorded.exists():
        raise SystemExit(f"regime {regime_name!r}: no frozen target or reference seed 0 to verify a policy against")
    data = D.load_data(regime_name, work, False, params_file)
    if data["policy_sha256"] in store.accepted_policies(regime_name):
        log(f"[{regime_name}] policy {data['policy_sha256'][:12]} is already accepted")
        return store.policy_record(regime_name) or {"policy_sha256": data["policy_sha256"]}
    scratch = RunStore(work / "verify-policy" / regime_name)
    shutil.rmtree(scratch.out, ignore_errors=True)
    t0 = time.perf_counter()
    rerun, _ = run_one(scratch, regime_name, "reference", "grpo", 0, work=scratch.out / "work", quick=False,
                       data=data, params_file=params_file)
    before = json.loads(recorded.read_text())
    if diff := curve_difference(rerun["curve"], before["curve"]):
        was = (t.get("policy_sha256") or "")[:12] or "the recorded policy"
        raise SystemExit(f"regime {regime_name!r}: policy {data['policy_sha256'][:12]} does not train as {was} did; "
                         f"reference seed 0 differs at {diff}")
    log(f"[{regime_name}] reference seed 0 rerun from policy {data['policy_sha256'][:12]}: the same "
        f"{len(before['curve'])} evaluations as recorded ({time.perf_counter() - t0:.0f} s)")
    return store.freeze(store.policy_path(regime_name), {
        "regime": regime_name, "policy_sha256": data["policy_sha256"], "recorded_policy_sha256": t.get("policy_sha256"),
        "rule": "reference seed 0 rerun from this policy: every evaluation equal to the recorded run's, wall-clock "
                "seconds aside", "evaluations": len(before["curve"]), "recorded_run_commit": before.get("commit"),
        "rerun_commit": _commit(), "verified_at": _now()})


def matched_sizes(store: RunStore, regime_name: str, entry: str) -> int:
    """The prompt batch of a matched-updates run, frozen in ``study/<regime>/matched.json`` from the reference
    (uniform GRPO) runs before any matched run: E = their median effective groups per update at batch B.
    ``matched-updates`` (grpo): round(B x B / E) prompts, whose expected effective groups equal the equal-batch
    allocators' B. ``matched-updates-small``: round(E) effective groups per update for the equal-batch allocators,
    what GRPO at B carries."""
    m = store.matched(regime_name)
    if m is None:
        runs = store.reference_runs(regime_name)
        if not runs:
            raise RuntimeError(f"regime {regime_name}: matched-updates needs the reference runs first")
        e = float(np.median([r["ledger"]["effective_groups_per_step"] for r in runs]))
        b = int(runs[0]["batch_size"])
        if e <= 0:
            raise RuntimeError(f"regime {regime_name}: the reference runs trained no effective group, so no batch "
                               "matches their effective groups per update")
        m = store.freeze(store.matched_path(regime_name), {
            "reference_batch": b, "effective_groups_per_update": e, "reference_seeds": [r["seed"] for r in runs],
            "matched-updates": max(1, round(b * b / e)), "matched-updates-small": max(1, round(e)), "set_at": _now()})
    return int(m[entry])


def preregister(store: RunStore, regime_name: str, data: Mapping[str, Any], quick: bool,
                params_file: Path = PARAMS_FILE) -> dict[str, Any]:
    """The regime's criteria (plan.Regime.criteria) on its reference runs, written once to
    ``study/<regime>/preregistration.json`` before any other allocator of the regime runs: the zero-variance
    share of k-groups at the start of RL (1,000 training prompts), and per reference run the evaluations below the
    frozen target before its fitted reach and the fitted reach itself."""
    if (pre := store.preregistration(regime_name)) is not None:
        return pre
    t = store.target(regime_name)
    params = regime_params(regime_name, params_file=params_file)
    k = params.train.k
    shares = D.start_shares(data["policy"], data["train"], k=k, n=50 if quick else 1000, task=params.prepare.task,
                            max_new_tokens=params.train.max_new_tokens)
    refs = store.reference_runs(regime_name)
    per_run = []
    for r in refs:
        x = reach(r["curve"], t["target"], fit=True)["cum_rollouts"]
        below = sum(1 for c in r["curve"][1:] if not c["cum_rollouts"] >= x)
        per_run.append({"seed": r["seed"], "fit_rollouts_to_target": x if math.isfinite(x) else None,
                        "evals_below_target": below})
    c = dict(regime(regime_name).criteria)
    med_x = median_interval([p["fit_rollouts_to_target"] for p in per_run])["median"]
    med_below = float(np.median([p["evals_below_target"] for p in per_run]))
    zv = shares["zero_variance_share"]
    pre = {"regime": regime_name, "criteria": c, "zero_variance_share": zv, "k": k, "train_prompts": len(data["train"]),
           "runs": per_run, "median_fit_rollouts_to_target": med_x, "median_evals_below_target": med_below,
           "meets": bool(zv >= c["min_zero_variance_share"] and med_below >= c["min_evals_below_target"]
                         and med_x is not None and med_x >= c["min_rise_rollouts"]), "set_at": _now()}
    pre["conditioning"] = conditioning(refs, t["target"])  # reported beside the criteria, declared after them
    if (extra := regime(regime_name).extra_criteria) is not None:
        pre["extra"] = cost_structure(refs, data, params, extra, quick)
        pre["meets"] = bool(pre["meets"] and pre["extra"]["meets"])
    return store.freeze(store.preregistration_path(regime_name), pre)


def cost_structure(refs: Sequence[Mapping[str, Any]], d: Mapping[str, Any], params: Any, extra: Mapping[str, float],
                   quick: bool) -> dict[str, Any]:
    """A regime's extra criteria (plan.Regime.extra_criteria) on its reference runs: each run's generation share of
    its training wall-clock (generate_s over generate + verify + allocate + update, evaluations excluded) and their
    median; and the failing and passing completions' median lengths at the start of RL (``data.start_lengths``:
    k samples on 1,000 training prompts, at the training temperature and max_new_tokens)."""
    shares = []
    for r in refs:
        led = r["ledger"]
        spent = sum(led[key] for key in ("generate_s", "verify_s", "allocate_s", "update_s"))
        shares.append({"seed": r["seed"], "generate_share": led["generate_s"] / spent if spent else None,
                       "generate_s": led["generate_s"], "update_s": led["update_s"], "train_s": spent,
                       "generated_tokens": led["generated_tokens"], "rollouts": led["rollouts"]})
    med_share = median_or_none([s["generate_share"] for s in shares])
    tr = params.train
    lengths = D.start_lengths(d["policy"], d["train"], task=params.prepare.task, k=tr.k, n=50 if quick else 1000,
                              max_new_tokens=tr.max_new_tokens, temperature=tr.temperature)
    ratio = lengths["fail_pass_length_ratio"]
    return {"criteria": dict(extra), "runs": shares, "median_generate_share": med_share, "start_lengths": lengths,
            "meets": bool(med_share is not None and med_share >= extra["min_generate_share"]
                          and ratio is not None and ratio >= extra["min_fail_pass_length_ratio"])}


def _best(target: float, candidates: Sequence[tuple[Any, Sequence[Mapping[str, Any]]]]) -> tuple[Any, ...] | None:
    """(key, candidate, median validation rollouts-to-target, mean validation accuracy, runs) of the candidate whose
    validation runs reach ``target`` in the fewest median rollouts (unreached: infinite); ties and all-unreached
    broken by the highest mean validation accuracy over the run. None when no candidate has a run."""
    best = None
    for cand, runs in candidates:
        if not runs:
            continue
        r2t = [reach(r["curve"], target)["cum_rollouts"] for r in runs]
        med = median_ci(r2t, n_boot=1)["median"]
        mean_acc = float(np.mean([np.mean([c["greedy_acc"] for c in r["curve"]]) for r in runs]))
        key = (math.inf if med is None else med, -mean_acc)
        if best is None or key < best[0]:
            best = (key, cand, med, mean_acc, len(runs))
    return best


def choose_grid(store: RunStore, regime_name: str, quick: bool, label: str) -> dict[str, Any]:
    """The grid point of ``label`` chosen on the validation split (``_best``'s rule)."""
    target = store.target(regime_name)["target"]
    best = _best(target, [(g, store.grid_runs(regime_name, label, g)) for g in grid_points(quick)])
    return {"grid": list(best[1]) if best else None,
            "validation_rollouts_to_target": best[2] if best else None,
            "validation_mean_accuracy": best[3] if best else None, "runs": best[4] if best else 0}


def choose_group_size(store: RunStore, regime_name: str) -> dict[str, Any]:
    """The group-size protocol's best k of a regime, chosen on the validation split by ``_best``'s rule, and
    every k's validation figures beside it."""
    target = store.target(regime_name)["target"]
    per_k = {}
    for lab in labels("group-size", regime_name):
        runs = store.validation_runs(regime_name, "group-size", lab)
        one = _best(target, [(lab, runs)])
        per_k[lab] = {"k": VARIANTS[lab].train.get("k", 8), "runs": len(runs),
                      "validation_rollouts_to_target": one[2] if one else None,
                      "validation_mean_accuracy": one[3] if one else None}
    best = _best(target, [(lab, store.validation_runs(regime_name, "group-size", lab)) for lab in per_k])
    return {"best": best[1] if best else None, "k": per_k[best[1]]["k"] if best else None, "candidates": per_k}


def record_group_size(store: RunStore, regime_name: str) -> dict[str, Any]:
    """Choose the regime's best k and write ``study/<regime>/group-size/choice.json``."""
    return store.freeze(store.choice_path(regime_name, "group-size"), choose_group_size(store, regime_name),
                        sort_keys=True)


def record_choice(store: RunStore, regime_name: str, quick: bool, label: str) -> dict[str, Any]:
    """Choose ``label``'s grid point and add it to ``study/<regime>/tuned/choice.json``."""
    choice = choose_grid(store, regime_name, quick, label)
    known = store.choice(regime_name)
    known[label] = choice
    store.freeze(store.choice_path(regime_name), known, sort_keys=True)
    return choice


# ----- the protocol driver -------------------------------------------------------------------------------
class _Driver:
    """The runs of one (regime, protocol) invocation: each skipped when its file exists, counted in the log."""

    def __init__(self, store: RunStore, regime_name: str, seeds: Sequence[int], *, work: Path, quick: bool,
                 params_file: Path, log: Log) -> None:
        self.store, self.regime, self.seeds, self.work, self.quick = store, regime_name, seeds, work, quick
        self.params_file, self.log = params_file, log
        self.data = D.load_data(regime_name, work, quick, params_file)
        check_policy(store, regime_name, self.data["policy_sha256"])
        self.n = self.total = 0

    def preregister(self) -> None:
        log_preregistration(preregister(self.store, self.regime, self.data, self.quick, self.params_file), self.log)

    def freeze_target(self) -> None:
        refs = wait_for_references(self.store, self.regime, self.seeds, self.log)
        t = set_target(self.store, self.regime, refs)
        self.log(f"[{self.regime}] target frozen at {t['target']:.4f} from {len(refs)} reference runs")
        if not step_grid(self.regime):
            self.preregister()

    def go(self, proto: str, lab: str, s: int, g: tuple[int, float] | None, split: str) -> None:
        self.n += 1
        if proto != "reference" and self.store.target(self.regime) is None:
            self.freeze_target()
        t0 = time.perf_counter()
        res, trained = run_one(self.store, self.regime, proto, lab, s, work=self.work, quick=self.quick, grid=g,
                               split=split, data=self.data, params_file=self.params_file)
        tag = f"[{self.regime}/{proto} {self.n}/{self.total}] {lab}{grid_tag(g)} seed {s} ({split})"
        if not res:
            self.log(f"{tag}: running in another study process")
            return
        c = res["curve"]
        self.log(f"{tag}: {'trained' if trained else 'skipped (done)'}; acc {c[0]['greedy_acc']:.3f} -> "
                 f"{c[-1]['greedy_acc']:.3f}, {res['ledger']['rollouts']} rollouts, {res['ledger']['updates']} "
                 "updates" + (f", {time.perf_counter() - t0:.0f} s" if trained else ""))

    def tuned(self, labels: Sequence[str]) -> None:
        """One allocator at a time: its grid on the validation split, its choice, then its test runs."""
        for lab in labels:
            for g in grid_points(self.quick):
                for s in grid_seeds(self.quick):
                    self.go("tuned", lab, s, g, "validation")
            while locks := self.store.validation_locks(self.regime, lab):
                self.log(f"[{self.regime}/tuned] {lab}: waiting for {len(locks)} validation run(s) of another study "
                         "process")
                time.sleep(15)
            choice = record_choice(self.store, self.regime, self.quick, lab)
            g = tuple(choice["grid"]) if choice["grid"] else None
            self.log(f"[{self.regime}/tuned] {lab}: chose {grid_tag(g) or 'nothing'} on the validation split")
            for s in self.seeds:
                self.go("tuned", lab, s, g, "test")


    def group_size(self, labs: Sequence[str]) -> None:
        """Every k's validation runs, the best k's choice, then the test runs of the k other than 8 (k = 8's are
        the reference runs)."""
        for lab in labs:
            for s in grid_seeds(self.quick):
                self.go("group-size", lab, s, None, "validation")
        while locks := self.store.held(self.store.run_file(self.regime, "group-size", lab, s, None, "validation")
                                       for lab in labs for s in grid_seeds(self.quick)):
            self.log(f"[{self.regime}/group-size] waiting for {len(locks)} validation run(s) of another study process")
            time.sleep(15)
        missing = [lab for lab in labels("group-size", self.regime)
                   if len(self.store.validation_runs(self.regime, "group-size", lab)) < len(grid_seeds(self.quick))]
        if missing:  # a choice among some k only would not be the best k: it waits for the rest
            self.log(f"[{self.regime}/group-size] no choice yet: validation runs missing for {missing}")
        else:
            choice = record_group_size(self.store, self.regime)
            self.log(f"[{self.regime}/group-size] chose {choice['best']} (k = {choice['k']}) on the validation split")
        for lab in labs:
            if lab != "grpo":
                for s in self.seeds:
                    self.go("group-size", lab, s, None, "test")


    def grpo_tuning(self, oracle: bool = True) -> None:
        """The tuned uniform GRPO of one warm start (benchmarks/study/tuning.py): the one-pass grid's validation
        runs (the reference configuration's first, so that the validation target is frozen early), the (k, lr)
        choice, the second pass's validation runs, the final choice, then the test runs: the chosen configuration's
        and, with ``oracle``, every one-pass configuration's and two passes at the test-best one-pass (k, lr).
        Each step waits for nothing: a run another study process holds is left to it, and a choice whose runs are
        missing is made by a later invocation."""
        first = [T.REFERENCE_CONFIG, *(c for c in T.one_pass() if c != T.REFERENCE_CONFIG)]
        todo = [(c, s) for c in first for s in T.missing_validation(self.store, self.regime, c)]
        self.total += len(todo)
        for c, s in todo:
            self.go(T.PROTOCOL, tune_label(*c), s, None, "validation")
        kl = T.choose_k_lr(self.store, self.regime)
        if kl is None:
            self.log(f"[{self.regime}/{T.PROTOCOL}] no (k, lr) choice yet: validation runs missing")
            return
        self.log(f"[{self.regime}/{T.PROTOCOL}] chose {kl['best']} (k = {kl['k']}, lr {kl['lr']:g}) on the "
                 "validation split")
        second = T.two_pass((kl["k"], kl["lr"], 1))
        self.total += len(T.missing_validation(self.store, self.regime, second))
        for s in T.missing_validation(self.store, self.regime, second):
            self.go(T.PROTOCOL, tune_label(*second), s, None, "validation")
        choice = T.choose(self.store, self.regime)
        if choice is None:
            self.log(f"[{self.regime}/{T.PROTOCOL}] no final choice yet: two-pass validation runs missing")
            return
        self.log(f"[{self.regime}/{T.PROTOCOL}] chose {choice['best']} ({choice['epochs']} pass(es) per batch)")
        cells = T.cells_to_test(choice) if oracle else [T.config_of(choice["best"])]
        self.total += len(cells) * len(self.seeds)
        for c in cells:
            for s in self.seeds:
                self.go(T.test_protocol(c), tune_label(*c), s, None, "test")
        if oracle and (extra := T.oracle_two_pass(self.store, self.regime, self.seeds)) is not None:
            self.total += len(self.seeds)
            for s in self.seeds:
                self.go(T.PROTOCOL, tune_label(*extra), s, None, "test")


def run_replication_cells(store: RunStore, regime_name: str, seeds: Sequence[int],
                          cells: Sequence[tuple[str, str]], *, work: Path, quick: bool, params_file: Path = PARAMS_FILE,
                          log: Log = print) -> None:
    """One admitted warm start of the confirmatory replication (benchmarks/study/replication.py): the reference
    runs at ``seeds``, the tuned uniform GRPO's choice and chosen test cell at ``seeds`` (no oracle cells), then each
    (protocol, label) of ``cells`` at ``seeds`` (from the protocol's first seed), each skipped when its file
    exists."""
    drv = _Driver(store, regime_name, seeds, work=work, quick=quick, params_file=params_file, log=log)
    drv.total = len(seeds) * (1 + len(cells))
    for s in seeds:
        drv.go("reference", "grpo", s, None, "test")
    drv.grpo_tuning(oracle=False)
    for protocol, label in cells:
        for s in seeds:
            drv.go(protocol, label, PROTOCOLS[protocol].first_seed + s, None, "test")


def run_protocol(regime_name: str, protocol: str, seeds: Sequence[int], *, out: Path, work: Path, quick: bool,
                 params_file: Path = PARAMS_FILE, log: Log = print, variants: Sequence[str] | None = None) -> None:
    """Reference runs, the frozen target, then the protocol's runs (each skipped when its file exists).

    ``variants`` restricts the protocol to some of its allocators, run in the order given. ``tuned`` goes one
    allocator at a time: its grid on the validation split, its choice, then its test runs, so that a partial
    study already reports finished allocators.
    """
    if protocol == T.PROTOCOL:
        T.check_regime(regime_name)
    store = RunStore(out)
    drv = _Driver(store, regime_name, seeds, work=work, quick=quick, params_file=params_file, log=log)
    labels = select(protocol, regime_name, quick, variants)
    refs = [("reference", "grpo", s, None, "test") for s in seeds]
    if protocol == T.PROTOCOL:
        drv.total = len(refs)
        for item in refs:
            drv.go(*item)
        drv.grpo_tuning()
    elif protocol == "group-size":
        drv.total = len(refs) + len(labels) * len(grid_seeds(quick)) + (len(labels) - ("grpo" in labels)) * len(seeds)
        for item in refs:
            drv.go(*item)
        drv.group_size(labels)
    elif protocol != "tuned":
        first = PROTOCOLS[protocol].first_seed
        todo = refs + ([(protocol, lab, first + s, None, "test") for lab in labels for s in seeds]
                       if protocol != "reference" else [])
        drv.total = len(todo)
        for item in todo:
            drv.go(*item)
    else:
        drv.total = len(refs) + len(labels) * (len(grid_points(quick)) * len(grid_seeds(quick)) + len(seeds))
        for item in refs:
            drv.go(*item)
        drv.tuned(labels)
    if protocol == "reference" and store.target(regime_name) is None:
        # every seed's run, those another study process still trains included: a target frozen from the runs that
        # happen to be finished would read fewer than the declared reference seeds
        set_target(store, regime_name, wait_for_references(store, regime_name, seeds, log))
    if not step_grid(regime_name) and store.target(regime_name) is not None:
        drv.preregister()


def log_preregistration(pre: Mapping[str, Any], log: Log) -> None:
    extra = pre.get("extra")

    def two(v: float | None) -> str:
        return "none" if v is None else f"{v:.2f}"

    more = "" if extra is None else (
        f", median generation share {two(extra['median_generate_share'])}, failing/passing median length "
        f"{two(extra['start_lengths']['fail_pass_length_ratio'])}")
    x = pre["median_fit_rollouts_to_target"]
    reach_s = "never" if x is None or not math.isfinite(x) else f"{x:,.0f} rollouts"
    log(f"[{pre['regime']}] pre-registration (uniform GRPO only): meets the criteria: {pre['meets']} (zero-variance "
        f"share {pre['zero_variance_share']:.2f}, median {pre['median_evals_below_target']:.0f} evaluations below the "
        f"target, median fitted reach {reach_s}{more})")


def wait_for_references(store: RunStore, regime_name: str, seeds: Sequence[int], log: Log,
                        poll_s: float = 15.0) -> list[dict]:
    """The reference runs of ``seeds``, waiting while another study process still trains some of them."""
    while True:
        paths = {s: store.run_file(regime_name, "reference", "grpo", s) for s in seeds}
        missing = [s for s, p in paths.items() if not p.exists()]
        if not missing:
            return [json.loads(paths[s].read_text()) for s in seeds]
        held = [s for s in missing if paths[s].with_suffix(".lock").exists()]
        if len(held) < len(missing):
            raise RuntimeError(f"reference runs {missing} of regime {regime_name} are missing; run the reference "
                               "first")
        log(f"[{regime_name}] waiting for reference seeds {held} (another study process)")
        time.sleep(poll_s)
