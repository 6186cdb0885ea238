"""benchmarks/advisor_validation.py's saving to target: the study's own statistic, read from the committed run files."""

from __future__ import annotations

import json

import pytest

from benchmarks import advisor_validation as av


def cell(regime: str, protocol: str, variant: str) -> dict:
    return next(c for c in av.cells(regime) if (c["protocol"], c["variant"]) == (protocol, variant))


def test_the_measured_saving_to_target_is_the_studys_against_uniform_grpo():
    """hard, equal rollouts, sara[budget] against grpo: the figure of the committed warm-start table."""
    base, target = av.STUDY.reference_runs("hard"), av.STUDY.target_value("hard")
    got = av.measured_saving(cell("hard", "equal-rollouts", "sara[budget]"), base, target)
    ws = json.loads((av.ROOT / "benchmarks" / "results" / "warmstarts" / "training_warmstarts.json").read_text())
    row = next(r for r in ws["rollouts"] if (r["protocol"], r["ours"], r["baseline"]) ==
               ("equal-rollouts", "sara[budget]", "grpo") and r["family"] == "hard")
    hard = next(w for w in row["per_warm_start"] if w["regime"] == "hard")
    assert got["value"] == pytest.approx(hard["value"]) and not got["censored"]


def test_a_cell_whose_median_run_never_reached_gives_an_upper_bound():
    base, target = av.STUDY.reference_runs("hard"), av.STUDY.target_value("hard")
    got = av.measured_saving(cell("hard", "equal-batch", "dapo"), base, target)  # dapo reached in 2 of 5 runs
    assert got["censored"] and got["value"] < 0 and got["hi"] is not None and got["value"] <= got["hi"] + 1e-9


def test_families_set_contextual_priors_apart_and_split_recurring_replays():
    c = cell("hard", "equal-batch", "sara+dps[context]")
    assert av.family(c) == "contextual prior" and av.family(c, "pool") == "contextual prior on recurring prompts"
    assert av.family(cell("hard", "equal-batch", "sara"), "fresh") == "sara"
