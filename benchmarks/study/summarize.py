"""The study's summary: every row computed in memory from one RunStore, then each file written once.

Order: the cells (training_protocols.json and training_<regime>_<protocol>.*), the screening floor (floor/), the
targets (study_targets/), the warm starts (warmstarts/), the group-size grid (group_size/), the tuned uniform GRPO
(grpo_tuning/), the null controls (null_controls/), the headline rows on the large held-out set (large_set/),
training_study.md, and for the committed results root the results index and the tables of README.md,
docs/results.md and docs/training-study.md.
No writer reads another's output: the floor's rows go to the targets, the targets' tables to training_study.md,
the warm starts' rows to the README's, in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import (
    ar3po_anatomy,
    floor,
    group_size,
    grpo_tuning,
    large_set,
    null_controls,
    readme,
    replication,
    results_index,
    study_targets,
    warmstarts,
)
from benchmarks.common import RESULTS, output_dir
from benchmarks.study import tables
from benchmarks.study.noise import aa_bands
from benchmarks.study.plan import PROTOCOLS, VARIANTS, baseline_of, budget_of, shared_sources
from benchmarks.study.stats import against_baseline, cell_rows
from benchmarks.study.store import RunStore

Cells = dict[tuple[str, str, str], list[dict[str, Any]]]


def cells_of(store: RunStore) -> Cells:
    """(regime, protocol, variant) -> test-split runs, each run also in the cells of the protocols that share it
    (where the regime ran that protocol), in path order."""
    runs = store.runs()
    present = {(r["regime"], r["protocol"]) for r in runs}
    shares = {p: shared_sources(p) for p in PROTOCOLS}
    cells: Cells = {}
    for r in runs:
        if r.get("split", "test") != "test":
            continue
        protos = [r["protocol"]]
        for proto, sources in shares.items():  # e.g. the reference runs are equal-rollouts' grpo
            if (r["regime"], proto) in present and any(r["protocol"] == src and (labs is None or r["variant"] in labs)
                                                       for src, labs in sources):
                protos.append(proto)
        for p in protos:
            cells.setdefault((r["regime"], p, r["variant"]), []).append(r)
    return cells


def cell_records(store: RunStore, cells: Cells) -> list[dict[str, Any]]:
    """One record per cell of a regime with a frozen target, in regime, protocol and table order."""
    order = list(PROTOCOLS), list(VARIANTS)
    records = []
    for (regime, proto, lab), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], order[0].index(kv[0][1]),
                                                                         order[1].index(kv[0][2]))):
        target = store.target(regime)
        if target is None:
            continue
        base_label = baseline_of(proto)
        base = cells.get((regime, proto, base_label)) or (cells.get((regime, "reference", "grpo"))
                                                          if base_label == "grpo" else None)
        budget = budget_of(regime)
        rec = {"regime": regime, "protocol": proto, "allocator": lab,
               **cell_rows(rs, target["target"], start=target.get("start"), gain=target.get("gain"),
                           budget=budget if budget is not None else target.get("budget_rollouts")),
               "target": target["target"], "budget_rollouts": int(np.median([r["ledger"]["rollouts"] for r in rs])),
               "seed_list": sorted(int(r["seed"]) for r in rs), "quick": any(r.get("quick") for r in rs),
               **against_baseline(rs, base, proto, lab, target["target"], base_label)}
        if proto == "tuned":
            rec["grid"] = rs[0]["grid"]
        records.append(rec)
    return records


def write_cells(summary: Path, store: RunStore, records: list[dict[str, Any]], cells: Cells, *,
                redraw: bool = False) -> None:
    """training_protocols.json and training_<regime>_<protocol>.{csv,md,png} in the results root's study/ (a PNG
    drawn from the same inputs is kept, unless ``redraw``)."""
    (summary / "training_protocols.json").write_text(json.dumps(records, indent=1) + "\n")
    for regime, proto in sorted({(r["regime"], r["protocol"]) for r in records}):
        if proto == "reference":
            continue
        sub = [r for r in records if r["regime"] == regime and r["protocol"] == proto]
        rs = {lab: cells[(regime, proto, lab)] for lab in [r["allocator"] for r in sub]}
        if proto == "equal-batch" and (regime, "reference", "grpo") in cells:
            rs = {"grpo (reference)": cells[(regime, "reference", "grpo")], **rs}
        stem = summary / f"training_{regime}_{proto}"
        target = store.target(regime)
        stem.with_suffix(".csv").write_text(tables.cell_csv(regime, proto, rs))
        stem.with_suffix(".md").write_text(tables.cell_markdown(regime, proto, sub, target))
        tables.plot_cell(stem.with_suffix(".png"), regime, proto, rs, target["target"], redraw=redraw)


def aggregate(out: Path, results: Path, *, redraw: bool = False) -> list[dict[str, Any]]:
    """Rebuild every summary of the results root ``results`` from the run files under ``out``/study: the cells,
    floor/, study_targets/, warmstarts/ and training_study.md; for the committed root (benchmarks/results) also its
    INDEX.md and the tables of README.md and docs/results.md. A cell's figure is drawn again only when what it
    shows changed (tables.plot_key), or with ``redraw``."""
    store = RunStore(out)
    cells = cells_of(store)
    records = cell_records(store, cells)
    summary = output_dir(results, "study")
    write_cells(summary, store, records, cells, redraw=redraw)
    fl = floor.write(results, store=store)
    targets = study_targets.measure(store, results, floor=fl)
    study_targets.write(targets, results)
    comparisons = warmstarts.measure(store, conditioned=True)  # the headline rows: conditioned warm starts only
    nulls = null_controls.measure(store)
    bands = aa_bands(nulls)  # every headline row is printed beside its family's A/A band
    warmstarts.write(warmstarts.measure(store), results, warmstarts.measure_costs(store),
                     warmstarts.measure_budget(store), headline=comparisons, bands=bands)
    group_size.write(group_size.measure(store), results)
    grpo_tuning.write(grpo_tuning.measure(store), results)
    replication.write(replication.measure(store), results)
    ar3po_anatomy.write(ar3po_anatomy.measure(store), results)
    null_controls.write(nulls, results)
    large_set.write(large_set.measure(store), results)
    (summary / "training_study.md").write_text(tables.study_doc(store, records, *study_targets.tables(targets)))
    if results.resolve() == RESULTS.resolve():  # the committed folder: its index lists the files just written
        results_index.write(results)
        readme.write_headlines(results, protocols=records, comparisons=list(comparisons), bands=bands)
        readme.sync_all(results=results)
    return records
