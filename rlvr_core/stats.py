"""Statistics of training curves: when a run first reaches a target, medians with bootstrap intervals over
seeds, and the target set on a reference allocator's curves. Pure numpy; used by the pipeline's report
(tasks/report.py) and by the training study (benchmarks/study.py) alike.

A curve is a sequence of evaluations, each a mapping with ``greedy_acc`` and the cost axes (``cum_rollouts``,
``cum_tokens``, ...), the first one at step 0 (the start of RL).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["BOOT", "TARGET_FRACTION", "accuracy_se", "first_reach", "gain_target", "median_ci", "reach"]

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


def reach(curve: Sequence[Mapping[str, float]], target: float,
          axes: Sequence[str] = ("cum_rollouts", "seconds", "cum_tokens", "cum_trained_tokens", "updates")
          ) -> dict[str, float]:
    """x at which a run first reaches ``target`` on each of ``axes`` (NaN if never), interpolated."""
    acc = np.asarray([c["greedy_acc"] for c in curve], float)
    return {axis: first_reach(np.asarray([c[axis] for c in curve], float), acc, target) for axis in axes}


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
