"""The training targets (benchmarks/study_targets.py): savings with censored baselines, dominance, tuned choice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import study_targets as T
from benchmarks.study import plan


def run(accs, seed, per_step=100, variant="x", updates_per_step=1):
    curve = [{"step": i, "updates": i * updates_per_step, "cum_rollouts": i * per_step, "seconds": 0.5 * i,
              "greedy_acc": a} for i, a in enumerate(accs)]
    return {"curve": curve, "seed": seed, "variant": variant, "split": "test"}


def test_saving_counts_a_baseline_miss_at_its_budget_and_ours_as_never():
    ours = [run([0.0, 0.5, 1.0], s) for s in range(5)]  # reach 0.5 at 100 rollouts
    base = [run([0.0, 0.25, 0.5], s) for s in range(3)] + [run([0.0, 0.1, 0.2], s) for s in (3, 4)]  # 200; 2 miss
    s = T.saving(ours, base, 0.5)
    assert s["value"] == pytest.approx(0.5) and s["base_reached"] == 3 and s["ours_reached"] == 5
    assert s["lo"] <= s["value"] <= s["hi"]
    miss = [run([0.0, 0.1, 0.2], s) for s in range(5)]
    assert T.saving(miss, base, 0.5)["value"] is None  # ours never reaches: no saving to claim
    # a baseline that always misses is charged its whole budget (200), not infinity
    assert T.saving(ours, miss, 0.5)["value"] == pytest.approx(0.5)


def test_dominance_skips_the_first_tenth_and_reports_the_worst_gap():
    base = [run([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], s) for s in range(3)]
    ahead = [run([0.0, 0.3, 0.5, 0.7, 0.9, 1.0], s) for s in range(3)]
    d = T.dominance(ahead, base)
    assert d["value"] == 1.0 and d["min_difference"] >= 0 and d["updates"] == [0.5, 5.0]
    behind = [run([0.0, 0.1, 0.5, 0.7, 0.9, 1.0], s) for s in range(3)]  # behind only around update 1
    d2 = T.dominance(behind, base)
    assert 0 < d2["value"] < 1 and d2["min_difference"] < 0


def write_cell(root: Path, regime: str, proto: str, sub: str, variant: str, runs):
    d = root / "study" / regime / proto / sub
    d.mkdir(parents=True, exist_ok=True)
    for r in runs:
        r = {**r, "variant": variant}
        (d / f"s{r['seed']}.json").write_text(json.dumps(r))


def test_tuned_target_takes_our_best_on_validation_not_on_test(tmp_path):
    (tmp_path / "study" / "hard").mkdir(parents=True)
    (tmp_path / "study" / "hard" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "hard", "tuned", "grpo-b32-lr0.0001", "grpo", [run([0, 0.25, 0.5], s) for s in range(5)])
    # sara is best on validation but slower on test than sara[budget]: the target must report sara
    write_cell(tmp_path, "hard", "tuned", "sara-b16-lr0.0001", "sara", [run([0, 0.5, 1], s, 150) for s in range(5)])
    write_cell(tmp_path, "hard", "tuned", "sara_budget-b16-lr0.0001", "sara[budget]",
               [run([0, 0.5, 1], s, 50) for s in range(5)])
    (tmp_path / "study" / "hard" / "tuned" / "choice.json").write_text(json.dumps(
        {"grpo": {"validation_rollouts_to_target": 200, "grid": [32, 1e-4]},
         "sara": {"validation_rollouts_to_target": 90, "grid": [16, 1e-4]},
         "sara[budget]": {"validation_rollouts_to_target": 120, "grid": [16, 1e-4]}}))
    rows = {r["target"]: r for r in T.measure(tmp_path)}
    tuned = [r for t, r in rows.items() if "tuned" in t and "rollouts" in t][0]
    assert tuned["allocator"] == "sara" and tuned["value"] == pytest.approx(150 / 200) and tuned["met"] is False
    sim = [r for t, r in rows.items() if t.startswith("simulator")][0]
    assert sim["met"] is None and sim["value"] is None
    eb = [r for t, r in rows.items() if "equal-batch" in t]
    assert all(r["met"] is None for r in eb)  # no equal-batch cells: not run, neither met nor missed
    T.write(list(rows.values()), tmp_path)
    written = tmp_path / "study_targets"
    md = (written / "training_targets.md").read_text()
    assert "0.75x" in md and "not run yet" in md
    saved = [r for r in json.loads((written / "training_targets.json").read_text()) if r["target"] == tuned["target"]]
    assert not math.isnan(saved[0]["value"])


def test_a_cell_of_ours_that_never_reaches_is_a_miss_not_a_cell_not_run():
    ours = [run([0.0, 0.1, 0.2], s) for s in range(5)]
    base = [run([0.0, 0.25, 0.5], s) for s in range(5)]
    row = {"kind": "saving", **T.saving(ours, base, 0.5)}
    assert row["value"] is None and row["ours_seeds"] == 5
    assert T.fmt(row) == "none: our median run never reaches the target (0/5 vs 5/5 reached)"
    assert T.fmt({"kind": "saving", "value": None}) == "not run yet"


def test_easy_equal_batch_cells_are_candidate_rows_against_easy_dapo_at_the_easy_target(tmp_path):
    for regime, target in (("hard", 0.9), ("easy", 0.5)):
        (tmp_path / "study" / regime).mkdir(parents=True)
        (tmp_path / "study" / regime / "target.json").write_text(json.dumps({"target": target}))
    write_cell(tmp_path, "easy", "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(5)])
    write_cell(tmp_path, "easy", "equal-batch", "sara_context", "sara[context]",
               [run([0, 0.5, 1], s) for s in range(5)])
    rows = {r["target"]: r for r in T.measure(tmp_path)}
    easy = {t: r for t, r in rows.items() if t.startswith("(candidate) easy, equal-batch")}
    # only the cells that ran; at the easy target (0.5): 100 rollouts against dapo's 200
    assert list(easy) == ["(candidate) easy, equal-batch: sara[context]'s saving against dapo"]
    row = easy["(candidate) easy, equal-batch: sara[context]'s saving against dapo"]
    assert row["value"] == pytest.approx(0.5) and row["want"] is None and row["met"] is None
    T.write(list(rows.values()), tmp_path)
    written = tmp_path / "study_targets"
    assert "easy, equal-batch: sara[context]" in (written / "training_candidates.md").read_text()
    assert "easy, equal-batch" not in (written / "training_targets.md").read_text()  # no target of its own


def test_matched_updates_rows_compare_ours_with_grpo_at_equal_effective_groups(tmp_path):
    (tmp_path / "study" / "pool").mkdir(parents=True)
    (tmp_path / "study" / "pool" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "pool", "reference", "grpo", "grpo", [run([0, 0.25, 0.5], s) for s in range(5)])  # 200
    write_cell(tmp_path, "pool", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s, 50) for s in range(5)])  # 50
    rows = {r["target"]: r for r in T._matched_rows(tmp_path)}
    # no matched grpo runs yet: the equal-batch cell alone is not the matched-updates protocol
    assert rows["pool, matched-updates: our best allocator reaches the target with <= 0.5x the rollouts of grpo"][
        "value"] is None
    write_cell(tmp_path, "pool", "matched-updates", "grpo", "grpo", [run([0, 0.5, 1], s, 80) for s in range(5)])
    write_cell(tmp_path, "pool", "matched-updates-small", "sara", "sara", [run([0, 0.5, 1], s, 120) for s in range(5)])
    rows = {r["target"]: r for r in T._matched_rows(tmp_path)}
    up = rows["pool, matched-updates: our best allocator reaches the target with <= 0.5x the rollouts of grpo "
              "(best of the cells, picked on these runs)"]
    assert up["allocator"] == "sara" and up["value"] == pytest.approx(50 / 80) and up["met"] is False
    down = rows["pool, matched-updates-small: our best allocator reaches the target with <= 0.5x the rollouts of "
                "grpo (best of the cells, picked on these runs)"]
    assert down["value"] == pytest.approx(120 / 200) and down["p_value"] is not None  # against the reference runs
    assert "(candidate) pool, matched-updates-small: sara against grpo" in rows


def test_pool_rows_name_the_declared_target_and_the_published_allocators(tmp_path):
    (tmp_path / "study" / "pool").mkdir(parents=True)
    (tmp_path / "study" / "pool" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "pool", "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(5)])
    write_cell(tmp_path, "pool", "equal-batch", "saraplusdps", "sara+dps", [run([0, 0.5, 1], s, 80) for s in range(5)])
    write_cell(tmp_path, "pool", "equal-batch", "pilot-commit", "pilot-commit",
               [run([0, 0.5, 1], s, 60) for s in range(5)])
    (pool,) = [c for c in plan.CANDIDATES if c.regime == "pool"]
    rows = {r["target"]: r for r in T.candidate_rows(tmp_path, pool)}
    decl = rows["pool, equal-batch: sara+dps spends >= 50% fewer rollouts to target than dapo"]
    assert decl["value"] == pytest.approx(0.6) and decl["met"] is True
    vs = rows["(candidate) pool, equal-batch: sara+dps's saving against pilot-commit, the best published allocator "
              "of the cell"]
    assert vs["value"] == pytest.approx(1 - 80 / 60)  # a loss against the published allocator is shown as one


def run_tokens(accs, seed, per_step, tokens_per_rollout, variant="x"):
    curve = [{"step": i, "updates": i, "cum_rollouts": i * per_step, "cum_tokens": i * per_step * tokens_per_rollout,
              "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]
    return {"curve": curve, "seed": seed, "variant": variant, "split": "test"}


def test_the_token_gap_is_the_token_saving_minus_the_rollout_saving_with_paired_resamples():
    base = [run_tokens([0, 0.25, 0.5], s, 100, 40) for s in range(5)]  # 200 rollouts, 8,000 tokens to 0.5
    short = [run_tokens([0, 0.5, 1], s, 75, 20) for s in range(5)]  # 75 rollouts (62.5%), 1,500 tokens (81.25%)
    g = T.saving_gap(short, base, 0.5, axis="cum_tokens")
    assert g["value"] == pytest.approx(0.8125 - 0.625) and g["lo"] == pytest.approx(g["value"])  # no spread
    same = [run_tokens([0, 0.5, 1], s, 75, 40) for s in range(5)]  # as long per rollout as the baseline's
    assert T.saving_gap(same, base, 0.5, axis="cum_tokens")["value"] == pytest.approx(0.0)
    never = [run_tokens([0, 0.1, 0.2], s, 75, 20) for s in range(5)]
    assert T.saving_gap(never, base, 0.5, axis="cum_tokens")["value"] is None


def test_steps_rows_report_three_units_and_the_token_claim(tmp_path):
    (tmp_path / "study" / "steps").mkdir(parents=True)
    (tmp_path / "study" / "steps" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "steps", "equal-batch", "dapo", "dapo",
               [run_tokens([0, 0.25, 0.5], s, 100, 40) for s in range(5)])
    write_cell(tmp_path, "steps", "equal-batch", "sara", "sara", [run_tokens([0, 0.5, 1], s, 75, 20) for s in range(5)])
    rows = T._steps_rows(tmp_path)
    assert [r["target"].split(" in ")[-1] for r in rows[:3]] == ["rollouts", "generated tokens", "training seconds"]
    per = rows[-1]  # this warm start's gap: a candidate row
    assert per["kind"] == "gap" and per["want"] is None and per["value"] == pytest.approx(0.8125 - 0.625)
    assert T._steps_rows(tmp_path, regime="hard") == []
    # the claim itself pools every warm start of steps (here one): the same gap, met when its interval is above 0
    (claim,) = T._token_claim_row(tmp_path)
    assert claim["want"] == 0.0 and claim["met"] is True and claim["value"] == pytest.approx(per["value"])
    assert claim["warm_starts"] == 1 and "points" in T.fmt(claim)
    # a second warm start where sara's rollouts are as long as dapo's: the pooled gap shrinks, still above 0
    (tmp_path / "study" / "steps-ws1").mkdir(parents=True)
    (tmp_path / "study" / "steps-ws1" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "steps-ws1", "equal-batch", "dapo", "dapo",
               [run_tokens([0, 0.25, 0.5], s, 100, 40) for s in range(5)])
    write_cell(tmp_path, "steps-ws1", "equal-batch", "sara", "sara",
               [run_tokens([0, 0.5, 1], s, 75, 40) for s in range(5)])
    (both,) = T._token_claim_row(tmp_path)
    assert both["warm_starts"] == 2 and both["ours_seeds"] == 10 and 0 < both["value"] < claim["value"]


def test_a_declared_target_pools_the_warm_starts_of_its_regime_with_each_one_beside_it(tmp_path):
    """hard (warm start 0): sara reaches at 100 rollouts, dapo at 200; hard-ws1: both at 100. With warm start 0
    alone the row is that warm start's saving (50%); with both, the pooled saving (the median of the ratios 0.5 x5
    and 1.0 x5: 25%), the rank test stratified by warm start, and each warm start's own figure as a candidate."""
    for name in ("hard", "hard-ws1"):
        (tmp_path / "study" / name).mkdir(parents=True)
        (tmp_path / "study" / name / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "hard", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(5)])
    write_cell(tmp_path, "hard", "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(5)])
    head = "hard, equal-batch: sara spends >= 22% fewer rollouts to target than dapo, rank test p < 0.05"
    alone = {r["target"]: r for r in T.measure(tmp_path)}[head]
    assert alone["value"] == pytest.approx(0.5) and alone["met"] is True and "warm_starts" not in alone
    write_cell(tmp_path, "hard-ws1", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s) for s in range(5)])
    write_cell(tmp_path, "hard-ws1", "equal-batch", "dapo", "dapo", [run([0, 0.5, 1], s) for s in range(5)])
    rows = {r["target"]: r for r in T.measure(tmp_path)}
    both = rows[head]
    assert both["value"] == pytest.approx(0.25) and both["warm_starts"] == 2 and both["ours_seeds"] == 10
    assert both["regimes"] == ["hard", "hard-ws1"] and both["p_value"] < 0.05 and both["met"] is True
    assert "pooled over 2 warm starts (hard, hard-ws1), p stratified" in T.fmt(both)
    ws1 = rows["(candidate) hard-ws1, equal-batch: sara's saving against dapo (this warm start alone)"]
    assert ws1["value"] == pytest.approx(0.0) and ws1["want"] is None
    assert rows["(candidate) hard, equal-batch: sara's saving against dapo (this warm start alone)"]["value"] == \
        pytest.approx(0.5)


