"""The study's plan is data (benchmarks/study/plan.py): a variant is one record, a half-declared regime is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.study import ENVIRONMENT, execute, plan
from benchmarks.study.store import RunStore
from benchmarks.study.summarize import aggregate
from rlvr_core.allocation import ALLOCATORS
from rlvr_core.allocation.grpo import GRPOAllocator


def _run(regime: str, protocol: str, label: str, seed: int, accs: list[float]) -> dict:
    curve = [{"step": i, "updates": i, "cum_rollouts": 1000 * i, "cum_tokens": 4000 * i, "cum_trained_tokens": 2000 * i,
              "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]
    ledger = {"rollouts": 1000 * (len(accs) - 1), "generated_tokens": 4000, "trained_tokens": 2000, "steps": 5,
              "updates": len(accs) - 1, "generate_s": 1.0, "verify_s": 0.1, "allocate_s": 0.0, "update_s": 1.0,
              "eval_s": 0.2, "flops": 1e12, "effective_groups_per_step": 20.0, "rollouts_per_step": 200.0,
              "rounds_per_step": 1.0}
    return {"regime": regime, "protocol": protocol, "variant": label, "seed": seed, "split": "test", "curve": curve,
            "ledger": ledger, "eval_size": 2000, "grid": None}


def test_a_variant_is_one_record_of_the_plan_and_shows_in_the_generated_tables(tmp_path: Path, monkeypatch) -> None:
    """A toy allocator registered in the library and one Variant record: the study runs it on the protocols and
    regimes its record names, builds its configuration, and the summary lists its cell."""

    class Toy(GRPOAllocator):
        name = "toy"

    monkeypatch.setitem(ALLOCATORS._items, "toy", Toy)
    monkeypatch.setitem(plan.VARIANTS, "toy", plan.Variant("toy", "toy", {}, "a toy allocator",
                                                           runs={"equal-batch": plan.ROLLOUT_GRID}))
    assert "toy" in plan.labels("equal-batch", "pool") and "toy" in plan.labels("equal-batch", "pool-ws1")
    assert "toy" not in plan.labels("equal-batch", "hard") and "toy" not in plan.labels("tuned", "pool")
    assert plan.expected_runs("equal-batch", "pool") == (len(plan.labels("equal-batch", "pool")) + 1) * 5
    assert execute.run_params("pool", "toy", 0, protocol="equal-batch").train.allocator == "toy"

    store = RunStore(tmp_path)
    store.freeze(store.target_path("pool"), {"regime": "pool", "target": 0.5, "rule": "toy", "reference_seeds": [0, 1],
                                             "start": 0.3, "gain": 0.3, "set_at": "now", "budget_rollouts": 5000})
    for seed in (0, 1):
        for proto, label, accs in (("reference", "grpo", [0.3, 0.4, 0.5, 0.55, 0.6, 0.6]),
                                   ("equal-batch", "dapo", [0.3, 0.35, 0.45, 0.5, 0.55, 0.6]),
                                   ("equal-batch", "toy", [0.3, 0.5, 0.6, 0.6, 0.65, 0.7])):
            path = store.run_file("pool", proto, label, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_run("pool", proto, label, seed, accs)))
    records = aggregate(tmp_path, tmp_path)
    assert [r["allocator"] for r in records if r["protocol"] == "equal-batch"] == ["dapo", "toy"]
    toy = next(r for r in records if r["allocator"] == "toy")
    assert toy["baseline"] == "dapo" and toy["reached_fit"] == 2
    table = (tmp_path / "study" / "training_pool_equal-batch.md").read_text()
    assert "| toy | 2 | 2/2 |" in table
    assert "| pool | equal-batch | toy | 2 | 2/2 |" in (tmp_path / "study" / "training_study.md").read_text()


def test_a_regime_without_its_budget_grid_or_criteria_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="regime 'new': no budget declared"):
        plan.Regime("new", {}, grid="rollouts", criteria=plan.CRITERIA)
    with pytest.raises(ValueError, match="regime 'new': no grid declared"):
        plan.Regime("new", {}, budget=40000, criteria=plan.CRITERIA)
    with pytest.raises(ValueError, match="regime 'new': no criteria declared"):
        plan.Regime("new", {}, budget=40000, grid="rollouts")
    with pytest.raises(ValueError, match="step-grid regime needs eval_every"):
        plan.Regime("new", {}, budget=40000, grid="steps", criteria=plan.CRITERIA)
    with pytest.raises(ValueError, match="budget must be a positive number"):
        plan.Regime("new", {}, budget=0, grid="rollouts", criteria=plan.CRITERIA)
    with pytest.raises(ValueError, match="eval_rollouts must be a number of rollouts >= 0"):
        plan.Regime("new", {}, budget=40000, grid="rollouts", eval_rollouts=-256, criteria=plan.CRITERIA)
    with pytest.raises(ValueError, match="on a rollout-grid regime, got 256 on grid 'steps'"):
        plan.Regime("new", {}, budget=40000, grid="steps", eval_every=6, eval_rollouts=256, criteria=plan.CRITERIA)
    # a declared regime takes its own budget, never another's
    r = plan.Regime("new", {}, budget=12345, grid="rollouts", criteria=plan.CRITERIA)
    assert r.budget == 12345 and plan.REGIMES["pool"].budget == 40000 and plan.REGIMES["easy"].budget == 30000


def test_a_regime_may_declare_its_own_evaluation_grid_and_its_warm_starts_inherit_it() -> None:
    """steps-fine evaluates every 256 rollouts over 12,288 (the measurement issue's finer grid for steps); every
    other rollout-grid regime keeps EVAL_GRID, and the step-grid ones their step interval."""
    assert plan.sizing("steps-fine", False) == {"eval_every_rollouts": 256, "rollouts": 12288, "eval_every": 0,
                                                 "eval_size": plan.TEST_ROWS}
    assert plan.sizing("steps-fine-ws2", False)["eval_every_rollouts"] == 256
    assert plan.sizing("steps", False)["eval_every_rollouts"] == plan.EVAL_GRID == 1536
    assert plan.sizing("hard", False)["eval_every"] == 6 and plan.sizing("hard", False)["eval_every_rollouts"] == 0
    assert plan.regime_params("steps-fine").prepare.task == plan.regime_params("steps").prepare.task
    assert plan.REGIMES["steps-fine"].criteria["min_rise_rollouts"] == 0


def test_the_plan_s_protocols_and_comparisons_name_only_declared_cells() -> None:
    for v in plan.VARIANTS.values():
        assert set(v.runs) <= set(plan.PROTOCOLS), v.label
    for p in plan.PROTOCOLS.values():
        assert p.baseline in plan.VARIANTS and all(lab in plan.VARIANTS and p.name in plan.VARIANTS[lab].runs
                                                   for lab in p.order), p.name
    for c in (*plan.COMPARISONS, *plan.COST_COMPARISONS, *plan.SAVING_TARGETS, *plan.DOMINANCE_TARGETS):
        assert c.protocol in plan.PROTOCOLS and {c.ours, c.baseline} <= set(plan.VARIANTS), c
    for t in (*plan.SAVING_TARGETS, *plan.RATIO_TARGETS, *plan.DOMINANCE_TARGETS):
        shared = {lab for _, labs in plan.shared_sources(t.protocol) for lab in (labs or ())}
        # a target reads its regime's family: the baseline runs in the regime or in its warm starts (ar3po runs on
        # the rollout grid only, so in hard's warm starts, not in hard itself)
        family = {*plan.labels(t.protocol, t.regime), *plan.labels(t.protocol, f"{t.regime}{plan.WS_SEP}2")}
        assert t.regime in plan.REGIMES and t.baseline in {*family, *shared}, t
    assert plan.SAVING_TARGETS[0].text == ("hard, equal-batch: sara spends >= 22% fewer rollouts to target than "
                                           "dapo, rank test p < 0.05")
    # the README's headline rows are chosen by a field of the record, not by their place in the table
    assert [c.ours for c in plan.COMPARISONS if c.readme][:2] == ["sara", "sara+dps[context]"]
    assert not any(c.readme for c in plan.COMPARISONS if c.ours in ("sara+dps", "sara[carry]", "greso"))
    # the README's opening rows: a field of the record too, a subset of the summary's, at most FRONT_ROWS (eight)
    # with the regimes
    from benchmarks.readme import FRONT_ROWS

    front = [c for c in plan.COMPARISONS if c.front]
    assert front and all(c.readme for c in front)
    assert len(front) * sum(r.headline for r in plan.REGIMES.values()) <= FRONT_ROWS == 8


def test_importing_the_study_sets_no_environment_variable() -> None:
    """Only a benchmark's own process sets its environment (benchmarks/study/__main__.py, a script's
    ``if __name__ == "__main__"``); importing any module of benchmarks/ (a test, a notebook, another benchmark) leaves
    the caller's environment alone."""
    import subprocess
    import sys

    code = ("import importlib, os, pkgutil, torch, torch._inductor.config, transformers, trl, benchmarks; "
            "from benchmarks.study import ENVIRONMENT; before = dict(os.environ); "  # after what the libraries set
            "names = [m.name for m in pkgutil.walk_packages(benchmarks.__path__, 'benchmarks.') "
            "if not m.name.endswith('__main__')]; [importlib.import_module(n) for n in names]; "
            "assert len(names) > 30, names; "
            "print(sorted(k for k in {*ENVIRONMENT, *os.environ, *before} if os.environ.get(k) != before.get(k)))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in {*ENVIRONMENT, "MPLBACKEND", "HF_HUB_OFFLINE"}}
    out = subprocess.run([sys.executable, "-c", code], cwd=plan.ROOT, capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_every_table_prints_a_bound_that_falls_on_a_run_that_never_reached_as_never() -> None:
    """One convention for a missing bound (benchmarks/study/formats.py): the targets' rows, the README's savings
    across warm starts and the study's cells all read 'never' (the savings once printed 'n/a' or dropped the
    interval)."""
    from benchmarks import readme, study_targets, warmstarts

    target = {"kind": "saving", "value": 0.13, "lo": None, "hi": 0.34, "p_value": 0.5, "ours_reached": 4,
              "ours_seeds": 5, "base_reached": 5, "base_seeds": 5}
    assert study_targets.fmt(target).startswith("13% [never, 34%], p = 0.500 (4/5 vs 5/5 reached")
    ratio = {"kind": "ratio", "value": 1.6, "lo": 1.25, "hi": None, "allocator": "sara", "ours_seeds": 5}
    assert study_targets.fmt(ratio).startswith("1.60x [1.25, never] (sara, 5 seeds")
    row = {"family": "pool", "protocol": "equal-batch", "ours": "sara", "baseline": "dapo", "warm_starts": 1,
           "ours_runs": 5, "base_runs": 5,
           "per_warm_start": [{"ours_reached": 4, "base_reached": 5, "p_value": 0.0004}],
           "pooled_saving": 0.13, "pooled_lo": None, "pooled_hi": 0.34, "p_value_stratified": 0.0004, "holds_in": 1,
           "p_holm": 0.0004}
    assert "| 13% [never, 34%] | < 0.001 | < 0.001 | 1/1 (p < 0.001) |" in warmstarts.summary_md([row])
    cell = {"regime": "hard", "protocol": "equal-batch", "allocator": "sara", "seeds": 5, "reached_fit": 2,
            "reached": 2, "fit_rollouts_to_target": {"median": None, "lo": 1500.0, "hi": None}, "p_value": 0.0004,
            "rollouts_to_target": {"median": 900.0, "lo": 800.0, "hi": None}}
    assert "| never [1,500, never] | 900 [800, never] | < 0.001 |" in readme.training_headline([cell])


def test_a_summary_reads_each_run_file_once(tmp_path: Path, monkeypatch) -> None:
    """The summary holds the runs in memory (one RunStore): every table is computed from them, no writer reads
    another's output, and no run file is read twice."""
    import collections
    import re

    store = RunStore(tmp_path)
    for regime in ("pool", "pool-ws1"):
        store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5, "rule": "r", "start": 0.3,
                                                 "gain": 0.3, "reference_seeds": [0, 1, 2], "set_at": "now",
                                                 "budget_rollouts": 5000})
        for seed in (0, 1, 2):
            for proto, label, accs in (("reference", "grpo", [0.3, 0.4, 0.5, 0.55, 0.6, 0.6]),
                                       ("equal-batch", "dapo", [0.3, 0.35, 0.45, 0.5, 0.55, 0.6]),
                                       ("equal-batch", "sara+dps", [0.3, 0.5, 0.6, 0.6, 0.65, 0.7])):
                path = store.run_file(regime, proto, label, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(_run(regime, proto, label, seed, accs)))
    reads: collections.Counter = collections.Counter()
    read_text = Path.read_text

    def counted(self: Path, *args, **kwargs) -> str:
        if re.fullmatch(r"s\d+\.json", self.name):
            reads[self] += 1
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    aggregate(tmp_path, tmp_path)
    assert len(reads) == 18 and set(reads.values()) == {1}
    rows = json.loads(read_text(tmp_path / "study_targets" / "training_targets.json"))
    pool = next(r for r in rows if r["target"].startswith("pool, equal-batch: sara+dps"))
    assert pool["regimes"] == ["pool", "pool-ws1"] and pool["ours_seeds"] == 6  # pooled over both warm starts


