"""The group-size protocol (docs/training-study.md, "The group-size grid"): uniform GRPO at k in K_GRID with the
same rollouts per update, its best k chosen on the validation split only, and AR3PO's decomposition cells."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.study import cli, execute, plan
from benchmarks.study.store import RunStore
from rlvr_core.grpo.advantages import grpo_advantages


def _curve(accs: list[float]) -> list[dict[str, float]]:
    return [{"step": i, "updates": i, "cum_rollouts": 1000 * i, "cum_tokens": 4000 * i, "cum_trained_tokens": 0,
             "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]


def _write(store: RunStore, label: str, seed: int, accs: list[float], split: str) -> None:
    path = store.run_file("pool", "group-size", label, seed, None, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"regime": "pool", "protocol": "group-size", "variant": label, "seed": seed,
                                "split": split, "curve": _curve(accs), "ledger": {"rollouts": 1000 * len(accs)},
                                "grid": None}))


def _store(tmp_path: Path) -> RunStore:
    store = RunStore(tmp_path)
    store.freeze(store.target_path("pool"), {"regime": "pool", "target": 0.5})
    return store


def test_every_k_of_the_grid_spends_the_same_rollouts_per_update() -> None:
    labs = plan.labels("group-size", "pool")
    assert labs == ("grpo[k2]", "grpo[k4]", "grpo", "grpo[k16]")
    for lab in labs:
        t = execute.run_params("pool", lab, 0, protocol="group-size").train
        assert t.allocator == "grpo" and t.batch_size * t.k == plan.ROLLOUTS_PER_UPDATE
        assert t.eval_every_rollouts == plan.EVAL_GRID and t.lr == execute.run_params("pool", "grpo", 0).train.lr
    assert [execute.run_params("pool", lab, 0).train.k for lab in labs] == list(plan.K_GRID)
    # k = 8's test cell is the reference runs: no run file of its own, the same folder
    store = RunStore(Path("/nonexistent"))
    assert store.run_file("pool", "reference", "grpo", 0).parent.name == "grpo"
    assert "group-size" in plan.reported_protocols("pool") and "group-size" not in plan.reported_protocols("hard")
    # a protocol with nothing to run in a regime is not in its plan: the DAPO replication runs on pool only
    assert "null-dapo" in plan.reported_protocols("pool-ws3") and "null-dapo" not in plan.reported_protocols("hard-ws3")
    assert "equal-rollouts" in plan.reported_protocols("hard-ws3") and plan.expected_runs("null-dapo", "pool-ws3") == 15
    # 4 k x 5 test seeds (k = 8's the reference runs) + 4 k x 2 selection seeds on the validation split
    assert plan.expected_runs("group-size", "pool") == 4 * 5 + 4 * len(plan.GRID_SEEDS)


def test_ar3po_without_its_stop_samples_fixed_groups_of_four_at_grpo_k4_s_rollouts() -> None:
    t = execute.run_params("pool", "ar3po[no-stop]", 0, protocol="equal-rollouts").train
    p = t.allocator_params["ar3po"]
    assert t.allocator == "ar3po" and p["max_stages"] == 1 and p["stage_size"] == 4 and p.get("reuse", True)
    assert t.batch_size * p["stage_size"] == plan.ROLLOUTS_PER_UPDATE
    assert "ar3po[no-stop]" in plan.labels("equal-rollouts", "hard-ws1")


def test_a_two_row_group_s_advantage_is_well_defined() -> None:
    adv, m = grpo_advantages(np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), np.array([0, 0, 1, 1, 2, 2]))
    assert adv[:2] == pytest.approx([2 ** -0.5, -(2 ** -0.5)], abs=1e-5)
    assert list(adv[2:]) == [0.0, 0.0, 0.0, 0.0] and m["constant_groups"] == 2


def test_the_best_k_is_chosen_on_the_validation_split_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    fast, slow, never = [0.3, 0.6, 0.6], [0.3, 0.4, 0.6], [0.3, 0.35, 0.4]
    for seed in plan.GRID_SEEDS:
        _write(store, "grpo[k2]", seed, never, "validation")
        _write(store, "grpo[k4]", seed, fast, "validation")
        _write(store, "grpo", seed, slow, "validation")
        _write(store, "grpo[k16]", seed, slow, "validation")
    for seed in range(3):  # on the test split k = 2 is best: it must not move the choice
        _write(store, "grpo[k2]", seed, [0.9, 0.9, 0.9], "test")
    choice = execute.record_group_size(store, "pool")
    assert choice["best"] == "grpo[k4]" and choice["k"] == 4
    assert choice["candidates"]["grpo[k2]"]["validation_rollouts_to_target"] is None
    cand = choice["candidates"]
    assert 0 < cand["grpo[k4]"]["validation_rollouts_to_target"] < cand["grpo"]["validation_rollouts_to_target"]
    assert all(c["runs"] == len(plan.GRID_SEEDS) for c in cand.values())
    assert json.loads(store.choice_path("pool", "group-size").read_text())["best"] == "grpo[k4]"
    assert store.choice_path("pool", "group-size").parent.name == "group-size"


def test_ties_and_all_unreached_go_to_the_higher_mean_validation_accuracy(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for seed in plan.GRID_SEEDS:
        for lab, accs in (("grpo[k2]", [0.3, 0.35, 0.4]), ("grpo[k4]", [0.3, 0.4, 0.45]),
                          ("grpo", [0.3, 0.32, 0.34]), ("grpo[k16]", [0.3, 0.3, 0.3])):
            _write(store, lab, seed, accs, "validation")
    assert execute.choose_group_size(store, "pool")["best"] == "grpo[k4]"


def test_the_driver_runs_validation_then_chooses_only_with_every_k_then_tests(tmp_path: Path, capsys) -> None:
    """--quick runs one k: its selection run, no choice (the other k have no validation runs), then its test
    seeds; the log says why no k was chosen."""
    out = tmp_path / "out"
    assert cli.main(["--quick", "--regime", "pool", "--protocol", "group-size", "--out", str(out)]) == 0
    log = capsys.readouterr().out
    gs = out / "study" / "pool" / "group-size"
    assert sorted(p.parent.name + "/" + p.name for p in gs.glob("*/s*.json")) == \
        ["grpo_k2-val/s100.json", "grpo_k2/s0.json", "grpo_k2/s1.json"]
    assert not (gs / "choice.json").exists()
    lines = [ln for ln in log.splitlines() if "[pool/group-size" in ln]
    assert "(validation)" in lines[0] and "no choice yet" in lines[1] and "grpo[k4]" in lines[1]
    assert all("(test)" in ln for ln in lines[2:]) and len(lines) == 4
    for p in gs.glob("grpo_k2/s*.json"):
        r = json.loads(p.read_text())
        assert r["k"] == 2 and r["batch_size"] == 128 and r["split"] == "test"


def _test_cell(store: RunStore, protocol: str, label: str, accs: list[float], seeds: int = 3) -> None:
    for seed in range(seeds):
        path = store.run_file("pool", protocol, label, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        bump = [a + 0.01 * seed * (i > 0) for i, a in enumerate(accs)]
        path.write_text(json.dumps({"regime": "pool", "protocol": protocol, "variant": label, "seed": seed,
                                    "split": "test", "curve": _curve(bump), "ledger": {"rollouts": 1000 * len(accs)},
                                    "grid": None, "eval_size": 2000, "allocator_params": {}}))


def test_an_allocator_is_read_against_k8_and_against_the_chosen_k(tmp_path: Path) -> None:
    """ar3po beats k = 8 but not k = 4, the k chosen on validation: the row says both, and the README's opening
    table carries the second beside the first."""
    from benchmarks import group_size, readme

    store = _store(tmp_path)
    for seed in plan.GRID_SEEDS:
        for lab, accs in (("grpo[k2]", [0.3, 0.4, 0.6]), ("grpo[k4]", [0.3, 0.6, 0.6]), ("grpo", [0.3, 0.4, 0.6]),
                          ("grpo[k16]", [0.3, 0.35, 0.4])):
            _write(store, lab, seed, accs, "validation")
    execute.record_group_size(store, "pool")
    _test_cell(store, "reference", "grpo", [0.3, 0.35, 0.45, 0.55])
    for lab, accs in (("grpo[k2]", [0.3, 0.4, 0.5, 0.6]), ("grpo[k4]", [0.3, 0.6, 0.6, 0.6]),
                      ("grpo[k16]", [0.3, 0.3, 0.35, 0.4])):
        _test_cell(store, "group-size", lab, accs)
    _test_cell(store, "equal-rollouts", "ar3po", [0.3, 0.45, 0.55, 0.6])
    # a warm start whose target is not conditioned is shown in the grid but left out of the pooled rows
    assert group_size.measure(RunStore(tmp_path), bases=("pool",))["comparisons"] == []
    store.freeze(store.preregistration_path("pool"), {"conditioning": {
        "conditioned": True, "slope_points_per_1k": 0.3, "headroom_points": 2.0, "evals_before_target": 12}})
    res = group_size.measure(RunStore(tmp_path), bases=("pool",))
    (grid,) = res["grids"]
    assert [c["k"] for c in grid["cells"]] == [2, 4, 8, 16] and grid["chosen"] == "grpo[k4]"
    assert grid["best_on_test"] == "grpo[k4]" and grid["cells"][3]["reached_fit"] == 0
    ar3po = next(r for r in res["comparisons"] if r["ours"] == "ar3po")
    assert ar3po["front"] and ar3po["vs_k8"]["pooled_saving"] > 0.2 and ar3po["vs_best"]["pooled_saving"] < 0
    assert ar3po["vs_best"]["per_warm_start"][0]["regime"] == "pool"
    k4 = next(r for r in res["comparisons"] if r["ours"] == "grpo[k4]")
    assert k4["vs_best"]["pooled_saving"] == pytest.approx(0.0)
    group_size.write(res, tmp_path)
    md = (tmp_path / "group_size" / "group_size.md").read_text()
    assert "| pool | ar3po | equal-rollouts | pool |" in md and (tmp_path / "group_size" / "group_size.png").exists()
    # the README reads the tuned uniform GRPO (benchmarks/grpo_tuning.py), not the best k, beside a row
    row = {"family": "pool", "protocol": "equal-rollouts", "ours": "ar3po", "baseline": "grpo", **ar3po["vs_k8"]}
    assert readme.evidence_headline([row]).splitlines()[2].endswith("| not run yet | not run yet |")
