"""Headline comparisons across warm starts (benchmarks/warmstarts.py): per warm start, pooled, stratified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import warmstarts as W
from benchmarks.study.store import RunStore
from tests.benchmarks.test_study_targets import run, write_cell


def regime(root: Path, name: str, target: float, met: bool = True) -> None:
    (root / "study" / name).mkdir(parents=True, exist_ok=True)
    (root / "study" / name / "target.json").write_text(json.dumps({"target": target}))
    (root / "study" / name / "preregistration.json").write_text(json.dumps({"meets": met}))


def test_family_is_the_regime_then_its_warm_starts_in_seed_order(tmp_path):
    for name in ("pool", "pool-ws10", "pool-ws2", "pool-k16", "pool-k16-ws1"):
        regime(tmp_path, name, 0.5)
    (tmp_path / "study" / "pool-ws3").mkdir()  # no frozen target yet: not part of the family
    assert W.family(tmp_path, "pool") == ["pool", "pool-ws2", "pool-ws10"]


def test_a_saving_in_one_warm_start_only_says_so_and_the_stratified_test_sees_it(tmp_path):
    # warm start 0: ours reaches 0.5 at 100 rollouts, dapo at 200; warm start 1: the policy learns fast, both
    # reach at 100 (no saving). Pooled: one run in two saves half, the other nothing
    regime(tmp_path, "pool", 0.5)
    regime(tmp_path, "pool-ws1", 0.5, met=False)
    write_cell(tmp_path, "pool", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(4)])
    write_cell(tmp_path, "pool", "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(4)])
    write_cell(tmp_path, "pool-ws1", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(4)])
    write_cell(tmp_path, "pool-ws1", "equal-batch", "dapo", "dapo", [run([0, 0.5, 1], s) for s in range(4)])
    rows = W.measure(tmp_path, bases=("pool",))
    assert [(r["protocol"], r["ours"]) for r in rows] == [("equal-batch", "sara")]
    r = rows[0]
    assert r["warm_starts"] == 2 and r["holds_in"] == 1 and r["ours_runs"] == 8
    per = {p["regime"]: p for p in r["per_warm_start"]}
    assert per["pool"]["value"] == pytest.approx(0.5) and per["pool-ws1"]["value"] == pytest.approx(0.0)
    assert per["pool-ws1"]["preregistration_met"] is False
    assert r["pooled_saving"] == pytest.approx(0.25)  # median of the ratios 0.5 x4 and 1.0 x4
    # within warm start 0 ours wins every pair (p = 1/70 there); warm start 1 is all ties: significant, not tiny
    assert 0.0 < r["p_value_stratified"] < 0.05
    md = "\n".join(W.table(rows))
    assert "pool-ws1 (pre-reg. missed)" in md and "| 1/2 |" in md
    # one readme row in the family: Holm leaves its p as it is; the summary prints it and each warm start's own p
    assert r["p_holm"] == pytest.approx(r["p_value_stratified"]) and r["holm_family"] == 1
    own = ", ".join(f"{p['p_value']:.3f}" for p in r["per_warm_start"])
    assert f"| 1/2 (p {own}) |" in W.summary_md(rows)


def test_a_warm_start_without_both_cells_is_left_out(tmp_path):
    regime(tmp_path, "pool", 0.5)
    regime(tmp_path, "pool-ws1", 0.5)
    write_cell(tmp_path, "pool", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(3)])
    write_cell(tmp_path, "pool", "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(3)])
    write_cell(tmp_path, "pool-ws1", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(3)])
    rows = W.measure(tmp_path, bases=("pool",))
    assert rows[0]["warm_starts"] == 1 and rows[0]["base_runs"] == 3
    assert W.measure(tmp_path, bases=("hard",)) == []


def test_costs_pool_the_worked_answer_warm_starts_on_three_axes_with_the_token_gap(tmp_path):
    """Warm start 0: sara reaches at 100 rollouts of 20 tokens, dapo at 200 of 40 (saves 50% of rollouts and 75% of
    tokens); warm start 1: both reach at 100 rollouts, sara's 20 tokens against dapo's 40 (0% and 50%). Pooled: the
    medians of the per-run ratios, 0.75 of rollouts and 0.375 of tokens; the token claim's gap is +37.5 points,
    its interval above zero since every resample keeps it there."""
    from tests.benchmarks.test_study_targets import run_tokens

    regime(tmp_path, "steps", 0.5)
    regime(tmp_path, "steps-ws1", 0.5, met=False)
    write_cell(tmp_path, "steps", "equal-batch", "sara", "sara",
               [run_tokens([0, 0.5, 1], s, 100, 20) for s in range(4)])
    write_cell(tmp_path, "steps", "equal-batch", "dapo", "dapo",
               [run_tokens([0, 0.25, 0.5], s, 100, 40) for s in range(4)])
    write_cell(tmp_path, "steps-ws1", "equal-batch", "sara", "sara",
               [run_tokens([0, 0.5, 1], s, 100, 20) for s in range(4)])
    write_cell(tmp_path, "steps-ws1", "equal-batch", "dapo", "dapo",
               [run_tokens([0, 0.5, 1], s, 100, 40) for s in range(4)])
    rows = W.measure_costs(tmp_path)
    assert [(r["protocol"], r["ours"], r["baseline"]) for r in rows] == [("equal-batch", "sara", "dapo")]
    ax = rows[0]["axes"]
    assert ax["cum_rollouts"]["pooled_value"] == pytest.approx(0.25)
    assert ax["cum_tokens"]["pooled_value"] == pytest.approx(0.625)
    assert ax["seconds"]["pooled_value"] == pytest.approx(0.25)
    assert ax["cum_tokens"]["holds_in"] == 2 and ax["cum_rollouts"]["holds_in"] == 1
    assert ax["cum_tokens"]["pooled_gap"] == pytest.approx(0.375) and ax["cum_tokens"]["pooled_gap_lo"] > 0
    md = W.costs_md(rows)
    assert "| sara vs dapo | equal-batch | 8 vs 8 (2) | 25% [" in md
    assert "**holds**" in W.claim_line(rows) and "+37.5 points" in W.claim_line(rows)
    W.write(W.measure(tmp_path, bases=("pool",)), tmp_path, rows)
    assert W.claim_line(rows) in (tmp_path / "warmstarts" / "training_warmstarts.md").read_text()
    saved = json.loads((tmp_path / "warmstarts" / "training_warmstarts.json").read_text())
    assert saved["rollouts"] == [] and saved["costs"][0]["ours"] == "sara"
    assert (tmp_path / "warmstarts" / "training_costs.md").read_text() == md


def test_the_summary_shows_the_headline_rows_with_pooled_intervals_and_names_a_miss(tmp_path):
    """pool: sara saves half against dapo in both warm starts (interval [50%, 50%]); vigor never reaches the target
    in warm start 0 while grpo does: its row says so instead of printing a saving. greso is measured
    (training_warmstarts.md) but not one of the README's rows."""
    regime(tmp_path, "pool", 0.5)
    regime(tmp_path, "pool-ws1", 0.5)
    for name in ("pool", "pool-ws1"):
        write_cell(tmp_path, name, "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(3)])
        write_cell(tmp_path, name, "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(3)])
    write_cell(tmp_path, "pool", "equal-batch", "greso", "greso", [run([0, 0.5, 1], s) for s in range(3)])
    write_cell(tmp_path, "pool", "equal-rollouts", "vigor", "vigor", [run([0, 0.1, 0.2], s) for s in range(3)])
    write_cell(tmp_path, "pool", "reference", "grpo", "grpo", [run([0, 0.5, 1], s) for s in range(3)])
    rows = W.measure(tmp_path, bases=("pool",))
    assert {r["ours"] for r in rows} == {"sara", "greso", "vigor"}
    sara = next(r for r in rows if r["ours"] == "sara")
    assert sara["pooled_saving"] == pytest.approx(0.5) and sara["pooled_lo"] == pytest.approx(0.5)
    md = W.summary_md(rows)
    assert "| pool | equal-batch | sara vs dapo | 6 vs 6 (2) | 6/6 vs 6/6 | 50% [50%, 50%] |" in md
    assert "| pool | equal-rollouts | vigor vs grpo | 3 vs 3 (1) | 0/3 vs 3/3 | none: the median run never " \
        "reaches |" in md
    assert "greso" not in md and "training_warmstarts.md" in md
    W.write(rows, tmp_path)
    assert (tmp_path / "warmstarts" / "training_summary.md").read_text() == md


def test_a_warm_start_whose_runs_used_other_allocator_settings_is_left_out_and_named(tmp_path):
    """VIGOR's runs on warm start 0 predate `fill` (other allocator_params): pooling them with warm start 1's would
    mix two allocators under one name, so the row reads warm start 1 alone and says which was left out."""
    regime(tmp_path, "pool", 0.5)
    regime(tmp_path, "pool-ws1", 0.5)
    for name, params, per_step in (("pool", {}, 50), ("pool-ws1", {"fill": True}, 200)):
        write_cell(tmp_path, name, "equal-rollouts", "vigor", "vigor",
                   [{**run([0, 0.5, 1], s, per_step), "allocator_params": params} for s in range(3)])
        write_cell(tmp_path, name, "reference", "grpo", "grpo", [run([0, 0.5, 1], s) for s in range(3)])
    (row,) = W.measure(tmp_path, bases=("pool",))
    assert row["warm_starts"] == 1 and row["left_out_other_settings"] == ["pool"]
    assert row["pooled_saving"] == pytest.approx(-1.0)  # warm start 1 only: 200 against 100 rollouts
    assert "3 vs 3 (1; pool left out: other allocator settings)" in W.summary_md([row])


def test_holm_adjusts_a_family_step_down_and_leaves_untested_rows_out() -> None:
    from benchmarks.study.stats import holm

    assert holm([0.01, 0.04, None, 0.03, 0.5]) == pytest.approx([0.04, 0.09, None, 0.09, 0.5])
    assert holm([0.2, 0.9]) == pytest.approx([0.4, 0.9]) and holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    assert holm([]) == [] and holm([None]) == [None]


def test_fixed_budget_statistics_pair_runs_by_seed_within_each_warm_start(tmp_path):
    """Accuracy at 25/50/75/100% of the budget and the area under the curve, ours - baseline per seed pair: a
    cell whose every run sits 2 points above its baseline's reads +2.0 at every fraction, with no spread."""
    from benchmarks.study.stats import paired_budget

    for name in ("pool", "pool-ws1"):
        regime(tmp_path, name, 0.5)
        base = [{"seed": s, "eval_size": 2000, "allocator_params": {},
                 "curve": [{"cum_rollouts": x, "greedy_acc": 0.2 + 0.01 * s + 0.1 * x / 40000, "updates": 0,
                            "seconds": 0, "cum_tokens": 0, "cum_trained_tokens": 0} for x in range(0, 40001, 4000)]}
                for s in range(3)]
        ours = [{**r, "curve": [{**c, "greedy_acc": c["greedy_acc"] + 0.02} for c in r["curve"]]} for r in base]
        write_cell(tmp_path, name, "equal-batch", "sara", "sara", ours)
        write_cell(tmp_path, name, "equal-batch", "dapo", "dapo", base)
    d = paired_budget(RunStore(tmp_path), ["pool", "pool-ws1"], "equal-batch", "sara", "dapo")
    assert d["pairs"] == 6 and d["warm_starts"] == 2
    for name in ("0.25", "0.5", "0.75", "1", "auc"):
        assert d[name]["mean"] == pytest.approx(0.02) and d[name]["lo"] == pytest.approx(0.02)
        assert d[name]["hi"] == pytest.approx(0.02) and d[name]["pairs"] == 6
    (row,) = W.measure_budget(tmp_path, bases=("pool",))
    assert row["ours"] == "sara" and "| +2.0 [+2.0, +2.0] |" in W.budget_md([row])


def _ref(seed: int, speed: float, n: int = 27) -> dict:
    """A reference run on the rollout grid whose accuracy rises ``speed`` points per 1,000 rollouts from 0.20."""
    from benchmarks.study.plan import EVAL_GRID

    return {"seed": seed, "eval_size": 2000, "allocator_params": {},
            "curve": [{"cum_rollouts": i * EVAL_GRID, "greedy_acc": 0.20 + speed * i * EVAL_GRID / 1e5,
                       "updates": 6 * i, "seconds": i, "cum_tokens": 0, "cum_trained_tokens": 0} for i in range(n)]}


def test_conditioning_reads_slope_headroom_and_evaluations_before_the_target() -> None:
    from benchmarks.study.stats import conditioning

    # 0.2 points per 1k rollouts, target at 0.26: reached at 30k rollouts (evaluation 19.5), 1.9 points headroom
    steep = conditioning([_ref(s, 0.2) for s in range(5)], 0.26)
    assert steep["slope_points_per_1k"] == pytest.approx(0.2, rel=1e-6) and steep["evals_before_target"] == 19
    assert steep["headroom_points"] == pytest.approx(100 * (0.20 + 0.2 * 26 * 1536 / 1e5 - 0.26))
    assert steep["conditioned"] is True
    flat = conditioning([_ref(s, 0.05, n=40) for s in range(5)], 0.215)  # 0.05 per 1k: too flat, though it reaches
    assert flat["meets"] == {"slope": False, "headroom": True, "evals": True} and not flat["conditioned"]
    early = conditioning([_ref(s, 2.0) for s in range(5)], 0.25)  # reached after 1-2 evaluations
    assert early["meets"]["evals"] is False and early["evals_before_target"] == 1
    never = conditioning([_ref(s, 0.01) for s in range(5)], 0.5)
    assert never["slope_points_per_1k"] == 0.0 and never["median_fit_reach"] is None and not never["conditioned"]


def test_conditioning_s_slope_window_is_three_evaluations_of_the_runs_own_grid() -> None:
    """A regime with its own grid (steps-fine: every 256 rollouts): 2 points per 1k up to 3,000 rollouts, flat at
    0.26 after. The slope near the reach (2,500) reads 3 evaluations of 256 either side, not of EVAL_GRID, whose
    window would reach far into the flat part."""
    from benchmarks.study.stats import conditioning

    def fine(seed: int, record: bool) -> dict:
        xs = [256 * i for i in range(48)]
        curve = [{"cum_rollouts": x, "greedy_acc": 0.2 + 0.02 * min(x, 3000) / 1000, "updates": i, "seconds": i,
                  "cum_tokens": 0, "cum_trained_tokens": 0} for i, x in enumerate(xs)]
        return {"seed": seed, "curve": curve, **({"eval_every_rollouts": 256} if record else {})}

    own = conditioning([fine(s, True) for s in range(5)], 0.25)
    wide = conditioning([fine(s, False) for s in range(5)], 0.25)  # no grid recorded: EVAL_GRID's window
    assert own["median_fit_reach"] == pytest.approx(2500) and own["evals_before_target"] == 9
    assert own["slope_points_per_1k"] > 1.5 > 1.0 > wide["slope_points_per_1k"] > 0


def test_headline_rows_pool_conditioned_warm_starts_and_name_the_others(tmp_path):
    regime(tmp_path, "pool", 0.26)
    regime(tmp_path, "pool-ws1", 0.26)
    for name, speed in (("pool", 0.2), ("pool-ws1", 0.05)):  # pool-ws1's GRPO never gets near: not conditioned
        write_cell(tmp_path, name, "reference", "grpo", "grpo", [_ref(s, speed) for s in range(3)])
        write_cell(tmp_path, name, "equal-rollouts", "sara_budget", "sara[budget]", [_ref(s, 0.3) for s in range(3)])
    everyone = W.measure(tmp_path, bases=("pool",))
    (head,) = [r for r in W.measure(tmp_path, bases=("pool",), conditioned=True) if r["ours"] == "sara[budget]"]
    (full,) = [r for r in everyone if r["ours"] == "sara[budget]"]
    assert full["warm_starts"] == 2 and full["left_out_unconditioned"] == []
    assert head["warm_starts"] == 1 and head["left_out_unconditioned"] == ["pool-ws1"]
    assert "pool-ws1 left out: not conditioned" in W.summary_md([head])


def test_the_paired_interval_pools_the_spread_within_each_warm_start() -> None:
    """Each warm start's own mean is taken out, so a shift between warm starts does not widen the interval:
    variance 4 / (6 - 2), t(0.975, 4) = 2.776; one pair per warm start leaves no degree of freedom."""
    import math

    from benchmarks.study.stats import stratified_t_interval

    lo, hi = stratified_t_interval([1, 2, 3, 10, 11, 12], ["a"] * 3 + ["b"] * 3)
    half = 2.7764451 * math.sqrt(1 / 6)
    assert lo == pytest.approx(6.5 - half) and hi == pytest.approx(6.5 + half)
    assert stratified_t_interval([1.0, 2.0], ["a", "b"]) == (None, None)


def test_holm_carries_each_monte_carlo_se_through_its_factor() -> None:
    from benchmarks.study.stats import holm, holm_with_se

    ps, ses = [0.01, 0.04, None, 0.03, 0.5], [0.001, 0.0, None, 0.002, 0.0]
    out = holm_with_se(ps, ses)
    assert [p for p, _ in out] == pytest.approx(holm(ps))
    # 0.01 x 4 (its SE x 4); 0.03 x 3 = 0.09 (SE x 3); 0.04 x 2 = 0.08 < 0.09: it takes 0.09 and that p's SE
    assert [se for _, se in out] == pytest.approx([0.004, 0.006, None, 0.006, 0.0])
    assert holm_with_se([0.6, 0.7], [0.01, 0.01]) == [(1.0, 0.0), (1.0, 0.0)]  # the cap at 1 decides: no SE
