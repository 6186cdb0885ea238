"""Allocation benchmark on the simulated engine.

Runs every allocator on every scenario for k in {8, 16} over several seeds and
writes, under benchmarks/results/allocation/:

- allocation.csv          one row per (allocator, scenario, k) with means and 95% intervals
- allocation_runs.csv     one row per seed
- allocation.md           the markdown table (also pasted into the README)
- allocation.png          rollouts per effective group and useful share, per scenario
- allocation_timing.csv   milliseconds per decision round with 1,024 live prompts
- allocation_targets.json the README targets, measured

A run with --quick or a changed --seeds/--steps/--batch-size writes to a fresh temporary
folder (printed) instead, unless --out names one: smoke runs never replace the results.

``--scenarios A B`` runs only those scenarios and merges: their rows replace the same scenarios' rows
of the results folder's allocation/allocation_runs.csv, every other scenario's rows are kept as they are, and the
summary, table, plot and targets are rebuilt from the merged runs (the decision-round timing is kept
from the earlier run). It refuses to merge into files of another protocol (steps, seeds, batch size).

Scenario ``replay`` replays the pass rates of a real training run (rlvr_core.rollout.simulated,
benchmarks/replay/README.md); its logged steps are mapped onto the run's ``--steps`` updates.

Usage: python -m benchmarks.allocation [--quick] [--scenarios S ...] [--json PATH] [--out DIR]

``--out DIR`` names the results root: the files go to DIR/allocation/. ``--json PATH`` also writes the figures
as a JSON list; the committed one, benchmarks/results/allocation/allocation.json, is read by benchmarks/floor.py
and benchmarks/study_targets.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # a run sets its environment before numpy loads; an import leaves the caller's alone
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pandas as pd
from scipy import stats as sps

from benchmarks.common import output_dir, results_dir, save_figure
from benchmarks.study.plan import VARIANTS as ALL_VARIANTS
from benchmarks.study.plan import Variant, flagged
from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
from rlvr_core.rollout.simulated import SimulatedEngine

SCENARIOS = ("early", "late", "ushape", "uniform", "drift", "replay")
FULL = {"seeds": 5, "steps": 60, "batch_size": 32}  # the protocol behind benchmarks/results/allocation/


def full_protocol(quick: bool, seeds: int, steps: int, batch_size: int) -> bool:
    """Whether a run repeats the protocol of the committed results (only such a run writes there by default)."""
    return not quick and {"seeds": seeds, "steps": steps, "batch_size": batch_size} == FULL


# the allocation benchmark's variants: the plan's records with ``simulated`` set (benchmarks/study/plan.py), in its
# table order
LABELS = flagged("simulated")
VARIANTS = tuple(ALL_VARIANTS[label] for label in LABELS)


def run_one(variant: Variant, scenario: str, k: int, seed: int, steps: int, batch_size: int) -> dict[str, Any]:
    """Train-free allocation run: ``steps`` steps on one simulated scenario."""
    # replay: the whole logged run over this run's updates (drift keeps the engine's horizon, 60 = FULL steps)
    engine = SimulatedEngine(scenario, seed=seed, **({"horizon": steps} if scenario == "replay" else {}))
    source = PromptSource(engine.pool_size, seed=seed)
    alloc = make_allocator(variant.allocator, k=k, batch_size=batch_size, seed=seed, **variant.params)
    tot: dict[str, float] = {}
    for _ in range(steps):
        _, st = run_allocation_step(alloc, engine, source)
        engine.update_weights()
        for key in ("rollouts", "tokens", "effective_groups", "useful_rollouts", "rounds", "hit_cap"):
            tot[key] = tot.get(key, 0) + getattr(st, key)
        # a reused completion (ar3po) sits in an effective group but was not generated: not a useful rollout
        tot["useful_rollouts"] -= st.extra.get("reused_rollouts", 0)
    eff = max(tot["effective_groups"], 1)
    return {
        "allocator": variant.label, "scenario": scenario, "k": k, "seed": seed,
        "rollouts_per_effective_group": tot["rollouts"] / eff,
        "tokens_per_effective_group": tot["tokens"] / eff,
        "useful_share": tot["useful_rollouts"] / max(tot["rollouts"], 1),
        "effective_groups_per_step": tot["effective_groups"] / steps,
        "rounds_per_step": tot["rounds"] / steps,
        "rollouts_per_step": tot["rollouts"] / steps,
        "capped_steps": tot["hit_cap"] / steps,
    }


def ci95(x: np.ndarray) -> tuple[float, float]:
    """Two-sided 95% t-interval of the mean."""
    if len(x) < 2:
        return float(x.mean()), float(x.mean())
    half = float(sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return float(x.mean() - half), float(x.mean() + half)


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (alloc, scen, k), g in runs.groupby(["allocator", "scenario", "k"], sort=False):
        r = g["rollouts_per_effective_group"].to_numpy()
        lo, hi = ci95(r)
        rows.append({
            "allocator": alloc, "scenario": scen, "k": int(k), "seeds": len(g),
            "rollouts_per_effective_group": float(r.mean()), "rpeg_ci_low": lo, "rpeg_ci_high": hi,
            "tokens_per_effective_group": float(g["tokens_per_effective_group"].mean()),
            "useful_share": float(g["useful_share"].mean()),
            "effective_groups_per_step": float(g["effective_groups_per_step"].mean()),
            "rounds_per_step": float(g["rounds_per_step"].mean()),
            "rollouts_per_step": float(g["rollouts_per_step"].mean()),
            "capped_steps": float(g["capped_steps"].mean()),
        })
    for scen in runs["scenario"].unique():  # the oracle limit: every rollout lands in an effective group
        for k in sorted(runs["k"].unique()):
            rows.append({"allocator": "oracle", "scenario": scen, "k": int(k), "seeds": 0,
                         "rollouts_per_effective_group": float(k), "rpeg_ci_low": float(k), "rpeg_ci_high": float(k),
                         "tokens_per_effective_group": float("nan"), "useful_share": 1.0,
                         "effective_groups_per_step": float("nan"), "rounds_per_step": 1.0,
                         "rollouts_per_step": float("nan"), "capped_steps": 0.0})
    return pd.DataFrame(rows)


def time_decision_rounds(k: int = 8, live: int = 1024, repeats: int = 30) -> pd.DataFrame:
    """Median ms of one propose+observe round with ``live`` live prompts (engine time excluded)."""
    out = []
    for v in VARIANTS:
        engine = SimulatedEngine("uniform", seed=0, pool_size=64 * live)
        samples = []
        for rep in range(repeats):
            source = PromptSource(engine.pool_size, seed=rep)
            params = dict(v.params)
            if v.allocator in ("sara", "sara+dps"):
                params.setdefault("max_new_prompts_per_round", live)
            alloc = make_allocator(v.allocator, k=k, batch_size=live, seed=rep, **params)
            alloc.start_step(source)
            req = alloc.propose()
            ro = engine.generate(req)
            alloc.observe(ro)  # first round done: `live` prompts are now live
            t0 = time.perf_counter()
            req = alloc.propose()
            t_prop = time.perf_counter() - t0
            if not req:
                continue
            ro = engine.generate(req)
            t1 = time.perf_counter()
            alloc.observe(ro)
            samples.append((t_prop + time.perf_counter() - t1) * 1e3)
        if samples:
            out.append({"allocator": v.label, "live_prompts": live, "k": k,
                        "median_ms": float(np.median(samples)), "p90_ms": float(np.percentile(samples, 90)),
                        "repeats": len(samples)})
    return pd.DataFrame(out)


def targets(summary: pd.DataFrame) -> dict[str, Any]:
    """The README's allocation targets, computed from the summary table."""
    def rpeg(alloc: str, scen: str, k: int = 8) -> float:
        row = summary[(summary.allocator == alloc) & (summary.scenario == scen) & (summary.k == k)]
        return float(row["rollouts_per_effective_group"].iloc[0]) if len(row) else float("nan")

    def share(alloc: str, scen: str, k: int) -> float:
        row = summary[(summary.allocator == alloc) & (summary.scenario == scen) & (summary.k == k)]
        return float(row["useful_share"].iloc[0]) if len(row) else float("nan")

    res: dict[str, Any] = {}
    for scen in ("early", "ushape", "replay"):
        if scen not in set(summary.scenario):
            continue
        saving = 1 - rpeg("sara", scen) / rpeg("dapo", scen)
        res[f"sara_vs_dapo_saving_{scen}_k8"] = {"value": saving, "target": 0.22, "met": bool(saving >= 0.22)}
    saving = 1 - rpeg("sara[carry]", "drift") / rpeg("dapo", "drift")
    res["sara_carry_vs_dapo_saving_drift_k8"] = {"value": saving, "target": 0.35, "met": bool(saving >= 0.35)}
    ok = [(s, k, share("vigor", s, k), share("grpo", s, k)) for s in summary.scenario.unique()
          for k in sorted(summary.k.unique())]
    res["vigor_useful_share_above_grpo"] = {
        "value": {f"{s}/k{k}": [round(v, 4), round(g, 4)] for s, k, v, g in ok},
        "met": bool(all(v > g for _, _, v, g in ok)),
    }
    return res


