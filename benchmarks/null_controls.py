"""The study's null controls: what the instrument reports when allocation is held equal.

    python -m benchmarks.null_controls       # (also run by `python -m benchmarks.study --summarize-only`)

Each control is read through the same pooling and tests as the headline rows (benchmarks/warmstarts.py), per family
of warm starts (docs/training-study.md, "Null controls", declared before their runs):

- **A/A**: uniform GRPO (``grpo[aa]``, the reference configuration on seeds 5-9) against the reference runs (seeds
  0-4) in fitted rollouts to target. Passes when its pooled interval covers zero and its point estimate lies within
  10%.
- **A/A false positives**: the ten runs of each warm start re-split at random into two sets of five (``SPLITS``
  seeded draws, the same split drawn for every warm start of a family at once), each split read as a comparison:
  the share whose stratified p lies below 0.05 (the stated level) and the share whose 95% interval lies wholly
  above zero (a claimed saving; 2.5% expected); and, the two sides paired at random, the share whose accuracy-gap
  interval (stats.paired_budget, at equal updates and at a fixed budget) excludes zero (5% expected).
- **DAPO against matched GRPO** in updates to target: DAPO picks its groups as GRPO does, so at matched effective
  groups per update (the matched-updates protocol) its saving in updates should be about zero; beside it the same
  cells in rollouts.
- **Its diagnosis at equal updates**: DAPO's held-out accuracy minus matched GRPO's, seed by seed, at 25/50/75/100%
  of the fewest updates any run of the two cells of a warm start made, and the area under the curve to there
  (benchmarks.study.stats.paired_budget on the updates axis). A reach to target can fail the control for reasons
  other than training: DAPO spends more rollouts per update, so its runs end after fewer updates (a run that ends
  below the target counts as never), and a flat target turns small accuracy gaps into large reach gaps. Read at
  equal updates over the range both made, neither applies. The A/A is read the same way beside it (grpo[aa] seed
  5 + i against reference seed i).
- **The DAPO control on the large held-out set** (benchmarks/study/heldout.py: the test split's 2,000 problems and
  12,000 more of the same cells, an evaluation's standard error about a third of a point): the same runs, the
  control and its diagnosis read on both sets side by side, over the warm starts whose three cells (the reference
  runs that fix the target, DAPO, matched GRPO) were all evaluated on it (``benchmarks.large_set.LargeSet``). A
  gap that one set shows and the other does not is evaluation noise; one both show is training.
- **The DAPO control replicated on fresh seeds** (protocol ``null-dapo``, declared before its runs, after the
  control had failed on pool): the same two configurations, DAPO at B and GRPO at the matched-updates batch, on
  seeds 5-9 of pool, pool-ws2, pool-ws3 and pool-ws4 (the warm starts of the control's large-set reading; pool-ws1's
  policy is not kept in artifacts/warmstart). Read as the control is, on seeds 5-9 alone (the replication) and on
  seeds 0-9 pooled: updates to target (passes when the interval covers zero and the point estimate lies within
  10%) and the accuracy gap at equal updates, at the end and for the area (passes when its interval covers zero);
  on the test split, and on the large set once every run of the replication is evaluated there. No seeds are
  added after it is read.
- **What the two sides train, from their decision logs** (``trained_recurrence``): over the first updates both
  sides made (the fewest any run of the warm start made), per update the prompts drawn and the groups, rows and
  tokens trained, a trained group's pass rate, and how many times its prompt had been trained before; DAPO minus
  matched GRPO seed by seed. DAPO draws more prompts per update (it discards the mixed groups past B); this reads
  whether it therefore trains on prompts it has trained on more often, or on other groups.

Writes benchmarks/results/null_controls/null_controls.json and null_controls.md (docs/results.md pastes it).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.common import RESULTS, output_dir
from benchmarks.large_set import LargeSet, evaluation_se, missing_cells, pooled_row, resume_command
from benchmarks.study.formats import p_value, pct, points_ci
from benchmarks.study.noise import BAND, band, band_words
from benchmarks.study.plan import COMPARISON_FAMILIES, PROTOCOLS
from benchmarks.study.stats import BUDGET_FRACTIONS, paired_budget, stratified_t_interval
from benchmarks.study.store import RunStore, as_store
from rlvr_core.stats import significant

AA = ("null-aa", "grpo[aa]", "grpo")
DAPO = ("matched-updates", "dapo", "grpo")
SPLITS = 200  # random re-splits of the A/A runs per family
LEVEL = 0.05
TOLERANCE = 0.10  # the A/A point estimate's allowed distance from zero


class Split:
    """A view of the A/A cells with each warm start's runs of both sides re-split: ``ours[regime]`` indexes the
    pooled runs taken as grpo[aa], the rest are the reference side."""

    def __init__(self, store: RunStore, pooled: Mapping[str, list[dict]], ours: Mapping[str, np.ndarray]) -> None:
        self.store, self.pooled, self.ours = store, pooled, ours

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]:
        """One side's runs, their seeds renumbered 0, 1, ... so that paired statistics pair the sides at random."""
        runs, mine = self.pooled[regime], set(self.ours[regime].tolist())
        side = [r for i, r in enumerate(runs) if (i in mine) == (label == AA[1])]
        return [{**r, "seed": j} for j, r in enumerate(side)]

    def target_value(self, regime: str) -> float | None:
        return self.store.target_value(regime)

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self.store.preregistration(regime)


