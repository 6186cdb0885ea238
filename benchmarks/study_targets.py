"""The targets allocation must meet in real training, measured from the study's run files.

    python -m benchmarks.study_targets          # (also run by `python -m benchmarks.study --summarize-only`)

Writes ``training_targets.json``, ``training_targets.md`` and ``training_candidates.md`` (the candidates of
the allocation issue without a target of their own, and on ``easy`` every equal-batch allocator of ours, measured
the same way) in benchmarks/results/study_targets/ (``--out DIR``: the results root, DIR/study_targets/; the run
files are read from DIR/study/).
Each target holds its measured value, an interval where one applies, the seeds behind it, and ``met`` (true,
false, or null while the cells it needs have not run). The rules were written down before the cells ran:

- rollouts-to-target is the first crossing of each run's isotonic (monotone) fit of its evaluation curve
  (``rlvr_core.stats.fitted_reach``), not the raw first crossing, which favours the allocator evaluated most
  often per rollout; the raw figure stays beside it (``value_raw``).
- ``saving`` of allocator A against B = 1 - median(A) / median(B) of rollouts-to-target, with a 95% percentile
  bootstrap interval (each cell's seeds resampled on their own). A run that never reaches the target counts
  against its own side only: ours as never (infinitely late), the baseline's at its whole budget (the least it
  could have cost). So a saving is never inflated by a baseline run that missed. Beside it, ``p_value``: a
  one-sided rank test (``rlvr_core.stats.rank_test``) of ours against the baseline, misses of both ranked last.
- ``tuned``: "our best" is the allocator of ours (any sara or vigor variant) with the lowest median
  rollouts-to-target on the *validation* split (tuned/choice.json), never picked on the reported test runs.
- ``equal-rollouts``: the median accuracy over seeds against the update count, interpolated on 50 points from
  10% of the run to the end of the shorter of the two cells; met when vigor's median is >= grpo's at all of them.
- ``steps`` (worked answers): ours against dapo at equal batch in rollouts, generated tokens and training seconds
  to target, and the sources' token claim (sara saves more tokens than rollouts against dapo): the token saving
  minus the rollout saving with a bootstrap interval that keeps each run's two costs paired; met when the
  interval lies above zero.
- the simulator target reads benchmarks/results/allocation/allocation.json (k = 8, scenarios early, late and ushape):
  the best allocator's rollouts per effective group over the limit of k.
- with the screening floor's rows (``measure(..., floor=)``: benchmarks.floor.write's result, which the study's
  summary passes in memory; this script reads benchmarks/results/floor/allocation_floor.json), the simulator row
  also gives each scenario's screening floor (the least any allocator without a prompt's history can spend)
  and the equal-batch rows the most such an allocator can save against the study's dapo cell.

The declared targets are records of the study's plan (benchmarks/study/plan.py ``SAVING_TARGETS``,
``RATIO_TARGETS``, ``DOMINANCE_TARGETS``); which regimes show candidate rows beside them, against what, and with
which published allocators is ``plan.CANDIDATES``; the cost rows of the worked-answer family are
``plan.COST_COMPARISONS`` and ``plan.TOKEN_CLAIM``. No regime is named here.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.common import RESULTS, output_dir
from benchmarks.study import plan, stats
from benchmarks.study.formats import NEVER, number, p_eq, pct
from benchmarks.study.stats import cost_of, dominance, percentile_interval, saving, saving_gap  # noqa: F401
from benchmarks.study.store import RunStore, as_store
from rlvr_core.stats import significant

SIM_SCENARIOS = ("early", "late", "ushape")


def targeted(regime: str, protocol: str) -> tuple[str, ...]:
    """The allocators a declared saving target (plan.SAVING_TARGETS) names in a cell of ``regime``."""
    return tuple(t.ours for t in plan.SAVING_TARGETS if (t.regime, t.protocol) == (regime, protocol))


def untargeted(protocol: str, regime: str, named: tuple[str, ...]) -> tuple[str, ...]:
    """The candidates of a cell: the allocators of ours the plan runs there (at equal rollouts: VIGOR's variants,
    the ones its dominance row reads) other than those a declared target ``named``, in table order."""
    ours = plan.ours_in(protocol, regime)
    if protocol == "equal-rollouts":
        ours = tuple(lab for lab in ours if plan.VARIANTS[lab].allocator == "vigor")
    return tuple(lab for lab in ours if lab not in named)


def family_saving(store: RunStore, base: str, protocol: str, ours: str, baseline: str,
                  axis: str = "cum_rollouts") -> dict[str, Any]:
    """``ours`` against ``baseline`` over every warm start of regime ``base`` (``base``, ``base-wsJ``) that ran both
    cells: with one, its saving (``saving``); with several, the pooled saving, its bootstrap interval resampling runs
    within each warm start, and the rank test stratified by warm start (benchmarks.study.stats.family_saving).
    ``regimes`` names the warm starts used."""
    kept = stats.matched_cells(store, store.family(base), protocol, ours, baseline)[0]
    if not kept:
        return {"value": None, "lo": None, "hi": None}
    if len(kept) == 1:
        ((r, t, a, b),) = kept
        return {**saving(a, b, t, axis=axis), "regimes": [r]}
    return stats.family_saving(store, [r for r, *_ in kept], protocol, ours, baseline, axis=axis)


def _per_warm_start(store: RunStore, pooled: Mapping[str, Any], protocol: str, ours: str, baseline: str, *,
                    always: bool = False) -> list[dict[str, Any]]:
    """Candidate rows of each warm start's own saving behind a pooled one (``always``: also when one warm start
    ran, the row then being the figure itself)."""
    regimes = pooled.get("regimes", ())
    if len(regimes) < 2 and not always:
        return []
    return [{"target": f"(candidate) {r}, {protocol}: {ours}'s saving against {baseline}"
             + (" (this warm start alone)" if len(regimes) > 1 else ""), "kind": "saving", "want": None,
             **saving(store.cell(r, protocol, ours), store.cell(r, protocol, baseline), store.target_value(r)),
             "met": None} for r in regimes]


def _met(value: float | None, ok: bool) -> bool | None:
    return None if value is None else bool(ok)


def measure(out: Path | RunStore, results: Path | None = None, floor: Mapping[str, Any] | None = None
            ) -> list[dict[str, Any]]:
    """Every target, measured from what has run so far: the runs of ``out`` (a results root or its RunStore), the
    simulator row from the results root ``results`` (default ``out``)'s allocation/allocation.json, and the
    screening floor's rows ``floor`` (benchmarks.floor.write's result; {}: none)."""
    store = as_store(out)
    rows: list[dict[str, Any]] = []
    results = store.out if results is None else results
    allocation_json = results / "allocation" / "allocation.json"
    floor = floor or {}
    study_floor = floor.get("study_equal_batch") or [{}]
    ceiling = study_floor[0].get("ceiling_without_prompt_information")
    for c in plan.CANDIDATES:
        rows += candidate_rows(store, c, ceiling)
    rows += _matched_rows(store)
    for regime in store.family(plan.COST_FAMILY):  # steps, steps-wsJ
        rows += _steps_rows(store, regime)
    rows += _token_claim_row(store)
    rows += _tuned_rows(store)
    rows += _vigor_rows(store)
    rows.append(_simulator_row(allocation_json, floor))
    return rows


def saving_target(store: RunStore, tg: plan.Target, ceiling: float | None = None) -> list[dict[str, Any]]:
    """A declared saving target's row (pooled over its regime's warm starts) and each warm start's own."""
    s = family_saving(store, tg.regime, tg.protocol, tg.ours, tg.baseline, axis=tg.axis)
    row = {"target": tg.text, "kind": "saving", "want": tg.saving, **s}
    if tg.ceiling:
        row["ceiling_without_prompt_information"] = ceiling
    row["met"] = _met(s["value"], s["value"] is not None and (s["value"] >= tg.saving if tg.saving > 0
                                                                else s["value"] > 0)
                      and (tg.p is None or significant(s, tg.p)))
    return [row, *_per_warm_start(store, s, tg.protocol, tg.ours, tg.baseline)]


