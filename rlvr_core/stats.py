"""Statistics of training curves: when a run reaches a target, medians with intervals over seeds, rank tests
between allocators, and the target set on a reference allocator's curves. Pure numpy; used by the pipeline's
report (tasks/report.py) and by the training study (benchmarks/study.py) alike.

A curve is a sequence of evaluations, each a mapping with ``greedy_acc`` and the cost axes (``cum_rollouts``,
``cum_tokens``, ...), the first one at step 0 (the start of RL).

Two reach statistics (docs/design.md §9.1):

- ``first_reach``: the first crossing of the raw curve. It favours the run evaluated most often: every
  evaluation is another chance for held-out noise to cross early, so an allocator that spends fewer rollouts
  per step (and is evaluated every n steps) reaches "earlier" by construction.
- ``fitted_reach`` (the primary statistic): the first crossing of the run's monotone (isotonic, least-squares)
  fit. A single noisy evaluation above the trend no longer counts as reaching; a dip no longer hides a reach.
  It is insensitive to evaluation density up to the noise the fit averages.

Intervals: ``median_interval`` is the distribution-free order-statistic interval of a median, with the exact
coverage the seed count allows (5 seeds: [min, max], 93.75%); ``median_ci`` is the percentile bootstrap, kept
for ratios. ``rank_test`` is a one-sided permutation test of ranks (Mann-Whitney's U), misses ranked last,
optionally stratified (permutations within strata, e.g. warm starts): exact (a dynamic program over the ranks)
wherever its work allows, else a Monte Carlo whose standard error it reports; ``significant`` reads a p with that
error.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["BOOT", "EXACT_CELLS", "MC_PERMUTATIONS", "TARGET_FRACTION", "accuracy_at", "accuracy_se",
           "area_under_curve", "exact_cells", "first_reach", "fitted_reach", "gain_target", "isotonic", "median_ci",
           "median_interval", "rank_sum_distribution", "rank_test", "reach", "significant"]

BOOT = 5000  # bootstrap resamples of the seeds
EXACT_CELLS = 10**8  # the most work (exact_cells) the exact rank test takes; beyond it, Monte Carlo
MC_PERMUTATIONS = 100_000  # the Monte Carlo's relabellings: SE <= 0.0016 at any p, 0.0007 at p = 0.05
TARGET_FRACTION = 0.8  # the target: start + 0.8 x the reference's gain at the end of the budget


def first_reach(xs: Sequence[float] | np.ndarray, acc: Sequence[float] | np.ndarray, target: float) -> float:
    """The x at which accuracy first reaches ``target`` (NaN if never).

    Linear interpolation between the last evaluation below the target and the first at or above it, so
    the figure does not jump by a whole evaluation interval (allocators spend different numbers of
    rollouts per step).
    """
    xs, acc = np.asarray(xs, float), np.asarray(acc, float)
    hit = np.flatnonzero(acc >= target)
    if not len(hit):
        return float("nan")
    i = int(hit[0])
    if i == 0 or acc[i] == acc[i - 1]:
        return float(xs[i])
    frac = (target - acc[i - 1]) / (acc[i] - acc[i - 1])
    return float(xs[i - 1] + frac * (xs[i] - xs[i - 1]))


def isotonic(y: Sequence[float] | np.ndarray, w: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """The least-squares non-decreasing fit of ``y`` (pool-adjacent-violators), with optional weights."""
    y = np.asarray(y, float)
    wts = np.ones(len(y)) if w is None else np.asarray(w, float)
    vals: list[float] = []
    ws: list[float] = []
    sizes: list[int] = []
    for v, wt in zip(y, wts):
        vals.append(float(v))
        ws.append(float(wt))
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:  # pool the last two blocks
            wsum = ws[-2] + ws[-1]
            vals[-2] = (vals[-2] * ws[-2] + vals[-1] * ws[-1]) / wsum
            ws[-2], sizes[-2] = wsum, sizes[-2] + sizes[-1]
            del vals[-1], ws[-1], sizes[-1]
    return np.repeat(np.asarray(vals), sizes)


def fitted_reach(xs: Sequence[float] | np.ndarray, acc: Sequence[float] | np.ndarray, target: float) -> float:
    """The x at which the run's isotonic fit first reaches ``target`` (NaN if never), interpolated."""
    acc = np.asarray(acc, float)
    return first_reach(xs, isotonic(acc), target) if len(acc) else float("nan")


