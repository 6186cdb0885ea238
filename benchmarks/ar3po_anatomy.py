"""Why AR3PO beats valor[reuse] on `pool`, read off the decision logs (issue 55, item 1).

    python -m benchmarks.ar3po_anatomy      # (also run by `python -m benchmarks.study --summarize-only`)

Both allocators spend the same rollout budget at equal rollouts on the same warm starts and seeds; the headline
says AR3PO reaches the target in fewer rollouts. This reads what each trains, from every run's decision log (one
row per prompt and step: rollouts, passes, tokens, trained and reused rows), over each run's whole budget:

- updates (steps that trained rows) and rollouts per update;
- rows trained per update, reused rows per update (a buffered correct completion added to an all-fail group) and
  the trained groups' sizes (the share of trained groups of at most 2, 3-4, 5-8 and more than 8 rows);
- distinct prompts trained, a trained group's pass rate, and how often its prompt had been trained before;
- the share of rollouts spent on prompt-steps that trained nothing (all-pass or all-fail, not rescued by reuse).

Per measure: the mean over each cell's runs, and AR3PO minus valor[reuse] over the seed pairs both ran, with a 95%
interval (benchmarks.study.stats.stratified_t_interval, warm starts as strata). Beside them, for context, the same
means of the two ablations of AR3PO (ar3po[no-stop]: full groups, no first-pass stop; ar3po[no-reuse]), valor and
the reference GRPO. Warm starts: `pool`'s conditioned ones where both cells
ran with every decision log. Nothing here is a test of a claim; the explanation it suggests is tested by ablation
runs (issue 55).

Writes benchmarks/results/ar3po_anatomy/: ar3po_anatomy.json, ar3po_anatomy.md (docs/design.md pastes its
table) and ar3po_anatomy.png (the trained groups' sizes per side).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from benchmarks.common import RESULTS, output_dir, save_figure
from benchmarks.study.formats import number
from benchmarks.study.stats import stratified_t_interval
from benchmarks.study.store import RunStore, as_store
from benchmarks.warmstarts import is_conditioned

FAMILY = "pool"
PROTOCOL = "equal-rollouts"
OURS, THEIRS = "ar3po", "valor[reuse]"  # the difference read: OURS - THEIRS
CONTEXT = (("equal-rollouts", "ar3po[no-stop]"), ("equal-rollouts", "ar3po[no-reuse]"), ("equal-rollouts", "valor"),
           ("reference", "grpo"))
SIZE_BINS = ((0, 2, "<= 2"), (3, 4, "3-4"), (5, 8, "5-8"), (9, 10 ** 9, "> 8"))
# (key, words, format) of each measure, in the table's order
MEASURES: tuple[tuple[str, str, str], ...] = (
    ("updates", "updates in the budget", ".0f"),
    ("rollouts_per_update", "rollouts per update", ".1f"),
    ("rows_per_update", "rows trained per update", ".1f"),
    ("reused_per_update", "reused rows per update", ".2f"),
    ("groups_per_update", "groups trained per update", ".1f"),
    ("rows_per_group", "rows per trained group", ".2f"),
    *((f"size_{name}", f"trained groups of {name} rows (share)", ".3f") for _, _, name in SIZE_BINS),
    ("distinct_prompts", "distinct prompts trained", ".0f"),
    ("pass_rate", "a trained group's pass rate", ".3f"),
    ("trained_before", "earlier trainings of a trained prompt", ".2f"),
    ("untrained_rollout_share", "rollouts on prompt-steps that trained nothing (share)", ".3f"),
)
COLUMNS = ("step", "prompt_id", "rollouts", "passes", "trained_rows", "reused_rows")


def log_measures(log: Path) -> dict[str, float]:
    """The MEASURES of one run's decision log, over its whole budget."""
    import pandas as pd

    d = pd.read_parquet(log, columns=list(COLUMNS)).sort_values(["step", "prompt_id"], kind="stable")
    trained = d[d["trained_rows"] > 0]
    updates = int(trained["step"].nunique())
    if not updates:
        raise ValueError(f"{log}: the run trained no row")
    sizes = trained["trained_rows"].to_numpy()
    out = {"updates": float(updates), "rollouts_per_update": float(d["rollouts"].sum()) / updates,
           "rows_per_update": float(sizes.sum()) / updates,
           "reused_per_update": float(d["reused_rows"].sum()) / updates,
           "groups_per_update": len(trained) / updates, "rows_per_group": float(sizes.mean()),
           "distinct_prompts": float(trained["prompt_id"].nunique()),
           "pass_rate": float((trained["passes"] / trained["rollouts"]).mean()),
           "trained_before": float(trained.groupby("prompt_id").cumcount().mean()),
           "untrained_rollout_share": float(d.loc[d["trained_rows"] == 0, "rollouts"].sum() / d["rollouts"].sum())}
    for lo, hi, name in SIZE_BINS:
        out[f"size_{name}"] = float(((sizes >= lo) & (sizes <= hi)).mean())
    return out


def _means(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k, _, _ in MEASURES}


