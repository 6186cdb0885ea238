"""The screening floor (rlvr_core/allocation/floor.py): the least rollouts per effective group on fresh prompts."""

import itertools

import numpy as np
import pytest

from rlvr_core.allocation.floor import floor_from_runs, go_on_values, runs_beta, runs_rates, screening_floor
from rlvr_core.errors import ConfigError


def threshold_ratio(rates: np.ndarray, k: int, t_fail: int, t_pass: int) -> float:
    """Exact ratio of the rule 'abandon after t_fail fails in a row / t_pass passes in a row' over a finite
    population, by enumerating each prompt's first rewards (no closed form shared with the module)."""
    cost = eff = 0.0
    for p in rates:
        for first, t in ((0, t_fail), (1, t_pass)):
            q = p if first else 1 - p  # the first reward's side
            # n identical rewards of that side, then stop at t, or a different reward at n + 1 <= k
            for n in range(1, k + 1):
                reach = q ** n
                if n == t or n == k:
                    cost += reach * n
                    break
                differ = reach * (1 - q)
                cost += differ * k
                eff += differ
    return cost / eff if eff > 0 else float("inf")


@pytest.mark.parametrize("rates", [np.array([0.02, 0.1, 0.5, 0.9]), np.array([0.0, 0.0, 0.3]),
                                   np.random.default_rng(0).beta(0.3, 0.8, 50)])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_floor_is_the_best_abandon_rule_found_by_exhaustive_search(rates, k):
    fl = screening_floor(k, rates=rates)
    ratios = {(tf, tp): threshold_ratio(rates, k, tf, tp)
              for tf, tp in itertools.product(range(1, k + 1), repeat=2)}
    best = min(ratios.values())
    assert fl.rollouts_per_effective_group == pytest.approx(best, rel=1e-9)
    assert ratios[(fl.abandon_after_fails, fl.abandon_after_passes)] == pytest.approx(best, rel=1e-9)
    assert fl.filter_rollouts_per_effective_group == pytest.approx(ratios[(k, k)], rel=1e-9)


@pytest.mark.parametrize("beta", [(0.4, 2.5), (0.3, 0.3), (2.0, 1.0)])
def test_at_the_floor_price_a_fresh_prompt_is_worth_nothing(beta):
    # the renewal-reward fixed point: pricing an effective group at the floor, drawing a fresh prompt and
    # playing the best rule breaks even; a higher price makes it pay, a lower one makes it lose
    k = 8
    f, s = runs_beta(*beta, k)
    same = (np.r_[0.0, f[2:] / f[1:k]], np.r_[0.0, s[2:] / s[1:k]])

    def fresh(lam):
        go = go_on_values(same, lam, k)
        return -1.0 + f[1] * max(go[0, 1], 0.0) + s[1] * max(go[1, 1], 0.0)

    lam = screening_floor(k, beta=beta).rollouts_per_effective_group
    assert fresh(lam) == pytest.approx(0.0, abs=1e-9)
    assert fresh(lam * 1.05) > 0 > fresh(lam * 0.95)


def test_go_on_values_broadcast_over_prompts_as_one_at_a_time():
    k, lam = 8, 17.0
    rng = np.random.default_rng(3)
    same = (rng.uniform(0.2, 0.99, (5, k)), rng.uniform(0.2, 0.99, (5, k)))
    together = go_on_values(same, lam, k)
    for i in range(5):
        np.testing.assert_array_equal(together[:, i], go_on_values((same[0][i], same[1][i]), lam, k))
    assert np.isneginf(together[..., 0]).all()  # no state "0 identical rewards"


def test_monte_carlo_of_the_rule_spends_what_the_floor_says():
    rng = np.random.default_rng(1)
    k, a, b = 8, 0.4, 2.5
    fl = screening_floor(k, beta=(a, b))
    p = rng.beta(a, b, 200_000)
    r = rng.random((p.size, k)) < p[:, None]
    run = np.cumprod(r == r[:, :1], axis=1).sum(axis=1)  # length of the identical first rewards, 1..k
    t = np.where(r[:, 0], fl.abandon_after_passes, fl.abandon_after_fails)
    dropped = run >= t  # abandoned after t identical rewards (or all k identical: lost)
    cost, eff = np.where(dropped, t, k).sum(), (~dropped).sum()
    assert cost / eff == pytest.approx(fl.rollouts_per_effective_group, rel=0.02)


def test_known_values_and_their_shape():
    early = screening_floor(8, beta=(0.4, 2.5))
    assert early.ratio_to_k == pytest.approx(1.8246, abs=1e-3)
    assert (early.abandon_after_fails, early.abandon_after_passes) == (1, 8)  # one fail first: drop it
    late = screening_floor(8, beta=(2.5, 0.4))  # the mirror image
    assert late.rollouts_per_effective_group == pytest.approx(early.rollouts_per_effective_group)
    assert (late.abandon_after_fails, late.abandon_after_passes) == (8, 1)
    # with a uniform population, no abandoning pays off at k = 8: the floor is the filter
    flat = screening_floor(8, beta=(1.0, 1.0))
    assert flat.rollouts_per_effective_group == pytest.approx(flat.filter_rollouts_per_effective_group)
    assert flat.max_saving_over_filter == pytest.approx(0.0, abs=1e-12)
    # the filter: k / P(mixed), with P(mixed) = 1 - 2 / (k + 1) under Beta(1, 1)
    assert flat.filter_rollouts_per_effective_group == pytest.approx(8 / (1 - 2 / 9))
    for fl in (early, late, flat, screening_floor(16, beta=(0.25, 0.25))):
        assert fl.k <= fl.rollouts_per_effective_group <= fl.filter_rollouts_per_effective_group


def test_beta_runs_equal_the_mean_over_many_draws():
    f, s = runs_beta(0.7, 1.9, 6)
    fr, sr = runs_rates(np.random.default_rng(2).beta(0.7, 1.9, 400_000), 6)
    np.testing.assert_allclose(f, fr, rtol=5e-3)
    np.testing.assert_allclose(s, sr, rtol=2e-2)


def test_a_population_that_never_mixes_has_no_floor():
    fl = screening_floor(8, rates=[0.0, 1.0, 0.0])
    assert fl.rollouts_per_effective_group == float("inf") and fl.mixed_probability == 0.0


@pytest.mark.parametrize("kwargs, match", [
    ({"k": 8}, "exactly one"),
    ({"k": 8, "beta": (1, 1), "rates": [0.5]}, "exactly one"),
    ({"k": 1, "beta": (1, 1)}, "at least 2"),
    ({"k": 8, "beta": (0, 1)}, "a, b > 0"),
    ({"k": 8, "rates": [1.5]}, r"\[0, 1\]"),
    ({"k": 8, "rates": []}, r"\[0, 1\]"),
])
def test_bad_input_is_refused_by_name(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        screening_floor(**kwargs)


def test_runs_of_the_wrong_length_are_refused():
    with pytest.raises(ConfigError, match="n = 0..8"):
        floor_from_runs((np.ones(5), np.ones(5)), 8)