def reach(curve: Sequence[Mapping[str, float]], target: float,
          axes: Sequence[str] = ("cum_rollouts", "seconds", "cum_tokens", "cum_trained_tokens", "updates"),
          *, fit: bool = False) -> dict[str, float]:
    """x at which a run reaches ``target`` on each of ``axes`` (NaN if never), interpolated: the raw curve's first
    crossing, or with ``fit`` its isotonic fit's."""
    acc = np.asarray([c["greedy_acc"] for c in curve], float)
    if fit:
        acc = isotonic(acc)
    return {axis: first_reach(np.asarray([c[axis] for c in curve], float), acc, target) for axis in axes}


def accuracy_at(curve: Sequence[Mapping[str, float]], budget: float, axis: str = "cum_rollouts") -> float | None:
    """The isotonic fit's accuracy at ``budget`` on ``axis`` (linear between evaluations); None past the run's end."""
    xs = np.asarray([c[axis] for c in curve], float)
    if not len(xs) or budget > xs[-1]:
        return None
    return float(np.interp(budget, xs, isotonic([c["greedy_acc"] for c in curve])))


def area_under_curve(curve: Sequence[Mapping[str, float]], upto: float, axis: str = "cum_rollouts") -> float | None:
    """Mean held-out accuracy over [0, ``upto``] on ``axis`` (trapezoids on the raw curve, linear between
    evaluations); None when the run ended before ``upto``. Denser evaluation does not bias it."""
    xs = np.asarray([c[axis] for c in curve], float)
    ys = np.asarray([c["greedy_acc"] for c in curve], float)
    if not len(xs) or upto > xs[-1] or upto <= 0:
        return None
    keep = xs < upto
    gx = np.append(xs[keep], upto)
    gy = np.append(ys[keep], np.interp(upto, xs, ys))
    return float(np.sum((gx[1:] - gx[:-1]) * (gy[1:] + gy[:-1]) / 2) / upto)


def median_ci(values: Sequence[float | None], *, n_boot: int = BOOT, level: float = 0.95,
              seed: int = 0) -> dict[str, Any]:
    """Median of ``values`` and a percentile-bootstrap interval; None, NaN or inf (never reached) count as
    infinite.

    Returns {median, lo, hi, n, finite}: a statistic that falls on an infinite value is None. The
    resampling is seeded, so the same values always give the same interval.
    """
    x = np.asarray([math.inf if v is None or not math.isfinite(v) else float(v) for v in values], float)
    if len(x) == 0:
        return {"median": None, "lo": None, "hi": None, "n": 0, "finite": 0}
    rng = np.random.default_rng(seed)
    boots = np.median(x[rng.integers(0, len(x), size=(n_boot, len(x)))], axis=1) if len(x) > 1 else x.copy()
    a = (1 - level) / 2

    def fin(v: float) -> float | None:
        return float(v) if math.isfinite(v) else None

    sb = np.sort(boots)
    lo = sb[int(math.floor(a * (len(sb) - 1)))]
    hi = sb[int(math.ceil((1 - a) * (len(sb) - 1)))]
    return {"median": fin(float(np.median(x))), "lo": fin(float(lo)), "hi": fin(float(hi)), "n": int(len(x)),
            "finite": int(np.isfinite(x).sum())}


def median_interval(values: Sequence[float | None], level: float = 0.95) -> dict[str, Any]:
    """Median of ``values`` and its distribution-free interval [x_(j), x_(n+1-j)] from order statistics, with the
    exact coverage 1 - 2 P(Binomial(n, 1/2) < j) that the seed count allows: the narrowest such interval whose
    coverage is at least ``level``, else the widest ([min, max]) with its lower coverage said. None, NaN and inf
    (never reached) count as infinite; a statistic that falls on one is None.

    Returns {median, lo, hi, n, finite, coverage}.
    """
    x = np.sort([math.inf if v is None or not math.isfinite(v) else float(v) for v in values])
    n = len(x)
    if n == 0:
        return {"median": None, "lo": None, "hi": None, "n": 0, "finite": 0, "coverage": None}

    def cover(j: int) -> float:  # P(x_(j) <= median <= x_(n+1-j)) for a continuous distribution
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0 ** n

    j = 1
    while j + 1 <= (n + 1) // 2 and cover(j + 1) >= level:
        j += 1

    def fin(v: float) -> float | None:
        return float(v) if math.isfinite(v) else None

    return {"median": fin(float(np.median(x))) if np.isfinite(np.median(x)) else None, "lo": fin(x[j - 1]),
            "hi": fin(x[n - j]), "n": int(n), "finite": int(np.isfinite(x).sum()), "coverage": cover(j)}


