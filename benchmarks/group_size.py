"""Uniform GRPO at its best group size: is an allocator's saving more than a better k?

    python -m benchmarks.group_size          # (also run by `python -m benchmarks.study --summarize-only`)

Reads the group-size protocol's cells (docs/training-study.md, "The group-size grid"): uniform GRPO at every k of
plan.K_GRID with B x k = 256 rollouts per update, its k = 8 cell the reference runs. Per warm start:

- each k's test cell: fitted rollouts to the warm start's own target [order-statistic interval], reached runs,
  final accuracy; and the k chosen on the validation split (``group-size/choice.json``) beside the k whose test
  cell is best, so a reader sees whether the choice carried over;
- the pass-rate population the k met: the share of zero-variance groups of the reference runs at k = 8 (their
  pre-registration) and the start accuracy.

Then each comparison of ``plan.BEST_K_COMPARISONS`` twice, with warmstarts' pooled saving, interval and stratified
rank test, over the same warm starts (those with a chosen k whose target is conditioned, as the headline rows'; the
others are named; and where the reference runs, the chosen k and every baseline of the README row shown beside it,
the tuned uniform GRPO's included, ran: ``set_baselines``, so that these read the README row's warm starts):
against uniform GRPO at k = 8 (the reference runs) and against ``plan.BEST_K``, the test cell of each warm start's
chosen k. Rows with a protocol other than group-size keep their own cell of ours and replace only the baseline.

Writes benchmarks/results/group_size/: group_size.json, group_size.md (every table), group_size_headline.md
(docs/training-study.md's AR3PO decomposition) and group_size.png (fitted reach against k, per warm start).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common import RESULTS, output_dir, save_figure
from benchmarks.study.formats import interval, p_value, pct
from benchmarks.study.plan import (
    BEST_K,
    BEST_K_COMPARISONS,
    COMPARISON_FAMILIES,
    COMPARISONS,
    REFERENCE,
    TUNED,
    VARIANTS,
    Comparison,
    budget_of,
    labels,
    row_baselines,
)
from benchmarks.study.stats import cell_rows, compare, conditioning, pooled_costs
from benchmarks.study.store import RunStore, as_store
from benchmarks.warmstarts import is_conditioned, row_warm_starts

GRID = "group-size"


class BestK:
    """A view of a RunStore for one protocol's comparisons: ``BEST_K`` is the group-size cell of the k chosen on
    the validation split (empty before the choice), ``grpo`` the reference runs, any other label its cell under
    ``protocol``."""

    def __init__(self, store: RunStore, protocol: str) -> None:
        self.store, self.protocol = store, protocol

    def chosen(self, regime: str) -> str | None:
        return self.store.choice(regime, GRID).get("best")

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]:
        if label == BEST_K:
            best = self.chosen(regime)
            return self.store.cell(regime, GRID, best) if best else []
        return self.store.cell(regime, GRID if label == "grpo" else self.protocol, label)

    def target_value(self, regime: str) -> float | None:
        return self.store.target_value(regime)

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self.store.preregistration(regime)


def grid_rows(store: RunStore, regime: str) -> dict[str, Any] | None:
    """One warm start's grid: each k's test cell, the validation choice and the population (None: no group-size
    run there)."""
    target = store.target(regime)
    choice = store.choice(regime, GRID)
    cells = {lab: store.cell(regime, GRID, lab) for lab in labels(GRID, regime)}
    if target is None or not any(store.validation_runs(regime, GRID, lab) for lab in cells) or \
            not any(cells[lab] for lab in cells if lab != "grpo"):
        return None
    budget = budget_of(regime) or target.get("budget_rollouts")
    ks = []
    for lab, runs in cells.items():
        if runs:
            rec = cell_rows(runs, target["target"], start=target.get("start"), gain=target.get("gain"), budget=budget)
            ks.append({"label": lab, "k": VARIANTS[lab].train.get("k", 8), "seeds": rec["seeds"],
                       "reached_fit": rec["reached_fit"], "fit_rollouts_to_target": rec["fit_rollouts_to_target"],
                       "final_accuracy": rec["final_accuracy"], "start_accuracy": rec["start_accuracy"]})
    ks.sort(key=lambda r: r["k"])

    def key(r: Mapping[str, Any]) -> float:
        m = r["fit_rollouts_to_target"].get("median")
        return math.inf if m is None else m

    pre = store.preregistration(regime) or {}
    cond = pre.get("conditioning") or conditioning(store.cell(regime, "reference", "grpo"), target["target"])
    return {"regime": regime, "target": target["target"], "cells": ks, "chosen": choice.get("best"),
            "chosen_k": choice.get("k"), "validation": choice.get("candidates", {}),
            "best_on_test": min(ks, key=key)["label"] if ks else None,
            "zero_variance_share_k8": pre.get("zero_variance_share"), "conditioning": cond,
            "start_accuracy": ks[0]["start_accuracy"] if ks else None}


def set_baselines(c: Comparison) -> tuple[str, ...]:
    """The baselines whose runs a BEST_K_COMPARISONS row's warm starts need: the reference runs and the best k, and
    every baseline of the README row shown beside it (plan.row_baselines), so that both savings of that row pool
    one set of warm starts."""
    shown = [h for h in COMPARISONS if (h.protocol, h.ours) == (c.protocol, c.ours) and TUNED in row_baselines(h)]
    return tuple(dict.fromkeys((*(b for h in shown for b in row_baselines(h)), REFERENCE, BEST_K)))


def measure(out: Path | RunStore, bases: Sequence[str] = COMPARISON_FAMILIES) -> dict[str, Any]:
    """Every warm start's grid, and each BEST_K_COMPARISONS row per family against k = 8 and against the best k."""
    store = as_store(out)
    grids, rows = [], []
    for base in bases:
        regimes = store.family(base)
        grids += [g for r in regimes if (g := grid_rows(store, r)) is not None]
        chosen = [r for r in regimes if BestK(store, GRID).chosen(r)]  # both sides read the same warm starts
        regimes = [r for r in chosen if is_conditioned(store, r)]  # as the headline rows: conditioned ones only
        gone = [r for r in chosen if r not in regimes]
        for c in BEST_K_COMPARISONS:
            view = BestK(store, c.protocol)
            kept = row_warm_starts(store, regimes, c.protocol, c.ours, set_baselines(c))
            pair = {}
            for baseline in ("grpo", BEST_K):
                row = compare(view, kept, c.protocol, c.ours, baseline)
                if row is not None:
                    ci = pooled_costs(view, kept, c.protocol, c.ours, baseline, ("cum_rollouts",))["cum_rollouts"]
                    pair[baseline] = {**row, "pooled_lo": ci["lo"], "pooled_hi": ci["hi"]}
            if BEST_K in pair:
                rows.append({"family": base, "protocol": c.protocol, "ours": c.ours, "front": c.front,
                             "vs_k8": pair.get("grpo"), "vs_best": pair[BEST_K], "left_out_unconditioned": gone})
    return {"grids": grids, "comparisons": rows}