def test_matched_updates_pool_over_the_warm_starts_that_ran_the_protocol(tmp_path):
    """hard's own warm start ran no matched grpo (its cells are equal-batch only): the hard row pools hard-ws1 and
    hard-ws2, each against its own matched grpo runs."""
    for name in ("hard", "hard-ws1", "hard-ws2"):
        (tmp_path / "study" / name).mkdir(parents=True)
        (tmp_path / "study" / name / "target.json").write_text(json.dumps({"target": 0.5}))
        write_cell(tmp_path, name, "equal-batch", "sara", "sara", [run([0, 0.5, 1], s, 50) for s in range(5)])
    for name, per_step in (("hard-ws1", 100), ("hard-ws2", 200)):
        write_cell(tmp_path, name, "matched-updates", "grpo", "grpo", [run([0, 0.5, 1], s, per_step) for s in range(5)])
    rows = {r["target"]: r for r in T._matched_rows(tmp_path)}
    best = rows["hard, matched-updates: our best allocator reaches the target with <= 0.5x the rollouts of grpo "
                "(best of the cells, picked on these runs)"]
    # ratios 0.5 (ws1) and 0.25 (ws2), five runs each: the median of the ten is their midpoint
    assert best["value"] == pytest.approx(0.375) and best["regimes"] == ["hard-ws1", "hard-ws2"]
    assert best["met"] is True and best["ours_seeds"] == 10
    ws2 = rows["(candidate) hard-ws2, matched-updates: sara against grpo (this warm start alone)"]
    assert ws2["kind"] == "ratio" and ws2["value"] == pytest.approx(0.25) and ws2["allocator"] == "sara"


