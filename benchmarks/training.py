"""Training benchmark (superseded by the training study, benchmarks/study/): every allocator trains the same
warm-started tiny policy. Not rlvr_core/training.py (the training loop) nor tasks/training.py (its Prefect task).

Each (allocator, seed) run gets the same rollout budget (``--rollouts``) and
is compared on cumulative rollouts and tokens, not steps. Writes, under
benchmarks/results/archive/training/ (benchmarks/results/archive/README.md says what replaced it):

- training.csv              every evaluation point: allocator, seed, step, cum rollouts/tokens, accuracy
- training_summary.csv      per run: start/final accuracy, rollouts and tokens to the target accuracy
- training.md               the comparison table (pasted into the README)
- training_rollouts.png     held-out greedy accuracy vs cumulative rollouts (seed spread shaded)
- training_tokens.png       the same vs cumulative tokens
- training_timings.json     wall-clock seconds per run and per step phase

Usage: python -m benchmarks.training [--quick] [--allocators a,b] [--seeds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.ablation import data_and_policy
from benchmarks.common import RESULTS, default_out, save_figure
from benchmarks.study import ENVIRONMENT
from rlvr_core.allocation import ALLOCATORS
from rlvr_core.config import TrainConfig
from rlvr_core.stats import first_reach
from rlvr_core.training import check_and_train

OUT = RESULTS / "archive" / "training"  # this superseded benchmark's own folder
ALL = tuple(ALLOCATORS.names())  # every registered allocator


def plot(curves: pd.DataFrame, x: str, path: Path, target: float) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for alloc, g in curves.groupby("allocator", sort=False):
        grid = np.linspace(0, g[x].max(), 60)
        ys = np.vstack([np.interp(grid, s[x], s["greedy_acc"]) for _, s in g.groupby("seed")])
        ax.plot(grid, ys.mean(0), label=alloc)
        ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.2)
    ax.axhline(target, color="k", ls=":", lw=1, label=f"target {target:.2f}")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("tiny policy, arithmetic: accuracy vs " + x.replace("cum_", "cumulative "))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def run_all(args: argparse.Namespace, allocators: list[str], seeds: int, budget: int) -> pd.DataFrame:
    """Warm-start once, train every (allocator, seed) on ``budget`` rollouts; the evaluation points."""
    t0 = time.perf_counter()
    ds, policy = data_and_policy(args.work, args.quick)
    timings: dict[str, Any] = {"warm_start_s": time.perf_counter() - t0, "runs": {}}

    points = []
    for alloc in allocators:
        for seed in range(seeds):
            cfg = TrainConfig(allocator=alloc, steps=100000, max_rollouts=budget, seed=seed,
                              eval_every=args.eval_every, eval_size=args.eval_size, eval_samples=8,
                              checkpoint_every=100000, **({"lr": args.lr} if args.lr is not None else {}))
            run_dir = args.work / f"{alloc}-s{seed}"
            t1 = time.perf_counter()
            res = check_and_train(cfg, policy_dir=policy, train_rows=ds["train"], test_rows=ds["test"], run_dir=run_dir,
                                  resume=False)
            secs = time.perf_counter() - t1
            steps = [r for r in res.metrics if r["step"] > 0]
            timings["runs"][f"{alloc}/{seed}"] = {
                "seconds": secs, "steps": len(steps),
                "generate_s": float(sum(r["generate_s"] for r in steps)),
                "update_s": float(sum(r["update_s"] for r in steps)),
            }
            for r in res.metrics:
                if "eval/greedy_acc" in r:
                    points.append({"allocator": alloc, "seed": seed, "step": r["step"],
                                   "cum_rollouts": r["cum_rollouts"], "cum_tokens": r["cum_tokens"],
                                   "greedy_acc": r["eval/greedy_acc"], "pass_at_1": r.get("eval/pass_at_1"),
                                   "pass_at_8": r.get("eval/pass_at_8")})
            evals = [r for r in res.metrics if "eval/greedy_acc" in r]
            print(f"{alloc:9s} seed {seed}: {len(steps)} steps, {evals[-1]['cum_rollouts']} rollouts, "
                  f"acc {evals[0]['eval/greedy_acc']:.3f} -> {evals[-1]['eval/greedy_acc']:.3f} in {secs:.0f} s",
                  flush=True)
    (args.out / "training_timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    return pd.DataFrame(points)


def report(curves: pd.DataFrame, gains: list[float], out: Path, json_path: Path | None) -> list[str]:
    """Per-run summary, plots and the markdown table: rollouts and tokens to each accuracy gain."""
    rows = []
    for (alloc, seed), g in curves.groupby(["allocator", "seed"], sort=False):
        g = g.sort_values("step")
        start = float(g.greedy_acc.iloc[0])
        row = {"allocator": alloc, "seed": int(seed), "start_accuracy": start,
               "final_accuracy": float(g.greedy_acc.iloc[-1]), "best_accuracy": float(g.greedy_acc.max()),
               "rollouts": int(g.cum_rollouts.iloc[-1]), "tokens": int(g.cum_tokens.iloc[-1])}
        for gain in gains:
            tag = f"{round(gain * 100):d}"
            row[f"rollouts_to_plus{tag}"] = first_reach(g.cum_rollouts.to_numpy(), g.greedy_acc.to_numpy(),
                                                        start + gain)
            row[f"tokens_to_plus{tag}"] = first_reach(g.cum_tokens.to_numpy(), g.greedy_acc.to_numpy(), start + gain)
        rows.append(row)
    summary = pd.DataFrame(rows)
    head = f"{round(gains[0] * 100):d}"
    summary["rollouts_to_target"] = summary[f"rollouts_to_plus{head}"]
    summary.to_csv(out / "training_summary.csv", index=False)
    mean_start = float(summary.start_accuracy.mean())
    plot(curves, "cum_rollouts", out / "training_rollouts.png", mean_start + gains[0])
    plot(curves, "cum_tokens", out / "training_tokens.png", mean_start + gains[0])
    n_seeds = summary.seed.nunique()
    budget = int(summary.rollouts.median())
    lines = [f"Held-out greedy accuracy of the tiny policy (arithmetic, 1-3 digits), {n_seeds} seed(s), "
             f"about {budget:,} rollouts per run.",
             "Rollouts (and tokens) until a run's greedy accuracy first gains +N points over its own warm start,",
             "interpolated between evaluations; median over the seeds that got there ('reached').", "",
             "| allocator | start acc | final acc | best acc | "
             + " | ".join(f"+{round(g * 100):d} pts: reached, rollouts, tokens" for g in gains) + " |",
             "|---|---|---|---|" + "---|" * len(gains)]
    for alloc, g in summary.groupby("allocator", sort=False):
        cells = []
        for gain in gains:
            tag = f"{round(gain * 100):d}"
            r, tk = g[f"rollouts_to_plus{tag}"], g[f"tokens_to_plus{tag}"]
            ok = r.notna()
            cells.append(f"{int(ok.sum())}/{len(g)}, {np.median(r[ok]):,.0f}, {np.median(tk[ok]):,.0f}"
                         if ok.any() else f"0/{len(g)}, -, -")
        lines.append(f"| {alloc} | {g.start_accuracy.mean():.3f} | {g.final_accuracy.mean():.3f} | "
                     f"{g.best_accuracy.mean():.3f} | " + " | ".join(cells) + " |")
    (out / "training.md").write_text("\n".join(lines) + "\n")
    if json_path:
        keys = ["allocator", "seed", "start_accuracy", "final_accuracy", "rollouts", "tokens", "rollouts_to_target"]
        recs = summary[keys].astype(object).where(summary[keys].notna(), None).to_dict(orient="records")
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(recs, indent=2) + "\n")
    return lines


def main(argv: list[str] | None = None) -> int:
    for key, value in ENVIRONMENT.items():  # the study's, before torch loads
        os.environ.setdefault(key, value)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one allocator, a few steps, a short warm start")
    ap.add_argument("--allocators", default=",".join(ALL))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=50000, help="rollout budget per run")
    ap.add_argument("--gains", default="0.10,0.20,0.25,0.30",
                    help="accuracy gains over each run's warm start to report rollouts-to-target for")
    ap.add_argument("--summarize-only", action="store_true",
                    help="rebuild tables and plots from an existing training.csv without training")
    ap.add_argument("--eval-every", type=int, default=5, help="steps between held-out evaluations")
    ap.add_argument("--eval-size", type=int, default=400)
    ap.add_argument("--lr", type=float, default=None, help="GRPO learning rate (default: train.lr's default)")
    ap.add_argument("--work", type=Path, default=Path("runs/benchmark"))
    ap.add_argument("--out", type=Path, default=None,
                    help="results folder (default benchmarks/results/archive/training; --quick: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.out = default_out(args.out, args.quick, "training", full=OUT)
    allocators = ["sara"] if args.quick else [a.strip() for a in args.allocators.split(",") if a.strip()]
    for a in allocators:
        if a not in ALL:
            ap.error(f"unknown allocator {a!r}; valid: {', '.join(ALL)}")
    seeds = 1 if args.quick else args.seeds
    budget = 2000 if args.quick else args.rollouts
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)

    gains = [float(g) for g in args.gains.split(",") if g.strip()]
    if args.summarize_only:
        curves = pd.read_csv(args.out / "training.csv")
    else:
        curves = run_all(args, allocators, seeds, budget)
        curves.to_csv(args.out / "training.csv", index=False)
    lines = report(curves, gains, args.out, args.json)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
