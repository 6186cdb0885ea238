"""The headline comparisons across independent warm starts: does a saving hold for more than one policy?

    python -m benchmarks.warmstarts          # (also run by `python -m benchmarks.study --summarize-only`)

A regime and its warm-start variants (``pool``, ``pool-ws1``, ``pool-ws2``: each its own warm-started policy,
reference runs and frozen target) form one family. For each headline comparison the family's cells are read
side by side:

- per warm start: the saving (1 - median ours / median baseline of fitted rollouts to that warm start's own
  target, the rules of benchmarks/study_targets.py, bootstrap interval) and its one-sided rank test;
- across warm starts: the rank test stratified by warm start (ranks and relabelling within each warm start, so a
  policy that learns fast cannot stand in for an allocator that saves), and the pooled saving: 1 - the median over
  every run of ours of its reach divided by the median reach of the baseline *of its own warm start* (misses
  count as never reached on our side, the baseline's at its whole budget, as in study_targets);
- ``holds_in``: how many warm starts show a saving above zero, so a claim that holds for one policy only says so.

Warm starts whose pre-registration (benchmarks/results/study/<regime>/preregistration.json) misses its criteria
are reported and marked, not dropped: the criteria were fixed before any allocator ran.

Writes ``training_warmstarts.json`` and ``training_warmstarts.md`` in benchmarks/results/warmstarts/.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks import regimes as R
from benchmarks.common import RESULTS, output_dir
from benchmarks.study_targets import cell_runs, cost_of, reach_x, saving, target_of
from rlvr_core.stats import rank_test

# (protocol, ours, baseline): the measurement issue's headline cells
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("equal-batch", "sara", "dapo"),
    ("equal-batch", "sara+dps[context]", "dapo"),
    ("equal-rollouts", "sara[budget]", "grpo"),
    ("matched-updates", "sara", "grpo"),
    ("matched-updates", "sara+dps[context]", "grpo"),
)


def family(out: Path, base: str) -> list[str]:
    """``base`` and its warm-start variants that have a frozen target, base first, then by warm-start seed."""
    study = out / "study"
    names = [p.name for p in study.glob(f"{base}{R.WS_SEP}*") if p.is_dir()] if study.exists() else []
    variants = sorted((n for n in names if n[len(base) + len(R.WS_SEP):].isdigit()), key=lambda n: R.base_regime(n)[1])
    return [r for r in (base, *variants) if target_of(out, r) is not None]


def preregistered(out: Path, regime: str) -> bool | None:
    """Whether the regime's pre-registration met its criteria (None: none recorded)."""
    p = out / "study" / regime / "preregistration.json"
    return bool(json.loads(p.read_text()).get("meets")) if p.exists() else None


def compare(out: Path, regimes: Sequence[str], protocol: str, ours: str, base: str) -> dict[str, Any] | None:
    """One comparison across the warm starts in ``regimes`` that ran both cells; None where none did."""
    per, ratios, fa, fb, sa, sb = [], [], [], [], [], []
    for regime in regimes:
        t = target_of(out, regime)
        a, b = cell_runs(out, regime, protocol, ours), cell_runs(out, regime, protocol, base)
        if not a or not b:
            continue
        s = saving(a, b, t)
        per.append({"regime": regime, "warm_start": R.base_regime(regime)[1] or 0,
                    "preregistration_met": preregistered(out, regime), "target": t, **s})
        base_median = float(np.median([cost_of(r, t, "cum_rollouts", False) for r in b]))
        ratios += [cost_of(r, t, "cum_rollouts", True) / base_median for r in a]
        fa += [reach_x(r, t, "cum_rollouts") for r in a]
        fb += [reach_x(r, t, "cum_rollouts") for r in b]
        sa += [regime] * len(a)
        sb += [regime] * len(b)
    if not per:
        return None
    test = rank_test(fa, fb, strata_ours=sa, strata_base=sb)
    pooled = float(np.median(ratios))
    return {"protocol": protocol, "ours": ours, "baseline": base, "warm_starts": len(per),
            "ours_runs": len(fa), "base_runs": len(fb), "per_warm_start": per,
            "pooled_saving": None if not math.isfinite(pooled) else 1.0 - pooled,
            "p_value_stratified": test["p_value"],
            "holds_in": sum(1 for p in per if p["value"] is not None and p["value"] > 0)}


def measure(out: Path, bases: Sequence[str] = ("pool", "hard")) -> list[dict[str, Any]]:
    rows = []
    for base in bases:
        regimes = family(out, base)
        for proto, ours, baseline in COMPARISONS:
            if (row := compare(out, regimes, proto, ours, baseline)) is not None:
                rows.append({"family": base, **row})
    return rows


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


def _p(v: float | None) -> str:
    return "n/a" if v is None else "< 0.001" if v < 0.001 else f"{v:.3f}"


def _p_eq(v: float | None) -> str:
    return _p(v) if v is not None and v < 0.001 else f"= {_p(v)}"


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| regimes | protocol | ours vs baseline | per warm start: saving [95% CI] (p) | pooled saving | "
             "stratified p | holds in |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        per = "; ".join(f"{p['regime']}{'' if p['preregistration_met'] is not False else ' (pre-reg. missed)'}: "
                        f"{_pct(p['value'])} [{_pct(p['lo'])}, {_pct(p['hi'])}] (p {_p_eq(p['p_value'])}, "
                        f"{p['ours_reached']}/{p['ours_seeds']} vs {p['base_reached']}/{p['base_seeds']} reached)"
                        for p in r["per_warm_start"])
        ps = _p(r["p_value_stratified"])
        lines.append(f"| {r['family']} x {r['warm_starts']} | {r['protocol']} | {r['ours']} vs {r['baseline']} | "
                     f"{per} | {_pct(r['pooled_saving'])} | {ps} | {r['holds_in']}/{r['warm_starts']} |")
    return lines


def write(rows: Sequence[Mapping[str, Any]], results: Path) -> None:
    """training_warmstarts.{json,md} in the results root ``results``'s warmstarts/."""
    dest = output_dir(results, "warmstarts")
    (dest / "training_warmstarts.json").write_text(json.dumps(list(rows), indent=1) + "\n")
    head = ["# Headline comparisons across warm starts", "",
            "Written by `python -m benchmarks.warmstarts` from the study's run files; the module docstring gives "
            "the rules. Each warm start has its own policy, reference runs and target; a saving is fitted rollouts "
            "to that target. `holds in`: warm starts with a saving above zero.", ""]
    (dest / "training_warmstarts.md").write_text("\n".join(head + table(rows)) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    rows = measure(RESULTS)
    write(rows, RESULTS)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