def _ranks(v: np.ndarray) -> np.ndarray:
    """Mid-ranks (1-based) of ``v``; equal values, infinities included, share their mean rank."""
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    sv = v[order]
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and sv[j + 1] == sv[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _stratum_groups(a: np.ndarray, b: np.ndarray, strata_ours: Sequence[Any] | None,
                    strata_base: Sequence[Any] | None) -> list[tuple[np.ndarray, int]]:
    """Per stratum that holds runs of both sides: (the doubled mid-ranks of all its runs, ours first; how many are
    ours). Doubled mid-ranks are integers (a tie's mean rank is a half at worst)."""
    if (strata_ours is None) != (strata_base is None):
        raise ValueError("rank_test: give the strata of both sides or of neither")
    sa, sb = np.zeros(len(a), int), np.zeros(len(b), int)
    if strata_ours is not None and strata_base is not None:
        keys = sorted(set(map(str, strata_ours)) | set(map(str, strata_base)))
        sa = np.asarray([keys.index(str(s)) for s in strata_ours], int)
        sb = np.asarray([keys.index(str(s)) for s in strata_base], int)
    groups = []
    for s in sorted(set(sa.tolist()) | set(sb.tolist())):
        va, vb = a[sa == s], b[sb == s]
        if len(va) and len(vb):
            groups.append((np.rint(2 * _ranks(np.concatenate([va, vb]))).astype(np.int64), len(va)))
    return groups


def exact_cells(groups: Sequence[tuple[np.ndarray, int]]) -> int:
    """The work of the exact test on ``groups`` (_stratum_groups), in cells: each stratum's table of n ranks x (m + 1)
    sizes x (its doubled rank total + 1) sums, then each convolution of the strata's distributions."""
    cells, width = 0, 1
    for r, m in groups:
        total = int(r.sum()) + 1
        cells += len(r) * (m + 1) * total + width * total
        width += total - 1
    return cells


def rank_sum_distribution(ranks: np.ndarray, m: int) -> np.ndarray:
    """The null distribution of the sum of ``m`` of the integer ``ranks`` drawn without replacement, every subset
    equally likely: entry s is P(sum = s), s = 0 .. sum(ranks). Dynamic programming over the ranks (the shift
    recursion): count[j, s], the subsets of size j with sum s, gains count[j - 1, s - r] as rank r joins."""
    ranks = np.asarray(ranks, np.int64)
    total = int(ranks.sum())
    count = np.zeros((m + 1, total + 1))
    count[0, 0] = 1.0
    for i, r in enumerate(ranks.tolist()):
        top = min(i + 1, m)
        count[1:top + 1, r:] += count[:top, :total + 1 - r].copy()
    return count[m] / count[m].sum()


def _exact_p(groups: Sequence[tuple[np.ndarray, int]], observed: int) -> float:
    """P(T <= observed) under relabelling within strata, T the sum of the strata's (doubled) rank sums of ours."""
    dist = np.ones(1)
    for r, m in groups:
        dist = np.convolve(dist, rank_sum_distribution(r, m))
    return float(min(1.0, max(0.0, dist[:observed + 1].sum())))


def _monte_carlo_p(groups: Sequence[tuple[np.ndarray, int]], observed: int, n_perm: int,
                   seed: int) -> tuple[float, float]:
    """(p, its standard error) from ``n_perm`` seeded random relabellings within strata: (1 + hits) / (n_perm + 1)."""
    rng = np.random.default_rng(seed)
    hits, chunk = 0, 10000
    for done in range(0, n_perm, chunk):
        size = min(chunk, n_perm - done)
        tot = np.zeros(size, np.int64)
        for r, m in groups:
            perm = np.argsort(rng.random((size, len(r))), axis=1)[:, :m]
            tot += r[perm].sum(axis=1)
        hits += int(np.sum(tot <= observed))
    p = (1 + hits) / (n_perm + 1)
    return float(p), math.sqrt(p * (1 - p) / n_perm)


def rank_test(ours: Sequence[float | None], base: Sequence[float | None], *,
              strata_ours: Sequence[Any] | None = None, strata_base: Sequence[Any] | None = None,
              n_perm: int = MC_PERMUTATIONS, seed: int = 0, max_cells: int = EXACT_CELLS) -> dict[str, Any]:
    """One-sided test that ``ours`` costs less than ``base`` (e.g. rollouts to target): the p-value of the rank
    sum of ours under random relabelling, P(T <= observed), misses (None, NaN, inf) ranked last and tied.

    With strata (e.g. the warm start of each run), ranks are taken and labels permuted within each stratum, and the
    statistic is the sum over strata (van Elteren's idea without its weights). Exact (``method`` "exact") when its
    work (``exact_cells``) is at most ``max_cells``: each stratum's null distribution by dynamic programming over
    its doubled mid-ranks, the strata's convolved. Else ``n_perm`` seeded random relabellings ("monte-carlo"), whose
    standard error is ``p_mc_se`` (0 for the exact test; ``significant`` reads it). Returns {p_value, p_mc_se,
    method, exact, permutations, u, n_ours, n_base}; U counts the (ours, base) pairs where ours is lower (ties count
    one half).
    """
    a = np.asarray([math.inf if v is None or not math.isfinite(v) else float(v) for v in ours], float)
    b = np.asarray([math.inf if v is None or not math.isfinite(v) else float(v) for v in base], float)
    groups = _stratum_groups(a, b, strata_ours, strata_base)
    out: dict[str, Any] = {"p_value": None, "p_mc_se": None, "method": None, "exact": False, "permutations": None,
                           "u": None, "n_ours": len(a), "n_base": len(b)}
    if not len(a) or not len(b):
        return out
    out["u"] = float(sum((x < y) + 0.5 * (x == y) for x in a for y in b))
    if not groups:
        return out
    observed = sum(int(r[:m].sum()) for r, m in groups)
    if exact_cells(groups) <= max_cells:
        out.update(p_value=_exact_p(groups, observed), p_mc_se=0.0, method="exact", exact=True)
    else:
        p, se = _monte_carlo_p(groups, observed, n_perm, seed)
        out.update(p_value=p, p_mc_se=se, method="monte-carlo", permutations=n_perm)
    return out


def significant(result: Mapping[str, Any], level: float, *, p: str = "p_value", se: str = "p_mc_se") -> bool:
    """Whether a test's p lies below ``level`` with its Monte Carlo interval: p + 1.96 SE < level (``result[p]``
    and ``result[se]``; an SE that is absent or None counts as 0, an exact p's). False without a p, so a row never
    reads significant while its interval straddles the level."""
    pv = result.get(p)
    if pv is None:
        return False
    return float(pv) + 1.96 * float(result.get(se) or 0.0) < level


def gain_target(curves: Sequence[Sequence[Mapping[str, float]]], fraction: float = TARGET_FRACTION,
                tail: int = 3) -> dict[str, float]:
    """The target of reference runs: median start accuracy + ``fraction`` x the median gain at the end of
    the budget, a run's end being the mean of its last ``tail`` evaluations. Returns {start, gain, target}."""
    if not curves or any(not c for c in curves):
        raise ValueError("gain_target needs at least one reference run, each with at least one evaluation")
    starts = [float(c[0]["greedy_acc"]) for c in curves]
    ends = [float(np.mean([e["greedy_acc"] for e in c[-tail:]])) for c in curves]
    start, gain = float(np.median(starts)), float(np.median(np.subtract(ends, starts)))
    return {"start": start, "gain": gain, "target": start + fraction * gain}


def accuracy_se(p: float, n: int) -> float:
    """Standard error of an accuracy p measured on n problems."""
    return math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))
