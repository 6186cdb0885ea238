"""Empirical-Bayes Beta(a, b) fits from observed pass rates (method of moments, binomial noise removed).

Pure numpy, on the ground floor of rlvr_core (docs/design.md §2.1): SARA's carried posterior
(``rlvr_core.allocation.posterior``), the simulated engine's replay (``rlvr_core.rollout.simulated``) and
the advisor (``rlvr_core.advise.model``) fit their populations with it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["beta_from_moments", "fit_beta_moments"]


def fit_beta_moments(rates: np.ndarray, counts: np.ndarray, *, min_concentration: float = 0.2,
                     max_concentration: float = 50.0) -> tuple[float, float]:
    """Empirical-Bayes Beta(a, b) from observed per-prompt pass rates s/n.

    Method of moments with the binomial sampling noise removed: for rates
    observed from n rollouts, Var(s/n) = Var(p) (1 - h) + m (1 - m) h with
    h = E[1/n], so Var(p) = (Var(s/n) - m (1 - m) h) / (1 - h). ``counts`` are
    the n behind each rate. The concentration a + b is clipped to
    [min_concentration, max_concentration] so a handful of observations never
    produces a degenerate prior.
    """
    rates = np.asarray(rates, np.float64)
    counts = np.asarray(counts, np.float64)
    if rates.size < 2:
        return 1.0, 1.0
    return beta_from_moments(float(rates.mean()), float(rates.var()), float(np.mean(1.0 / np.maximum(counts, 1.0))),
                             min_concentration=min_concentration, max_concentration=max_concentration)


def beta_from_moments(mean: float, var: float, h: float, *, min_concentration: float = 0.2,
                      max_concentration: float = 50.0) -> tuple[float, float]:
    """Beta(a, b) from the mean and variance of observed rates s/n and h = E[1/n] (see ``fit_beta_moments``).

    The moments may be weighted (the contextual prior decays old observations). h >= 1 (single-rollout
    observations) carries no spread information and gives Beta(1, 1).
    """
    m = float(np.clip(mean, 1e-3, 1 - 1e-3))
    if h >= 1.0:  # single-rollout observations carry no spread information
        return 1.0, 1.0
    var_p = (var - m * (1 - m) * h) / (1.0 - h)
    conc = m * (1 - m) / max(var_p, 1e-9) - 1.0
    conc = float(np.clip(conc, min_concentration, max_concentration))
    return m * conc, (1 - m) * conc
