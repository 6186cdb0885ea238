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

The worked-answer family (``steps``, ``steps-wsJ``) is read the same way on three cost axes (COST_COMPARISONS):
rollouts, generated tokens and training seconds to target, each pooled saving with a 95% bootstrap interval that
resamples runs within each warm start and keeps each run's costs on every axis together; so the token row also
gives the token saving minus the rollout saving (the sources' claim that SARA saves more tokens than rollouts
against DAPO) with its interval.

Warm starts whose pre-registration (benchmarks/results/study/<regime>/preregistration.json) misses its criteria
are reported and marked, not dropped: the criteria were fixed before any allocator ran.

Writes ``training_warmstarts.json``, ``training_warmstarts.md``, ``training_summary.md`` (the README's table of the
headline rows) and ``training_costs.md`` (the README's table of the worked-answer costs) in
benchmarks/results/warmstarts/.
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
from benchmarks.study_targets import (
    cell_runs,
    cost_of,
    finite_or_none,
    pct,
    percentile_interval,
    reach_x,
    saving,
    target_of,
)
from rlvr_core.stats import rank_test

# (protocol, allocator, baseline): the measurement issue's headline cells, then the other allocators of ours and the
# published baselines, each against its protocol's baseline (a row appears where some warm start ran both cells)
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("equal-batch", "sara", "dapo"),
    ("equal-batch", "sara+dps[context]", "dapo"),
    ("equal-rollouts", "sara[budget]", "grpo"),
    ("matched-updates", "sara", "grpo"),
    ("matched-updates", "sara+dps[context]", "grpo"),
    ("matched-updates-small", "sara", "grpo"),
    ("matched-updates-small", "sara+dps[context]", "grpo"),
    ("equal-batch", "sara+dps", "dapo"),
    ("equal-batch", "sara[carry]", "dapo"),
    ("equal-batch", "greso", "dapo"),
    ("equal-rollouts", "vigor", "grpo"),
    ("equal-batch", "pilot-commit", "dapo"),
    ("equal-batch", "reinforce-ada", "dapo"),
    ("equal-rollouts", "ar3po", "grpo"),
)
# the rows the README's summary shows (every row: training_warmstarts.md)
SUMMARY_SHOWS = frozenset({*COMPARISONS[:7], ("equal-rollouts", "vigor", "grpo"), *COMPARISONS[-3:]})


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


def _settings(runs: Sequence[Mapping[str, Any]]) -> set[str]:
    return {json.dumps(r.get("allocator_params") or {}, sort_keys=True) for r in runs}


def cells(out: Path, regimes: Sequence[str], protocol: str, ours: str,
          base: str) -> tuple[list[tuple[str, float, list[dict], list[dict]]], list[str]]:
    """(regime, target, our runs, baseline runs) of each warm start in ``regimes`` that ran both cells with the
    allocator settings of the last of them, and the warm starts left out for other settings: a label whose protocol
    changed (VIGOR's runs on the step-grid regimes predate ``fill``) is another allocator there."""
    found = [(r, target_of(out, r), cell_runs(out, r, protocol, ours), cell_runs(out, r, protocol, base))
             for r in regimes]
    found = [c for c in found if c[2] and c[3]]
    if not found:
        return [], []
    latest = (_settings(found[-1][2]), _settings(found[-1][3]))
    keep = [c for c in found if (_settings(c[2]), _settings(c[3])) == latest]
    return keep, [c[0] for c in found if c not in keep]


