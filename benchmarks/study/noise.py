"""The study's noise floor: the A/A band and what a saving may be called beside it (issue 54).

The A/A control (benchmarks/null_controls.py) re-splits each warm start's uniform GRPO runs of one configuration
at random into two sides, as many runs per side as a headline cell holds, and reads each split as a comparison.
Its band is the central BAND share of those splits' pooled savings: how far a saving spreads when nothing differs.
A headline row reads as a **saving** only when its 95% interval lies above zero and its estimate above the band.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.study.formats import pct

BAND = 0.95  # the A/A band: this central share of the re-splits' pooled savings


def band(savings: Sequence[float], coverage: float = BAND) -> dict[str, Any]:
    """The A/A band: the central ``coverage`` range of the pooled savings of the re-splits (a split whose median
    run never reaches counts as -inf, below every other), the range a saving read with the study's seeds spreads
    over when nothing differs."""
    xs = np.sort(np.asarray(savings, float))
    if not len(xs):
        raise ValueError("an A/A band needs at least one re-split")
    lo, hi = (float(np.quantile(xs, q, method="inverted_cdf")) for q in ((1 - coverage) / 2, (1 + coverage) / 2))
    return {"lo": lo if math.isfinite(lo) else None, "hi": hi if math.isfinite(hi) else None, "coverage": coverage,
            "splits": len(xs)}


def band_words(b: Mapping[str, Any] | None) -> str:
    """``[-20%, 17%]``: a band's ends (``never`` at a split whose median run never reaches), or ``-``."""
    if not b:
        return "-"
    return f"[{'never' if b['lo'] is None else pct(b['lo'])}, {'never' if b['hi'] is None else pct(b['hi'])}]"


def aa_bands(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """Each family's A/A band (None where its A/A has not run), with the runs per side of a split."""
    out: dict[str, dict[str, Any] | None] = {}
    for r in rows:
        fp = r.get("aa_false_positives")
        out[r["family"]] = None if not fp or "band" not in fp else \
            {**fp["band"], "runs_per_side": fp["runs"] // 2, "warm_starts": fp["warm_starts"]}
    return out


def written_bands(results: Path) -> dict[str, dict[str, Any] | None] | None:
    """The bands of the null controls a summary last wrote under the results root ``results`` (None: none yet)."""
    nulls = results / "null_controls" / "null_controls.json"
    return aa_bands(json.loads(nulls.read_text())) if nulls.is_file() else None


def reads_as(row: Mapping[str, Any], band_: Mapping[str, Any] | None) -> str:
    """What a pooled saving may be called (issue 54): ``saving`` when its 95% interval lies above zero and its
    estimate above the A/A band, ``loss`` when both lie below, else ``not separated`` (``no A/A band`` without
    one; a band's end at ``never`` is unbounded on its side)."""
    if band_ is None:
        return "no A/A band"
    b_lo = -math.inf if band_.get("lo") is None else band_["lo"]
    b_hi = math.inf if band_.get("hi") is None else band_["hi"]
    s, lo, hi = row.get("pooled_saving"), row.get("pooled_lo"), row.get("pooled_hi")
    if s is not None and lo is not None and lo > 0 and s > b_hi:
        return "saving"
    if s is None or (hi is not None and hi < 0 and s < b_lo):
        return "loss"
    return "not separated"