def check_mergeable(out: Path, meta: dict[str, Any]) -> None:
    """SystemExit when ``out`` holds results of another protocol than ``meta``'s (steps, seeds, batch size,
    quick): rows of two protocols never share a table."""
    meta_path = out / "allocation_targets.json"
    if (out / "allocation_runs.csv").is_file() and meta_path.is_file():
        old = json.loads(meta_path.read_text()).get("run", {})
        differ = {k: (old.get(k), meta[k]) for k in ("steps", "seeds", "batch_size", "quick") if old.get(k) != meta[k]}
        if differ:
            raise SystemExit(f"--scenarios: {out} holds a run of another protocol ({differ}: earlier, now); "
                             "rerun every scenario or pass another --out")


def merge_runs(out: Path, runs: pd.DataFrame, scenarios: tuple[str, ...]) -> tuple[
        pd.DataFrame, pd.DataFrame | None, list[str]]:
    """``runs`` (of ``scenarios``) merged into ``out``'s allocation_runs.csv: the earlier rows of those
    scenarios are replaced, the others kept (``check_mergeable`` first). Returns (merged runs in the
    table's order, the earlier timing or None, the scenarios kept)."""
    old_path = out / "allocation_runs.csv"
    if not old_path.is_file():
        return runs, None, []
    old_runs = pd.read_csv(old_path)
    kept = old_runs[~old_runs.scenario.isin(scenarios)]
    merged = pd.concat([kept, runs], ignore_index=True)
    order = {s: i for i, s in enumerate(SCENARIOS)}
    labels = {v.label: i for i, v in enumerate(VARIANTS)}
    merged = merged.assign(_k=merged.k, _s=merged.scenario.map(lambda s: order.get(s, len(order))),
                           _v=merged.allocator.map(lambda a: labels.get(a, len(labels))))
    merged = merged.sort_values(["_k", "_s", "_v", "seed"], kind="stable").drop(columns=["_k", "_s", "_v"])
    timing_path = out / "allocation_timing.csv"
    timing = pd.read_csv(timing_path) if timing_path.is_file() else None
    return merged.reset_index(drop=True), timing, [s for s in SCENARIOS if s in set(kept.scenario)]