def compare(out: Path, regimes: Sequence[str], protocol: str, ours: str, base: str,
            axis: str = "cum_rollouts") -> dict[str, Any] | None:
    """One comparison across the warm starts in ``regimes`` that ran both cells (``cells``), on cost ``axis``; None
    where none did."""
    per, ratios, fa, fb, sa, sb = [], [], [], [], [], []
    kept, left_out = cells(out, regimes, protocol, ours, base)
    for regime, t, a, b in kept:
        s = saving(a, b, t, axis=axis)
        per.append({"regime": regime, "warm_start": R.base_regime(regime)[1] or 0,
                    "preregistration_met": preregistered(out, regime), "target": t, **s})
        base_median = float(np.median([cost_of(r, t, axis, False) for r in b]))
        ratios += [cost_of(r, t, axis, True) / base_median for r in a]
        fa += [reach_x(r, t, axis) for r in a]
        fb += [reach_x(r, t, axis) for r in b]
        sa += [regime] * len(a)
        sb += [regime] * len(b)
    if not per:
        return None
    test = rank_test(fa, fb, strata_ours=sa, strata_base=sb)
    pooled = float(np.median(ratios))
    return {"protocol": protocol, "ours": ours, "baseline": base, "axis": axis, "warm_starts": len(per),
            "ours_runs": len(fa), "base_runs": len(fb), "per_warm_start": per, "left_out_other_settings": left_out,
            "pooled_saving": None if not math.isfinite(pooled) else 1.0 - pooled,
            "p_value_stratified": test["p_value"],
            "holds_in": sum(1 for p in per if p["value"] is not None and p["value"] > 0)}


def pooled_costs(out: Path, regimes: Sequence[str], protocol: str, ours: str, base: str, axes: Sequence[str], *,
                 boot: int = 2000, seed: int = 0) -> dict[str, dict[str, float | None]]:
    """The pooled saving of ``ours`` against ``base`` on each axis with a 95% bootstrap interval that resamples the
    runs of each side within each warm start, the same draw for every axis (a run's costs stay together); and for
    each axis but the first, its pooled saving minus the first axis's ({axis: {value, lo, hi, gap, gap_lo,
    gap_hi}})."""
    costs = [(np.asarray([[cost_of(r, t, x, True) for x in axes] for r in a], float),
              np.asarray([[cost_of(r, t, x, False) for x in axes] for r in b], float))
             for _, t, a, b in cells(out, regimes, protocol, ours, base)[0]]  # per warm start, each (runs, axes)
    if not costs:
        return {}

    def pooled(draw: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        ratios = np.concatenate([a / np.median(b, axis=0) for a, b in draw])
        return 1.0 - np.median(ratios, axis=0)

    rng = np.random.default_rng(seed)
    boots = np.asarray([pooled([(a[rng.integers(0, len(a), len(a))], b[rng.integers(0, len(b), len(b))])
                                for a, b in costs]) for _ in range(boot)])
    value = pooled(costs)

    def ci(x: np.ndarray) -> tuple[float | None, float | None]:
        lo, hi = percentile_interval(np.sort(x))
        return finite_or_none(lo), finite_or_none(hi)

    res: dict[str, dict[str, float | None]] = {}
    for j, x in enumerate(axes):
        lo, hi = ci(boots[:, j])
        res[x] = {"value": finite_or_none(value[j]), "lo": lo, "hi": hi}
        if j:
            glo, ghi = ci(boots[:, j] - boots[:, 0])
            res[x].update(gap=finite_or_none(value[j] - value[0]), gap_lo=glo, gap_hi=ghi)
    return res


def family_saving(out: Path, regimes: Sequence[str], protocol: str, ours: str, base: str) -> dict[str, Any] | None:
    """A target's saving over the warm starts in ``regimes`` that ran both cells, in study_targets' row form: the
    pooled saving of fitted rollouts with its bootstrap interval (pooled_costs), the rank test stratified by warm
    start, the runs and reaches summed over the warm starts; None where no warm start ran both."""
    row = compare(out, regimes, protocol, ours, base)
    if row is None:
        return None
    pooled = pooled_costs(out, regimes, protocol, ours, base, ("cum_rollouts",))["cum_rollouts"]
    per = row["per_warm_start"]
    return {"value": pooled["value"], "lo": pooled["lo"], "hi": pooled["hi"], "p_value": row["p_value_stratified"],
            "ours_seeds": row["ours_runs"], "base_seeds": row["base_runs"],
            "ours_reached": sum(p["ours_reached"] for p in per), "base_reached": sum(p["base_reached"] for p in per),
            "warm_starts": row["warm_starts"], "holds_in": row["holds_in"], "regimes": [p["regime"] for p in per]}


# the worked-answer family: what each allocator buys in rollouts, generated tokens and training seconds
COST_AXES = ("cum_rollouts", "cum_tokens", "seconds")
COST_COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("equal-batch", "sara", "dapo"),
    ("equal-batch", "sara+dps[context]", "dapo"),
    ("equal-batch", "sara[tokens]", "dapo"),
    ("equal-batch", "sara[tokens]", "sara"),
    ("equal-rollouts", "vigor", "grpo"),
    ("matched-updates", "sara", "grpo"),
)


