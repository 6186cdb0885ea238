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
- ``holds_in``: how many warm starts show a saving above zero, so a claim that holds for one policy only says so;
  each warm start's own p is printed beside it;
- ``p_holm``: the stratified p adjusted by Holm's step-down rule over the headline family (every comparison marked
  ``readme`` in the plan, both families: the rows of training_summary.md), with ``p_holm_se`` its Monte Carlo
  standard error carried through (0: every p of the family exact; rlvr_core.stats.rank_test).

The worked-answer family (``steps``, ``steps-wsJ``) is read the same way on three cost axes (COST_COMPARISONS):
rollouts, generated tokens and training seconds to target, each pooled saving with a 95% bootstrap interval that
resamples runs within each warm start and keeps each run's costs on every axis together; so the token row also
gives the token saving minus the rollout saving (the sources' claim that SARA saves more tokens than rollouts
against DAPO) with its interval.

Warm starts whose pre-registration (benchmarks/results/study/<regime>/preregistration.json) misses its criteria
are reported and marked, not dropped: the criteria were fixed before any allocator ran.

Beside the reach, the statistics that survive a flat curve: accuracy at 25/50/75/100% of the budget and the area under
the curve, each ours - baseline over seed pairs (``measure_budget``).

Writes ``training_warmstarts.json``, ``training_warmstarts.md``, ``training_summary.md`` (docs/results.md's table of
the headline rows), ``training_costs.md`` (docs/results.md's table of the worked-answer costs) and
``training_fixed_budget.md`` (docs/results.md's table of the fixed-budget statistics) in
benchmarks/results/warmstarts/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common import RESULTS, output_dir
from benchmarks.study import tuning
from benchmarks.study.formats import p_eq, p_value, pct, points, points_ci, rank_test_words
from benchmarks.study.noise import band_words, reads_as, written_bands
from benchmarks.study.plan import (
    BEST_K,
    COMPARISON_FAMILIES,
    COMPARISONS,
    COST_AXES,
    COST_COMPARISONS,
    COST_FAMILY,
    ORACLE,
    REFERENCE,
    TUNED,
    Comparison,
    row_baselines,
)
from benchmarks.study.stats import (
    BUDGET_FRACTIONS,
    compare,
    conditioning,
    holm_with_se,
    matched_cells,
    paired_budget,
    pooled_costs,
)
from benchmarks.study.store import RunStore, as_store


def family(out: Path | RunStore, base: str) -> list[str]:
    """``base`` and its warm-start variants that have a frozen target, base first, then by warm-start seed."""
    return as_store(out).family(base)


def measure_costs(out: Path | RunStore, base: str = COST_FAMILY) -> list[dict[str, Any]]:
    """Each COST_COMPARISONS row across ``base``'s warm starts: per axis the comparison (compare) and the pooled
    saving's interval (pooled_costs)."""
    store = as_store(out)
    regimes = store.family(base)
    rows = []
    for c in COST_COMPARISONS:
        pooled = pooled_costs(store, regimes, c.protocol, c.ours, c.baseline, COST_AXES)
        if not pooled:
            continue
        axes = {x: {**compare(store, regimes, c.protocol, c.ours, c.baseline, axis=x),
                    **{f"pooled_{k}": v for k, v in pooled[x].items()}} for x in COST_AXES}
        first = axes[COST_AXES[0]]
        rows.append({"family": base, "protocol": c.protocol, "ours": c.ours, "baseline": c.baseline,
                     "warm_starts": first["warm_starts"], "ours_runs": first["ours_runs"],
                     "base_runs": first["base_runs"], "axes": axes})
    return rows


def is_conditioned(store: RunStore, regime: str) -> bool:
    """Whether a warm start's target is conditioned (stats.conditioning on its reference runs; its
    pre-registration's record where it has one)."""
    pre = store.preregistration(regime) or {}
    cond = pre.get("conditioning") or conditioning(store.cell(regime, "reference", "grpo"),
                                                   store.target_value(regime))
    return bool(cond["conditioned"])


class Baselines:
    """A view of a RunStore in which a row reads its baselines: ``plan.BEST_K`` is the group-size cell of the k its
    warm start chose on the validation split (empty before the choice), ``plan.TUNED`` the test cell of the uniform
    GRPO configuration it chose there (benchmarks/study/tuning.py; empty before the choice or while that cell lacks a
    seed of tuning.TEST_SEEDS), ``plan.ORACLE`` the test-best configuration's (a bound; empty until every one-pass
    configuration has its test cell), ``plan.REFERENCE`` the reference runs, any other label its own cell under the
    protocol asked."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.picked: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (regime, TUNED or ORACLE): its cell

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]:
        if label == BEST_K:
            best = self.store.choice(regime, "group-size").get("best")
            return self.store.cell(regime, "group-size", best) if best else []
        if label in (TUNED, ORACLE):
            if (regime, label) not in self.picked:
                pick = tuning.chosen_config if label == TUNED else tuning.oracle_config
                self.picked[regime, label] = tuning.baseline_runs(self.store, regime, pick(self.store, regime))
            return self.picked[regime, label]
        if label == REFERENCE:
            return self.store.cell(regime, "reference", "grpo")
        return self.store.cell(regime, protocol, label)

    def target_value(self, regime: str) -> float | None:
        return self.store.target_value(regime)

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self.store.preregistration(regime)


def row_warm_starts(store: RunStore, regimes: Sequence[str], protocol: str, ours: str,
                    baselines: Sequence[str]) -> list[str]:
    """The warm starts of ``regimes`` where ``ours`` and every one of ``baselines`` ran (``Baselines``' cells, each
    pair with the allocator settings stats.matched_cells keeps): the one set all of a row's savings pool. A
    baseline that ran beside ``ours`` in none of them gives no saving to read and restricts nothing (a row whose
    best k has not run yet keeps its own warm starts)."""
    view = Baselines(store)
    kept = [{r for r, *_ in matched_cells(view, regimes, protocol, ours, b)[0]} for b in baselines]
    return [r for r in regimes if all(r in k for k in kept if k)]


def _rows_of(store: RunStore, base: str, regimes: Sequence[str], c: Comparison, one_set: bool) -> list[dict[str, Any]]:
    """The rows of one comparison over ``regimes`` (a family's, or its conditioned warm starts): against its
    baseline and, with ``one_set``, against the reference runs where it matches updates, both over the warm starts
    every baseline of plan.row_baselines ran (the best k's included)."""
    family, view = store.family(base), Baselines(store)
    bases = row_baselines(c) if one_set else (c.baseline,)
    kept = row_warm_starts(store, regimes, c.protocol, c.ours, bases) if len(bases) > 1 else list(regimes)
    rows = []
    for b in bases:
        if (row := compare(view, kept, c.protocol, c.ours, b)) is None:
            continue
        ci = pooled_costs(view, kept, c.protocol, c.ours, b, ("cum_rollouts",))["cum_rollouts"]
        ran = [r for r in family if view.cell(r, c.protocol, c.ours) and view.cell(r, c.protocol, b)]
        rows.append({"family": base, **row, "pooled_lo": ci["lo"], "pooled_hi": ci["hi"],
                     "left_out_unconditioned": [r for r in ran if r not in regimes],
                     "left_out_other_baselines": [r for r in ran if r in regimes and r not in kept],
                     "family_warm_starts": list(regimes),
                     **({"reference_of": c.baseline} if b == REFERENCE else {}),
                     **({"best_of": c.baseline} if b in (TUNED, ORACLE) else {})})
    return rows


def measure(out: Path | RunStore, bases: Sequence[str] = COMPARISON_FAMILIES, *,
            conditioned: bool = False) -> list[dict[str, Any]]:
    """Each COMPARISONS row over each base's family, with the pooled saving's 95% bootstrap interval (runs resampled
    within each warm start); ``conditioned``: the headline rows, over the family's conditioned warm starts only
    (naming the others that ran both cells in ``left_out_unconditioned``), each row's savings over one set of warm
    starts (``_rows_of``), a matched-updates row followed by its reading against the reference runs."""
    store = as_store(out)
    rows = []
    for base in bases:
        family = store.family(base)
        regimes = [r for r in family if is_conditioned(store, r)] if conditioned else family
        for c in COMPARISONS:
            rows += _rows_of(store, base, regimes, c, one_set=conditioned)
    headline = [r for r in rows if _headline(r)]  # the family Holm's correction runs over: every readme row
    adjusted = holm_with_se([r["p_value_stratified"] for r in headline], [r["p_value_stratified_se"] for r in headline])
    for r, (p, se) in zip(headline, adjusted):
        r.update(p_holm=p, p_holm_se=se, holm_family=sum(h["p_value_stratified"] is not None for h in headline))
    return rows


def _headline(r: Mapping[str, Any]) -> bool:
    """A row of the table of savings: a readme comparison's, or its reading against the reference runs."""
    key = (r["protocol"], r["ours"], r.get("reference_of", r["baseline"]))
    return any((c.protocol, c.ours, c.baseline) == key and c.readme for c in COMPARISONS)


def holds(r: Mapping[str, Any]) -> str:
    """``holds in`` with each warm start's own one-sided p: ``2/3 (p 0.010, 0.155, 0.155)``."""
    return f"{r['holds_in']}/{r['warm_starts']} (p " + ", ".join(p_value(p["p_value"]) for p in r["per_warm_start"]) \
        + ")"


def measure_budget(out: Path | RunStore, bases: Sequence[str] = COMPARISON_FAMILIES) -> list[dict[str, Any]]:
    """Each COMPARISONS row over each base's family in the statistics that survive a flat curve (paired_budget):
    accuracy at 25/50/75/100% of the budget and the area under the curve, ours - baseline per seed pair."""
    store = as_store(out)
    rows = []
    for base in bases:
        regimes = store.family(base)
        for c in COMPARISONS:
            if (d := paired_budget(store, regimes, c.protocol, c.ours, c.baseline)) is not None:
                rows.append({"family": base, "protocol": c.protocol, "ours": c.ours, "baseline": c.baseline, **d})
    return rows


def budget_md(rows: Sequence[Mapping[str, Any]]) -> str:
    """docs/results.md's table of accuracy at fixed budgets and area under the curve, against each baseline."""
    if not rows:
        return ""
    names = [f"{f:g}" for f in BUDGET_FRACTIONS]

    out = ["Held-out accuracy of the allocator minus its baseline's, in points, at fixed fractions of the regime's "
           "rollout budget (each run's isotonic fit) and averaged over the whole budget (area under the curve): the "
           "mean over the (warm start, seed) pairs both cells ran, with a 95% t interval from the spread within each "
           "warm start (checked on the A/A runs: docs/results.md, null controls). These read a flat curve where a "
           "reach to target cannot.", "",
           "| regime | protocol | allocator vs baseline | pairs (warm starts) | "
           + " | ".join(f"at {pct(float(n))} of budget" for n in names) + " | area under the curve |",
           "|---|---|---|---|" + "---|" * (len(names) + 1)]
    for r in rows:
        out.append(f"| {r['family']} | {r['protocol']} | {r['ours']} vs {r['baseline']} | {r['pairs']} "
                   f"({r['warm_starts']}) | " + " | ".join(points_ci(r[n]) for n in (*names, "auc"))
                   + " |")
    return "\n".join(out) + "\n"


def _left_out(r: Mapping[str, Any]) -> str:
    gone, flat = r.get("left_out_other_settings") or [], r.get("left_out_unconditioned") or []
    other = r.get("left_out_other_baselines") or []
    return ("" if not gone else f"; {', '.join(gone)} left out: other allocator settings") + \
        ("" if not flat else f"; {', '.join(flat)} left out: not conditioned") + \
        ("" if not other else f"; {', '.join(other)} left out: not every baseline of the row ran there")


def _ci(r: Mapping[str, Any]) -> str:
    return "" if "pooled_lo" not in r else f" [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}]"


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| regimes | protocol | allocator vs baseline | per warm start: saving [95% CI] (p) | pooled saving | "
             "stratified p | holds in |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        per = "; ".join(f"{p['regime']}{'' if p['preregistration_met'] is not False else ' (pre-reg. missed)'}: "
                        f"{pct(p['value'])} [{pct(p['lo'])}, {pct(p['hi'])}] (p {p_eq(p['p_value'])}, "
                        f"{p['ours_reached']}/{p['ours_seeds']} vs {p['base_reached']}/{p['base_seeds']} reached)"
                        for p in r["per_warm_start"])
        ps = p_value(r["p_value_stratified"], r.get("p_value_stratified_se"))
        lines.append(f"| {r['family']} x {r['warm_starts']}{_left_out(r)} | {r['protocol']} | {r['ours']} vs "
                     f"{r['baseline']} | "
                     f"{per} | {pct(r['pooled_saving'])}{_ci(r)} | {ps} | {r['holds_in']}/{r['warm_starts']} |")
    return lines


def summary_md(rows: Sequence[Mapping[str, Any]], bands: Mapping[str, Any] | None = None) -> str:
    """docs/results.md's table: per family and headline comparison (plan.Comparison.readme), the runs, the pooled
    saving [95% CI], the stratified p, the warm starts that hold (per warm start: training_warmstarts.md) and the
    family's A/A band (``bands``, benchmarks.study.noise.aa_bands) with what the saving may be called by it."""
    bands = bands or {}
    shown = [r for r in rows if _headline(r)]
    if not shown:
        return ""
    out = ["Fitted rollouts to each warm start's own target (80% of its uniform GRPO runs' gain), pooled over the "
           "warm starts that ran both cells: 1 - the median over the allocator's runs of its reach divided by the "
           "median reach of the baseline of the same warm start (a baseline's miss counts at its whole budget, ours "
           "as never), 95% bootstrap interval resampling runs within each warm start; p: one-sided rank test "
           f"stratified by warm start, misses ranked last, {rank_test_words(shown)}; p (Holm): that p adjusted "
           "by Holm's step-down rule over "
           f"the {shown[0].get('holm_family', len(shown))} rows of this table; holds in: warm starts with a saving "
           "above zero, each warm start's own one-sided p beside; A/A band: the central 95% of the pooled savings "
           "of uniform GRPO against itself re-split at random ([null_controls.md](benchmarks/results/null_controls/"
           "null_controls.md)), and a row reads as a saving only when its interval lies above zero and its estimate "
           "above that band. A row the README reads against the tuned uniform GRPO too pools only the warm starts "
           "where that configuration and the test-best one also ran; a matched-updates row is followed by the same "
           f"cells against the reference runs (`{REFERENCE}`: uniform GRPO at the regime's own batch), over the "
           "same warm starts. Per warm start: "
           "[training_warmstarts.md](benchmarks/results/warmstarts/training_warmstarts.md); rollouts and "
           "accuracy of the headline cells: [training_headline.md](benchmarks/results/readme/training_headline.md); "
           "every cell: [training_study.md](benchmarks/results/study/training_study.md).", "",
           "| regime | protocol | allocator vs baseline | runs (warm starts) | reached | saving [95% CI] | p | "
           "p (Holm) | holds in (p per warm start) | A/A band; reads as |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in shown:
        per = r["per_warm_start"]
        reached = f"{sum(p['ours_reached'] for p in per)}/{r['ours_runs']} vs " \
                  f"{sum(p['base_reached'] for p in per)}/{r['base_runs']}"
        ci = f"{pct(r['pooled_saving'])}{_ci(r)}" if r["pooled_saving"] is not None else \
            "none: the median run never reaches"
        out.append(f"| {r['family']} | {r['protocol']} | {r['ours']} vs {r['baseline']} | {r['ours_runs']} vs "
                   f"{r['base_runs']} ({r['warm_starts']}{_left_out(r)}) | {reached} | {ci} | "
                   f"{p_value(r['p_value_stratified'], r.get('p_value_stratified_se'))} | "
                   f"{p_value(r.get('p_holm'), r.get('p_holm_se'))} | {holds(r)} | "
                   f"{band_words(bands.get(r['family']))}; {reads_as(r, bands.get(r['family']))} |")
    return "\n".join(out) + "\n"


AXIS_WORDS = {"cum_rollouts": "rollouts", "cum_tokens": "generated tokens", "seconds": "training seconds"}


def _saving_ci(v: Mapping[str, Any]) -> str:
    return f"{pct(v['pooled_value'])} [{pct(v['pooled_lo'])}, {pct(v['pooled_hi'])}]"


def cost_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per comparison: the pooled saving [95% CI] and the stratified p on each cost axis."""
    lines = ["| ours vs baseline | protocol | runs (warm starts) | " + " | ".join(AXIS_WORDS[x] for x in COST_AXES)
             + " | holds in (rollouts, tokens, seconds) |", "|---|---|---|" + "---|" * (len(COST_AXES) + 1)]
    for r in rows:
        ax = r["axes"]
        cells = [f"{_saving_ci(ax[x])}, p {p_eq(ax[x]['p_value_stratified'])}" for x in COST_AXES]
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
            f"minus rollout saving {100 * t['pooled_gap']:+.1f} points [{points(lo)}, {points(hi)}]: "
            + ("**holds** (the interval lies above zero)." if held else "**not borne out** (the interval reaches "
               "zero or below)."))


def costs_md(rows: Sequence[Mapping[str, Any]], base: str = "steps") -> str:
    """The worked-answer family's cost comparisons (docs/results.md pastes them; the token claim is its targets'
    row)."""
    if not rows:
        return ""
    out = [f"Pooled over the warm starts of `{base}` (each against its own target): 1 - the median over our runs of "
           "the cost divided by the median cost of the baseline of the same warm start, with a 95% bootstrap "
           "interval (runs resampled within each warm start); p: one-sided rank test stratified by warm start. Per "
           "warm start: [training_warmstarts.md](benchmarks/results/warmstarts/training_warmstarts.md).", "",
           *cost_table(rows)]
    return "\n".join(out) + "\n"


def write(rows: Sequence[Mapping[str, Any]], results: Path, costs: Sequence[Mapping[str, Any]] = (),
          budget: Sequence[Mapping[str, Any]] = (), headline: Sequence[Mapping[str, Any]] | None = None,
          bands: Mapping[str, Any] | None = None) -> None:
    """training_warmstarts.{json,md} in the results root ``results``'s warmstarts/ (every warm start's rows; the
    worked-answer family's cost rows under "costs", the fixed-budget rows under "budget", the rows over conditioned
    warm starts under "headline"), training_summary.md (from ``headline``, default ``rows``, beside each family's
    A/A band of ``bands``), training_costs.md and training_fixed_budget.md, docs/results.md's tables of them."""
    headline = rows if headline is None else headline
    dest = output_dir(results, "warmstarts")
    (dest / "training_warmstarts.json").write_text(json.dumps({"rollouts": list(rows), "headline": list(headline),
                                                               "costs": list(costs), "budget": list(budget)},
                                                              indent=1) + "\n")
    (dest / "training_fixed_budget.md").write_text(budget_md(budget))
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
                per = "; ".join(f"{p['regime']}: {pct(p['value'])} [{pct(p['lo'])}, {pct(p['hi'])}] "
                                f"(p {p_eq(p['p_value'])})" for p in r["axes"][x]["per_warm_start"])
                body.append(f"| {r['ours']} vs {r['baseline']} | {r['protocol']} | {AXIS_WORDS[x]} | {per} |")
        body += ["", "Pooled:", "", costs_md(costs).rstrip()]
        if line := claim_line(costs):
            body += ["", line]
    (dest / "training_warmstarts.md").write_text("\n".join(body) + "\n")
    (dest / "training_costs.md").write_text(costs_md(costs))
    (dest / "training_summary.md").write_text(summary_md(headline, bands))


def main(argv: Sequence[str] | None = None) -> int:
    store = RunStore(RESULTS)
    rows, costs = measure(store), measure_costs(store)
    write(rows, RESULTS, costs, measure_budget(store), measure(store, conditioned=True), written_bands(RESULTS))
    print("\n".join(table(rows)))
    print(costs_md(costs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