def markdown_table(summary: pd.DataFrame, timing: pd.DataFrame | None) -> str:
    lines = [
        "Rollouts per effective group (mean over seeds, 95% interval), tokens per effective group (thousands),",
        "useful share (rollouts inside effective training groups / all rollouts), effective groups and sync",
        "rounds per step; B = 32. The oracle spends exactly k rollouts per effective group.",
        "",
    ]
    for k in sorted(summary.k.unique()):
        lines += [f"**k = {k}**", "",
                  "| allocator | scenario | rollouts / eff. group | tokens / eff. group (k) | useful share "
                  "| eff. groups / step | rounds / step |",
                  "|---|---|---|---|---|---|---|"]
        sub = summary[summary.k == k]
        for scen in sub.scenario.unique():
            for _, r in sub[sub.scenario == scen].iterrows():
                tok = "-" if np.isnan(r.tokens_per_effective_group) else f"{r.tokens_per_effective_group / 1e3:.2f}"
                egs = "-" if np.isnan(r.effective_groups_per_step) else f"{r.effective_groups_per_step:.1f}"
                lines.append(
                    f"| {r.allocator} | {scen} | {r.rollouts_per_effective_group:.2f} "
                    f"[{r.rpeg_ci_low:.2f}, {r.rpeg_ci_high:.2f}] | {tok} | {r.useful_share:.3f} | {egs} | "
                    f"{r.rounds_per_step:.1f} |")
        lines.append("")
    if timing is not None and len(timing):
        lines += ["Decision round with 1,024 live prompts (propose + observe, engine excluded):", "",
                  "| allocator | median ms | p90 ms |", "|---|---|---|"]
        lines += [f"| {r.allocator} | {r.median_ms:.2f} | {r.p90_ms:.2f} |" for _, r in timing.iterrows()]
        lines.append("")
    return "\n".join(lines)


