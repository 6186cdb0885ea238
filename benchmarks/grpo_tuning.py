"""The tuned uniform GRPO: what tuning k, lr and passes per batch buys, and whether validation picks the test-best.

    python -m benchmarks.grpo_tuning        # (also run by `python -m benchmarks.study --summarize-only`)

Reads the grpo-tuning protocol's files (docs/training-study.md, "The tuned uniform GRPO"; benchmarks/study/
tuning.py) on each declared warm start (plan.TUNE_WARM_STARTS):

- every configuration's validation figures (the fitted reach of the validation target, median over seeds 100-102)
  and test cell (fitted rollouts to the regime's own target [order-statistic interval], reached runs, final
  accuracy), with the validation choice and the oracle (the test-best configuration, a bound: chosen on the split
  it is read on) marked;
- whether validation picked the test-best configuration, per warm start and in how many;
- what each tuned knob buys over the reference configuration (k = 8, lr 1e-4, one pass: the reference runs), pooled
  per family with warmstarts' rules (the saving, its 95% bootstrap interval, the stratified rank test): the k chosen
  at lr 1e-4, one pass; the lr chosen at k = 8, one pass; the chosen (k, lr) at one pass; the full choice; and the
  oracle. A pick's warm start counts once its test cell has every seed.

A warm start whose choice or cells are not complete yet is reported as far as its files go; nothing is inferred.
Writes benchmarks/results/grpo_tuning/: grpo_tuning.json, grpo_tuning.md and grpo_tuning.png.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common import RESULTS, output_dir, save_figure
from benchmarks.study import tuning as T
from benchmarks.study.formats import interval, p_value, pct
from benchmarks.study.plan import (
    ORACLE,
    TUNE_CONFIGS,
    TUNE_FAMILIES,
    TUNE_LR_DEFAULT,
    TUNE_WARM_STARTS,
    TUNED,
    tune_label,
)
from benchmarks.study.stats import cell_rows, compare, pooled_costs
from benchmarks.study.store import RunStore, as_store

TEST_SEEDS = T.TEST_SEEDS
REFERENCE = "grpo"
# the picks, each a configuration per warm start (or none yet), in the order the knobs are added
PICKS = ("grpo[tuned k]", "grpo[tuned lr]", "grpo[tuned k, lr]", TUNED, ORACLE)
PICK_WORDS = {"grpo[tuned k]": "k chosen on validation, lr 1e-4, one pass",
              "grpo[tuned lr]": "lr chosen on validation, k = 8, one pass",
              "grpo[tuned k, lr]": "(k, lr) chosen on validation, one pass",
              TUNED: "the full validation choice (k, lr, passes): the best uniform GRPO",
              ORACLE: "the test-best configuration: an oracle bound, not a baseline"}


def _best(cands: Mapping[str, Mapping[str, Any]], keep: Any) -> str | None:
    kept = [c for c in cands.values() if keep(c)]
    return min(kept, key=T.rank_key)["label"] if kept else None


def picks(store: RunStore, regime: str) -> dict[str, str | None]:
    """Each pick's configuration label on one warm start (None: not made yet). The oracle is the test-best of the
    configurations with every test seed, once every one-pass configuration has them (tuning.oracle_config)."""
    kl, ch = T.read_frozen(store, regime, "choice-k-lr.json"), T.read_frozen(store, regime, "choice.json")
    cands = kl["candidates"] if kl else {}
    oracle = T.oracle_config(store, regime, TEST_SEEDS)
    return {"grpo[tuned k]": _best(cands, lambda c: c["lr"] == TUNE_LR_DEFAULT),
            "grpo[tuned lr]": _best(cands, lambda c: c["k"] == 8),
            "grpo[tuned k, lr]": kl["best"] if kl else None, TUNED: ch["best"] if ch else None,
            ORACLE: tune_label(*oracle) if oracle else None}


def warm_start(store: RunStore, regime: str) -> dict[str, Any] | None:
    """One warm start's grid: each configuration's validation and test figures, the choices and the oracle (None:
    no validation run of the protocol's own there yet)."""
    vt, t = T.validation_target(store, regime), store.target(regime)
    if t is None or not (store.root / regime / T.PROTOCOL).is_dir():
        return None
    cells = {}
    for c in TUNE_CONFIGS:
        val, test = T.validation_runs(store, regime, c), T.test_runs(store, regime, c, TEST_SEEDS)
        if not val and not test:
            continue
        rec = {**T.config_record(c), "validation": T.score(val, vt["target"]) if val and vt else None,
               "test": None, "test_score": None}
        if test:
            rows = cell_rows(test, t["target"], start=t.get("start"), gain=t.get("gain"),
                             budget=t.get("budget_rollouts"))
            rec["test"] = {key: rows[key] for key in ("seeds", "reached_fit", "fit_rollouts_to_target",
                                                      "final_accuracy")}
            rec["test_score"] = T.score(test, t["target"])
        cells[rec["label"]] = rec
    chosen = picks(store, regime)
    return {"regime": regime, "validation_target": vt["target"] if vt else None, "target": t["target"],
            "cells": list(cells.values()), "picks": chosen,
            "validation_picked_test_best": None if not (chosen[TUNED] and chosen[ORACLE])
            else chosen[TUNED] == chosen[ORACLE]}


class Picks:
    """A view of a RunStore for benchmarks.study.stats.compare: ``grpo`` is the reference runs, a pick of PICKS the
    test cell of the configuration it names on that warm start (complete cells only)."""

    def __init__(self, store: RunStore, grids: Mapping[str, Mapping[str, Any]]) -> None:
        self.store, self.grids = store, grids

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]:
        if label == REFERENCE:
            return self.store.cell(regime, "reference", REFERENCE)
        lab = self.grids[regime]["picks"].get(label) if regime in self.grids else None
        if lab is None:
            return []
        runs = T.test_runs(self.store, regime, T.config_of(lab), TEST_SEEDS)
        return runs if len(runs) == len(TEST_SEEDS) else []

    def target_value(self, regime: str) -> float | None:
        return self.store.target_value(regime)

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self.store.preregistration(regime)