def measure_costs(out: Path, base: str = "steps") -> list[dict[str, Any]]:
    """Each COST_COMPARISONS row across ``base``'s warm starts: per axis the comparison (compare) and the pooled
    saving's interval (pooled_costs)."""
    regimes = family(out, base)
    rows = []
    for proto, ours, baseline in COST_COMPARISONS:
        pooled = pooled_costs(out, regimes, proto, ours, baseline, COST_AXES)
        if not pooled:
            continue
        axes = {x: {**compare(out, regimes, proto, ours, baseline, axis=x), **{f"pooled_{k}": v
                                                                               for k, v in pooled[x].items()}}
                for x in COST_AXES}
        first = axes[COST_AXES[0]]
        rows.append({"family": base, "protocol": proto, "ours": ours, "baseline": baseline,
                     "warm_starts": first["warm_starts"], "ours_runs": first["ours_runs"],
                     "base_runs": first["base_runs"], "axes": axes})
    return rows


def measure(out: Path, bases: Sequence[str] = ("hard", "pool")) -> list[dict[str, Any]]:
    """Each COMPARISONS row over each base's family, with the pooled saving's 95% bootstrap interval (runs resampled
    within each warm start)."""
    rows = []
    for base in bases:
        regimes = family(out, base)
        for proto, ours, baseline in COMPARISONS:
            if (row := compare(out, regimes, proto, ours, baseline)) is not None:
                ci = pooled_costs(out, regimes, proto, ours, baseline, ("cum_rollouts",))["cum_rollouts"]
                rows.append({"family": base, **row, "pooled_lo": ci["lo"], "pooled_hi": ci["hi"]})
    return rows


def _left_out(r: Mapping[str, Any]) -> str:
    gone = r.get("left_out_other_settings") or []
    return "" if not gone else f"; {', '.join(gone)} left out: other allocator settings"


def _ci(r: Mapping[str, Any]) -> str:
    return "" if "pooled_lo" not in r else f" [{_pct(r['pooled_lo'])}, {_pct(r['pooled_hi'])}]"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else pct(v)


def _p(v: float | None) -> str:
    return "n/a" if v is None else "< 0.001" if v < 0.001 else f"{v:.3f}"


def _p_eq(v: float | None) -> str:
    return _p(v) if v is not None and v < 0.001 else f"= {_p(v)}"


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| regimes | protocol | allocator vs baseline | per warm start: saving [95% CI] (p) | pooled saving | "
             "stratified p | holds in |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        per = "; ".join(f"{p['regime']}{'' if p['preregistration_met'] is not False else ' (pre-reg. missed)'}: "
                        f"{_pct(p['value'])} [{_pct(p['lo'])}, {_pct(p['hi'])}] (p {_p_eq(p['p_value'])}, "
                        f"{p['ours_reached']}/{p['ours_seeds']} vs {p['base_reached']}/{p['base_seeds']} reached)"
                        for p in r["per_warm_start"])
        ps = _p(r["p_value_stratified"])
        lines.append(f"| {r['family']} x {r['warm_starts']}{_left_out(r)} | {r['protocol']} | {r['ours']} vs "
                     f"{r['baseline']} | "
                     f"{per} | {_pct(r['pooled_saving'])}{_ci(r)} | {ps} | {r['holds_in']}/{r['warm_starts']} |")
    return lines