def plot(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    ks = sorted(summary.k.unique())
    scens = list(summary.scenario.unique())
    labels = [v.label for v in VARIANTS]
    fig, axes = plt.subplots(2, len(ks), figsize=(7 * len(ks), 8), squeeze=False)
    width = 0.8 / len(labels)
    for j, k in enumerate(ks):
        sub = summary[summary.k == k]
        for i, lab in enumerate(labels):
            s = sub[sub.allocator == lab].set_index("scenario").reindex(scens)
            x = np.arange(len(scens)) + (i - len(labels) / 2) * width + width / 2
            err = np.vstack([s.rollouts_per_effective_group - s.rpeg_ci_low,
                             s.rpeg_ci_high - s.rollouts_per_effective_group])
            axes[0, j].bar(x, s.rollouts_per_effective_group, width, yerr=err, label=lab, capsize=1.5)
            axes[1, j].bar(x, s.useful_share, width, label=lab)
        axes[0, j].axhline(k, color="k", ls="--", lw=1, label="oracle (k)")
        axes[1, j].axhline(1.0, color="k", ls="--", lw=1)
        for ax, ttl in ((axes[0, j], f"rollouts per effective group, k={k} (lower is better)"),
                        (axes[1, j], f"useful share, k={k} (higher is better)")):
            ax.set_xticks(np.arange(len(scens)), scens)
            ax.set_title(ttl, fontsize=10)
            ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def simulate(combos: list[tuple[Variant, str, int]], seeds: int, steps: int, batch_size: int) -> list[dict[str, Any]]:
    """Every (variant, scenario, k) of ``combos`` over ``seeds`` seeds, each line of progress printed."""
    runs: list[dict[str, Any]] = []
    for i, (v, scen, k) in enumerate(combos, 1):
        for seed in range(seeds):
            runs.append(run_one(v, scen, k, seed, steps, batch_size))
        print(f"[{i:3d}/{len(combos)}] k={k:2d} {scen:8s} {v.label:13s} "
              f"rollouts/eff.group={np.mean([r['rollouts_per_effective_group'] for r in runs[-seeds:]]):6.2f}",
              flush=True)
    return runs


def write(out: Path, args: Any, runs_df: pd.DataFrame, summary: pd.DataFrame, timing: pd.DataFrame,
          tgt: dict[str, Any], meta: dict[str, Any], scenarios: tuple[str, ...], kept: list[str],
          t_start: float) -> None:
    """The benchmark's files in ``out`` (and ``--json``), the run's metadata beside the targets."""
    runs_df.to_csv(out / "allocation_runs.csv", index=False)
    summary.to_csv(out / "allocation.csv", index=False)
    timing.to_csv(out / "allocation_timing.csv", index=False)
    tgt["decision_round_ms_1024_live"] = {
        "value": {r.allocator: round(r.median_ms, 3) for _, r in timing.iterrows()},
        "target": 5.0, "met": bool((timing.median_ms < 5.0).all()),
    }
    if not args.timing_only:
        meta["seconds"] = round(time.perf_counter() - t_start, 1)
    if args.scenarios and not args.timing_only:
        earlier = out / "allocation_targets.json"
        meta["scenarios_run"] = list(scenarios)
        meta["scenarios_kept"] = kept
        if kept and earlier.is_file():
            prev = json.loads(earlier.read_text()).get("run", {})
            meta["earlier_run"] = prev.get("earlier_run", prev)
    (out / "allocation_targets.json").write_text(json.dumps({"run": meta, "targets": tgt}, indent=2) + "\n")
    (out / "allocation.md").write_text(markdown_table(summary, timing))
    plot(summary, out / "allocation.png")
    if args.json:
        keys = ["allocator", "scenario", "k", "rollouts_per_effective_group", "tokens_per_effective_group",
                "useful_share", "rounds_per_step", "effective_groups_per_step", "rpeg_ci_low", "rpeg_ci_high"]
        recs = summary[keys].replace({np.nan: None}).to_dict(orient="records")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(recs, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps (finishes in well under a minute)")
    ap.add_argument("--seeds", type=int, default=FULL["seeds"])
    ap.add_argument("--steps", type=int, default=None, help=f"steps per run (default {FULL['steps']}, quick 15)")
    ap.add_argument("--batch-size", type=int, default=FULL["batch_size"])
    ap.add_argument("--scenarios", nargs="+", default=None, choices=SCENARIOS, metavar="SCENARIO",
                    help=f"only these scenarios ({', '.join(SCENARIOS)}), merged into the results folder's files")
    ap.add_argument("--timing-only", action="store_true",
                    help="re-measure only the decision-round timing (on a quiet machine) and rewrite the files that "
                         "show it, from the results folder's allocation_runs.csv")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as a JSON list here")
    ap.add_argument("--out", type=Path, default=None,
                    help="results root, written under its allocation/ (default benchmarks/results for the full "
                         "protocol, else a temporary one)")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.batch_size < 1:
        ap.error("--seeds and --batch-size must be >= 1")
    steps = args.steps or (15 if args.quick else FULL["steps"])
    args.out = results_dir(args.out, full_protocol(args.quick, args.seeds, steps, args.batch_size), "allocation")
    out = output_dir(args.out, "allocation")
    t_start = time.perf_counter()
    meta: dict[str, Any] = {"steps": steps, "seeds": args.seeds, "batch_size": args.batch_size, "quick": args.quick}
    if args.scenarios or args.timing_only:
        check_mergeable(out, meta)
    scenarios = tuple(s for s in SCENARIOS if s in args.scenarios) if args.scenarios else SCENARIOS
    runs_df = pd.DataFrame(simulate([] if args.timing_only else [(v, s, k) for k in (8, 16) for s in scenarios
                                                                 for v in VARIANTS], args.seeds, steps,
                                    args.batch_size))
    timing, kept = None, []
    if args.timing_only:
        if not (out / "allocation_runs.csv").is_file():
            raise SystemExit(f"--timing-only: {out} holds no allocation_runs.csv; run the benchmark first")
        runs_df = pd.read_csv(out / "allocation_runs.csv")
        prev = json.loads((out / "allocation_targets.json").read_text()).get("run", {})
        meta = {**prev, "timing_remeasured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    elif args.scenarios:
        runs_df, timing, kept = merge_runs(out, runs_df, scenarios)
    summary = summarise(runs_df)
    if timing is None:
        timing = time_decision_rounds(repeats=10 if args.quick else 30)
    tgt = targets(summary)
    write(out, args, runs_df, summary, timing, tgt, meta, scenarios, kept, t_start)
    print(f"wrote {out}/allocation.{{csv,md,png}} in {meta['seconds']} s")
    for name, t in tgt.items():
        print(f"  target {name}: {'met' if t['met'] else 'MISSED'} ({t['value']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
