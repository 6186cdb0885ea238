"""The README's rows against uniform GRPO read again on the large held-out set (benchmarks/study/heldout.py).

    python -m benchmarks.large_set      # (also run by `python -m benchmarks.study --summarize-only`)

The test split's 2,000 problems give one evaluation a standard error of about a point; the large set's 14,000
about a third of one (the measurement issue, 36). Runs gain a large-set curve by being trained again
(``python -m benchmarks.study --regime R --warm-start J --heldout-large --cells P/V ...``, about 3 minutes a run),
so the headline cells move onto it a few at a time. The rule, declared before any headline cell's large-set curve
was read (2026-12-06):

- the rows: the README's comparisons against uniform GRPO (``ROWS``: plan.COMPARISONS marked ``front`` or
  ``value`` whose baseline is ``grpo``), each over its family's conditioned warm starts that ran both cells, as the
  headline rows pool them;
- a row is read once every run of its two cells and every reference run of those warm starts (the runs that fix
  each warm start's target) has a large-set curve; until then it says how many runs are still to evaluate and the
  command that evaluates them, and nothing else, so no row is read on part of its warm starts;
- a warm start with one of those runs that was tried and not reproduced (the rerun differed from the run, or could
  not start from the run's policy) can never complete: it is left out of the row and named;
- a read row gives the headline's statistics (pooled saving in fitted rollouts to each warm start's own target with
  its bootstrap interval, the one-sided rank test stratified by warm start, the warm starts it holds in) on the test
  split and on the large set side by side, over the same runs. Each set's target comes from the reference runs'
  curves on that set by the study's rule (``LargeSet``). The p values are not adjusted: Holm's family is the headline
  table's, on the test split.

A saving that the test split shows and the large set does not was evaluation noise.

Writes benchmarks/results/large_set/large_set.json, large_set.md (docs/results.md pastes it) and, once a row is
read, large_set.png (each read row's saving on both sets).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.common import RESULTS, output_dir, save_figure
from benchmarks.study import backfill as B
from benchmarks.study.formats import p_value, pct
from benchmarks.study.plan import COMPARISON_FAMILIES, COMPARISONS, Comparison
from benchmarks.study.stats import compare, pooled_costs
from benchmarks.study.store import RunStore, as_store
from benchmarks.warmstarts import is_conditioned
from rlvr_core.stats import TARGET_FRACTION, accuracy_se, gain_target

ROWS: tuple[Comparison, ...] = tuple(c for c in COMPARISONS if c.baseline == "grpo" and (c.front or c.value))
RECORD = "heldout_large.json"  # study/<regime>/: each rerun's outcome (benchmarks/study/heldout.py writes it)


class LargeSet:
    """The runs read on the large held-out set: a run's curve is its ``heldout_large`` curve, and a warm start's
    target comes from its reference runs' curves there by the study's rule (``gain_target``, the seeds its frozen
    target lists). ``cells`` are the (protocol, variant) cells read beside the reference runs; ``complete`` lists
    the warm starts of ``regimes`` where they and the reference runs all have a large-set curve (the view holds
    those only), ``missing`` the runs of ``regimes`` still without one."""

    def __init__(self, store: RunStore, regimes: Sequence[str], cells: Sequence[tuple[str, str]]) -> None:
        self.store, self.cells = store, tuple(cells)
        self.missing: list[dict[str, Any]] = []
        self.complete = []
        for r in regimes:
            groups = (self._refs(r), *(store.cell(r, *c) for c in self.cells))
            # a baseline cell may be the reference runs themselves: each run once (the store holds each run once)
            lacking = list({id(run): run for runs in groups for run in runs if "heldout_large" not in run}.values())
            self.missing += lacking
            if all(groups) and not lacking:
                self.complete.append(r)

    def _refs(self, regime: str) -> list[dict[str, Any]]:
        seeds = set((self.store.target(regime) or {}).get("reference_seeds", []))
        return [r for r in self.store.cell(regime, "reference", "grpo") if r["seed"] in seeds]  # held in memory

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]:
        if regime not in self.complete:
            return []
        return [{**r, "curve": r["heldout_large"]["curve"]} for r in self.store.cell(regime, protocol, label)]

    def target_value(self, regime: str) -> float | None:
        if regime not in self.complete:
            return None
        return gain_target([r["heldout_large"]["curve"] for r in self._refs(regime)], TARGET_FRACTION)["target"]

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self.store.preregistration(regime)

    def problems(self) -> int | None:
        """The large set's size, as the first complete warm start's runs recorded it."""
        for r in self.complete:
            return int(self.store.cell(r, *self.cells[0])[0]["heldout_large"]["problems"])
        return None


def evaluation_se(cells: Any, regimes: Sequence[str], read: Sequence[tuple[str, str]], large: bool
                  ) -> dict[str, float] | None:
    """The median and largest standard error of one evaluation of the runs of ``read`` (the test split's from its
    accuracy and size; the large set's as recorded)."""
    ses = [e["se"] if large else accuracy_se(e["greedy_acc"], int(r["eval_size"]))
           for reg in regimes for c in read for r in cells.cell(reg, *c) for e in r["curve"]]
    return {"median": float(np.median(ses)), "max": float(max(ses))} if ses else None


def pooled_row(cells: Any, regimes: Sequence[str], protocol: str, ours: str, base: str, axis: str = "cum_rollouts",
               boot: int = 2000) -> dict[str, Any] | None:
    """The headline's reading of ours against base over ``regimes`` (``stats.compare``) with its pooled saving's
    bootstrap interval (``pooled_lo``, ``pooled_hi``); None where no warm start ran both cells."""
    row = compare(cells, regimes, protocol, ours, base, axis=axis)
    if row is None:
        return None
    ci = pooled_costs(cells, regimes, protocol, ours, base, (axis,), boot=boot)[axis]
    return {**row, "pooled_lo": ci["lo"], "pooled_hi": ci["hi"]}


def _reading(cells: Any, regimes: Sequence[str], c: Comparison, large: bool) -> dict[str, Any] | None:
    row = pooled_row(cells, regimes, c.protocol, c.ours, c.baseline)
    if row is None:
        return None
    return {**row, "se": evaluation_se(cells, regimes, ((c.protocol, c.ours), (c.protocol, c.baseline)), large),
            "targets": {r: cells.target_value(r) for r in regimes}}


def missing_cells(missing: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The [warm start, protocol/variant] cells of the runs still without a large-set curve, each once, in order."""
    return [list(k) for k in dict.fromkeys((run["regime"], f"{run['protocol']}/{run['variant']}") for run in missing)]


def resume_command(cells: Sequence[Sequence[str]]) -> list[str]:
    """One ``--heldout-large`` command per warm start of ``cells`` ([warm start, protocol/variant] pairs)."""
    by_regime: dict[str, list[str]] = {}
    for regime, cell in cells:
        if cell not in by_regime.setdefault(regime, []):
            by_regime[regime].append(cell)
    out = []
    for regime, names in by_regime.items():
        base, _, ws = regime.partition("-ws")
        out.append(f"python -m benchmarks.study --regime {base}{f' --warm-start {ws}' if ws else ''} --heldout-large "
                   "--cells " + " ".join(f"'{c}'" for c in names))
    return out


def _unreproduced(store: RunStore, regime: str) -> set[str]:
    """The run files of ``regime`` (relative to the store's root) whose rerun was tried and did not reproduce."""
    runs = B.record(store, regime, RECORD).get("runs", {})
    return {rel for rel, e in runs.items() if e.get("result") != "reproduced"}


def _left_out(store: RunStore, regimes: Sequence[str], view: LargeSet) -> list[str]:
    """The warm starts of ``regimes`` with a run ``view`` lacks whose rerun did not reproduce: it never will."""
    failed = {r: _unreproduced(store, r) for r in regimes}
    return [r for r in regimes if any(
        run["regime"] == r and store.run_file(r, run["protocol"], run["variant"], run["seed"]).relative_to(
            store.root).as_posix() in failed[r] for run in view.missing)]


def measure(out: Path | RunStore, bases: Sequence[str] = COMPARISON_FAMILIES) -> list[dict[str, Any]]:
    """Each ROWS comparison over each family's conditioned warm starts that ran both cells, less those with a run
    that could not be trained again: read on both sets where every run is evaluated on the large one, else what is
    missing."""
    store = as_store(out)
    rows = []
    for base in bases:
        for c in ROWS:
            regimes = [r for r in store.family(base) if store.cell(r, c.protocol, c.ours)
                       and store.cell(r, c.protocol, c.baseline) and is_conditioned(store, r)]
            if not regimes:
                continue
            cells = ((c.protocol, c.ours), (c.protocol, c.baseline))
            gone = _left_out(store, regimes, LargeSet(store, regimes, cells))
            regimes = [r for r in regimes if r not in gone]
            view = LargeSet(store, regimes, cells)
            row: dict[str, Any] = {"family": base, "protocol": c.protocol, "ours": c.ours, "baseline": c.baseline,
                                   "warm_starts": regimes, "left_out_unreproduced": gone,
                                   "missing": len(view.missing), "missing_cells": missing_cells(view.missing),
                                   "problems": view.problems()}
            if regimes and not view.missing:
                row.update(test=_reading(store, regimes, c, False), large=_reading(view, regimes, c, True))
            rows.append(row)
    return rows


def _read(x: Mapping[str, Any]) -> str:
    lo, hi = x["pooled_lo"], x["pooled_hi"]
    ci = "" if lo is None and hi is None else f" [{pct(lo)}, {pct(hi)}]"
    per = ", ".join(p_value(p["p_value"]) for p in x["per_warm_start"])
    return (f"{pct(x['pooled_saving'])}{ci}, p {p_value(x['p_value_stratified'])}; holds in {x['holds_in']} of "
            f"{x['warm_starts']} (p {per})")


def markdown(rows: Sequence[Mapping[str, Any]], figure: bool = False) -> str:
    size = next((r["problems"] for r in rows if r.get("problems")), None)
    out = ["The rows against uniform GRPO read on the large held-out set"
           f"{f' ({size:,} problems)' if size else ''} beside the test split, over the same runs and conditioned warm "
           "starts (benchmarks/large_set.py: the rule, declared before any row was read). Each set's target comes "
           "from the reference runs' curves on that set. Fewer rollouts to target [95% CI], the one-sided rank test "
           "stratified by warm start (not adjusted), the warm starts the saving holds in with each one's p. A row "
           "whose runs are not all evaluated on the large set yet says how many are left.", "",
           "| regime | allocator | protocol | warm starts | SE of one evaluation, test split / large, points "
           "| test split (2,000) | large set |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ws = ", ".join(r["warm_starts"]) or "none"
        if r["left_out_unreproduced"]:
            ws += f" (left out, a run not reproduced: {', '.join(r['left_out_unreproduced'])})"
        if r.get("large") is None:
            n = r["missing"]
            out.append(f"| {r['family']} | {r['ours']} | {r['protocol']} | {ws} | - | {n} run{'s' * (n != 1)} to "
                       "evaluate | - |")
            continue
        se = " / ".join(f"{100 * r[k]['se']['median']:.2f}" for k in ("test", "large"))
        out.append(f"| {r['family']} | {r['ours']} | {r['protocol']} | {ws} | {se} | {_read(r['test'])} "
                   f"| **{_read(r['large'])}** |")
    if figure:
        out += ["", "![the rows read on both sets](benchmarks/results/large_set/large_set.png)"]
    todo = resume_command([c for r in rows for c in r["missing_cells"]])
    if todo:
        out += ["", "To evaluate the runs left, one command per warm start, about 3 minutes a run. A command may be "
                "stopped anywhere and run again: it goes on from the runs not yet tried (`--limit N` bounds one "
                "command).", "",
                "```bash", *todo, "```"]
    return "\n".join(out) + "\n"


def plot(path: Path, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Each read row's saving and interval on both sets, one line per row; False (nothing drawn) when none is
    read. An interval end at "never" is drawn to the axis' edge."""
    read = [r for r in rows if r.get("large")]
    if not read:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.55 * len(read)))
    for j, (name, colour, dy) in enumerate((("test", "0.55", -0.14), ("large", "tab:blue", 0.14))):
        for i, r in enumerate(read):
            x = r[name]
            mid = 100 * (x["pooled_saving"] if x["pooled_saving"] is not None else np.nan)
            lo, hi = (100 * v if v is not None else (-100 if k == "lo" else 100)
                      for k, v in (("lo", x["pooled_lo"]), ("hi", x["pooled_hi"])))
            ax.errorbar(mid, i + dy, xerr=[[mid - lo], [hi - mid]], fmt="o", color=colour, capsize=3,
                        label=(("test split (2,000)", "large set")[j] if i == 0 else None))
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(read)), [f"{r['family']}: {r['ours']} ({r['protocol']})" for r in read], fontsize=8)
    ax.set_ylim(len(read) - 0.5, -0.5)  # the first row on top
    ax.set_xlabel("fewer rollouts to target than uniform GRPO, % (pooled; 95% interval)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("the README's rows on the test split and on the large held-out set")
    save_figure(fig, path, dpi=100)
    return True


def write(rows: Sequence[Mapping[str, Any]], results: Path) -> None:
    folder = output_dir(results, "large_set")
    (folder / "large_set.json").write_text(json.dumps(list(rows), indent=1) + "\n")
    drawn = plot(folder / "large_set.png", rows)
    (folder / "large_set.md").write_text(markdown(rows, figure=drawn))


def main(argv: Sequence[str] | None = None) -> int:
    write(measure(RunStore(RESULTS)), RESULTS)
    print((RESULTS / "large_set" / "large_set.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
