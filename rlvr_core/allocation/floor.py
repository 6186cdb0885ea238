"""The screening floor: the fewest rollouts per effective group any allocator can spend on fresh prompts.

An allocator that meets a prompt for the first time knows only the population its pass rate comes from.
Whatever it does, it pays one rollout per sample; a group counts (is *effective*) once it holds k rollouts
with mixed rewards. The best it can do with a prompt is sequential: draw a rollout, and while every reward
so far is the same, either go on or abandon the prompt (its rollouts are lost); once the rewards are mixed
the group will be effective, and finishing it costs k - n more. Waiting for rounds, batching and priors that
do not match the population only add to that cost, so the minimum of

    E[rollouts spent on a prompt] / E[effective groups it yields]

over these stopping rules bounds every allocator of its class, given the exact population. The class: at most
k rollouts per prompt, groups of exactly k, no choice of a subset of the rollouts drawn, a stationary
population, and nothing known of a prompt before its first rollout. SARA, DAPO and GRPO on fresh prompts are
in it. Outside it, the floor is a reference and not a bound: PODS (draws more and keeps a mixed subset, which
can go below it), VIGOR (ragged groups), and any allocator whose prompts recur or carry features: the history
of a prompt that recurs (carried priors, sara+dps's selection, GRESO, the recurring ``pool`` regime of the
study) or features shared with similar prompts (the contextual prior). docs/design.md §4.10.

The minimum is a ratio of expectations (a renewal-reward problem). For a price lam of an effective group
the best stopping rule follows from backward induction over the states "n identical rewards, all fails" and
"n identical rewards, all passes"; Dinkelbach's iteration (lam <- cost / yield of that rule, repeated) reaches
the minimum ratio exactly in a few steps.

The population enters through the probabilities of a run of n identical rewards,
F(n) = E[(1 - p)^n] and S(n) = E[p^n]: closed form for Beta(a, b), a mean over pass rates otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlvr_core.errors import require


@dataclass(frozen=True)
class Floor:
    """The screening floor of one population at group size k.

    Attributes:
        rollouts_per_effective_group: the minimum ratio (inf when no group can be mixed)
        abandon_after_fails: the best rule abandons a prompt after this many fails in a row, with no pass
            (k: it never abandons on fails)
        abandon_after_passes: the same for passes
        filter_rollouts_per_effective_group: k rollouts for every prompt, the mixed groups kept (DAPO's
            dynamic sampling, GRPO's effective groups): k / P(mixed)
        mixed_probability: P(a group of k is mixed)
    """

    k: int
    rollouts_per_effective_group: float
    abandon_after_fails: int
    abandon_after_passes: int
    filter_rollouts_per_effective_group: float
    mixed_probability: float

    @property
    def ratio_to_k(self) -> float:
        """The floor in units of the ideal, k rollouts per effective group."""
        return self.rollouts_per_effective_group / self.k

    @property
    def max_saving_over_filter(self) -> float:
        """The largest share of a filter's rollouts an allocator without prompt information can save."""
        return 1.0 - self.rollouts_per_effective_group / self.filter_rollouts_per_effective_group


def runs_beta(a: float, b: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """F(n) = E[(1 - p)^n] and S(n) = E[p^n] for n = 0..k under p ~ Beta(a, b)."""
    require(a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b), "beta", f"need a, b > 0, got {a}, {b}")
    lb = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    def ratio(x: float, y: float) -> float:
        return math.exp(math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y) - lb)

    return (np.array([ratio(a, b + n) for n in range(k + 1)]),
            np.array([ratio(a + n, b) for n in range(k + 1)]))