def summary_md(rows: Sequence[Mapping[str, Any]]) -> str:
    """The README's table: per family and SUMMARY_SHOWS comparison, the runs, the pooled saving [95% CI], the
    stratified p and the warm starts that hold (per warm start: training_warmstarts.md)."""
    shown = [r for r in rows if (r["protocol"], r["ours"], r["baseline"]) in SUMMARY_SHOWS]
    if not shown:
        return ""
    out = ["Fitted rollouts to each warm start's own target (80% of its uniform GRPO runs' gain), pooled over the "
           "warm starts that ran both cells: 1 - the median over the allocator's runs of its reach divided by the "
           "median reach of the baseline of the same warm start (a baseline's miss counts at its whole budget, ours "
           "as never), 95% bootstrap interval resampling runs within each warm start; p: one-sided rank test "
           "stratified by warm start, misses ranked last; holds in: warm starts with a saving above zero. Per warm "
           "start: [training_warmstarts.md](benchmarks/results/warmstarts/training_warmstarts.md); rollouts and "
           "accuracy of the headline cells: [training_headline.md](benchmarks/results/readme/training_headline.md); "
           "every cell: [training_study.md](benchmarks/results/study/training_study.md).", "",
           "| regime | protocol | allocator vs baseline | runs (warm starts) | reached | saving [95% CI] | p "
           "| holds in |",
           "|---|---|---|---|---|---|---|---|"]
    for r in shown:
        per = r["per_warm_start"]
        reached = f"{sum(p['ours_reached'] for p in per)}/{r['ours_runs']} vs " \
                  f"{sum(p['base_reached'] for p in per)}/{r['base_runs']}"
        ci = f"{_pct(r['pooled_saving'])}{_ci(r)}" if r["pooled_saving"] is not None else \
            "none: the median run never reaches"
        out.append(f"| {r['family']} | {r['protocol']} | {r['ours']} vs {r['baseline']} | {r['ours_runs']} vs "
                   f"{r['base_runs']} ({r['warm_starts']}{_left_out(r)}) | {reached} | {ci} | "
                   f"{_p(r['p_value_stratified'])} | "
                   f"{r['holds_in']}/{r['warm_starts']} |")
    return "\n".join(out) + "\n"


AXIS_WORDS = {"cum_rollouts": "rollouts", "cum_tokens": "generated tokens", "seconds": "training seconds"}


def _saving_ci(v: Mapping[str, Any]) -> str:
    return f"{_pct(v['pooled_value'])} [{_pct(v['pooled_lo'])}, {_pct(v['pooled_hi'])}]"


