"""From the advisor's proxy to the saving it predicts in rollouts to target (docs/advisor.md, "Predicted saving
to target").

The proxy is the replayed saving against uniform GRPO in rollouts per trained row (``SimRun``). The outcome a
user pays for is the saving in rollouts to a target accuracy, which the training study measures. ``fit`` maps
one to the other over the study's cells: a straight line through all cells (least squares), with a prediction
interval from its residuals. A family (an allocator, on fresh or on recurring prompts: ``family_key``; cells
using a contextual prior apart) whose cells sit off that line by more than its interval allows on their mean is
one whose proxy does not carry over: the line is refitted without it, and its predictions take its own mean
offset from the line, with an interval of a new cell around that offset. ``predict`` applies a fit to one
allocator's proxy.

``benchmarks.advisor_validation`` gathers the cells, calls ``fit`` and writes its ``to_json`` into
advisor_validation.json ("calibration"); the advisor reads it back as data (``from_json``): rlvr_core never
imports benchmarks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

MIN_CELLS = 4  # fewer cells than this: no line, no prediction
RECURRING = " on recurring prompts"


def family_key(allocator: str, replay: str) -> str:
    """The calibration's family of an allocator replayed in ``replay`` mode ("pool" or "fresh"): a replay whose
    prompts recur credits prompt history (greso, sara+dps, carried priors) and a fresh one cannot, so the two are
    calibrated apart."""
    return allocator + (RECURRING if replay == "pool" else "")


@dataclass(frozen=True)
class Point:
    """One cell: its family, the replayed proxy saving and the measured saving to target."""

    family: str
    proxy: float
    measured: float


@dataclass(frozen=True)
class Calibration:
    """A fitted map (module docstring). ``families``: {family: {cells, offset, bound, carries_over}}; ``offset``:
    the mean residual of the family's cells from the line; ``bound``: the half-width of a 95% interval of that
    mean under the line's residual spread."""

    intercept: float
    slope: float
    residual_sd: float
    t: float  # the 97.5% t quantile at the line's degrees of freedom
    cells: int  # cells on the line (those of the families that carry over)
    proxy_mean: float
    proxy_sxx: float
    families: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Calibration | None:
        if not d:
            return None
        try:
            return cls(**{k: d[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError):
            return None

    def carries_over(self, family: str) -> bool | None:
        """Whether the family's proxy carries over (None: the family has no cell in the study)."""
        f = self.families.get(family)
        return None if f is None else bool(f["carries_over"])

    def predict(self, family: str, proxy: float, proxy_half: float = 0.0) -> tuple[float, float, float]:
        """(estimate, low, high): the 95% prediction interval of the saving to target of a new cell of ``family``
        with replayed ``proxy`` (``proxy_half``: the half-width of the proxy's own interval, added in
        quadrature through the slope)."""
        f = self.families.get(family)
        est = self.intercept + self.slope * proxy
        if f is not None and not f["carries_over"]:
            est += f["offset"]
            var = self.residual_sd ** 2 * (1.0 + 1.0 / f["cells"])
        else:
            lever = (proxy - self.proxy_mean) ** 2 / self.proxy_sxx if self.proxy_sxx > 0 else 0.0
            var = self.residual_sd ** 2 * (1.0 + 1.0 / self.cells + lever)
        half = math.hypot(self.t * math.sqrt(var), self.slope * proxy_half)
        return est, est - half, est + half


def _line(points: Sequence[Point]) -> tuple[float, float, float, float, float, float]:
    """(intercept, slope, residual sd, t, proxy mean, proxy Sxx) of least squares through ``points``."""
    from scipy import stats as sps

    x = np.asarray([p.proxy for p in points], np.float64)
    y = np.asarray([p.measured for p in points], np.float64)
    xm, sxx = float(x.mean()), float(((x - x.mean()) ** 2).sum())
    slope = float(((x - xm) * (y - y.mean())).sum() / sxx) if sxx > 0 else 0.0
    intercept = float(y.mean() - slope * xm)
    dof = len(points) - 2
    sd = float(math.sqrt(((y - intercept - slope * x) ** 2).sum() / dof))
    return intercept, slope, sd, float(sps.t.ppf(0.975, dof)), xm, sxx


def _families(points: Sequence[Point], a: float, b: float, sd: float, t: float,
              off: set[str]) -> dict[str, dict[str, Any]]:
    """Each family's mean residual from the line, the 95% bound on it, and whether it carries over (its mean
    within the bound, and not in ``off``, the families already set apart)."""
    out: dict[str, dict[str, Any]] = {}
    for fam in sorted({p.family for p in points}):
        r = [p.measured - a - b * p.proxy for p in points if p.family == fam]
        offset, bound = float(np.mean(r)), t * sd / math.sqrt(len(r))
        out[fam] = {"cells": len(r), "offset": offset, "bound": bound,
                    "carries_over": fam not in off and abs(offset) <= bound}
    return out


def fit(points: Sequence[Point]) -> Calibration | None:
    """The map over ``points`` (module docstring): the line is refitted without each family found off it until
    none more is; None where fewer than MIN_CELLS cells stay on the line."""
    off: set[str] = set()
    while True:
        keep = [p for p in points if p.family not in off]
        if len(keep) < MIN_CELLS:
            return None
        a, b, sd, t, xm, sxx = _line(keep)
        fams = _families(points, a, b, sd, t, off)
        more = {f for f, v in fams.items() if not v["carries_over"]} - off
        if not more:
            return Calibration(a, b, sd, t, len(keep), xm, sxx, fams)
        off |= more


def leave_one_out(points: Sequence[Point]) -> list[tuple[float, float, float] | None]:
    """For each point, the prediction of a fit to all the others (None where they cannot be fitted)."""
    out: list[tuple[float, float, float] | None] = []
    for i, p in enumerate(points):
        cal = fit([q for j, q in enumerate(points) if j != i])
        out.append(None if cal is None else cal.predict(p.family, p.proxy))
    return out


def note(cal: Calibration, family: str) -> str:
    """What the advisor's table says about a family's calibration ("" where its proxy carries over on enough
    cells)."""
    f = cal.families.get(family)
    if f is None:
        return "not in the training study: the pooled line"
    n, cells = f["cells"], f"{f['cells']} study cell{'s' if f['cells'] > 1 else ''}"
    if not f["carries_over"]:
        return f"proxy does not carry over: {cells} measured {f['offset']:+.0%} off the line (predicted from that)"
    if n < 3:
        return f"{cells}, {f['offset']:+.0%} off the line: too few to tell whether the proxy carries over"
    return ""


def predicted(cal: Calibration | None, name: str, replay: str,
              proxy: tuple[float, float, float] | None) -> tuple[tuple[float, float, float] | None, str]:
    """(predicted saving to target with its 95% interval, note) of allocator ``name`` replayed in ``replay`` mode
    with ``proxy`` (mean, low, high); uniform GRPO is the baseline, 0 by definition; None without a calibration or
    a finite proxy."""
    if name == "grpo":
        return (0.0, 0.0, 0.0), "the baseline"
    if cal is None:
        return None, "no calibration (python -m benchmarks.advisor_validation)"
    if proxy is None or not all(math.isfinite(v) for v in proxy):
        return None, "no proxy to calibrate (n/a)"
    fam = family_key(name, replay)
    return cal.predict(fam, proxy[0], (proxy[2] - proxy[1]) / 2.0), note(cal, fam)
