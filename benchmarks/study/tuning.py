"""The tuned uniform GRPO (protocol ``grpo-tuning``, docs/training-study.md "The tuned uniform GRPO"): its cells,
its validation target and its choices, each frozen before the runs that depend on it.

Per warm start of plan.TUNE_WARM_STARTS:

1. the validation runs of every (k, lr) of plan.TUNE_K x plan.TUNE_LR at one pass, seeds plan.TUNE_SEEDS (the
   group-size grid's validation runs of k at lr 1e-4 count for their seeds 100 and 101);
2. ``validation_target.json``: the target rule (rlvr_core.stats.gain_target) applied to the validation runs of the
   reference configuration (k = 8, lr 1e-4, one pass), frozen once all of them exist;
3. ``choice-k-lr.json``: the (k, lr) whose validation runs reach that target in the fewest median fitted rollouts
   (the headline's statistic; ties and unreached ones go to the higher mean validation accuracy);
4. the validation runs of that (k, lr) at two passes per batch, then ``choice.json``: two passes only when their
   median fitted reach is strictly lower;
5. test runs, seeds 0-4: the chosen configuration's, then every other one-pass configuration's, then two passes at
   the test-best one-pass (k, lr) (the oracle bound reads the test-best configuration of these).

Every file lives under study/<regime>/grpo-tuning/. The test cells of k = 8, lr 1e-4, one pass are the reference
runs, and of k in (2, 4) at lr 1e-4 the group-size grid's (plan.PROTOCOLS' shares).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.study.plan import (
    TUNE_CONFIGS,
    TUNE_EPOCHS,
    TUNE_LR_DEFAULT,
    TUNE_SEEDS,
    TUNE_WARM_STARTS,
    tune_label,
)
from benchmarks.study.stats import reach
from benchmarks.study.store import RunStore
from rlvr_core.stats import TARGET_FRACTION, gain_target

PROTOCOL = "grpo-tuning"
SHARED_VALIDATION = "group-size"  # the protocol whose validation runs of k at lr 1e-4, one pass, count here
REFERENCE_CONFIG = (8, TUNE_LR_DEFAULT, 1)
TEST_SEEDS = tuple(range(5))  # the seeds every configuration's test cell holds: the oracle reads these
Config = tuple[int, float, int]


def check_regime(regime: str) -> None:
    """Refuse a regime outside the declared warm starts, before any run."""
    if regime not in TUNE_WARM_STARTS:
        raise SystemExit(f"protocol {PROTOCOL!r} runs on the declared warm starts {list(TUNE_WARM_STARTS)} only, "
                         f"not {regime!r} (plan.TUNE_WARM_STARTS)")


def one_pass() -> list[Config]:
    return [c for c in TUNE_CONFIGS if c[2] == 1]


def shared(config: Config) -> bool:
    """Whether a configuration's runs are also the group-size grid's (k at lr 1e-4, one pass)."""
    return config[1] == TUNE_LR_DEFAULT and config[2] == 1


def validation_runs(store: RunStore, regime: str, config: Config) -> list[dict[str, Any]]:
    """The validation runs of one configuration at plan.TUNE_SEEDS, read now: its own, and the group-size grid's
    where it shares them, in seed order."""
    lab = tune_label(*config)
    protos = (SHARED_VALIDATION, PROTOCOL) if shared(config) else (PROTOCOL,)
    by_seed = {}
    for proto in protos:
        for p in sorted(store.run_file(regime, proto, lab, 0, None, "validation").parent.glob("s*.json")):
            run = json.loads(p.read_text())
            if int(run["seed"]) in TUNE_SEEDS:
                by_seed.setdefault(int(run["seed"]), run)
    return [by_seed[s] for s in sorted(by_seed)]


def missing_validation(store: RunStore, regime: str, config: Config) -> list[int]:
    """The seeds of plan.TUNE_SEEDS a configuration has no validation run of yet."""
    have = {int(r["seed"]) for r in validation_runs(store, regime, config)}
    return [s for s in TUNE_SEEDS if s not in have]


def frozen_path(store: RunStore, regime: str, name: str) -> Path:
    """A frozen file of the protocol: study/<regime>/grpo-tuning/<name>."""
    return store.root / regime / PROTOCOL / name


def read_frozen(store: RunStore, regime: str, name: str) -> dict[str, Any] | None:
    p = frozen_path(store, regime, name)
    return json.loads(p.read_text()) if p.exists() else None


def validation_target(store: RunStore, regime: str) -> dict[str, Any] | None:
    """The frozen validation target, set now if the reference configuration's validation runs are all there (None
    until then)."""
    if (t := read_frozen(store, regime, "validation_target.json")) is not None:
        return t
    refs = validation_runs(store, regime, REFERENCE_CONFIG)
    if len(refs) < len(TUNE_SEEDS):
        return None
    g = gain_target([r["curve"] for r in refs], TARGET_FRACTION)
    t = {"regime": regime, "target": g["target"], "start": g["start"], "gain": g["gain"],
         "rule": f"median start + {TARGET_FRACTION} x median gain at the end of the budget (mean of the last three "
                 "evaluations) of the validation runs of k = 8, lr 1e-4, one pass",
         "seeds": [int(r["seed"]) for r in refs]}
    return store.freeze(frozen_path(store, regime, "validation_target.json"), t)


def score(runs: Sequence[Mapping[str, Any]], target: float) -> dict[str, Any]:
    """A configuration's validation figures: the median fitted reach of the target in rollouts (None: the median
    run never reaches it), each seed's, and the mean validation accuracy over the runs' evaluations."""
    xs = [reach(r["curve"], target, fit=True)["cum_rollouts"] for r in runs]
    med = float(np.median(xs)) if xs else math.inf
    return {"runs": len(runs), "seeds": [int(r["seed"]) for r in runs],
            "fit_rollouts_to_target": [x if math.isfinite(x) else None for x in xs],
            "median_fit_rollouts_to_target": med if math.isfinite(med) else None,
            "mean_accuracy": float(np.mean([np.mean([c["greedy_acc"] for c in r["curve"]]) for r in runs]))}


def rank_key(s: Mapping[str, Any]) -> tuple[float, float]:
    """Fewer median fitted rollouts first (unreached: last); ties go to the higher mean validation accuracy."""
    m = s["median_fit_rollouts_to_target"]
    return (math.inf if m is None else m, -s["mean_accuracy"])


def config_record(config: Config) -> dict[str, Any]:
    k, lr, e = config
    return {"label": tune_label(*config), "k": k, "lr": lr, "epochs": e}


def choose_k_lr(store: RunStore, regime: str) -> dict[str, Any] | None:
    """The frozen (k, lr) choice, made now if the target and every one-pass configuration's validation runs are
    there (None until then)."""
    if (c := read_frozen(store, regime, "choice-k-lr.json")) is not None:
        return c
    t = validation_target(store, regime)
    if t is None or any(missing_validation(store, regime, c) for c in one_pass()):
        return None
    cands = {tune_label(*c): {**config_record(c), **score(validation_runs(store, regime, c), t["target"])}
             for c in one_pass()}
    best = min(cands.values(), key=rank_key)
    return store.freeze(frozen_path(store, regime, "choice-k-lr.json"),
                        {"regime": regime, "target": t["target"], "best": best["label"], "k": best["k"],
                         "lr": best["lr"], "candidates": cands}, sort_keys=True)


def two_pass(config: Config) -> Config:
    return (config[0], config[1], max(TUNE_EPOCHS))


def choose(store: RunStore, regime: str) -> dict[str, Any] | None:
    """The frozen final choice (k, lr, passes per batch), made now if the (k, lr) choice and its two-pass
    validation runs are there (None until then)."""
    if (c := read_frozen(store, regime, "choice.json")) is not None:
        return c
    kl = choose_k_lr(store, regime)
    if kl is None:
        return None
    one = (kl["k"], kl["lr"], 1)
    if missing_validation(store, regime, two_pass(one)):
        return None
    target = kl["target"]
    cands = {tune_label(*c): {**config_record(c), **score(validation_runs(store, regime, c), target)}
             for c in (one, two_pass(one))}
    a, b = cands[tune_label(*one)], cands[tune_label(*two_pass(one))]
    best = b if rank_key(b)[0] < rank_key(a)[0] else a
    return store.freeze(frozen_path(store, regime, "choice.json"),
                        {"regime": regime, "target": target, "best": best["label"], "k": best["k"],
                         "lr": best["lr"], "epochs": best["epochs"], "candidates": cands}, sort_keys=True)


def config_of(label: str) -> Config:
    for c in TUNE_CONFIGS:
        if tune_label(*c) == label:
            return c
    raise KeyError(f"{label!r} is not a configuration of the tuned uniform GRPO")


def cells_to_test(choice: Mapping[str, Any] | None) -> list[Config]:
    """The test cells to run, in order: the chosen configuration (when chosen), then every one-pass configuration
    (the oracle's). Two passes at the test-best one-pass (k, lr) follow once those exist (``oracle_two_pass``)."""
    first = [config_of(choice["best"])] if choice else []
    return list(dict.fromkeys([*first, *one_pass()]))


def test_protocol(config: Config) -> str:
    """The protocol whose folder holds a configuration's test runs: the reference runs' for k = 8, lr 1e-4, one
    pass, the group-size grid's for k in (2, 4) there, else this protocol's."""
    if config == REFERENCE_CONFIG:
        return "reference"
    return SHARED_VALIDATION if shared(config) else PROTOCOL


def test_runs(store: RunStore, regime: str, config: Config, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """The test runs of one configuration at ``seeds``, read now, in seed order."""
    lab = tune_label(*config)
    files = [store.run_file(regime, test_protocol(config), lab, s) for s in seeds]
    return [json.loads(p.read_text()) for p in files if p.exists()]


def test_best(store: RunStore, regime: str, configs: Sequence[Config], seeds: Sequence[int]) -> Config | None:
    """The test-best of ``configs`` by the headline's statistic against the regime's test target, among those whose
    test runs hold every one of ``seeds``, once every one-pass configuration's do (None until then). Ties go as
    ``rank_key`` says, then to the earlier of ``configs``."""
    t = store.target(regime)
    if t is None:
        return None
    full = {c: runs for c in configs if len(runs := test_runs(store, regime, c, seeds)) == len(seeds)}
    if any(c not in full for c in one_pass()):
        return None
    return min(full, key=lambda c: rank_key(score(full[c], t["target"])))


def oracle_two_pass(store: RunStore, regime: str, seeds: Sequence[int]) -> Config | None:
    """Two passes at the test-best one-pass (k, lr) (None until every one-pass configuration has its test runs at
    ``seeds``)."""
    best = test_best(store, regime, one_pass(), seeds)
    return None if best is None else two_pass(best)


def chosen_config(store: RunStore, regime: str) -> Config | None:
    """The configuration a warm start chose on its validation split (choice.json; None before the choice)."""
    ch = read_frozen(store, regime, "choice.json")
    return config_of(ch["best"]) if ch else None


def oracle_config(store: RunStore, regime: str, seeds: Sequence[int] = TEST_SEEDS) -> Config | None:
    """The test-best configuration of the whole grid (``test_best`` over TUNE_CONFIGS): a bound, chosen on the split
    it is read on."""
    return test_best(store, regime, TUNE_CONFIGS, seeds)


def baseline_runs(store: RunStore, regime: str, config: Config | None,
                  seeds: Sequence[int] = TEST_SEEDS) -> list[dict[str, Any]]:
    """A configuration's test cell read as a baseline: every test run of it (the seeds beyond ``seeds`` too), once
    it holds each of ``seeds`` (else none: a partial cell is not read)."""
    if config is None or len(test_runs(store, regime, config, seeds)) < len(seeds):
        return []
    return store.cell(regime, test_protocol(config), tune_label(*config))
