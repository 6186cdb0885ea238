"""rlvr_core.stats: first reach of a target, medians with bootstrap intervals, the reference target."""

from __future__ import annotations

import math

import pytest

from rlvr_core.stats import accuracy_se, first_reach, gain_target, median_ci, reach


def curve(accs: list[float], per_step: int = 100) -> list[dict[str, float]]:
    return [{"step": i, "cum_rollouts": i * per_step, "cum_tokens": 3 * i * per_step, "greedy_acc": a}
            for i, a in enumerate(accs)]


def test_first_reach_interpolates_and_says_never():
    assert first_reach([0, 100, 200], [0.2, 0.3, 0.5], 0.4) == pytest.approx(150.0)
    assert first_reach([0, 100, 200], [0.2, 0.4, 0.5], 0.4) == 100.0  # exactly at an evaluation
    assert first_reach([0, 100], [0.5, 0.6], 0.4) == 0.0  # already there at the start
    assert math.isnan(first_reach([0, 100, 200], [0.2, 0.3, 0.35], 0.4))
    # the first crossing counts, not a later one after a dip
    assert first_reach([0, 100, 200, 300], [0.2, 0.45, 0.3, 0.5], 0.4) == pytest.approx(80.0)


def test_reach_on_several_axes():
    hit = reach(curve([0.2, 0.3, 0.5]), 0.4, axes=("cum_rollouts", "cum_tokens"))
    assert hit == {"cum_rollouts": pytest.approx(150.0), "cum_tokens": pytest.approx(450.0)}


def test_median_ci_counts_unreached_as_never_and_is_deterministic():
    ci = median_ci([100, 200, 300, float("nan"), None])
    assert ci["median"] == 300 and ci["hi"] is None and ci["finite"] == 3 and ci["n"] == 5
    assert median_ci([100, None, None])["median"] is None
    wide = median_ci([100, 400, 900, 1600, 2500, 3600])
    assert wide["lo"] < wide["median"] < wide["hi"]
    assert median_ci([100, 400, 900, 1600, 2500, 3600]) == wide  # seeded: the same values, the same interval
    one = median_ci([500.0])
    assert one["median"] == one["lo"] == one["hi"] == 500.0 and one["n"] == 1


def test_gain_target_from_reference_runs():
    refs = [curve([0.2, 0.3, 0.4, 0.5, 0.6]), curve([0.3, 0.3, 0.5, 0.5, 0.5]), curve([0.2, 0.2, 0.2, 0.2, 0.2])]
    t = gain_target(refs)
    # starts 0.2, 0.3, 0.2 -> median 0.2; ends (mean of the last 3) 0.5, 0.5, 0.2 -> gains 0.3, 0.2, 0.0 -> 0.2
    assert t["start"] == pytest.approx(0.2) and t["gain"] == pytest.approx(0.2)
    assert t["target"] == pytest.approx(0.2 + 0.8 * 0.2)
    assert gain_target(refs, fraction=0.5)["target"] == pytest.approx(0.3)
    with pytest.raises(ValueError):
        gain_target([])


def test_accuracy_se():
    assert accuracy_se(0.5, 400) == pytest.approx(0.025)
    assert accuracy_se(0.0, 100) == 0.0
