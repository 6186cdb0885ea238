"""The tuned uniform GRPO (docs/training-study.md, "The tuned uniform GRPO"): the k x lr grid at 256 rollouts per
update and the second pass, its validation target, and its choices by the fitted reach on the validation split
only, each frozen before the runs that depend on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.study import execute, plan
from benchmarks.study import tuning as T
from benchmarks.study.store import RunStore
from rlvr_core.registry import slug

WS = "pool-ws2"
REF = [0.3, 0.4, 0.5, 0.5, 0.5]  # start 0.3, gain 0.2: the validation target is 0.3 + 0.8 x 0.2 = 0.46


def _curve(accs: list[float]) -> list[dict[str, float]]:
    return [{"step": i, "updates": i, "cum_rollouts": 1000 * i, "cum_tokens": 4000 * i, "cum_trained_tokens": 0,
             "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]


def _write(store: RunStore, protocol: str, label: str, seed: int, accs: list[float], split: str) -> None:
    path = store.run_file(WS, protocol, label, seed, None, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"regime": WS, "protocol": protocol, "variant": label, "seed": seed, "split": split,
                                "curve": _curve(accs), "ledger": {"rollouts": 1000 * len(accs)}, "grid": None,
                                "eval_size": 1000 if split == "validation" else 2000}))


def _validation(store: RunStore, config: T.Config, accs: list[float], seeds=plan.TUNE_SEEDS) -> None:
    """Validation runs where the driver puts them: seeds 100 and 101 of a shared configuration in the group-size
    grid's folder, every other one in grpo-tuning's."""
    for s in seeds:
        proto = T.SHARED_VALIDATION if T.shared(config) and s in plan.GRID_SEEDS else T.PROTOCOL
        _write(store, proto, plan.tune_label(*config), s, accs, "validation")


def _store(tmp_path: Path) -> RunStore:
    store = RunStore(tmp_path)
    store.freeze(store.target_path(WS), {"regime": WS, "target": 0.9})  # the test target: never read by a choice
    return store


def test_every_configuration_spends_256_rollouts_per_update_at_its_lr_and_passes() -> None:
    assert len(plan.TUNE_CONFIGS) == 18 and len({plan.tune_label(*c) for c in plan.TUNE_CONFIGS}) == 18
    for k, lr, e in plan.TUNE_CONFIGS:
        lab = plan.tune_label(k, lr, e)
        t = execute.run_params(WS, lab, 0, protocol=T.PROTOCOL).train
        assert (t.allocator, t.k, t.lr, t.epochs) == ("grpo", k, lr, e), lab
        assert t.batch_size * t.k == plan.ROLLOUTS_PER_UPDATE and t.eval_every_rollouts == plan.EVAL_GRID
        slug(lab)  # a valid folder name
    # the reference configuration and the group-size grid's cells keep their labels (their runs count here)
    assert [plan.tune_label(k, 1e-4, 1) for k in plan.TUNE_K] == ["grpo[k2]", "grpo[k4]", "grpo"]
    assert plan.tune_label(2, 5e-5, 2) == "grpo[k2_lr5e-5_e2]" and plan.tune_label(8, 2e-4, 1) == "grpo[lr2e-4]"
    assert set(plan.labels(T.PROTOCOL, WS)) == {plan.tune_label(*c) for c in plan.TUNE_CONFIGS} - {
        "grpo", "grpo[k2]", "grpo[k4]"}
    assert [T.test_protocol(c) for c in ((8, 1e-4, 1), (4, 1e-4, 1), (4, 1e-4, 2), (8, 2e-4, 1))] == [
        "reference", "group-size", T.PROTOCOL, T.PROTOCOL]


def test_a_regime_outside_the_declared_warm_starts_is_refused_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="declared warm starts"):
        execute.run_protocol("pool", T.PROTOCOL, range(5), out=tmp_path, work=tmp_path / "w", quick=True)
    assert not any(tmp_path.iterdir())


def test_the_group_size_grid_s_validation_runs_count_and_other_seeds_do_not(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _validation(store, T.REFERENCE_CONFIG, REF, seeds=(100, 101))
    assert T.missing_validation(store, WS, T.REFERENCE_CONFIG) == [102]
    _write(store, T.PROTOCOL, "grpo", 7, REF, "validation")  # not a selection seed
    _write(store, T.PROTOCOL, "grpo", 3, REF, "test")  # the test split
    assert T.validation_target(store, WS) is None  # frozen only once all three exist
    _write(store, T.PROTOCOL, "grpo", 102, REF, "validation")
    assert [r["seed"] for r in T.validation_runs(store, WS, T.REFERENCE_CONFIG)] == [100, 101, 102]
    t = T.validation_target(store, WS)
    assert t["target"] == pytest.approx(0.46) and t["seeds"] == [100, 101, 102]
    # frozen: other runs added later do not move it
    _write(store, T.PROTOCOL, "grpo", 102, [0.0, 0.9, 0.9], "validation")
    assert T.validation_target(store, WS)["target"] == pytest.approx(0.46)
    # a configuration of its own keeps none of the group-size grid's runs
    _write(store, T.SHARED_VALIDATION, "grpo[k2_lr2e-4]", 100, REF, "validation")
    assert T.validation_runs(store, WS, (2, 2e-4, 1)) == []


def test_the_k_lr_choice_reads_the_fitted_reach_of_the_validation_target_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    rest = [c for c in T.one_pass() if c not in (T.REFERENCE_CONFIG, (4, 2e-4, 1), (2, 5e-5, 1))]
    _validation(store, T.REFERENCE_CONFIG, REF)
    for c in rest:
        _validation(store, c, [0.3, 0.35, 0.4, 0.4, 0.4])  # never reaches 0.46
    # a spike: its first crossing is at 1,000 rollouts, but its isotonic fit crosses 0.46 at 3,300
    _validation(store, (2, 5e-5, 1), [0.3, 0.6, 0.3, 0.3, 0.6])
    assert T.choose_k_lr(store, WS) is None  # (4, 2e-4) has no runs yet: no choice
    _validation(store, (4, 2e-4, 1), [0.3, 0.45, 0.5, 0.5, 0.5], seeds=(100, 101))
    assert T.choose_k_lr(store, WS) is None  # nor with two of its three seeds
    _validation(store, (4, 2e-4, 1), [0.3, 0.45, 0.5, 0.5, 0.5], seeds=(102,))
    for s in range(5):  # the test split: k = 2 at lr 5e-5 best by far there; it must not move the choice
        _write(store, T.PROTOCOL, "grpo[k2_lr5e-5]", s, [0.9] * 5, "test")
    kl = T.choose_k_lr(store, WS)
    assert (kl["best"], kl["k"], kl["lr"]) == ("grpo[k4_lr2e-4]", 4, 2e-4)
    cands = kl["candidates"]
    assert cands["grpo[k4_lr2e-4]"]["median_fit_rollouts_to_target"] == pytest.approx(1200)
    assert cands["grpo[k2_lr5e-5]"]["median_fit_rollouts_to_target"] > cands["grpo"][
        "median_fit_rollouts_to_target"] > cands["grpo[k4_lr2e-4]"]["median_fit_rollouts_to_target"]
    assert cands["grpo[k2]"]["median_fit_rollouts_to_target"] is None and cands["grpo[k2]"]["runs"] == 3
    assert T.frozen_path(store, WS, "choice-k-lr.json") == store.root / WS / "grpo-tuning" / "choice-k-lr.json"
    assert json.loads(T.frozen_path(store, WS, "choice-k-lr.json").read_text())["best"] == "grpo[k4_lr2e-4]"


def test_a_tie_goes_to_the_highest_mean_validation_accuracy(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _validation(store, T.REFERENCE_CONFIG, [0.3, 0.25, 0.2, 0.2, 0.2])  # target 0.3 + 0.8 x -0.1: reached at once
    for c in T.one_pass():
        if c != T.REFERENCE_CONFIG:
            _validation(store, c, [0.3, 0.32, 0.33, 0.34, 0.35] if c == (2, 2e-4, 1) else [0.3, 0.31, 0.31, 0.31, 0.31])
    t = T.validation_target(store, WS)["target"]
    assert t == pytest.approx(0.22)  # every run starts above it: all reach it at 0 rollouts, a tie
    assert T.choose_k_lr(store, WS)["best"] == "grpo[k2_lr2e-4]"


def _chosen_k_lr(store: RunStore) -> None:
    _validation(store, T.REFERENCE_CONFIG, REF)
    for c in T.one_pass():
        if c != T.REFERENCE_CONFIG:
            _validation(store, c, [0.3, 0.35, 0.4, 0.4, 0.4])


def test_two_passes_are_kept_only_when_strictly_faster(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _chosen_k_lr(store)
    assert T.choose_k_lr(store, WS)["best"] == "grpo"
    assert T.choose(store, WS) is None  # its two-pass runs are missing
    _validation(store, (8, 1e-4, 2), REF)  # equal reach: one pass stays
    c = T.choose(store, WS)
    assert (c["best"], c["epochs"]) == ("grpo", 1) and set(c["candidates"]) == {"grpo", "grpo[e2]"}
    other = RunStore(tmp_path / "b")
    other.freeze(other.target_path(WS), {"regime": WS, "target": 0.9})
    _chosen_k_lr(other)
    _validation(other, (8, 1e-4, 2), [0.3, 0.5, 0.5, 0.5, 0.5])
    c = T.choose(other, WS)
    assert (c["best"], c["k"], c["lr"], c["epochs"]) == ("grpo[e2]", 8, 1e-4, 2)
    assert T.cells_to_test(c)[0] == (8, 1e-4, 2) and len(T.cells_to_test(c)) == 10


def test_the_oracle_s_two_pass_cell_is_at_the_test_best_one_pass_configuration(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.freeze(store.target_path(WS), {"regime": WS, "target": 0.46})
    for c in T.one_pass():
        for s in range(5):
            accs = [0.3, 0.5, 0.5, 0.5, 0.5] if c == (4, 5e-5, 1) else REF
            if s < 4 or c != (2, 2e-4, 1):
                _write(store, T.test_protocol(c), plan.tune_label(*c), s, accs, "test")
    assert T.oracle_two_pass(store, WS, range(5)) is None  # one cell lacks a seed
    _write(store, T.PROTOCOL, "grpo[k2_lr2e-4]", 4, REF, "test")
    assert T.oracle_two_pass(store, WS, range(5)) == (4, 5e-5, 2)


def test_the_summary_reads_each_pick_against_the_reference_runs_and_checks_the_choice(tmp_path: Path) -> None:
    from benchmarks import grpo_tuning as G

    store = _store(tmp_path)
    store.freeze(store.target_path(WS), {"regime": WS, "target": 0.46})
    _chosen_k_lr(store)  # validation: k = 8, lr 1e-4, one pass; then two passes strictly faster
    _validation(store, (8, 1e-4, 2), [0.3, 0.5, 0.5, 0.5, 0.5])
    assert T.choose(store, WS)["best"] == "grpo[e2]"
    fast = [0.3, 0.5, 0.5, 0.5, 0.5]
    for s in range(5):
        _write(store, "reference", "grpo", s, REF, "test")
        _write(store, T.PROTOCOL, "grpo[e2]", s, fast, "test")
    res = G.measure(store)
    (g,) = res["warm_starts"]
    assert g["picks"]["grpo[tuned]"] == "grpo[e2]" and g["picks"]["grpo[oracle]"] is None  # one-pass cells missing
    assert res["validation_picked_test_best"] == {"yes": 0, "of": 0}
    knobs = {r["pick"]: r for r in res["knobs"]}
    assert set(knobs) == {"grpo[tuned k]", "grpo[tuned lr]", "grpo[tuned k, lr]", "grpo[tuned]"}
    assert knobs["grpo[tuned k, lr]"]["pooled_saving"] == pytest.approx(0.0)  # it is the reference configuration
    # 800 rollouts against 1,600: a 50% saving, every run ahead
    assert knobs["grpo[tuned]"]["pooled_saving"] == pytest.approx(0.5) and knobs["grpo[tuned]"]["holds_in"] == 1
    assert knobs["grpo[tuned]"]["configurations"] == {WS: "grpo[e2]"}
    for c in T.one_pass():  # every one-pass test cell: the oracle is now defined, the two-pass cell the test-best
        if c != T.REFERENCE_CONFIG:
            for s in range(5):
                _write(store, T.test_protocol(c), plan.tune_label(*c), s, REF, "test")
    res = G.measure(store)
    assert res["warm_starts"][0]["picks"]["grpo[oracle]"] == "grpo[e2]"
    assert res["validation_picked_test_best"] == {"yes": 1, "of": 1}
    G.write(res, tmp_path)
    md = (tmp_path / "grpo_tuning" / "grpo_tuning.md").read_text()
    assert "| pool-ws2 | 30 | grpo | grpo[e2] | 10 |" in md and "in 1 of 1 warm starts" in md
    assert "--warm-start 4 --protocol grpo-tuning" in md  # a warm start with nothing yet names its command
    assert (tmp_path / "grpo_tuning" / "grpo_tuning.png").stat().st_size > 0
