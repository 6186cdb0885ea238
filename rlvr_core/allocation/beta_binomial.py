"""Beta-Binomial effectiveness predictor for SARA (docs/allocators/sara.md).

A prompt's pass rate p has a Beta(a, b) prior. After n rollouts with s passes
the posterior is Beta(a + s, b + n - s). A group of k rollouts is *effective*
(carries GRPO signal) when it ends mixed: at least one pass and one fail.

``p_effective(n, s, k, a, b)`` is the probability, under the prior and the
observed prefix, that the completed group of k is mixed:

- mixed prefix (0 < s < n):  1
- nothing seen (n = 0):      1 - B(a, b + k)/B(a, b) - B(a + k, b)/B(a, b)
- all-fail prefix (s = 0):   1 - B(a, b + k) / B(a, b + n)
- all-pass prefix (s = n):   1 - B(a + k, b) / B(a + n, b)

With the uniform prior (a = b = 1) the all-fail case is (k - n)/(k + 1).
All functions broadcast over numpy arrays and use log-Beta (no loops). The empirical-Bayes fit of a
Beta prior (``fit_beta_moments``, ``beta_from_moments``) is in ``rlvr_core.beta_moments``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln

# the empirical-Bayes fit lives on the ground floor (the simulated engine uses it too); kept importable here
from rlvr_core.beta_moments import beta_from_moments, fit_beta_moments

ArrayLike = np.ndarray | float | int


def p_effective(n: ArrayLike, s: ArrayLike, k: ArrayLike, a: ArrayLike = 1.0, b: ArrayLike = 1.0) -> np.ndarray:
    """Probability that a group of k ends mixed given s passes in its first n rollouts.

    Args (all broadcast together):
        n: rollouts seen so far, 0 <= n <= k
        s: passes among them, 0 <= s <= n
        k: full group size, k >= 2
        a, b: Beta prior pseudo-counts (> 0) for this prompt's pass rate
    Returns:
        float64 array of the broadcast shape, values in [0, 1].
    """
    n, s, k, a, b = np.broadcast_arrays(
        np.asarray(n, np.float64), np.asarray(s, np.float64), np.asarray(k, np.float64),
        np.asarray(a, np.float64), np.asarray(b, np.float64),
    )
    if np.any(s < 0) or np.any(s > n) or np.any(n > k):
        raise ValueError("p_effective needs 0 <= s <= n <= k elementwise")
    if np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("p_effective needs a Beta prior with a > 0 and b > 0")
    # P(all remaining fail | prefix has no pass) and P(all remaining pass | prefix has no fail)
    log_all_fail = betaln(a, b + k) - betaln(a, b + n)
    log_all_pass = betaln(a + k, b) - betaln(a + n, b)
    no_pass = s == 0
    no_fail = s == n
    p_sat = np.where(no_pass, np.exp(log_all_fail), 0.0) + np.where(no_fail, np.exp(log_all_pass), 0.0)
    out = np.clip(1.0 - p_sat, 0.0, 1.0)
    return np.where(no_pass | no_fail, out, 1.0)


def group_mixed_probability(p: ArrayLike, k: ArrayLike) -> np.ndarray:
    """P(a group of k Bernoulli(p) rollouts is mixed) = 1 - p^k - (1-p)^k (known pass rate)."""
    p = np.asarray(p, np.float64)
    return 1.0 - p**k - (1.0 - p) ** k


__all__ = ["ArrayLike", "beta_from_moments", "fit_beta_moments", "group_mixed_probability", "p_effective"]
