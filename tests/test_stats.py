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


def test_isotonic_is_the_least_squares_monotone_fit():
    from rlvr_core.stats import isotonic

    assert isotonic([1.0, 3.0, 2.0, 4.0]).tolist() == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert isotonic([0.5, 0.4, 0.3]).tolist() == pytest.approx([0.4, 0.4, 0.4])
    assert isotonic([0.1, 0.2, 0.3]).tolist() == pytest.approx([0.1, 0.2, 0.3])  # already monotone: unchanged
    # weights pull the pooled value toward the heavier point
    assert isotonic([2.0, 1.0], w=[3.0, 1.0]).tolist() == pytest.approx([1.75, 1.75])


def test_fitted_reach_ignores_a_single_noisy_crossing():
    from rlvr_core.stats import fitted_reach

    xs = [0, 100, 200, 300, 400]
    noisy = [0.20, 0.45, 0.25, 0.30, 0.50]  # one lucky evaluation at 100 crosses 0.4, the trend crosses later
    assert first_reach(xs, noisy, 0.4) == pytest.approx(80.0)
    fr = fitted_reach(xs, noisy, 0.4)
    assert 300 < fr <= 400  # the fit pools 0.45, 0.25, 0.30 to 0.333 and reaches 0.4 between 300 and 400
    assert fitted_reach(xs, [0.2, 0.3, 0.5, 0.6, 0.7], 0.4) == pytest.approx(150.0)  # monotone: as the raw curve
    assert math.isnan(fitted_reach(xs, [0.2, 0.3, 0.3, 0.35, 0.3], 0.4))


def test_fitted_reach_does_not_reward_evaluation_density():
    """Two samplings of the same noisy trend: the raw first crossing of the denser one is earlier on average,
    the fitted one is not (much)."""
    import numpy as np

    from rlvr_core.stats import fitted_reach

    rng = np.random.default_rng(0)
    raw_d, raw_s, fit_d, fit_s = [], [], [], []
    for _ in range(300):
        for every, raw, fit in ((500, raw_d, fit_d), (2000, raw_s, fit_s)):
            xs = np.arange(0, 40001, every)
            ys = 0.2 + 0.15 * xs / 40000 + rng.normal(0, 0.012, len(xs))
            raw.append(first_reach(xs, ys, 0.32))
            fit.append(fitted_reach(xs, ys, 0.32))
    true = (0.32 - 0.2) / 0.15 * 40000  # 32,000
    bias_raw = np.nanmedian(raw_s) - np.nanmedian(raw_d)
    bias_fit = np.nanmedian(fit_s) - np.nanmedian(fit_d)
    assert bias_raw > 1500  # the dense run crosses "early" by about 2,300 rollouts (of a true 32,000)
    assert abs(bias_fit) < bias_raw / 4  # the fitted crossing moves by about 300
    assert abs(np.nanmedian(fit_d) - true) < abs(np.nanmedian(raw_d) - true)


def test_accuracy_at_and_area_under_curve():
    from rlvr_core.stats import accuracy_at, area_under_curve

    c = curve([0.2, 0.4, 0.3, 0.6])  # at 0, 100, 200, 300 rollouts
    assert accuracy_at(c, 150) == pytest.approx(0.35)  # the fit pools 0.4 and 0.3
    assert accuracy_at(c, 301) is None  # past the run's end
    assert area_under_curve(c, 100) == pytest.approx(0.3)
    assert area_under_curve(c, 300) == pytest.approx((0.3 + 0.35 + 0.45) / 3)
    assert area_under_curve(c, 400) is None


def test_median_interval_has_the_exact_order_statistic_coverage():
    from rlvr_core.stats import median_interval

    five = median_interval([5, 1, 4, 2, 3])
    assert (five["median"], five["lo"], five["hi"]) == (3, 1, 5)
    assert five["coverage"] == pytest.approx(1 - 2 / 32)  # 93.75%: the most 5 seeds allow
    ten = median_interval(list(range(10)))
    assert (ten["lo"], ten["hi"]) == (1, 8) and ten["coverage"] == pytest.approx(1 - 2 * 11 / 1024)
    miss = median_interval([1, 2, 3, None, float("inf")])
    assert miss["median"] == 3 and miss["hi"] is None and miss["finite"] == 3
    assert median_interval([])["median"] is None


def test_rank_test_one_sided_with_misses_last():
    from rlvr_core.stats import rank_test

    clear = rank_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert clear["exact"] and clear["p_value"] == pytest.approx(1 / 252) and clear["u"] == 25
    assert rank_test([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])["p_value"] == pytest.approx(1.0)
    # a baseline that misses is ranked last: ours beat it; our misses count against us
    assert rank_test([10, 11, 12], [5, None, None])["p_value"] < rank_test([10, 11, 12], [5, 6, 7])["p_value"]
    assert rank_test([None, None, None], [5, 6, 7])["p_value"] == pytest.approx(1.0)
    mixed = rank_test([3, 5, 7, 9, 11], [4, 6, 8, 10, 12])
    assert 0.2 < mixed["p_value"] < 0.6


def test_rank_test_stratified_permutes_within_strata():
    from rlvr_core.stats import rank_test

    # within each warm start ours is lower, but the warm starts differ more than the allocators do
    ours, base = [1, 2, 3, 101, 102, 103], [4, 5, 6, 104, 105, 106]
    strata_o, strata_b = ["a"] * 3 + ["b"] * 3, ["a"] * 3 + ["b"] * 3
    st = rank_test(ours, base, strata_ours=strata_o, strata_base=strata_b)
    assert st["exact"] and st["p_value"] == pytest.approx(1 / 400)  # two strata each at the extreme: (1/20)^2
    assert rank_test(ours, base)["p_value"] > st["p_value"]
    with pytest.raises(ValueError):
        rank_test(ours, base, strata_ours=strata_o)