def test_a_cell_s_figure_is_drawn_again_only_when_what_it_shows_changed(tmp_path: Path) -> None:
    from benchmarks.common import figure_key
    from benchmarks.study import tables

    runs = {"grpo": [_run("pool", "reference", "grpo", s, [0.3, 0.4, 0.5]) for s in (0, 1)]}
    png = tmp_path / "cell.png"
    assert tables.plot_cell(png, "pool", "equal-batch", runs, 0.45) is True
    assert figure_key(png) == tables.plot_key("pool", "equal-batch", runs, 0.45)
    before = png.read_bytes()
    assert tables.plot_cell(png, "pool", "equal-batch", runs, 0.45) is False  # the same inputs: kept
    assert png.read_bytes() == before
    assert tables.plot_cell(png, "pool", "equal-batch", runs, 0.45, redraw=True) is True
    assert png.read_bytes() == before  # drawing is deterministic
    assert tables.plot_cell(png, "pool", "equal-batch", runs, 0.46) is True  # another target
    changed = {"grpo": [runs["grpo"][0], _run("pool", "reference", "grpo", 1, [0.3, 0.4, 0.51])]}
    assert tables.plot_cell(png, "pool", "equal-batch", changed, 0.46) is True  # another point of one curve
    png.write_bytes(b"not a png")
    assert figure_key(png) is None and tables.plot_cell(png, "pool", "equal-batch", changed, 0.46) is True


def test_the_other_benchmarks_list_their_variants_by_the_plan_s_flags(monkeypatch) -> None:
    from benchmarks import allocation, floor
    from benchmarks.study import round_price

    assert allocation.LABELS == plan.flagged("simulated")
    assert round_price.ROUND_VARIANTS == plan.flagged("round_priced")
    assert set(floor.HISTORY) <= set(allocation.LABELS) and set(floor.SMALL_GROUPS) <= set(allocation.LABELS)
    assert {"sara[carry]", "greso", "pilot-commit", "mopps"} <= set(floor.HISTORY) and "grpo" not in floor.HISTORY
    assert floor.SMALL_GROUPS == ("ar3po", "ar3po[no-reuse]")
    monkeypatch.setitem(plan.VARIANTS, "toy", plan.Variant("toy", "grpo", simulated=True, history=True))
    assert plan.flagged("simulated")[-1] == "toy" and "toy" in plan.flagged("history")
    with pytest.raises(ValueError, match="no flag 'ours_only'"):
        plan.flagged("ours_only")
