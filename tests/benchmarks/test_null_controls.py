"""The null controls (benchmarks/null_controls.py): A/A on disjoint seeds, its false positives by re-splitting, and
DAPO against matched GRPO in updates."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import null_controls
from benchmarks.study import cli, plan
from benchmarks.study.store import RunStore
from rlvr_core.stats import TARGET_FRACTION, gain_target


def _write(store: RunStore, regime: str, protocol: str, label: str, seed: int, speed: float) -> None:
    """A run whose accuracy rises ``speed`` per 1,000 rollouts (and per 5 updates) from 0.3."""
    curve = [{"step": i, "updates": 5 * i, "cum_rollouts": 1000 * i, "cum_tokens": 4000 * i, "cum_trained_tokens": 0,
              "seconds": 0.5 * i, "greedy_acc": min(0.3 + speed * i, 0.9)} for i in range(12)]
    path = store.run_file(regime, protocol, label, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"regime": regime, "protocol": protocol, "variant": label, "seed": seed,
                                "split": "test", "curve": curve, "ledger": {"rollouts": 11000}, "grid": None,
                                "eval_size": 2000, "allocator_params": {}}))


def _family(tmp_path: Path, aa_speed: float) -> RunStore:
    store = RunStore(tmp_path)
    for regime in ("pool", "pool-ws1"):
        store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5})
        for s in range(5):
            _write(store, regime, "reference", "grpo", s, 0.04 + 0.004 * s)
            _write(store, regime, "null-aa", "grpo[aa]", 5 + s, aa_speed + 0.004 * s)
            _write(store, regime, "equal-batch", "dapo", s, 0.04 + 0.004 * s)
            _write(store, regime, "matched-updates", "grpo", s, 0.04 + 0.004 * ((s + 2) % 5))
    return store


def test_an_a_a_from_the_same_runs_passes_and_its_false_positives_are_counted(tmp_path: Path) -> None:
    (row,) = null_controls.measure(_family(tmp_path, 0.042), bases=("pool",), splits=20)
    aa = row["aa"]
    assert aa["ours"] == "grpo[aa]" and aa["baseline"] == "grpo" and aa["warm_starts"] == 2
    assert aa["ours_runs"] == aa["base_runs"] == 10
    assert row["aa_passes"] is True and abs(aa["pooled_saving"]) <= null_controls.TOLERANCE
    fp = row["aa_false_positives"]
    assert fp["splits"] == 20 and fp["runs"] == 20 and fp["warm_starts"] == 2
    gaps = fp["gap_excludes_zero"]
    assert set(gaps) == {"updates", "cum_rollouts"} and all(set(g) == {"1", "auc"} for g in gaps.values())
    for share in (fp["p_below_level"], fp["interval_above_zero"], *(v for g in gaps.values() for v in g.values())):
        assert round(share * 20) == share * 20 and share < 0.5  # shares of the 20 splits, far below half
    # the A/A band: the central 95% of the 20 splits' pooled savings, around zero for runs of one speed
    b = fp["band"]
    assert b["splits"] == 20 and b["lo"] <= 0 <= b["hi"] and b["hi"] - b["lo"] < 0.5
    # DAPO's cells equal matched GRPO's (the same speeds, other seeds): about zero in updates and rollouts
    assert abs(row["dapo_updates"]["pooled_saving"]) < 0.05 and row["dapo_updates"]["axis"] == "updates"
    md = null_controls.markdown([row])
    assert "| pool | " in md and "| yes |" in md and "at equal updates: " in md and "at fixed budget: " in md


def test_an_a_a_that_separates_fails(tmp_path: Path) -> None:
    (row,) = null_controls.measure(_family(tmp_path, 0.08), bases=("pool",), splits=10)
    assert row["aa"]["pooled_saving"] > 0.3 and row["aa_passes"] is False
    assert "| **no** |" in null_controls.markdown([row])


def test_a_family_without_a_a_runs_says_so(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.freeze(store.target_path("pool"), {"regime": "pool", "target": 0.5})
    (row,) = null_controls.measure(store, bases=("pool",))
    assert row["aa"] is None and row["aa_passes"] is None and row["aa_false_positives"] is None
    assert "not run yet" in null_controls.markdown([row])


def test_the_a_a_runs_take_seeds_disjoint_from_the_reference_runs(tmp_path: Path) -> None:
    assert plan.PROTOCOLS["null-aa"].first_seed == 5 and plan.labels("null-aa", "pool") == ("grpo[aa]",)
    out = tmp_path / "out"
    assert cli.main(["--quick", "--regime", "pool", "--protocol", "null-aa", "--out", str(out)]) == 0
    study = out / "study" / "pool"
    assert sorted(p.name for p in (study / "null-aa" / "grpo_aa").glob("s*.json")) == ["s5.json", "s6.json"]
    assert sorted(p.name for p in (study / "reference" / "grpo").glob("s*.json")) == ["s0.json", "s1.json"]


def test_the_a_a_rule_reads_a_bound_at_never_as_unbounded() -> None:
    row = {"pooled_saving": -0.08, "pooled_lo": None, "pooled_hi": 0.26}
    assert null_controls.passes(row) is True
    assert null_controls.passes({**row, "pooled_saving": None}) is False
    assert null_controls.passes({**row, "pooled_lo": 0.02, "pooled_saving": 0.08}) is False  # excludes zero
    assert null_controls.passes({**row, "pooled_saving": -0.15}) is False


def test_the_dapo_control_is_read_again_at_equal_updates(tmp_path: Path) -> None:
    """The diagnosis pairs seeds and reads accuracy at fractions of the fewest updates any run made: a DAPO run that
    ends early (fewer updates, as its rollouts per update are more) is read only over the range it has."""
    store = _family(tmp_path, 0.042)
    (row,) = null_controls.measure(store, bases=("pool",), splits=5)
    d = row["dapo_at_updates"]
    assert d["pairs"] == 10 and d["warm_starts"] == 2
    # dapo seed s has matched grpo seed (s + 2) % 5's speed: the paired differences average out to zero exactly
    assert abs(d["1"]["mean"]) < 1e-9 and d["1"]["lo"] < 0 < d["1"]["hi"]
    assert row["dapo_final_updates"] == {"dapo": 55.0, "grpo": 55.0}
    for regime, s in ((r, s) for r in ("pool", "pool-ws1") for s in range(5)):  # faster DAPO, over half the updates
        path = store.run_file(regime, "equal-batch", "dapo", s)
        run = json.loads(path.read_text())
        run["curve"] = [{**c, "greedy_acc": min(0.3 + (0.05 + 0.004 * ((s + 2) % 5)) * c["step"], 0.9)}
                        for c in run["curve"][:6]]
        path.write_text(json.dumps(run))
    (row,) = null_controls.measure(RunStore(tmp_path), bases=("pool",), splits=5)
    d = row["dapo_at_updates"]
    assert row["dapo_final_updates"] == {"dapo": 25.0, "grpo": 55.0}
    assert d["1"]["lo"] > 0 and d["1"]["mean"] > 0  # read to 25 updates, where every run still is
    md = null_controls.markdown([row])
    assert "| pool | dapo vs matched grpo | 10 (2) |" in md and "at 100% of the updates" in md


def test_the_a_a_is_read_at_equal_updates_with_its_seeds_paired(tmp_path: Path) -> None:
    """grpo[aa] seed 5 + i pairs with reference seed i: here it rises 0.002 per evaluation faster than its pair, so
    every pair differs by 1.1 points at half of the 55 updates all the runs made (5.5 evaluations in)."""
    (row,) = null_controls.measure(_family(tmp_path, 0.042), bases=("pool",), splits=5)
    aa = row["aa_at_updates"]
    assert aa["pairs"] == 10 and aa["warm_starts"] == 2
    assert abs(aa["0.5"]["mean"] - 0.011) < 1e-9 and abs(aa["0.5"]["lo"] - 0.011) < 1e-9
    md = null_controls.markdown([row])
    assert "| pool | A/A: grpo[aa] vs grpo | 10 (2) | " in md and " | +1.1 [+1.1, +1.1] | " in md
    store = RunStore(tmp_path / "no-aa")
    store.freeze(store.target_path("pool"), {"regime": "pool", "target": 0.5})
    (row,) = null_controls.measure(store, bases=("pool",))
    assert row["aa_at_updates"] is None and "| pool | A/A: grpo[aa] vs grpo |" not in null_controls.markdown([row])


def _add_large(store: RunStore, regime: str, protocol: str, label: str, seed: int, speed: float) -> None:
    """Give a run a large-set curve rising ``speed`` per point from 0.25, with a standard error of 0.4 points."""
    path = store.run_file(regime, protocol, label, seed)
    run = json.loads(path.read_text())
    curve = [{**e, "greedy_acc": min(0.25 + speed * i, 0.9), "se": 0.004} for i, e in enumerate(run["curve"])]
    run["heldout_large"] = {"problems": 14000, "curve": curve}
    path.write_text(json.dumps(run))


def test_the_dapo_control_is_read_on_the_large_set_beside_the_test_split(tmp_path: Path) -> None:
    """The same runs on both sets over the warm starts whose three cells all have a large-set curve: here DAPO
    learns faster on the test split only, so the test row shows a saving and the large-set row none; the large
    set's target comes from its reference curves."""
    store = _family(tmp_path, 0.042)
    store.freeze(store.target_path("pool"), {"regime": "pool", "target": 0.5, "reference_seeds": [0, 1, 2, 3, 4]})
    for s in range(5):
        _write(store, "pool", "equal-batch", "dapo", s, 0.06 + 0.004 * s)  # faster on the test split
        for protocol, label in (("reference", "grpo"), ("equal-batch", "dapo"), ("matched-updates", "grpo")):
            _add_large(store, "pool", protocol, label, s, 0.03 + 0.004 * s)  # the same on the large set
            if s < 4:  # pool-ws1 misses one run's large curve: it stays out
                _add_large(store, "pool-ws1", protocol, label, s, 0.03)
    store = RunStore(tmp_path)
    (row,) = null_controls.measure(store, bases=("pool",), splits=5)
    large = row["dapo_large_set"]
    assert large["warm_starts"] == ["pool"] and large["problems"] == 14000 and large["conditioned"] is None
    assert large["test"]["updates"]["pooled_saving"] > 0.2 and large["test"]["updates"]["warm_starts"] == 1
    assert abs(large["large"]["updates"]["pooled_saving"]) < 0.01
    assert large["large"]["at_updates"]["1"]["mean"] == 0 < large["test"]["at_updates"]["1"]["mean"]
    assert large["large"]["se"] == {"median": 0.004, "max": 0.004} and large["test"]["se"]["max"] > 0.01
    assert large["test"]["targets"] == {"pool": 0.5}
    assert large["large"]["targets"]["pool"] == gain_target(
        [r["heldout_large"]["curve"] for r in store.reference_runs("pool")], TARGET_FRACTION)["target"] != 0.5
    md = null_controls.markdown([row])
    assert "| pool | pool | large (14,000) | 0.40 (0.40) |" in md and "| pool | pool | test split (2,000) |" in md