def _brute_force_p(ours, base, strata_ours, strata_base):
    """P(T <= observed) over every relabelling within every stratum, enumerated: the definition of the exact test."""
    import itertools

    import numpy as np

    from rlvr_core.stats import _ranks

    def val(v):
        return math.inf if v is None or not math.isfinite(v) else float(v)

    observed, sums = 0.0, []
    for k in sorted(set(strata_ours) & set(strata_base)):
        va = [val(x) for x, s in zip(ours, strata_ours) if s == k]
        vb = [val(x) for x, s in zip(base, strata_base) if s == k]
        r = _ranks(np.asarray(va + vb, float))
        observed += float(r[:len(va)].sum())
        sums.append([float(r[list(c)].sum()) for c in itertools.combinations(range(len(r)), len(va))])
    totals = np.asarray([sum(t) for t in itertools.product(*sums)])
    return float(np.mean(totals <= observed + 1e-9))


STRATIFIED_CASES = [
    # (ours, base, strata of ours, strata of base): ties, misses (None, inf, NaN) and uneven strata
    ([1, 2, None, 4, 4, 9], [3, 4, 4, None, 8, 8, 10], list("aabbbc"), list("abbbcca")),
    ([5, 5, 5, 7], [5, 5, 6, 7, 7], list("xxyy"), list("xyyyx")),
    ([None, None, 3], [None, 2, 2, 1], list("ppq"), list("pqqp")),
    ([1, 3, 3, 6, 2, 8, 8, 0.5], [2, 3, 7, 9, float("inf"), 8, 1], [0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2, 2]),
    ([4, 1, 1, float("nan")], [1, 2, 3], list("aaaa"), list("aaa")),
]


@pytest.mark.parametrize("ours,base,so,sb", STRATIFIED_CASES)
def test_exact_stratified_p_equals_brute_force_enumeration(ours, base, so, sb):
    from rlvr_core.stats import rank_test

    r = rank_test(ours, base, strata_ours=so, strata_base=sb)
    assert r["method"] == "exact" and r["exact"] and r["p_mc_se"] == 0.0
    assert r["p_value"] == pytest.approx(_brute_force_p(ours, base, so, sb), abs=1e-12)


def test_exact_unstratified_equals_the_enumeration_of_every_relabelling():
    """The unstratified test is what the one-stratum enumeration always gave (rank sums of all C(n, m) subsets)."""
    import itertools

    import numpy as np

    from rlvr_core.stats import _ranks, rank_test

    rng = np.random.default_rng(3)
    for _ in range(10):
        a = [None if rng.random() < 0.15 else int(rng.integers(0, 12)) for _ in range(int(rng.integers(2, 9)))]
        b = [None if rng.random() < 0.15 else int(rng.integers(0, 12)) for _ in range(int(rng.integers(2, 9)))]
        r = _ranks(np.asarray([math.inf if v is None else v for v in a + b], float))
        sums = np.fromiter((r[list(c)].sum() for c in itertools.combinations(range(len(r)), len(a))), float)
        old = float(np.mean(sums <= r[:len(a)].sum() + 1e-9))
        assert rank_test(a, b)["p_value"] == pytest.approx(old, abs=1e-12)


def test_rank_sum_distribution_counts_subsets():
    from rlvr_core.stats import rank_sum_distribution

    d = rank_sum_distribution([1, 2, 3, 4], 2)  # sums of pairs: 3, 4, 5, 5, 6, 7
    assert d.sum() == pytest.approx(1.0)
    assert d[3:8] * 6 == pytest.approx([1, 1, 2, 1, 1]) and not d[:3].any()


def test_monte_carlo_lies_within_a_few_se_of_the_exact_p_and_reports_its_se():
    from rlvr_core.stats import MC_PERMUTATIONS, rank_test

    ours = [3, 5, 7, 8, None, 12, 2, 9, 9, 15, 4, 6]
    base = [4, 6, 10, 11, 13, None, 8, 9, 14, 16, None, 7]
    strata = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    exact = rank_test(ours, base, strata_ours=strata, strata_base=strata)
    mc = rank_test(ours, base, strata_ours=strata, strata_base=strata, max_cells=1)
    assert exact["method"] == "exact" and mc["method"] == "monte-carlo" and not mc["exact"]
    assert mc["permutations"] == MC_PERMUTATIONS and 0 < mc["p_mc_se"] < 0.002
    assert abs(mc["p_value"] - exact["p_value"]) < 4 * mc["p_mc_se"]
    assert mc["p_mc_se"] == pytest.approx(math.sqrt(mc["p_value"] * (1 - mc["p_value"]) / MC_PERMUTATIONS))


def test_significant_refuses_a_p_whose_interval_straddles_the_level():
    from rlvr_core.stats import significant

    assert significant({"p_value": 0.03, "p_mc_se": 0.0}, 0.05)
    assert not significant({"p_value": 0.049, "p_mc_se": 0.001}, 0.05)  # 0.049 + 0.00196 > 0.05
    assert significant({"p_value": 0.047, "p_mc_se": 0.001}, 0.05)
    assert not significant({"p_value": 0.05, "p_mc_se": 0.0}, 0.05) and not significant({"p_value": None}, 0.05)
    assert significant({"p_holm": 0.01, "p_holm_se": 0.005}, 0.05, p="p_holm", se="p_holm_se")
    assert not significant({"p_holm": 0.041, "p_holm_se": 0.005}, 0.05, p="p_holm", se="p_holm_se")
    assert significant({"p_value": 0.01}, 0.05)  # no SE recorded: an exact p