def test_the_vigor_target_reads_the_warm_starts_whose_vigor_fills_its_budget(tmp_path):
    """hard's own VIGOR runs (no fill) trail grpo; hard-ws1's (fill) lead it at every update count: the declared row
    reads hard-ws1 only, and with a second filled warm start that trails, the lowest share decides."""
    for name in ("hard", "hard-ws1", "hard-ws2"):
        (tmp_path / "study" / name).mkdir(parents=True)
        (tmp_path / "study" / name / "target.json").write_text(json.dumps({"target": 0.5}))
        write_cell(tmp_path, name, "reference", "grpo", "grpo", [run([0, 0.2, 0.4, 0.6], s) for s in range(3)])
    write_cell(tmp_path, "hard", "equal-rollouts", "vigor", "vigor",
               [{**run([0, 0.1, 0.2, 0.3], s), "allocator_params": {}} for s in range(3)])
    write_cell(tmp_path, "hard-ws1", "equal-rollouts", "vigor", "vigor",
               [{**run([0, 0.3, 0.5, 0.7], s), "allocator_params": {"fill": True}} for s in range(3)])
    head = "hard, equal-rollouts: vigor's accuracy >= grpo's at every update count after the first 10% of the run"
    row = {r["target"]: r for r in T._vigor_rows(tmp_path)}[head]
    assert row["warm_starts_read"] == ["hard-ws1"] and row["value"] == 1.0 and row["met"] is True
    write_cell(tmp_path, "hard-ws2", "equal-rollouts", "vigor", "vigor",
               [{**run([0, 0.1, 0.2, 0.3], s), "allocator_params": {"fill": True}} for s in range(3)])
    rows = {r["target"]: r for r in T._vigor_rows(tmp_path)}
    assert rows[head]["warm_starts_read"] == ["hard-ws1", "hard-ws2"] and rows[head]["value"] == 0.0
    assert rows[head]["met"] is False and "(hard-ws1, hard-ws2, the lowest)" in T.fmt(rows[head])
    assert rows["(candidate) hard-ws1, equal-rollouts: vigor against grpo"]["value"] == 1.0


