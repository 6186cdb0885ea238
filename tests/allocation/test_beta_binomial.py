import math

import numpy as np
import pytest
from scipy.special import betaln, comb

from rlvr_core.allocation.beta_binomial import fit_beta_moments, group_mixed_probability, p_effective


def brute_force(n, s, k, a, b):
    """Enumerate the Beta-Binomial predictive of the remaining k - n rollouts."""
    m = k - n
    a1, b1 = a + s, b + n - s
    total = 0.0
    for j in range(m + 1):
        pj = comb(m, j) * math.exp(betaln(a1 + j, b1 + m - j) - betaln(a1, b1))
        passes = s + j
        if 0 < passes < k:
            total += pj
    return total


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (0.5, 0.5), (2.0, 5.0), (0.3, 3.0), (7.0, 1.5)])
def test_p_effective_matches_enumeration_for_all_prefixes(a, b):
    for k in range(2, 17):
        ns, ss = zip(*[(n, s) for n in range(k + 1) for s in range(n + 1)])
        got = p_effective(np.array(ns), np.array(ss), k, a, b)
        want = np.array([brute_force(n, s, k, a, b) for n, s in zip(ns, ss)])
        np.testing.assert_allclose(got, want, atol=1e-10)


def test_uniform_prior_closed_forms():
    k = 8
    n = np.arange(1, k + 1)
    np.testing.assert_allclose(p_effective(n, 0, k), (k - n) / (k + 1))
    np.testing.assert_allclose(p_effective(n, n, k), (k - n) / (k + 1))
    assert p_effective(0, 0, k) == pytest.approx((k - 1) / (k + 1))
    assert p_effective(5, 2, k) == 1.0


def test_p_effective_broadcasts_over_priors_and_rejects_impossible_prefixes():
    out = p_effective(np.array([2, 2]), np.array([0, 0]), 8, np.array([1.0, 1.0]), np.array([1.0, 20.0]))
    assert out.shape == (2,) and out[1] < out[0]
    with pytest.raises(ValueError):
        p_effective(3, 4, 8)
    with pytest.raises(ValueError):
        p_effective(9, 0, 8)
    with pytest.raises(ValueError):
        p_effective(1, 0, 8, a=0.0)


def test_group_mixed_probability_known_rate():
    assert group_mixed_probability(0.5, 2) == pytest.approx(0.5)
    assert group_mixed_probability(0.0, 8) == 0.0


def test_fit_beta_moments_recovers_population():
    rng = np.random.default_rng(0)
    p = rng.beta(0.8, 2.4, 20000)
    s = rng.binomial(8, p)
    a, b = fit_beta_moments(s / 8, np.full(p.size, 8))
    assert a / (a + b) == pytest.approx(0.25, abs=0.01)
    assert a + b == pytest.approx(3.2, rel=0.15)
