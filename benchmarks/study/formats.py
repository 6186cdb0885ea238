"""The study's number formats, one set for every table it writes (tables.py, and the tables of benchmarks/floor.py,
study_targets.py, warmstarts.py and readme.py).

One convention for a missing figure: a statistic that falls on a run that never reached the target (a median, an
interval's bound, a saving or cost ratio of such a run) reads ``never``; a figure that was not measured (a p-value
not computed, an accuracy past the end of a run) reads ``-``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

NEVER = "never"


def number(v: float | None, spec: str = ",.0f") -> str:
    """``v`` in ``spec``; ``never`` where it is missing or infinite (it fell on a run that never reached)."""
    return NEVER if v is None or not math.isfinite(v) else format(v, spec)


def interval(ci: Mapping[str, Any] | None, spec: str = ",.0f") -> str:
    """``median [lo, hi]`` of a statistic (``-`` where there is none)."""
    if not ci:
        return "-"
    return f"{number(ci.get('median'), spec)} [{number(ci.get('lo'), spec)}, {number(ci.get('hi'), spec)}]"


def pct(v: float | None) -> str:
    """A share as a whole percentage; one that rounds to zero reads 0%, never -0%."""
    return NEVER if v is None or not math.isfinite(v) else f"{round(100 * v) + 0}%"


def points(v: float | None) -> str:
    """A difference of shares in percentage points, signed."""
    return NEVER if v is None or not math.isfinite(v) else f"{100 * v:+.1f}"


def points_ci(v: Mapping[str, Any]) -> str:
    """A mean difference in points with its interval (stats.paired_budget's entries): ``+0.5 [+0.1, +0.9]``; ``-``
    without pairs; the mean alone where no interval could be formed."""
    if v["mean"] is None:
        return "-"
    return points(v["mean"]) + ("" if v["lo"] is None else f" [{points(v['lo'])}, {points(v['hi'])}]")


def p_value(v: float | None, se: float | None = None) -> str:
    """A p-value: three decimals, ``< 0.001`` below that; with a Monte Carlo standard error ``se`` above 0 (an
    exact p has none), ``0.048 (MC SE 0.0007)``."""
    text = "-" if v is None else "< 0.001" if v < 0.001 else f"{v:.3f}"
    return text if v is None or not se else f"{text} (MC SE {se:.4f})"


def rank_test_words(rows: Sequence[Mapping[str, Any]]) -> str:
    """How the rows' stratified p-values were computed (their ``p_method``, rlvr_core.stats.rank_test): exact, or
    exact where the test's work allows and Monte Carlo (its SE printed) elsewhere."""
    if {r.get("p_method") for r in rows} <= {"exact", None}:
        return "exact (every relabelling within the warm starts, by dynamic programming)"
    return "exact where its work allows, else 100,000 random relabellings with the Monte Carlo SE beside"


def p_eq(v: float | None) -> str:
    """A p-value after ``p``: ``= 0.012`` or ``< 0.001``."""
    return p_value(v) if v is None or v < 0.001 else f"= {p_value(v)}"