def _vigor_rows(out: Path | RunStore) -> list[dict[str, Any]]:
    """equal-rollouts, vigor against grpo by update count. On ``hard`` the declared row reads the warm starts whose
    VIGOR spends B x k rollouts per update (``fill``: hard-ws1, hard-ws2; warm start 0's runs predate it,
    benchmarks/warmstarts.py cells) where they ran: the lowest share over them, met only if every one dominates;
    each warm start is a candidate row."""
    store = as_store(out)
    rows: list[dict[str, Any]] = []
    for tg in plan.DOMINANCE_TARGETS:
        base, proto = tg.regime, tg.protocol
        kept = [r for r, *_ in stats.matched_cells(store, store.family(base) or [base], proto, tg.ours,
                                                   tg.baseline)[0]] or [base]
        per = {r: dominance(store.cell(r, proto, tg.ours), store.cell(r, proto, tg.baseline)) for r in kept}
        ran = [d for d in per.values() if d["value"] is not None]
        d = min(ran, key=lambda d: (d["value"], d["min_difference"])) if ran else {"value": None}
        where = "" if kept == [base] else f" ({', '.join(kept)}, the lowest)"
        rows.append({"target": tg.text, "kind": "dominance", "want": 1.0, **d, "warm_starts_read": kept,
                     "note": where, "met": _met(d["value"], bool(ran) and all(x["value"] == 1.0 for x in ran))})
        if len(kept) > 1:
            rows += [{"target": f"(candidate) {r}, {proto}: {tg.ours} against {tg.baseline}", "kind": "dominance",
                      "want": None, **x, "met": None} for r, x in per.items()]
        for lab in untargeted(proto, base, (tg.ours,)):
            if ours := store.cell(base, proto, lab):
                rows.append({"target": f"(candidate) {base}, {proto}: {lab} against {tg.baseline}",
                             "kind": "dominance", "want": None, **dominance(ours, store.cell(base, proto, tg.baseline)),
                             "met": None})
    return rows


