"""Issue 54 items 4 and 5: both savings of a headline row pool one set of warm starts, named where it is smaller
than the regime's; a matched-updates row is read against the reference runs too, beside its matched grpo."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import group_size, readme, warmstarts
from benchmarks.study import tuning
from benchmarks.study.plan import ORACLE, REFERENCE, TUNE_CONFIGS, TUNED, tune_label
from benchmarks.study.store import RunStore

REGIMES = ("pool", "pool-ws1")


def _curve(accs: list[float]) -> list[dict[str, float]]:
    return [{"step": i, "updates": i, "cum_rollouts": 1000 * i, "cum_tokens": 4000 * i, "cum_trained_tokens": 0,
             "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]


def _cell(store: RunStore, regime: str, protocol: str, label: str, accs: list[float], seeds: int = 3) -> None:
    for seed in range(seeds):
        path = store.run_file(regime, protocol, label, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        bump = [a + 0.01 * seed * (i > 0) for i, a in enumerate(accs)]
        path.write_text(json.dumps({"regime": regime, "protocol": protocol, "variant": label, "seed": seed,
                                    "split": "test", "curve": _curve(bump), "ledger": {"rollouts": 1000 * len(accs)},
                                    "grid": None, "eval_size": 2000, "allocator_params": {}}))


def _study(tmp_path: Path) -> RunStore:
    """Two conditioned warm starts that both ran ar3po, sara+dps[context], the reference and the matched grpo;
    only pool-ws1 ran the group-size grid (its chosen k, k = 4) and chose its tuned uniform GRPO (k = 4 at lr 1e-4,
    one pass: the group-size cell), whose grid's other test cells have not run."""
    store = RunStore(tmp_path)
    for regime in REGIMES:
        store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5})
        store.freeze(store.preregistration_path(regime), {"conditioning": {
            "conditioned": True, "slope_points_per_1k": 0.3, "headroom_points": 2.0, "evals_before_target": 12}})
        _cell(store, regime, "reference", "grpo", [0.3, 0.35, 0.45, 0.55])
        _cell(store, regime, "matched-updates", "grpo", [0.3, 0.32, 0.38, 0.45, 0.52])
        _cell(store, regime, "equal-rollouts", "ar3po", [0.3, 0.45, 0.55, 0.6] if regime == "pool-ws1" else
              [0.3, 0.35, 0.45, 0.55])
        _cell(store, regime, "equal-batch", "sara+dps[context]", [0.3, 0.4, 0.5, 0.6])
    store.freeze(store.choice_path("pool-ws1", "group-size"), {"best": "grpo[k4]", "k": 4})
    store.freeze(tuning.frozen_path(store, "pool-ws1", "choice.json"), {"best": "grpo[k4]", "k": 4, "lr": 1e-4,
                                                                        "epochs": 1})
    _cell(store, "pool-ws1", "group-size", "grpo[k4]", [0.3, 0.4, 0.52, 0.6], seeds=len(tuning.TEST_SEEDS))
    return RunStore(tmp_path)


def _row(rows: list[dict], protocol: str, ours: str, baseline: str) -> dict:
    return next(r for r in rows if (r["protocol"], r["ours"], r["baseline"]) == (protocol, ours, baseline))


def test_both_savings_of_a_row_pool_the_warm_starts_every_baseline_ran_and_the_table_names_them(tmp_path) -> None:
    store = _study(tmp_path)
    rows = warmstarts.measure(store, bases=("pool",), conditioned=True)
    ar3po = _row(rows, "equal-rollouts", "ar3po", "grpo")
    assert [p["regime"] for p in ar3po["per_warm_start"]] == ["pool-ws1"]  # not pool: no best k there
    assert ar3po["left_out_other_baselines"] == ["pool"] and ar3po["family_warm_starts"] == list(REGIMES)
    best = group_size.measure(store, bases=("pool",))["comparisons"]
    b = next(r for r in best if (r["protocol"], r["ours"]) == ("equal-rollouts", "ar3po"))
    assert [p["regime"] for p in b["vs_best"]["per_warm_start"]] == ["pool-ws1"]
    assert b["vs_k8"]["pooled_saving"] == ar3po["pooled_saving"]  # the same runs, the same saving
    tuned = _row(rows, "equal-rollouts", "ar3po", TUNED)
    assert [p["regime"] for p in tuned["per_warm_start"]] == ["pool-ws1"] and tuned["best_of"] == "grpo"
    assert tuned["base_runs"] == len(tuning.TEST_SEEDS) and not any(r["baseline"] == ORACLE for r in rows)
    line = next(ln for ln in readme.evidence_headline(rows).splitlines() if ln.startswith("| pool | ar3po |"))
    assert "| 1 of 1 warm starts, ws1 (p " in line
    assert line.endswith(f"| {readme._vs_best(tuned)} | not run yet |")  # the oracle's grid has not run
    assert "left out: not every baseline of the row ran there" in warmstarts.summary_md(rows)
    # the per-warm-start rows (not the headline) keep both warm starts
    every = warmstarts.measure(store, bases=("pool",))
    assert len(_row(every, "equal-rollouts", "ar3po", "grpo")["per_warm_start"]) == 2