def test_no_large_set_table_before_a_warm_start_is_complete(tmp_path: Path) -> None:
    (row,) = null_controls.measure(_family(tmp_path, 0.042), bases=("pool",), splits=5)
    assert row["dapo_large_set"] is None and "large held-out set" not in null_controls.markdown([row])


def _log(store: RunStore, regime: str, protocol: str, label: str, seed: int,
         steps: list[list[tuple[int, int]]]) -> None:
    """A decision log: per step, (prompt, trained rows) of each prompt drawn; 8 rollouts of 3 tokens each, a trained
    group passing 2 of them and one not trained none."""
    import pandas as pd

    path = store.run_file(regime, protocol, label, seed)
    rows = [{"step": i + 1, "prompt_id": p, "trained_rows": t, "rollouts": 8, "passes": 2 if t else 0, "tokens": 24}
            for i, step in enumerate(steps) for p, t in step]
    log = path.with_suffix(".rollouts.parquet")
    pd.DataFrame(rows).to_parquet(log)
    run = json.loads(path.read_text())
    run["decision_log"] = {"file": log.name}
    path.write_text(json.dumps(run))


def test_what_dapo_and_matched_grpo_train_is_read_from_their_decision_logs(tmp_path: Path) -> None:
    """Over the updates both sides made: DAPO here draws 3 prompts an update, GRPO 2; each trains 2 groups of 8 rows
    (GRPO one more in a step only DAPO's runs never reach), and DAPO trains prompt 0 a second time."""
    store = _family(tmp_path, 0.042)
    for s in range(5):
        _log(store, "pool", "equal-batch", "dapo", s, [[(0, 8), (1, 8), (2, 0)], [(0, 8), (3, 8), (4, 0)]])
        _log(store, "pool", "matched-updates", "grpo", s, [[(0, 8), (1, 8)], [(2, 0)], [(3, 8), (4, 8)],
                                                           [(5, 8), (6, 8), (7, 8)]])
    store = RunStore(tmp_path)
    t = null_controls.trained_recurrence(store, ["pool", "pool-ws1"])  # pool-ws1 has no logs: left out
    assert t["warm_starts"] == [{"regime": "pool", "updates": 2}] and t["pairs"] == 5
    assert t["dapo"] == {"drawn": 3.0, "groups": 2.0, "rows": 16.0, "tokens": 48.0, "pass_rate": 0.25,
                         "trained_before": 0.25, "distinct": 3.0}
    # GRPO's first 2 updates are steps 1 and 3 (step 2 trained nothing): 5 prompts drawn, 4 groups, none repeated
    assert t["grpo"] == {"drawn": 2.5, "groups": 2.0, "rows": 16.0, "tokens": 48.0, "pass_rate": 0.25,
                         "trained_before": 0.0, "distinct": 4.0}
    d = t["difference"]
    assert d["drawn"] == {"mean": 0.5, "lo": 0.5, "hi": 0.5} and d["trained_before"]["mean"] == 0.25
    md = null_controls.markdown([{**(null_controls.measure(store, bases=("pool",), splits=2)[0])}])
    assert "| pool | pool (2) | 5 | 3.0 vs 2.5: +0.5 [+0.5, +0.5] |" in md