GAP_AXES = ("updates", "cum_rollouts")  # the accuracy gaps' axes: the DAPO diagnosis's and the fixed-budget table's
GAP_STATS = ("1", "auc")  # at the end of the common range, and averaged over it


def false_positives(store: RunStore, regimes: Sequence[str], splits: int = SPLITS, seed: int = 0) -> dict[str, Any]:
    """The A/A runs of ``regimes`` re-split ``splits`` times: the share of splits with p < LEVEL and with the
    interval wholly above zero; and, for the accuracy gaps read on seed pairs (stats.paired_budget, the sides paired
    at random), the share whose 95% interval excludes zero (5% expected) on each GAP_AXES, per GAP_STATS."""
    pooled = {r: store.cell(r, *AA[:2]) + store.cell(r, AA[0], AA[2]) for r in regimes}
    pooled = {r: runs for r, runs in pooled.items() if store.cell(r, *AA[:2])}
    rng = np.random.default_rng(seed)
    low_p = above = 0
    savings: list[float] = []
    gaps = {x: dict.fromkeys(GAP_STATS, 0) for x in GAP_AXES}
    for _ in range(splits):
        ours = {r: rng.permutation(len(runs))[: len(runs) // 2] for r, runs in pooled.items()}
        view = Split(store, pooled, ours)
        row = pooled_row(view, list(pooled), *AA, boot=500)
        low_p += significant(row, LEVEL, p="p_value_stratified", se="p_value_stratified_se")
        above += row["pooled_lo"] is not None and row["pooled_lo"] > 0
        savings.append(-math.inf if row["pooled_saving"] is None else row["pooled_saving"])
        for x in GAP_AXES:
            d = paired_budget(view, list(pooled), *AA, axis=x)
            for k in GAP_STATS:
                gaps[x][k] += d[k]["lo"] is not None and not d[k]["lo"] <= 0 <= d[k]["hi"]
    return {"splits": splits, "warm_starts": len(pooled), "runs": sum(map(len, pooled.values())),
            "p_below_level": low_p / splits, "interval_above_zero": above / splits, "level": LEVEL,
            "band": band(savings),
            "gap_excludes_zero": {x: {k: n / splits for k, n in v.items()} for x, v in gaps.items()}}


def passes(aa: Mapping[str, Any]) -> bool:
    """The A/A rule: the pooled interval covers zero (a bound at "never" is unbounded on its side) and the point
    estimate lies within TOLERANCE of it (an estimate at "never" fails)."""
    lo = -math.inf if aa["pooled_lo"] is None else aa["pooled_lo"]
    hi = math.inf if aa["pooled_hi"] is None else aa["pooled_hi"]
    return aa["pooled_saving"] is not None and lo <= 0 <= hi and abs(aa["pooled_saving"]) <= TOLERANCE


# the DAPO control's cells beside the reference runs, as the large-set view reads them
LARGE_CELLS = (("equal-batch", "dapo"), ("matched-updates", "grpo"))


def _on_both_sets(store: RunStore, view: LargeSet, regimes: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"warm_starts": list(regimes)}
    for name, cells in (("test", store), ("large", view)):
        out[name] = {"updates": pooled_row(cells, regimes, *DAPO, axis="updates"),
                     "at_updates": paired_budget(cells, regimes, *DAPO, axis="updates"),
                     "se": evaluation_se(cells, regimes, LARGE_CELLS, name == "large"),
                     "targets": {r: cells.target_value(r) for r in regimes}}
    return out


def large_set_rows(store: RunStore, regimes: Sequence[str]) -> dict[str, Any] | None:
    """The DAPO control and its diagnosis on the test split and on the large set, over the same warm starts: every
    warm start whose cells were all evaluated on the large set (the declared reading), then, where it is another
    set, the conditioned ones among them, the warm starts the headline rows pool (read after the first)."""
    from benchmarks.warmstarts import is_conditioned

    view = LargeSet(store, regimes, LARGE_CELLS)
    if not view.complete:
        return None
    out = {**_on_both_sets(store, view, view.complete), "problems": view.problems()}
    cond = [r for r in view.complete if is_conditioned(store, r)]
    out["conditioned"] = _on_both_sets(store, view, cond) if cond and cond != view.complete else None
    return out


REPLICATION = ("null-dapo", DAPO[1], DAPO[2])


class Replicated:
    """``cells`` (the store or a LargeSet view) with the replication's runs added to the DAPO control's cells:
    matched-updates' dapo and grpo hold seeds 0-9."""

    def __init__(self, cells: Any) -> None:
        self.cells = cells

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]:
        runs = self.cells.cell(regime, protocol, label)
        if protocol == DAPO[0] and label in DAPO[1:]:
            runs = runs + self.cells.cell(regime, REPLICATION[0], label)
        return runs

    def target_value(self, regime: str) -> float | None:
        return self.cells.target_value(regime)

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self.cells.preregistration(regime)


def _control(cells: Any, regimes: Sequence[str], protocol: str) -> dict[str, Any]:
    """The DAPO control as declared for its replication: updates to target, the accuracy gap at equal updates, and
    whether each passes (the A/A rule for the first; the interval at the end and for the area covering zero)."""
    updates = pooled_row(cells, regimes, protocol, DAPO[1], DAPO[2], axis="updates")
    gaps = paired_budget(cells, regimes, protocol, DAPO[1], DAPO[2], axis="updates")
    covers = gaps is not None and all(gaps[k]["lo"] is not None and gaps[k]["lo"] <= 0 <= gaps[k]["hi"]
                                      for k in ("1", "auc"))
    return {"updates": updates, "updates_pass": updates is not None and passes(updates), "at_updates": gaps,
            "gap_pass": covers}


def replication(store: RunStore, regimes: Sequence[str]) -> dict[str, Any] | None:
    """The DAPO control's replication over the warm starts of ``regimes`` that ran it: seeds 5-9 alone and seeds
    0-9 pooled, on the test split, and on the large set once every run of those warm starts has a large-set curve
    (until then the runs still to evaluate and the commands)."""
    ran = [r for r in regimes if store.cell(r, *REPLICATION[:2]) and store.cell(r, REPLICATION[0], REPLICATION[2])]
    if not ran:
        return None
    view = LargeSet(store, ran, (*LARGE_CELLS, *((REPLICATION[0], lab) for lab in REPLICATION[1:])))
    out: dict[str, Any] = {"warm_starts": ran, "runs": {lab: sum(len(store.cell(r, REPLICATION[0], lab)) for r in ran)
                                                         for lab in REPLICATION[1:]},
                           "seeds": sorted({run["seed"] for r in ran for lab in REPLICATION[1:]
                                            for run in store.cell(r, REPLICATION[0], lab)}),
                           "large_missing": len(view.missing),
                           "large_commands": resume_command(missing_cells(view.missing))}
    for name, cells in (("test", store), ("large", view)):
        if name == "test" or view.complete == ran:
            out[name] = {"replication": _control(cells, ran, REPLICATION[0]),
                         "pooled": _control(Replicated(cells), ran, DAPO[0])}
    return out


RECURRENCE = ("drawn", "groups", "rows", "tokens", "pass_rate", "trained_before", "distinct")


def _log_stats(log: Path) -> tuple[int, Any]:
    """A decision log's updates (steps that trained rows) and a function of U: per update over its first U updates,
    the prompts drawn, groups, rows and tokens trained (a group's tokens times its trained share of its rollouts),
    a trained group's pass rate and earlier trainings (means over trained groups), and the distinct prompts trained
    in all."""
    import pandas as pd

    d = pd.read_parquet(log, columns=["step", "prompt_id", "trained_rows", "rollouts", "passes", "tokens"]
                        ).sort_values(["step", "prompt_id"], kind="stable")
    steps = np.sort(d.loc[d["trained_rows"] > 0, "step"].unique())

    def upto(u: int) -> dict[str, float]:
        first = d[d["step"] <= steps[u - 1]]
        trained = first[first["trained_rows"] > 0]
        before = trained.groupby("prompt_id").cumcount()
        share = trained["trained_rows"] / trained["rollouts"]
        return {"drawn": len(first) / u, "groups": len(trained) / u, "rows": float(trained["trained_rows"].sum()) / u,
                "tokens": float((trained["tokens"] * share).sum()) / u,
                "pass_rate": float((trained["passes"] / trained["rollouts"]).mean()),
                "trained_before": float(before.mean()), "distinct": float(trained["prompt_id"].nunique())}
    return len(steps), upto


def trained_recurrence(store: RunStore, regimes: Sequence[str]) -> dict | None:
    """DAPO against matched GRPO in what they train over the updates both made, from the decision logs of the warm
    starts whose two cells all have one: each side's mean per run, and DAPO minus GRPO over the seed pairs with a
    95% interval (``stratified_t_interval``, warm starts as strata). None where no warm start has every log."""
    sides = {DAPO[1]: ("equal-batch", DAPO[1]), DAPO[2]: ("matched-updates", DAPO[2])}
    per: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    pairs, strata, used = [], [], []
    for reg in regimes:
        logs = {k: store.decision_logs(reg, *cell) for k, cell in sides.items()}
        if any(v is None for v in logs.values()):
            continue
        stats = {k: {s: _log_stats(p) for s, p in v.items()} for k, v in logs.items()}
        u = min(n for v in stats.values() for n, _ in v.values())
        read = {k: {s: f(u) for s, (_, f) in v.items()} for k, v in stats.items()}
        used.append({"regime": reg, "updates": u})
        for k in sides:
            per[k] += read[k].values()
        for s in sorted(set(read[DAPO[1]]) & set(read[DAPO[2]])):
            pairs.append([read[DAPO[1]][s][m] - read[DAPO[2]][s][m] for m in RECURRENCE])
            strata.append(reg)
    if not pairs:
        return None
    d = np.asarray(pairs)
    ci = [stratified_t_interval(d[:, j], strata) for j in range(len(RECURRENCE))]
    return {"warm_starts": used, "pairs": len(pairs),
            **{k: {m: float(np.mean([x[m] for x in v])) for m in RECURRENCE} for k, v in per.items()},
            "difference": {m: {"mean": float(d[:, j].mean()), "lo": ci[j][0], "hi": ci[j][1]}
                           for j, m in enumerate(RECURRENCE)}}


def measure(out: Path | RunStore, bases: Sequence[str] = COMPARISON_FAMILIES, splits: int = SPLITS) -> list[dict]:
    """Per family: the A/A row, its false positives, and DAPO against matched GRPO in updates and rollouts."""
    store = as_store(out)
    rows = []
    for base in bases:
        regimes = store.family(base)
        aa = pooled_row(store, regimes, *AA)
        rows.append({"family": base, "aa": aa,
                     "aa_passes": None if aa is None else passes(aa),
                     "aa_false_positives": false_positives(store, regimes, splits) if aa is not None else None,
                     "dapo_updates": pooled_row(store, regimes, *DAPO, axis="updates"),
                     "dapo_rollouts": pooled_row(store, regimes, *DAPO),
                     "dapo_at_updates": paired_budget(store, regimes, *DAPO, axis="updates"),
                     "aa_at_updates": paired_budget(store, regimes, *AA, axis="updates",
                                                    seed_offset=PROTOCOLS[AA[0]].first_seed),
                     "dapo_final_updates": _final_updates(store, regimes),
                     "dapo_large_set": large_set_rows(store, regimes),
                     "dapo_replication": replication(store, regimes),
                     "dapo_trained": trained_recurrence(store, regimes)})
    return rows


def _final_updates(store: RunStore, regimes: Sequence[str]) -> dict[str, float | None]:
    """The median updates the DAPO and the matched GRPO runs made by the end of their budget."""
    def med(label: str) -> float | None:
        ups = [r["curve"][-1]["updates"] for reg in regimes for r in store.cell(reg, DAPO[0], label)]
        return float(np.median(ups)) if ups else None
    return {"dapo": med(DAPO[1]), "grpo": med(DAPO[2])}


def _cell(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return "not run yet"
    ci = "" if r["pooled_lo"] is None and r["pooled_hi"] is None else f" [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}]"
    return (f"{pct(r['pooled_saving'])}{ci}, p {p_value(r['p_value_stratified'])}, {r['ours_runs']} vs "
            f"{r['base_runs']} runs, {r['warm_starts']} warm start{'s' * (r['warm_starts'] != 1)}")


def _gap_fp(fp: Mapping[str, Any] | None) -> str:
    if fp is None or "gap_excludes_zero" not in fp:
        return "-"
    g = fp["gap_excludes_zero"]
    return "; ".join(f"{'at equal updates' if x == 'updates' else 'at fixed budget'}: {pct(g[x]['1'])} at the end, "
                     f"{pct(g[x]['auc'])} for the area" for x in GAP_AXES)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    out = ["Savings in fitted rollouts (or updates) to each warm start's own target, pooled over its family's warm "
           "starts as the headline rows are (95% bootstrap interval, one-sided rank test stratified by warm start). "
           f"A/A passes when its interval covers zero and its point estimate is within {pct(TOLERANCE)}; its false "
           f"positives re-split each warm start's ten runs {SPLITS} times (expected: {pct(LEVEL)} with p < "
           f"{LEVEL:g}, 2.5% with the interval above zero), and read the accuracy gaps of the tables below and of "
           "the fixed-budget table on those splits, the two sides paired at random. The A/A band is the central "
           f"{pct(BAND)} of those splits' pooled savings: a headline saving is called one only when its interval "
           "lies above zero and its estimate above the band (README, docs/results.md).", "",
           "| regime | A/A: grpo[aa] vs grpo | passes | A/A band (95% of the splits' pooled savings) "
           "| A/A splits with p < 0.05 | A/A splits with interval above 0 "
           "| A/A splits whose accuracy-gap interval excludes 0 (5% expected) "
           "| dapo vs matched grpo, updates | dapo vs matched grpo, rollouts |", "|---" * 9 + "|"]
    for r in rows:
        fp = r["aa_false_positives"]
        passes = "-" if r["aa_passes"] is None else "yes" if r["aa_passes"] else "**no**"
        out.append(f"| {r['family']} | {_cell(r['aa'])} | {passes} | {band_words((fp or {}).get('band'))} "
                   f"| {'-' if fp is None else pct(fp['p_below_level'])} "
                   f"| {'-' if fp is None else pct(fp['interval_above_zero'])} | {_gap_fp(fp)} "
                   f"| {_cell(r['dapo_updates'])} | {_cell(r['dapo_rollouts'])} |")
    return "\n".join(out + _equal_updates_md(rows) + _large_set_md(rows) + _replication_md(rows)
                     + _recurrence_md(rows)) + "\n"


def _equal_updates_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    names = [f"{f:g}" for f in BUDGET_FRACTIONS]

    out = ["", "The DAPO control's diagnosis: DAPO's held-out accuracy minus matched GRPO's, in points, seed by seed, "
           "at fractions of the fewest updates any run of the warm start's two cells made, and averaged to there "
           "(area under the curve); 95% t interval from the spread within each warm start. Beside it "
           "the median updates each side made by the end of its rollout budget, and the A/A control read the same "
           f"way (grpo[aa] seed {PROTOCOLS[AA[0]].first_seed} + i against reference seed i, over the warm starts "
           "that ran it): the gap the instrument shows at equal updates when allocation is equal.", "",
           "| regime | comparison | pairs (warm starts) | "
           + " | ".join(f"at {float(n):.0%} of the updates" for n in names)
           + " | area under the curve | updates made: dapo, matched grpo |",
           "|---|---|---|" + "---|" * (len(names) + 2)]
    for r in rows:
        fu = r.get("dapo_final_updates") or {}
        made = ", ".join("-" if fu.get(k) is None else f"{fu[k]:.0f}" for k in ("dapo", "grpo"))
        for key, label, end in (("dapo_at_updates", "dapo vs matched grpo", made),
                                ("aa_at_updates", "A/A: grpo[aa] vs grpo", "-")):
            if (d := r.get(key)) is not None:
                out.append(f"| {r['family']} | {label} | {d['pairs']} ({d['warm_starts']}) | "
                           + " | ".join(points_ci(d[n]) for n in names) + f" | {points_ci(d['auc'])} | {end} |")
    return out


def _large_set_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    found = [r for r in rows if r.get("dapo_large_set")]
    if not found:
        return []

    out = ["", f"The DAPO control on the large held-out set ({found[0]['dapo_large_set']['problems']:,} problems: "
           "the test split and more of its cells, weighted as the test split; benchmarks/study/heldout.py), beside the "
           "same runs read on the test split. Each set's target is fixed from the reference runs' curves on that set "
           "by the study's rule. A gap that only the smaller set shows is evaluation noise.", "",
           "| regime | warm starts | held-out set | SE of one evaluation, median (largest), points "
           "| dapo vs matched grpo, updates | accuracy gap at 100% of the updates | area under the curve |",
           "|---|---|---|---|---|---|---|"]
    for r in found:
        d = r["dapo_large_set"]
        for reading, which in ((d, ""), (d.get("conditioned"), ", conditioned only (read after the row above)")):
            if reading is None:
                continue
            for name, label in (("test", "test split (2,000)"), ("large", f"large ({d['problems']:,})")):
                x = reading[name]
                se = "-" if x["se"] is None else f"{100 * x['se']['median']:.2f} ({100 * x['se']['max']:.2f})"
                at = x["at_updates"] or {}
                gaps = " | ".join(points_ci(at[k]) if k in at else "-" for k in ("1", "auc"))
                out.append(f"| {r['family']} | {', '.join(reading['warm_starts'])}{which} | {label} | {se} "
                           f"| {_cell(x['updates'])} | {gaps} |")
    return out


def _replication_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    found = [r for r in rows if r.get("dapo_replication")]
    if not found:
        return []
    seeds = found[0]["dapo_replication"]["seeds"]
    fresh, pooled = f"{seeds[0]}-{seeds[-1]}", f"0-{seeds[-1]}"
    out = ["", f"The DAPO control replicated on fresh seeds (protocol {REPLICATION[0]}: DAPO at B and GRPO at the "
           f"matched-updates batch on seeds {fresh}), declared with its reading before its runs: updates to "
           f"target passes when its interval covers zero and its point estimate is within {pct(TOLERANCE)}; the "
           "accuracy gap at equal updates passes when its intervals at the end and for the area cover zero. Read on "
           f"the new seeds alone and on seeds {pooled} pooled; on the large set once all its runs are evaluated "
           "there.", "",
           "| regime | warm starts | seeds | held-out set | dapo vs matched grpo, updates | passes "
           "| accuracy gap at 100% of the updates | area under the curve | passes |", "|---" * 9 + "|"]
    for r in found:
        d = r["dapo_replication"]
        for name, label in (("test", "test split (2,000)"), ("large", "large (14,000)")):
            if name not in d:
                out.append(f"| {r['family']} | {', '.join(d['warm_starts'])} | {fresh}, {pooled} | {label} | "
                           f"{d['large_missing']} runs to evaluate | - | - | - | - |")
                continue
            for key, seeds in (("replication", fresh), ("pooled", pooled)):
                x = d[name][key]
                at = x["at_updates"] or {}
                gaps = " | ".join(points_ci(at[k]) if k in at else "-" for k in ("1", "auc"))
                out.append(f"| {r['family']} | {', '.join(d['warm_starts'])} | {seeds} | {label} "
                           f"| {_cell(x['updates'])} | {_yes(x['updates_pass'])} | {gaps} | {_yes(x['gap_pass'])} |")
        if d["large_commands"]:
            out += ["", "To evaluate the replication's runs on the large set (resumable):", "", "```bash",
                    *d["large_commands"], "```"]
    return out


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


_DIGITS = {"trained_before": ".2f", "pass_rate": ".3f", "distinct": ".0f", "tokens": ".0f"}


def _trained_cell(t: Mapping[str, Any], m: str) -> str:
    d, f = t["difference"][m], _DIGITS.get(m, ".1f")
    ci = "" if d["lo"] is None else f" [{d['lo']:+{f}}, {d['hi']:+{f}}]"
    return f"{t[DAPO[1]][m]:{f}} vs {t[DAPO[2]][m]:{f}}: {d['mean']:+{f}}{ci}"


def _recurrence_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    found = [r for r in rows if r.get("dapo_trained")]
    if not found:
        return []
    names = {"drawn": "prompts drawn per update", "groups": "groups trained per update",
             "rows": "rows trained per update", "tokens": "tokens trained per update",
             "pass_rate": "a trained group's pass rate",
             "trained_before": "earlier trainings of a trained group's prompt",
             "distinct": "distinct prompts trained"}
    out = ["", "What DAPO and matched GRPO train, from their decision logs, over the first updates both made (the "
           "fewest any run of the warm start made): each side's mean per run, and DAPO minus matched GRPO over the "
           "seed pairs (95% t interval from the spread within each warm start).", "",
           "| regime | warm starts (updates read) | pairs | " + " | ".join(names.values()) + " |",
           "|---|---|---|" + "---|" * len(names)]
    for r in found:
        t = r["dapo_trained"]

        ws = ", ".join(f"{w['regime']} ({w['updates']})" for w in t["warm_starts"])
        out.append(f"| {r['family']} | {ws} | {t['pairs']} | " + " | ".join(_trained_cell(t, m) for m in names) + " |")
    return out


def write(rows: Sequence[Mapping[str, Any]], results: Path) -> None:
    dest = output_dir(results, "null_controls")
    (dest / "null_controls.json").write_text(json.dumps(list(rows), indent=1) + "\n")
    (dest / "null_controls.md").write_text(markdown(rows))


def main(argv: Sequence[str] | None = None) -> int:
    rows = measure(RunStore(RESULTS))
    write(rows, RESULTS)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
