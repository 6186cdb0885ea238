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
optionally stratified (permutations within strata, e.g. warm starts).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["BOOT", "TARGET_FRACTION", "accuracy_at", "accuracy_se", "area_under_curve", "first_reach",
           "fitted_reach", "gain_target", "isotonic", "median_ci", "median_interval", "rank_test", "reach"]

BOOT = 5000  # bootstrap resamples of the seeds
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


def rank_test(ours: Sequence[float | None], base: Sequence[float | None], *,
              strata_ours: Sequence[Any] | None = None, strata_base: Sequence[Any] | None = None,
              n_perm: int = 20000, seed: int = 0) -> dict[str, Any]:
    """One-sided test that ``ours`` costs less than ``base`` (e.g. rollouts to target): the p-value of the rank
    sum of ours under random relabelling, misses (None, NaN, inf) ranked last and tied.

    Exact (every relabelling) when there are at most 50,000 of them per stratum and no strata, else ``n_perm``
    seeded random relabellings; with strata (e.g. the warm start of each run), ranks are taken and labels
    permuted within each stratum, and the statistic is the sum over strata (van Elteren's idea without its
    weights). Returns {p_value, u, n_ours, n_base, exact}; U counts the (ours, base) pairs where ours is lower
    (ties count one half).
    """
    a = np.asarray([math.inf if v is None or not math.isfinite(v) else float(v) for v in ours], float)
    b = np.asarray([math.inf if v is None or not math.isfinite(v) else float(v) for v in base], float)
    if (strata_ours is None) != (strata_base is None):
        raise ValueError("rank_test: give the strata of both sides or of neither")
    sa, sb = np.zeros(len(a), int), np.zeros(len(b), int)
    if strata_ours is not None and strata_base is not None:
        keys = sorted(set(map(str, strata_ours)) | set(map(str, strata_base)))
        sa = np.asarray([keys.index(str(s)) for s in strata_ours], int)
        sb = np.asarray([keys.index(str(s)) for s in strata_base], int)
    if not len(a) or not len(b):
        return {"p_value": None, "u": None, "n_ours": len(a), "n_base": len(b), "exact": False}
    u = float(sum((x < y) + 0.5 * (x == y) for x in a for y in b))
    groups = []  # per stratum: (ranks of all its runs, how many are ours)
    for s in sorted(set(sa.tolist()) | set(sb.tolist())):
        va, vb = a[sa == s], b[sb == s]
        if len(va) and len(vb):
            groups.append((_ranks(np.concatenate([va, vb])), len(va)))
    if not groups:
        return {"p_value": None, "u": u, "n_ours": len(a), "n_base": len(b), "exact": False}
    observed = sum(float(r[:m].sum()) for r, m in groups)
    exact = len(groups) == 1 and math.comb(len(groups[0][0]), groups[0][1]) <= 50000
    if exact:
        import itertools

        r, m = groups[0]
        sums = np.fromiter((r[list(c)].sum() for c in itertools.combinations(range(len(r)), m)), float)
        p = float(np.mean(sums <= observed + 1e-9))
    else:
        rng = np.random.default_rng(seed)
        tot = np.zeros(n_perm)
        for r, m in groups:
            perm = np.argsort(rng.random((n_perm, len(r))), axis=1)[:, :m]
            tot += r[perm].sum(axis=1)
        p = float((1 + np.sum(tot <= observed + 1e-9)) / (n_perm + 1))
    return {"p_value": p, "u": u, "n_ours": len(a), "n_base": len(b), "exact": exact}


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