def candidate_labels(c: plan.Candidates) -> tuple[str, ...]:
    """The allocators a Candidates record reads beside its regime's targets: ours that no target names (and the
    published ones with ``published``), in table order."""
    ours = untargeted(c.protocol, c.regime, targeted(c.regime, c.protocol))
    return ours + (plan.published_in(c.protocol, c.regime) if c.published else ())


def candidate_rows(out: Path | RunStore, c: plan.Candidates, ceiling: float | None = None) -> list[dict[str, Any]]:
    """A regime's declared saving targets (plan.SAVING_TARGETS) and its candidate rows (plan.CANDIDATES): nothing
    before its target is frozen."""
    store = as_store(out)
    t = store.target_value(c.regime)
    if t is None:
        return []
    if c.of:  # what regime ``of`` chose, read in this regime's own cell (one warm start)
        return [{"target": f"(candidate) {c.regime}, {c.protocol}: {lab}'s saving against {c.baseline}",
                 "kind": "saving", "want": None,
                 **saving(ours, store.cell(c.regime, c.protocol, c.baseline), t), "met": None}
                for lab in (*targeted(c.of, c.protocol), *candidate_labels(_candidates_of(c.of)))
                if (ours := store.cell(c.regime, c.protocol, lab))]
    rows = [row for tg in plan.SAVING_TARGETS if tg.regime == c.regime for row in saving_target(store, tg, ceiling)]
    rows += [row for tg in plan.SAVING_TARGETS if tg.regime == c.regime and tg.axis != "cum_rollouts"
             for row in _other_axis_rows(store, tg)]
    for lab in candidate_labels(c):
        s = family_saving(store, c.regime, c.protocol, lab, c.baseline)
        if len(s.get("regimes", ())) > 1:
            rows.append({"target": f"(candidate) {c.regime}, {c.protocol}: {lab}'s saving against {c.baseline}",
                         "kind": "saving", "want": None, **s, "met": None})
        rows += _per_warm_start(store, s, c.protocol, lab, c.baseline, always=True)
    return rows + (_best_published_rows(store, c, t) if c.best_published else [])