def knob_rows(store: RunStore, grids: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each pick against the reference runs, pooled per family over the warm starts where its cell is complete."""
    view, rows = Picks(store, grids), []
    for fam in TUNE_FAMILIES:
        regimes = [r for r in TUNE_WARM_STARTS if r.split("-ws")[0] == fam and r in grids]
        for pick in PICKS:
            row = compare(view, regimes, T.PROTOCOL, pick, REFERENCE)
            if row is None:
                continue
            ci = pooled_costs(view, regimes, T.PROTOCOL, pick, REFERENCE, ("cum_rollouts",))["cum_rollouts"]
            rows.append({"family": fam, "pick": pick, "words": PICK_WORDS[pick], **row,
                         "pooled_lo": ci["lo"], "pooled_hi": ci["hi"],
                         "configurations": {p["regime"]: grids[p["regime"]]["picks"][pick]
                                            for p in row["per_warm_start"]}})
    return rows


def measure(out: Path | RunStore) -> dict[str, Any]:
    store = as_store(out)
    grids = {r: g for r in TUNE_WARM_STARTS if (g := warm_start(store, r)) is not None}
    agree = [g["validation_picked_test_best"] for g in grids.values() if g["validation_picked_test_best"] is not None]
    return {"warm_starts": list(grids.values()), "knobs": knob_rows(store, grids),
            "validation_picked_test_best": {"yes": sum(agree), "of": len(agree)},
            "declared_warm_starts": list(TUNE_WARM_STARTS)}


def _num(v: float | None, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def grid_table(grids: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["| warm start | configuration | k | lr | passes | validation runs | validation: median fitted rollouts to "
           "its target | test runs | test: reached | test: fitted rollouts to target [interval] | test: final acc | "
           "picked |", "|---" * 12 + "|"]
    for g in grids:
        for c in g["cells"]:
            v, t = c["validation"], c["test"]
            marks = [p for p in (TUNED, ORACLE) if g["picks"][p] == c["label"]]
            reached = f"{t['reached_fit']}/{t['seeds']}" if t else "-"
            out.append(f"| {g['regime']} | {c['label']} | {c['k']} | {c['lr']:g} | {c['epochs']} | "
                       f"{v['runs'] if v else 0} | {_num(v['median_fit_rollouts_to_target']) if v else '-'} | "
                       f"{t['seeds'] if t else 0} | {reached} | "
                       f"{interval(t['fit_rollouts_to_target']) if t else '-'} | "
                       f"{_num(t['final_accuracy'], '.3f') if t else '-'} | "
                       f"{', '.join(m.removeprefix('grpo[').rstrip(']') for m in marks)} |")
    return out


def knob_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = ["| family | pick | what it is | warm starts (configuration) | fewer rollouts than k = 8, lr 1e-4, one pass "
           "[95% CI] | p (stratified rank test) | holds in |", "|---" * 7 + "|"]
    for r in rows:
        where = ", ".join(f"{ws} ({lab})" for ws, lab in r["configurations"].items())
        ci = "" if r["pooled_saving"] is None else f" [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}]"
        out.append(f"| {r['family']} | {r['pick']} | {r['words']} | {where} | {pct(r['pooled_saving'])}{ci} | "
                   f"{p_value(r['p_value_stratified'], r.get('p_value_stratified_se'))} | "
                   f"{r['holds_in']}/{r['warm_starts']} |")
    return out


def progress(grids: Sequence[Mapping[str, Any]]) -> list[str]:
    """What each declared warm start has so far, and the command that resumes it."""
    have = {g["regime"]: g for g in grids}
    out = ["| warm start | validation runs | (k, lr) chosen | final choice | test cells complete | resume with |",
           "|---" * 6 + "|"]
    for ws in TUNE_WARM_STARTS:
        g = have.get(ws)
        fam, j = ws.split("-ws")
        val = sum(c["validation"]["runs"] for c in g["cells"] if c["validation"]) if g else 0
        done = sum(1 for c in g["cells"] if c["test"] and c["test"]["seeds"] == len(TEST_SEEDS)) if g else 0
        out.append(f"| {ws} | {val} | {(g or {}).get('picks', {}).get('grpo[tuned k, lr]') or '-'} | "
                   f"{(g or {}).get('picks', {}).get(TUNED) or '-'} | {done} | `python -m benchmarks.study "
                   f"--regime {fam} --warm-start {j} --protocol grpo-tuning --seeds 5` |")
    return out


def write(res: Mapping[str, Any], results: Path) -> None:
    """grpo_tuning.json, grpo_tuning.md and grpo_tuning.png in ``results``/grpo_tuning/."""
    dest = output_dir(results, "grpo_tuning")
    (dest / "grpo_tuning.json").write_text(json.dumps(res, indent=1) + "\n")
    agree = res["validation_picked_test_best"]
    body = ["# The tuned uniform GRPO", "", "Written by `python -m benchmarks.grpo_tuning` from the grpo-tuning "
            "protocol's runs (docs/training-study.md, \"The tuned uniform GRPO\", declared before them).", "",
            "Validation: the fitted reach of each warm start's validation target (the target rule on the validation "
            "runs of k = 8, lr 1e-4, one pass), median over seeds 100-102. Test: fitted rollouts to the warm start's "
            "own target, seeds 0-4. A saving pools the warm starts whose pick has every test seed (warmstarts' "
            "rules: a baseline's miss counts at its whole budget, ours as never; 95% bootstrap interval within warm "
            "starts; p: one-sided rank test stratified by warm start).", "",
            "## Progress", "", *progress(res["warm_starts"]), "",
            "## Every configuration, per warm start", "", *grid_table(res["warm_starts"]), "",
            f"Validation picked the test-best configuration in {agree['yes']} of {agree['of']} warm starts with both.",
            "", "## What each tuned knob buys over k = 8, lr 1e-4, one pass", "", *knob_table(res["knobs"])]
    (dest / "grpo_tuning.md").write_text("\n".join(body) + "\n")
    plot(dest / "grpo_tuning.png", res["warm_starts"])


def plot(path: Path, grids: Sequence[Mapping[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 7), sharex=True)
    for ax, ws in zip(axes.ravel(), TUNE_WARM_STARTS):
        g = next((g for g in grids if g["regime"] == ws), None)
        ax.set_title(ws, fontsize=9)
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        if g is None:
            continue
        for k in sorted({c["k"] for c in g["cells"]}):
            one = sorted((c for c in g["cells"] if c["k"] == k and c["epochs"] == 1), key=lambda c: c["lr"])
            val = [(c["lr"], c["validation"]["median_fit_rollouts_to_target"]) for c in one if c["validation"]]
            test = [(c["lr"], c["test"]["fit_rollouts_to_target"].get("median")) for c in one if c["test"]]
            for pts, style, what in ((val, "-o", "validation"), (test, "--s", "test")):
                pts = [(x, y) for x, y in pts if y is not None and math.isfinite(y)]
                if pts:
                    ax.plot(*zip(*pts), style, label=f"k = {k}, {what}", markersize=4)
        ax.legend(fontsize=6)
    for ax in axes[1]:
        ax.set_xlabel("lr (one pass per batch)")
    for ax in axes[:, 0]:
        ax.set_ylabel("median fitted rollouts to target")
    fig.suptitle("uniform GRPO over k x lr: validation (solid) and test (dashed) reach, per warm start")
    save_figure(fig, path, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    res = measure(RunStore(RESULTS))
    write(res, RESULTS)
    print((RESULTS / "grpo_tuning" / "grpo_tuning.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