def test_the_large_set_reading_is_repeated_over_the_conditioned_warm_starts(tmp_path: Path, monkeypatch) -> None:
    """Where some complete warm start is not conditioned, a second reading covers the conditioned ones only, as the
    headline rows pool them; the declared reading over all of them comes first."""
    from benchmarks import warmstarts

    store = _family(tmp_path, 0.042)
    for regime in ("pool", "pool-ws1"):
        store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5, "reference_seeds": [0, 1, 2, 3, 4]})
        for s in range(5):
            for protocol, label in (("reference", "grpo"), ("equal-batch", "dapo"), ("matched-updates", "grpo")):
                _add_large(store, regime, protocol, label, s, 0.03 + 0.004 * s)
    monkeypatch.setattr(warmstarts, "is_conditioned", lambda store, regime: regime == "pool-ws1")
    (row,) = null_controls.measure(RunStore(tmp_path), bases=("pool",), splits=5)
    large = row["dapo_large_set"]
    assert large["warm_starts"] == ["pool", "pool-ws1"] and large["conditioned"]["warm_starts"] == ["pool-ws1"]
    assert large["conditioned"]["large"]["updates"]["warm_starts"] == 1
    md = null_controls.markdown([row])
    assert md.index("| pool | pool, pool-ws1 | large") < md.index("| pool | pool-ws1, conditioned only (read after the "
                                                                   "row above) | large")