def test_a_matched_updates_row_is_read_against_the_reference_runs_beside_its_matched_grpo(tmp_path) -> None:
    store = _study(tmp_path)
    rows = warmstarts.measure(store, bases=("pool",), conditioned=True)
    matched = _row(rows, "matched-updates", "sara+dps[context]", "grpo")
    ref = _row(rows, "matched-updates", "sara+dps[context]", REFERENCE)
    assert rows.index(ref) == rows.index(matched) + 1 and ref["reference_of"] == "grpo"
    assert [p["regime"] for p in ref["per_warm_start"]] == [p["regime"] for p in matched["per_warm_start"]]
    assert ref["pooled_saving"] < matched["pooled_saving"]  # the reference runs are the faster baseline here
    # the reference reading is a row of the table of savings, so of Holm's family
    family = [r for r in rows if "p_holm" in r]
    assert ref in family and all(r["holm_family"] == len(family) for r in family)
    table = warmstarts.summary_md(rows)
    assert f"| pool | matched-updates | sara+dps[context] vs {REFERENCE} |" in table
    line = next(ln for ln in readme.evidence_headline(rows).splitlines()
                if ln.startswith("| pool | sara+dps[context] | grpo | matched-updates |"))
    assert f"; vs the reference grpo: {readme._figure(ref)} |" in line
    assert f"| {readme._p_holm(matched)}; {readme._p_holm(ref)} |" in line
    # equal-rollouts rows read the reference runs already: no second reading
    assert not any(r["baseline"] == REFERENCE and r["protocol"] == "equal-rollouts" for r in rows)


def test_warm_starts_are_named_as_a_run_or_one_by_one() -> None:
    assert readme.warm_start_names(["hard-ws2", "hard-ws3", "hard-ws4"]) == "ws2-4"
    assert readme.warm_start_names(["hard", "hard-ws2"]) == "ws0, ws2"
    assert readme.warm_start_names(["pool-ws1"]) == "ws1"


def test_a_row_whose_tuned_grpo_has_not_run_anywhere_keeps_its_own_warm_starts(tmp_path) -> None:
    store = _study(tmp_path)
    tuning.frozen_path(store, "pool-ws1", "choice.json").unlink()
    rows = warmstarts.measure(RunStore(tmp_path), bases=("pool",), conditioned=True)
    ar3po = _row(rows, "equal-rollouts", "ar3po", "grpo")
    assert [p["regime"] for p in ar3po["per_warm_start"]] == list(REGIMES)
    line = next(ln for ln in readme.evidence_headline(rows).splitlines() if ln.startswith("| pool | ar3po |"))
    assert "| 1 of 2 warm starts (p " in line and line.endswith("| not run yet | not run yet |")


def test_the_best_uniform_grpo_columns_read_the_validation_choice_and_the_test_best_configuration(tmp_path) -> None:
    store = _study(tmp_path)
    # every other configuration's test cell: k = 2 at lr 2e-4, two passes is the test-best; the oracle is read
    # only once every one-pass configuration has every test seed
    _cell(store, "pool-ws1", "reference", "grpo", [0.3, 0.35, 0.45, 0.55], seeds=len(tuning.TEST_SEEDS))
    assert tuning.oracle_config(store, "pool-ws1") is None
    for config in TUNE_CONFIGS:
        if config in ((8, 1e-4, 1), (4, 1e-4, 1)):
            continue
        fast = config == (2, 2e-4, 2)
        _cell(store, "pool-ws1", tuning.test_protocol(config), tune_label(*config),
              [0.3, 0.55, 0.6, 0.6] if fast else [0.3, 0.33, 0.4, 0.5], seeds=len(tuning.TEST_SEEDS))
    assert tuning.oracle_config(store, "pool-ws1") == (2, 2e-4, 2)
    assert tuning.chosen_config(store, "pool-ws1") == (4, 1e-4, 1)
    rows = warmstarts.measure(RunStore(tmp_path), bases=("pool",), conditioned=True)
    tuned, oracle = (_row(rows, "equal-rollouts", "ar3po", b) for b in (TUNED, ORACLE))
    assert oracle["pooled_saving"] < tuned["pooled_saving"]  # the bound is the harder baseline
    assert [p["regime"] for p in oracle["per_warm_start"]] == ["pool-ws1"]
    # neither is a row of the table of savings (nor of Holm's family): they are read beside one
    assert "p_holm" not in tuned and "p_holm" not in oracle
    assert TUNED not in warmstarts.summary_md(rows)
    line = next(ln for ln in readme.evidence_headline(rows).splitlines() if ln.startswith("| pool | ar3po |"))
    assert line.endswith(f"| {readme._vs_best(tuned)} | {readme._vs_best(oracle)} |")
    # a chosen configuration whose test cell lacks a seed is not read: the row keeps both warm starts
    store.run_file("pool-ws1", "group-size", "grpo[k4]", 4).unlink()
    store.run_file("pool-ws1", "group-size", "grpo[k4]", 3).unlink()
    assert tuning.baseline_runs(RunStore(tmp_path), "pool-ws1", (4, 1e-4, 1)) == []
    rows = warmstarts.measure(RunStore(tmp_path), bases=("pool",), conditioned=True)
    assert not any(r["baseline"] in (TUNED, ORACLE) for r in rows)  # k = 4 is a one-pass cell of the oracle's too
    assert [p["regime"] for p in _row(rows, "equal-rollouts", "ar3po", "grpo")["per_warm_start"]] == list(REGIMES)