def cost_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per comparison: the pooled saving [95% CI] and the stratified p on each cost axis."""
    lines = ["| ours vs baseline | protocol | runs (warm starts) | " + " | ".join(AXIS_WORDS[x] for x in COST_AXES)
             + " | holds in (rollouts, tokens, seconds) |", "|---|---|---|" + "---|" * (len(COST_AXES) + 1)]
    for r in rows:
        ax = r["axes"]
        cells = [f"{_saving_ci(ax[x])}, p {_p_eq(ax[x]['p_value_stratified'])}" for x in COST_AXES]
        holds = ", ".join(f"{ax[x]['holds_in']}/{ax[x]['warm_starts']}" for x in COST_AXES)
        lines.append(f"| {r['ours']} vs {r['baseline']} | {r['protocol']} | {r['ours_runs']} vs {r['base_runs']} "
                     f"({r['warm_starts']}) | " + " | ".join(cells) + f" | {holds} |")
    return lines


def claim_line(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The sources' token claim pooled over the warm starts: sara's token saving minus its rollout saving
    against dapo at equal batch."""
    r = next((r for r in rows if (r["protocol"], r["ours"], r["baseline"]) == ("equal-batch", "sara", "dapo")), None)
    if r is None or (t := r["axes"]["cum_tokens"]).get("pooled_gap") is None:
        return None
    lo, hi = t["pooled_gap_lo"], t["pooled_gap_hi"]
    held = lo is not None and lo > 0
    return (f"The sources' token claim (sara's saving against dapo larger in generated tokens than in rollouts), "
            f"pooled over {r['warm_starts']} warm start(s), {r['ours_runs']} vs {r['base_runs']} runs: token saving "
            f"minus rollout saving {100 * t['pooled_gap']:+.1f} points [{_pts(lo)}, {_pts(hi)}]: "
            + ("**holds** (the interval lies above zero)." if held else "**not borne out** (the interval reaches "
               "zero or below)."))


def _pts(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f}"


def costs_md(rows: Sequence[Mapping[str, Any]], base: str = "steps") -> str:
    """The worked-answer family's cost comparisons (the README pastes them; the token claim is its targets' row)."""
    if not rows:
        return ""
    out = [f"Pooled over the warm starts of `{base}` (each against its own target): 1 - the median over our runs of "
           "the cost divided by the median cost of the baseline of the same warm start, with a 95% bootstrap "
           "interval (runs resampled within each warm start); p: one-sided rank test stratified by warm start. Per "
           "warm start: [training_warmstarts.md](benchmarks/results/warmstarts/training_warmstarts.md).", "",
           *cost_table(rows)]
    return "\n".join(out) + "\n"


def write(rows: Sequence[Mapping[str, Any]], results: Path, costs: Sequence[Mapping[str, Any]] = ()) -> None:
    """training_warmstarts.{json,md} in the results root ``results``'s warmstarts/ (the worked-answer family's cost
    rows under "costs"), and training_costs.md, the README's table of them."""
    dest = output_dir(results, "warmstarts")
    (dest / "training_warmstarts.json").write_text(json.dumps({"rollouts": list(rows), "costs": list(costs)},
                                                              indent=1) + "\n")
    head = ["# Headline comparisons across warm starts", "",
            "Written by `python -m benchmarks.warmstarts` from the study's run files; the module docstring gives "
            "the rules. Each warm start has its own policy, reference runs and target; a saving is fitted rollouts "
            "to that target. `holds in`: warm starts with a saving above zero.", ""]
    body = head + table(rows)
    if costs:
        body += ["", "## Worked answers: rollouts, tokens and seconds", "", "Per warm start (saving [95% CI], p):",
                 "", "| ours vs baseline | protocol | cost | per warm start |", "|---|---|---|---|"]
        for r in costs:
            for x in COST_AXES:
                per = "; ".join(f"{p['regime']}: {_pct(p['value'])} [{_pct(p['lo'])}, {_pct(p['hi'])}] "
                                f"(p {_p_eq(p['p_value'])})" for p in r["axes"][x]["per_warm_start"])
                body.append(f"| {r['ours']} vs {r['baseline']} | {r['protocol']} | {AXIS_WORDS[x]} | {per} |")
        body += ["", "Pooled:", "", costs_md(costs).rstrip()]
        if line := claim_line(costs):
            body += ["", line]
    (dest / "training_warmstarts.md").write_text("\n".join(body) + "\n")
    (dest / "training_costs.md").write_text(costs_md(costs))
    (dest / "training_summary.md").write_text(summary_md(rows))


def main(argv: Sequence[str] | None = None) -> int:
    rows, costs = measure(RESULTS), measure_costs(RESULTS)
    write(rows, RESULTS, costs)
    print("\n".join(table(rows)))
    print(costs_md(costs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