def test_a_share_that_rounds_to_zero_reads_zero_not_minus_zero():
    assert [T.pct(v) for v in (-0.004, 0.0, 0.335, -0.3)] == ["0%", "0%", "34%", "-30%"]


def test_a_regime_s_candidate_rows_are_one_plan_record(tmp_path, monkeypatch):
    """A Candidates record is all a regime needs for its rows beside the targets: here hard's rules on pool."""
    (tmp_path / "study" / "pool").mkdir(parents=True)
    (tmp_path / "study" / "pool" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "pool", "equal-batch", "dapo", "dapo", [run([0, 0.25, 0.5], s) for s in range(5)])
    write_cell(tmp_path, "pool", "equal-batch", "sara", "sara", [run([0, 0.5, 1], s, 80) for s in range(5)])
    rec = plan.Candidates("pool", "equal-batch", "dapo")
    rows = {r["target"]: r for r in T.candidate_rows(tmp_path, rec)}
    assert rows["(candidate) pool, equal-batch: sara's saving against dapo"]["value"] == pytest.approx(0.6)
    assert not any("published" in t for t in rows)  # published=False, best_published=False
    assert T.candidate_rows(tmp_path, plan.Candidates("steps", "equal-batch", "dapo")) == []  # no target yet
    monkeypatch.setattr(plan, "CANDIDATES", (rec, plan.Candidates("pool-ws9", "equal-batch", "dapo", of="pool")))
    assert any(r["target"].startswith("(candidate) pool, equal-batch: sara") for r in T.measure(tmp_path))