def saving(r: Mapping[str, Any] | None) -> str:
    """A pooled saving [95% CI] (p, holds in) of one side of a row."""
    if r is None:
        return "-"
    ci = "" if r["pooled_saving"] is None else f" [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}]"
    return (f"{pct(r['pooled_saving'])}{ci} (p {p_value(r['p_value_stratified'])}, {r['holds_in']}/"
            f"{r['warm_starts']})")


def conditioned(c: Mapping[str, Any]) -> str:
    """``yes (0.21, 4.3, 12)`` or ``**no** (0.05, 1.8, 14)``: the warm start's conditioning figures."""
    word = "yes" if c["conditioned"] else "**no**"
    return (f"{word} ({c['slope_points_per_1k']:.2f}, {c['headroom_points']:.1f}, "
            f"{c['evals_before_target']:.0f})")


def grid_table(grids: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["| warm start | conditioned (slope, headroom, evaluations before) | zero-variance share at k = 8 | "
           "start acc | k | runs | reached | fitted rollouts to target [interval] | final acc | chosen on validation | "
           "best on test |", "|---" * 11 + "|"]
    for g in grids:
        zv = "-" if g["zero_variance_share_k8"] is None else f"{g['zero_variance_share_k8']:.2f}"
        cond = conditioned(g["conditioning"])
        for c in g["cells"]:
            out.append(f"| {g['regime']} | {cond} | {zv} | {g['start_accuracy']:.3f} | {c['k']} | {c['seeds']} | "
                       f"{c['reached_fit']}/{c['seeds']} | {interval(c['fit_rollouts_to_target'])} | "
                       f"{c['final_accuracy']:.3f} | {'yes' if c['label'] == g['chosen'] else ''} | "
                       f"{'yes' if c['label'] == g['best_on_test'] else ''} |")
    return out


def comparison_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["| regime | allocator | protocol | warm starts | vs uniform GRPO at k = 8 (the reference runs): fewer "
           "rollouts [95% CI] (p, holds in) | vs the best uniform k: fewer rollouts [95% CI] (p, holds in) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        gone = r.get("left_out_unconditioned") or []
        note = "" if not gone else f" ({', '.join(gone)} left out: not conditioned)"
        out.append(f"| {r['family']} | {r['ours']} | {r['protocol']} | "
                   f"{', '.join(p['regime'] for p in r['vs_best']['per_warm_start'])}{note} | {saving(r['vs_k8'])} | "
                   f"{saving(r['vs_best'])} |")
    return out


def write(res: Mapping[str, Any], results: Path) -> None:
    """group_size.json, group_size.md, group_size_headline.md and group_size.png in ``results``/group_size/."""
    dest = output_dir(results, "group_size")
    (dest / "group_size.json").write_text(json.dumps(res, indent=1) + "\n")
    legend = ["Fitted rollouts to each warm start's own target; a saving pools the warm starts that ran both cells "
              "(benchmarks/warmstarts.py's rules: a baseline's miss counts at its whole budget, ours as never; "
              "95% bootstrap interval within warm starts; p: one-sided rank test stratified by warm start). The best "
              "k is chosen per warm start on the validation split (docs/training-study.md, \"The group-size "
              "grid\")."]
    body = ["# Uniform GRPO at its best group size", "", "Written by `python -m benchmarks.group_size`.", "",
            *legend, "", "## The grid, per warm start", "", *grid_table(res["grids"]), "",
            "## Against k = 8 and against the best k", "", *comparison_table(res["comparisons"])]
    (dest / "group_size.md").write_text("\n".join(body) + "\n")
    (dest / "group_size_headline.md").write_text("\n".join([*legend, "", *comparison_table(res["comparisons"])])
                                                 + "\n" if res["comparisons"] else "")
    plot(dest / "group_size.png", res["grids"])


def plot(path: Path, grids: Sequence[Mapping[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, g in enumerate(grids):
        ks = [c["k"] for c in g["cells"]]
        med = [c["fit_rollouts_to_target"].get("median") or math.nan for c in g["cells"]]
        lo = [c["fit_rollouts_to_target"].get("lo") or math.nan for c in g["cells"]]
        hi = [c["fit_rollouts_to_target"].get("hi") or math.nan for c in g["cells"]]
        ax.errorbar([k * (1 + 0.03 * i) for k in ks], med, yerr=[[m - a for m, a in zip(med, lo)],
                                                               [b - m for m, b in zip(med, hi)]],
                    marker="o", capsize=3, label=f"{g['regime']} (chosen: {g['chosen_k'] or '-'})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("group size k (B = 256 / k)")
    ax.set_ylabel("fitted rollouts to target (median, interval)")
    ax.grid(alpha=0.3)
    if grids:
        ax.legend(fontsize=7)
    fig.suptitle("uniform GRPO: rollouts to target against group size, per warm start")
    save_figure(fig, path, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    res = measure(RunStore(RESULTS))
    write(res, RESULTS)
    print((RESULTS / "group_size" / "group_size.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