def measure(out: Path | RunStore, read: Callable[[Path], dict[str, float]] = log_measures) -> dict[str, Any]:
    """Each side's mean measures and OURS - THEIRS over the seed pairs, on the family's conditioned warm starts
    where both cells ran with every decision log."""
    store = as_store(out)
    regimes = [r for r in store.family(FAMILY) if is_conditioned(store, r)]
    sides: dict[str, list[dict[str, float]]] = {OURS: [], THEIRS: []}
    context: dict[str, list[dict[str, float]]] = {label: [] for _, label in CONTEXT}
    pairs, strata, used = [], [], []
    for reg in regimes:
        ours, theirs = store.decision_logs(reg, PROTOCOL, OURS), store.decision_logs(reg, PROTOCOL, THEIRS)
        if not ours or not theirs:
            continue
        a = {s: read(p) for s, p in ours.items()}
        b = {s: read(p) for s, p in theirs.items()}
        sides[OURS] += a.values()
        sides[THEIRS] += b.values()
        for s in sorted(set(a) & set(b)):
            pairs.append([a[s][k] - b[s][k] for k, _, _ in MEASURES])
            strata.append(reg)
        used.append(reg)
        for protocol, label in CONTEXT:
            if (logs := store.decision_logs(reg, protocol, label)) is not None:
                context[label] += [read(p) for p in logs.values()]
    if not pairs:
        return {"warm_starts": [], "pairs": 0, "sides": {}, "context": {}, "difference": {}}
    d = np.asarray(pairs)
    diff = {}
    for j, (k, _, _) in enumerate(MEASURES):
        lo, hi = stratified_t_interval(d[:, j], strata)
        diff[k] = {"mean": float(d[:, j].mean()), "lo": lo, "hi": hi}
    return {"warm_starts": used, "pairs": len(pairs), "runs": {k: len(v) for k, v in sides.items()},
            "sides": {k: _means(v) for k, v in sides.items()},
            "context": {k: {"runs": len(v), **_means(v)} for k, v in context.items() if v},
            "difference": diff}


def table(res: Mapping[str, Any]) -> list[str]:
    ctx = list(res["context"])
    out = [f"| measure (per run, whole budget) | {OURS} | {THEIRS} | {OURS} - {THEIRS} [95% CI] | "
           + " | ".join(ctx) + " |", "|---" * (4 + len(ctx)) + "|"]
    for k, words, spec in MEASURES:
        d = res["difference"][k]
        ci = f"{number(d['mean'], spec)} [{number(d['lo'], spec)}, {number(d['hi'], spec)}]"
        out.append(f"| {words} | {number(res['sides'][OURS][k], spec)} | {number(res['sides'][THEIRS][k], spec)} | "
                   f"{ci} | " + " | ".join(number(res["context"][c][k], spec) for c in ctx) + " |")
    return out


def markdown(res: Mapping[str, Any]) -> str:
    if not res["pairs"]:
        return (f"No warm start of `{FAMILY}` has both {OURS} and {THEIRS} with every decision log yet.\n")
    ws = ", ".join(res["warm_starts"])
    ctx = ", ".join(f"{c} ({v['runs']} runs)" for c, v in res["context"].items())
    return "\n".join([
        f"What {OURS} and {THEIRS} train at equal rollouts on `{FAMILY}` ({ws}; {res['runs'][OURS]} and "
        f"{res['runs'][THEIRS]} runs, {res['pairs']} seed pairs), from their decision logs over each run's whole "
        f"budget: means per run, the difference over seed pairs with a 95% t interval (warm starts as strata); "
        f"context: {ctx}. Written by "
        "`python -m benchmarks.ar3po_anatomy`.", "", *table(res)]) + "\n"


def plot(path: Path, res: Mapping[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for _, _, name in SIZE_BINS]
    cells = {OURS: res["sides"][OURS], THEIRS: res["sides"][THEIRS], **res["context"]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(cells)
    for i, (label, m) in enumerate(cells.items()):
        left.bar(np.arange(len(names)) + i * width, [m[f"size_{n}"] for n in names], width, label=label)
    left.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
    left.set_xlabel("rows in a trained group")
    left.set_ylabel("share of trained groups")
    left.legend(fontsize=7)
    keys = ("updates", "rows_per_update", "distinct_prompts")
    for i, (label, m) in enumerate(cells.items()):
        right.bar(np.arange(len(keys)) + i * width, [m[k] for k in keys], width, label=label)
    right.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, ["updates", "rows / update", "distinct prompts"])
    right.set_yscale("log")
    fig.suptitle(f"What each allocator trains at equal rollouts on {FAMILY} ({', '.join(res['warm_starts'])})")
    save_figure(fig, path, dpi=100)


def write(res: Mapping[str, Any], results: Path) -> None:
    """ar3po_anatomy.json, .md and .png (the figure once a pair exists) in ``results``/ar3po_anatomy/."""
    dest = output_dir(results, "ar3po_anatomy")
    (dest / "ar3po_anatomy.json").write_text(json.dumps(res, indent=1) + "\n")
    (dest / "ar3po_anatomy.md").write_text(markdown(res))
    if res["pairs"]:
        plot(dest / "ar3po_anatomy.png", res)


def main(argv: Sequence[str] | None = None) -> int:
    res = measure(RunStore(RESULTS))
    write(res, RESULTS)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