def test_the_dapo_replication_is_read_alone_and_pooled_and_on_the_large_set_once_complete(tmp_path: Path) -> None:
    """Seeds 5-9 of the replication: here DAPO is slower than matched GRPO on the new seeds, so the replication
    fails on its own and the pooled reading lies between it and the original control's; the large set is read only
    once every run of the warm starts that ran it has a curve there."""
    store = _family(tmp_path, 0.042)
    store.freeze(store.target_path("pool"), {"regime": "pool", "target": 0.5, "reference_seeds": [0, 1, 2, 3, 4]})
    assert null_controls.replication(store, ["pool", "pool-ws1"]) is None  # not run yet: no table
    assert "replicated" not in null_controls.markdown(null_controls.measure(store, bases=("pool",), splits=5))
    for s in range(5):
        _write(store, "pool", "null-dapo", "dapo", 5 + s, 0.03 + 0.004 * s)
        _write(store, "pool", "null-dapo", "grpo", 5 + s, 0.05 + 0.004 * s)
    rep = null_controls.replication(RunStore(tmp_path), ["pool", "pool-ws1"])
    assert rep["warm_starts"] == ["pool"] and rep["runs"] == {"dapo": 5, "grpo": 5} and "large" not in rep
    alone, pooled = rep["test"]["replication"], rep["test"]["pooled"]
    assert alone["updates"]["ours_runs"] == alone["updates"]["base_runs"] == 5 and alone["updates"]["axis"] == "updates"
    assert pooled["updates"]["ours_runs"] == pooled["updates"]["base_runs"] == 10
    assert alone["updates"]["pooled_saving"] < -0.3 and alone["updates_pass"] is False
    assert alone["at_updates"]["pairs"] == 5 and pooled["at_updates"]["pairs"] == 10
    assert alone["at_updates"]["1"]["mean"] < pooled["at_updates"]["1"]["mean"] < 0 and alone["gap_pass"] is False
    # the 10 replication runs and pool's 15 reference and control runs lack a large curve: the command for them
    assert rep["large_missing"] == 25 and rep["large_commands"] == [
        "python -m benchmarks.study --regime pool --heldout-large --cells 'reference/grpo' 'equal-batch/dapo' "
        "'matched-updates/grpo' 'null-dapo/dapo' 'null-dapo/grpo'"]
    md = null_controls.markdown([{"family": "pool", "aa": None, "aa_passes": None, "aa_false_positives": None,
                                  "dapo_updates": None, "dapo_rollouts": None, "dapo_replication": rep}])
    assert "| pool | pool | 5-9 | test split (2,000) |" in md and "| 0-9 | test split" in md
    assert "| pool | pool | 5-9, 0-9 | large (14,000) | 25 runs to evaluate |" in md and "--heldout-large" in md
    for s in range(5):  # every run evaluated on the large set, where the two sides learn alike
        for protocol, label in (("reference", "grpo"), ("equal-batch", "dapo"), ("matched-updates", "grpo")):
            _add_large(store, "pool", protocol, label, s, 0.03 + 0.004 * s)
        for label in ("dapo", "grpo"):
            _add_large(store, "pool", "null-dapo", label, 5 + s, 0.03 + 0.004 * s)
    large = null_controls.replication(RunStore(tmp_path), ["pool", "pool-ws1"])["large"]
    assert large["replication"]["updates_pass"] and large["pooled"]["updates_pass"]
    assert large["replication"]["gap_pass"] and large["replication"]["at_updates"]["1"]["mean"] == 0