def _other_axis_rows(store: RunStore, tg: plan.Target) -> list[dict[str, Any]]:
    """Beside a target on another cost axis than rollouts (steps-fine's, in generated tokens): the targeted
    allocator's saving in rollouts, and every other allocator of ours that ran in the cell on both axes (candidate
    rows, not targets)."""
    words = dict(AXES)
    rows = []
    others = [lab for lab in plan.ours_in(tg.protocol, tg.regime)
              if lab != tg.ours and store.cell(tg.regime, tg.protocol, lab)]
    for lab, axis in [(tg.ours, "cum_rollouts"), *((lab, a) for lab in others for a in (tg.axis, "cum_rollouts"))]:
        s = family_saving(store, tg.regime, tg.protocol, lab, tg.baseline, axis=axis)
        if s["value"] is not None or s.get("ours_seeds"):
            rows.append({"target": f"(candidate) {tg.regime}, {tg.protocol}: {lab}'s saving against {tg.baseline} "
                         f"in {words[axis]}", "kind": "saving", "want": None, **s, "met": None})
    return rows


def _candidates_of(regime: str) -> plan.Candidates:
    return next(c for c in plan.CANDIDATES if c.regime == regime and not c.of)


def _best_published_rows(store: RunStore, c: plan.Candidates, t: float) -> list[dict[str, Any]]:
    """Each allocator of ours in the cell against the cell's best published allocator (its median cost)."""
    published = {lab: r for lab in plan.published_in(c.protocol, c.regime)
                 if (r := store.cell(c.regime, c.protocol, lab))}
    if not published:
        return []
    best = min(published, key=lambda lab: np.median([cost_of(r, t, "cum_rollouts", False) for r in published[lab]]))
    return [{"target": f"(candidate) {c.regime}, {c.protocol}: {lab}'s saving against {best}, the best published "
             "allocator of the cell", "kind": "saving", "want": None, **saving(ours, published[best], t), "met": None}
            for lab in plan.ours_in(c.protocol, c.regime) if (ours := store.cell(c.regime, c.protocol, lab))]


def _matched_rows(out: Path | RunStore) -> list[dict[str, Any]]:
    """hard and pool, matched-updates: ours against uniform GRPO at equal effective groups per update, over every
    warm start of the regime that ran the protocol (hard's own policy is lost, execute.check_policy: its
    matched cells run as warm-start variants), pooled and stratified where several did (family_saving). "Our best"
    is the highest saving of the cells that ran, picked on the reported runs themselves (no validation split here),
    so the ratio is optimistic; every one of ours is also a candidate row, pooled and per warm start."""
    store = as_store(out)
    rows = []
    for tg in (t for t in plan.RATIO_TARGETS if t.pick == "reported"):
        base, proto, need = tg.regime, tg.protocol, tg.ratio
        if store.target_value(base) is None:
            continue
        # no matched grpo runs: the equal-batch cells alone are not the matched-updates protocol
        ours = {lab: s for lab in plan.ours_in("matched-updates-small", base)
                if (s := family_saving(store, base, proto, lab, tg.baseline))["value"] is not None
                or s.get("ours_seeds")}
        if not ours:
            rows.append({"target": tg.text, "kind": "ratio", "want": need, "value": None, "met": None})
            continue
        best = max(ours, key=lambda lab: -math.inf if ours[lab]["value"] is None else ours[lab]["value"])
        for lab, s in ours.items():
            row = _as_ratio(s, lab)
            if lab == best:
                rows.append({**row, "target": tg.text + " (best of the cells, picked on these runs)", "want": need,
                             "met": _met(row["value"], row["value"] is not None and row["value"] <= need)})
            rows.append({**row, "target": f"(candidate) {base}, {proto}: {lab} against {tg.baseline}", "want": None,
                         "met": None})
            rows += [{**_as_ratio(r, lab), "target": r["target"].replace("'s saving against", " against")}
                     for r in _per_warm_start(store, s, proto, lab, tg.baseline)]
    return rows