def test_a_token_target_reads_generated_tokens_not_rollouts(tmp_path):
    """steps-fine's declared target is in generated tokens: valor[tokens] reaches the target at the same rollouts
    as uniform GRPO (no saving in rollouts) with half the tokens per rollout, so it saves 50% of the tokens."""
    tg = next(t for t in plan.SAVING_TARGETS if t.axis == "cum_tokens")
    assert tg.text == ("steps-fine, equal-rollouts: valor[tokens] spends >= 40% fewer generated tokens to target "
                       "than grpo, rank test p < 0.05")
    (tmp_path / "study" / "steps-fine").mkdir(parents=True)
    (tmp_path / "study" / "steps-fine" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "steps-fine", "reference", "grpo", "grpo",
               [run_tokens([0, 0.25, 0.5], s, 100, 40) for s in range(5)])
    write_cell(tmp_path, "steps-fine", "equal-rollouts", "valor[tokens]", "valor[tokens]",
               [run_tokens([0, 0.25, 0.5], s, 100, 20) for s in range(5)])
    rows = {r["target"]: r for r in T.measure(tmp_path)}
    row = rows[tg.text]
    assert row["value"] == pytest.approx(0.5) and row["p_value"] < 0.05 and row["met"] is True
    by_rollouts = T.family_saving(T.as_store(tmp_path), "steps-fine", "equal-rollouts", "valor[tokens]", "grpo")
    assert by_rollouts["value"] == pytest.approx(0.0)
    # beside it, candidate rows: the same allocator in rollouts, and another of ours that ran, on both axes
    assert rows["(candidate) steps-fine, equal-rollouts: valor[tokens]'s saving against grpo in rollouts"][
        "value"] == pytest.approx(0.0)
    assert "(candidate) steps-fine, equal-rollouts: valor's saving against grpo in generated tokens" not in rows
    write_cell(tmp_path, "steps-fine", "equal-rollouts", "valor", "valor",
               [run_tokens([0, 0.5, 1], s, 100, 40) for s in range(5)])  # half the rollouts, the same per rollout
    rows = {r["target"]: r for r in T.measure(tmp_path)}
    for unit in ("generated tokens", "rollouts"):
        row = rows[f"(candidate) steps-fine, equal-rollouts: valor's saving against grpo in {unit}"]
        assert row["value"] == pytest.approx(0.5) and row["met"] is None