def runs_rates(rates: Sequence[float] | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """F(n) and S(n) for n = 0..k over an empirical population of pass rates."""
    p = np.asarray(rates, np.float64)
    require(p.size > 0 and bool(np.all((p >= 0) & (p <= 1))), "rates", "need pass rates in [0, 1]")
    n = np.arange(k + 1)[:, None]
    return ((1.0 - p[None, :]) ** n).mean(axis=1), (p[None, :] ** n).mean(axis=1)


def _policy_value(cont: np.ndarray, runs: tuple[np.ndarray, np.ndarray], k: int) -> tuple[float, float]:
    """(expected rollouts, expected effective groups) per prompt drawn, for a rule that goes on in state
    (side, n identical rewards) where ``cont[side, n]`` is true (n = 1..k-1)."""
    cost, eff = 1.0, 0.0
    for side, r in enumerate(runs):
        for n in range(1, k):
            if not cont[side, n]:
                break
            mixed = r[n] - r[n + 1]  # reach n identical, then the next reward differs
            cost += r[n] + mixed * (k - n - 1)
            eff += mixed
    return cost, eff


def go_on_values(same: tuple[np.ndarray, np.ndarray], lam: float, k: int) -> np.ndarray:
    """Backward induction: the value of going on in each state "m identical rewards so far" when an
    effective group is worth ``lam`` and every later rollout is again decided the best way.

    ``same[side][..., m]`` (side 0: the m rewards are fails, 1: passes; m = 1..k-1, index 0 unused) is the
    probability that the next reward equals them. Returns ``go[side, ..., m]``: going on pays where it is
    positive. A mixed group at m + 1 rewards is worth ``lam`` less the k - m - 1 rollouts that finish it;
    k identical rewards lose the group. Leading axes broadcast (one population, or one posterior per prompt).
    """
    q = np.stack(np.broadcast_arrays(*(np.asarray(x, np.float64) for x in same)))
    go = np.full(q.shape, -np.inf)
    value = np.zeros(q.shape[:-1])  # value after m identical rewards, from m = k down
    for m in range(k - 1, 0, -1):
        go[..., m] = -1.0 + q[..., m] * value + (1.0 - q[..., m]) * (lam - (k - m - 1))
        value = np.maximum(go[..., m], 0.0)
    return go


def _best_rule(lam: float, runs: tuple[np.ndarray, np.ndarray], k: int) -> np.ndarray:
    """In which states (side, n identical rewards) going on is worth it when an effective group is worth lam."""
    r = np.stack([np.asarray(x, np.float64) for x in runs])
    reach = r[:, :k] > 0  # states that no prompt reaches never go on
    same = np.divide(r[:, 1:], r[:, :k], out=np.zeros((2, k)), where=reach)
    return (go_on_values((same[0], same[1]), lam, k) > 0) & reach


def floor_from_runs(runs: tuple[np.ndarray, np.ndarray], k: int) -> Floor:
    """The floor from the run probabilities F(n), S(n), n = 0..k (``runs_beta``, or means of ``runs_rates``)."""
    require(isinstance(k, int) and k >= 2, "k", f"a group needs at least 2 rollouts, got {k!r}")
    f, s = (np.asarray(r, np.float64) for r in runs)
    require(f.shape == s.shape == (k + 1,), "runs", f"need F(n), S(n) for n = 0..{k}")
    p_mixed = float(1.0 - f[k] - s[k])
    if p_mixed <= 1e-15:
        return Floor(k, math.inf, 1, 1, math.inf, 0.0)
    cont = np.ones((2, k), bool)  # start from the filter: never abandon
    cost, eff = _policy_value(cont, (f, s), k)
    for _ in range(100):
        lam = cost / eff
        new = _best_rule(lam, (f, s), k)
        c2, e2 = _policy_value(new, (f, s), k)
        if e2 <= 0 or c2 / e2 >= lam * (1 - 1e-12):
            break
        cont, cost, eff = new, c2, e2

    def abandon(side: int) -> int:
        stops = [n for n in range(1, k) if not cont[side, n]]
        return stops[0] if stops else k

    return Floor(k, float(cost / eff), abandon(0), abandon(1), k / p_mixed, p_mixed)


def screening_floor(k: int, *, beta: tuple[float, float] | None = None,
                    rates: Sequence[float] | np.ndarray | None = None) -> Floor:
    """The screening floor at group size ``k`` of a Beta(a, b) population or of an empirical one.

    >>> round(float(screening_floor(8, beta=(0.4, 2.5)).ratio_to_k), 2)
    1.82
    """
    require((beta is None) != (rates is None), "population", "give exactly one of beta=(a, b) or rates=[...]")
    require(isinstance(k, int) and k >= 2, "k", f"a group needs at least 2 rollouts, got {k!r}")
    if beta is not None:
        runs = runs_beta(float(beta[0]), float(beta[1]), k)
    else:
        runs = runs_rates(rates, k)
    return floor_from_runs(runs, k)