def _as_ratio(s: Mapping[str, Any], lab: str) -> dict[str, Any]:
    """A saving row of ``lab`` as the ratio of its cost to the baseline's (1 - saving; the interval flipped)."""
    return {**s, "kind": "ratio", "allocator": lab, "value": None if s["value"] is None else 1.0 - s["value"],
            "lo": None if s["hi"] is None else 1.0 - s["hi"], "hi": None if s["lo"] is None else 1.0 - s["lo"]}


# regime steps (worked answers, failing ones longer): what a rollout saved buys in tokens and seconds
AXES = (("cum_rollouts", "rollouts"), ("cum_tokens", "generated tokens"), ("seconds", "training seconds"))


def _steps_rows(out: Path | RunStore, regime: str = plan.COST_FAMILY) -> list[dict[str, Any]]:
    """``regime`` (a warm start of the worked-answer family): each equal-batch cost comparison of the plan
    (plan.COST_COMPARISONS) in rollouts and generated tokens to target, and in training seconds against the
    protocol's own baseline (candidate rows); beside the sources' claim (plan.TOKEN_CLAIM), the gap between its
    token saving and its rollout saving, met when the 95% interval of the difference lies above zero."""
    store = as_store(out)
    t = store.target_value(regime)
    rows: list[dict[str, Any]] = []
    for c in (c for c in plan.COST_COMPARISONS if c.protocol == "equal-batch" and t is not None):
        ours, base = store.cell(regime, c.protocol, c.ours), store.cell(regime, c.protocol, c.baseline)
        if not ours or not base:
            continue
        for axis, word in AXES if c.baseline == plan.PROTOCOLS[c.protocol].baseline else AXES[:2]:
            rows.append({"target": f"(candidate) {regime}, {c.protocol}: {c.ours}'s saving against {c.baseline} in "
                         f"{word}", "kind": "saving", "want": None, **saving(ours, base, t, axis=axis), "met": None})
        if c == plan.TOKEN_CLAIM:
            g = saving_gap(ours, base, t, axis="cum_tokens")
            rows.append({"target": f"(candidate) {regime}, {c.protocol}: {c.ours}'s saving against {c.baseline} in "
                         "generated tokens minus its saving in rollouts", "kind": "gap", "want": None, **g,
                         "ours_seeds": len(ours), "base_seeds": len(base), "met": None})
    return rows


def _token_claim_row(out: Path | RunStore, base: str = plan.COST_FAMILY) -> list[dict[str, Any]]:
    """The sources' token claim (plan.TOKEN_CLAIM) over every warm start of ``base``: its pooled saving in generated
    tokens minus in rollouts (benchmarks/warmstarts.py pooled_costs), met when its 95% interval lies above zero."""
    store = as_store(out)
    regimes = store.family(base)
    c = plan.TOKEN_CLAIM
    pooled = stats.pooled_costs(store, regimes, c.protocol, c.ours, c.baseline, ("cum_rollouts", "cum_tokens"))
    if not pooled:
        return []
    g = pooled["cum_tokens"]
    counts = [(len(store.cell(r, c.protocol, c.ours)), len(store.cell(r, c.protocol, c.baseline))) for r in regimes]
    ws = [(a, b) for a, b in counts if a and b]  # the warm starts pooled_costs used: both cells ran
    return [{"target": f"(the sources' claim) {base}, {c.protocol}: {c.ours}'s saving against {c.baseline} is larger "
             "in generated tokens than in rollouts", "kind": "gap", "want": 0.0, "value": g["gap"], "lo": g["gap_lo"],
             "hi": g["gap_hi"], "warm_starts": len(ws), "ours_seeds": sum(a for a, _ in ws),
             "base_seeds": sum(b for _, b in ws), "met": _met(g["gap"], g["gap_lo"] is not None and g["gap_lo"] > 0)}]