def test_a_target_of_zero_saving_asks_for_any_saving_above_zero(tmp_path):
    """valor against AR3PO (issue 37's second target): 'fewer rollouts than', met only above zero."""
    tg = plan.Target("pool", "equal-rollouts", "valor", "ar3po", 0.0)
    assert tg.text == "pool, equal-rollouts: valor spends fewer rollouts to target than ar3po"
    assert tg in plan.SAVING_TARGETS
    (tmp_path / "study" / "pool").mkdir(parents=True)
    (tmp_path / "study" / "pool" / "target.json").write_text(json.dumps({"target": 0.5}))
    write_cell(tmp_path, "pool", "equal-rollouts", "ar3po", "ar3po", [run([0, 0.5, 1], s) for s in range(5)])
    write_cell(tmp_path, "pool", "equal-rollouts", "valor", "valor", [run([0, 0.5, 1], s) for s in range(5)])
    (tie, *_) = T.saving_target(T.as_store(tmp_path), tg)
    assert tie["value"] == pytest.approx(0.0) and tie["met"] is False
    write_cell(tmp_path, "pool", "equal-rollouts", "valor", "valor", [run([0, 0.5, 1], s, 90) for s in range(5)])
    (ahead, *_) = T.saving_target(T.as_store(tmp_path), tg)
    assert ahead["value"] == pytest.approx(0.1) and ahead["met"] is True


def test_a_target_is_not_met_while_its_monte_carlo_interval_straddles_the_level(monkeypatch):
    """A saving target with p < 0.05 is met only when p + 1.96 SE is below 0.05 (rlvr_core.stats.significant)."""
    tg = plan.Target("hard", "equal-rollouts", "valor", "grpo", 0.4, p=0.05)
    found = {"value": 0.5, "lo": 0.2, "hi": 0.7, "regimes": ["hard"]}
    for p, se, met in ((0.03, 0.0, True), (0.049, 0.001, False), (0.045, 0.001, True), (None, None, False)):
        monkeypatch.setattr(T, "family_saving", lambda *a, p=p, se=se, **k: {**found, "p_value": p, "p_mc_se": se})
        (row,) = T.saving_target(None, tg)
        assert row["met"] is met, (p, se)