def _tuned_rows(out: Path | RunStore, t: float | None = None) -> list[dict[str, Any]]:
    """The tuned targets (plan.RATIO_TARGETS picked on the validation split): "our best" is the allocator of ours
    with the lowest median validation rollouts-to-target (tuned/choice.json), reported on its test runs."""
    store = as_store(out)
    out_rows = []
    for tg in (t for t in plan.RATIO_TARGETS if t.pick == "validation"):
        regime, need = tg.regime, tg.ratio
        t = store.target_value(regime)
        choice = store.choice(regime)
        ours = {lab: c for lab, c in choice.items() if plan.VARIANTS[lab].ours and store.cell(regime, tg.protocol, lab)}
        grpo = store.cell(regime, tg.protocol, tg.baseline)
        best = min(ours, key=lambda lab: (math.inf if ours[lab]["validation_rollouts_to_target"] is None
                                          else ours[lab]["validation_rollouts_to_target"])) if ours else None
        s = saving(store.cell(regime, tg.protocol, best), grpo, t, axis=tg.axis) if best and grpo and t is not None \
            else {"value": None, "lo": None, "hi": None}
        ratio = None if s["value"] is None else 1.0 - s["value"]
        out_rows.append({"target": tg.text, "kind": "ratio", "want": need, "allocator": best, **s,
                         "value": ratio, "lo": None if s["hi"] is None else 1.0 - s["hi"],
                         "hi": None if s["lo"] is None else 1.0 - s["lo"],
                         "met": _met(ratio, ratio is not None and ratio <= need),
                         "candidates": sorted(ours)})
    return out_rows


def _simulator_row(path: Path, floor: Mapping[str, Any] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"target": "simulator: our best allocator within 1.4x of k rollouts per effective group "
                           "on early, late and ushape at k = 8", "kind": "simulator", "want": 1.4}
    if not path.exists():
        return {**row, "value": None, "met": None}
    recs = [r for r in json.loads(path.read_text()) if r["k"] == 8 and r["scenario"] in SIM_SCENARIOS
            and r["allocator"] in plan.VARIANTS and plan.VARIANTS[r["allocator"]].ours]
    per = {}
    for sc in SIM_SCENARIOS:
        cand = [r for r in recs if r["scenario"] == sc]
        if cand:
            b = min(cand, key=lambda r: r["rollouts_per_effective_group"])
            per[sc] = {"allocator": b["allocator"], "over_limit": b["rollouts_per_effective_group"] / 8.0}
            fl = [r for r in (floor or {}).get("static", []) if r["scenario"] == sc and r["k"] == 8]
            if fl:
                per[sc]["floor_over_k"] = fl[0]["floor_over_k"]
    worst = max((v["over_limit"] for v in per.values()), default=None)
    return {**row, "value": worst, "per_scenario": per, "met": _met(worst, worst is not None and worst <= 1.4)}


def _p(v: float | None) -> str:
    return "" if v is None else f", p {p_eq(v)}"


def _pooled(row: Mapping[str, Any]) -> str:
    """How a figure pooled over warm starts says so (family_saving): their count, the p-value stratified by them."""
    n = row.get("warm_starts") or 1
    return "" if n < 2 else f"; pooled over {n} warm starts ({', '.join(row['regimes'])}), p stratified"


def fmt(row: Mapping[str, Any]) -> str:
    v = row.get("value")
    if v is None and row.get("kind") == "saving" and row.get("ours_seeds"):
        return f"none: our median run never reaches the target ({row['ours_reached']}/{row['ours_seeds']} vs " \
               f"{row['base_reached']}/{row['base_seeds']} reached)"
    if v is None:
        return "not run yet"
    if row["kind"] == "saving":
        iv = "" if row.get("lo") is None and row.get("hi") is None else f" [{pct(row.get('lo'))}, {pct(row.get('hi'))}]"
        ce = row.get("ceiling_without_prompt_information")
        pv = _p(row.get("p_value"))
        raw = "" if "value_raw" not in row else "; raw first crossing: " + (
            pct(row["value_raw"]))
        return f"{pct(v)}{iv}{pv} ({row['ours_reached']}/{row['ours_seeds']} vs {row['base_reached']}/" \
               f"{row['base_seeds']} reached{_pooled(row)}{raw}" + (
                   "" if ce is None else f"; at most {ce:.0%} per effective group without prompt information") + ")"
    if row["kind"] == "ratio":
        iv = "" if row.get("lo") is None and row.get("hi") is None else \
            f" [{number(row.get('lo'), '.2f')}, {number(row.get('hi'), '.2f')}]"
        pv = _p(row.get("p_value"))
        raw = "" if "value_raw" not in row else "; raw first crossing: " + (
            NEVER if row["value_raw"] is None else f"{1.0 - row['value_raw']:.2f}x")
        runs = "runs" if _pooled(row) else "seeds"
        return f"{v:.2f}x{iv}{pv} ({row['allocator']}, {row['ours_seeds']} {runs}{_pooled(row)}{raw})"
    if row["kind"] == "gap":
        ws = "" if "warm_starts" not in row else f", {row['warm_starts']} warm start" + "s" * (row["warm_starts"] > 1)
        return f"{100 * v:+.1f} points [{100 * row['lo']:+.1f}, {100 * row['hi']:+.1f}] (token saving minus rollout " \
               f"saving; {row['ours_seeds']} vs {row['base_seeds']} seeds{ws})"
    if row["kind"] == "dominance":
        return f"at {v:.0%} of update counts; lowest difference {row['min_difference']:+.3f} " \
               f"({row['ours_seeds']} vs {row['base_seeds']} seeds{row.get('note', '')})"
    floor = " floor: the least an allocator without a prompt's history can spend" \
        if any("floor_over_k" in p for p in row["per_scenario"].values()) else ""
    return f"{v:.2f}x (" + ", ".join(
        f"{sc}: {p['allocator']} {p['over_limit']:.2f}x"
        + (f" (floor {p['floor_over_k']:.2f}x)" if "floor_over_k" in p else "")
        for sc, p in row["per_scenario"].items()) + ";" * bool(floor) + floor + ")"


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| target | measured | met |", "|---|---|---|"]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        lines.append(f"| {r['target']} | {fmt(r)} | {met} |")
    return "\n".join(lines) + "\n"


def tables(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(the targets' table, the candidates' table): the rows with a declared target, and those without."""
    return _table([r for r in rows if r.get("want") is not None]), _table([r for r in rows if r.get("want") is None])


def write(rows: Sequence[Mapping[str, Any]], results: Path) -> None:
    """training_targets.json (every row), training_targets.md (the targets) and training_candidates.md (the
    candidates without a target of their own, measured the same way), in the results root ``results``'s
    study_targets/."""
    dest = output_dir(results, "study_targets")
    (dest / "training_targets.json").write_text(json.dumps(list(rows), indent=1) + "\n")
    targets, candidates = tables(rows)
    (dest / "training_targets.md").write_text(targets)
    (dest / "training_candidates.md").write_text(candidates)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, help="results root (writes its study_targets/, reads its "
                    "study/, allocation/ and floor/)")
    args = ap.parse_args(argv)
    floor = args.out / "floor" / "allocation_floor.json"  # python -m benchmarks.floor's
    write(measure(args.out, floor=json.loads(floor.read_text()) if floor.exists() else {}), args.out)
    print((args.out / "study_targets" / "training_targets.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
