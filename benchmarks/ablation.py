"""Ablation on the tiny policy: why VIGOR plateaus, and the learning rate of every allocator.

Each variant trains the warm-started policy of the first studies (``data_and_policy``: the easy setting,
runs/benchmark/policy, made there if missing; the superseded benchmarks/training.py trained it too) on the same
arithmetic data and rollout budget, evaluating held-out greedy accuracy every few steps. The variants separate
two suspects for VIGOR's plateau at the learning rate the project first used (lr 2e-4; this ablation is why the
default train.lr is now 1e-4):

- prompt diversity: VIGOR's 256-rollout step starts ~25 prompts and grows a few of them to 32
  rollouts, so an update sees fewer distinct mixed prompts than GRPO's 32 x 8
  (``vigor-budget512``: twice the rollouts per step, so about 51 prompts, at lr 2e-4);
- step size: the same learning rate applied to a gradient carried by fewer prompts
  (``*-lr2e-4`` against ``*-lr1e-4`` for every allocator of the default comparison).

A run whose updates collapse the policy shows it as steps with no effective group at all.

    python -m benchmarks.ablation [--rollouts 30000] [--seeds 3] [--variants grpo,vigor]

Writes benchmarks/results/ablation/ablation{.csv,.md,.png} and ablation_runs.csv: per variant the
accuracy curves, groups and effective groups per step (overall and over the last third of the steps), steps without an
effective group, and the final, best and last-third accuracy (means over the seeds). A run with
other rollouts, seeds, variants or eval schedule writes to a temporary folder (printed) instead,
unless --out names one.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.common import RESULTS, output_dir, results_dir, save_figure
from rlvr_core.config import TrainConfig
from rlvr_core.data.arithmetic import make_arithmetic
from rlvr_core.models.warmstart import WarmStartConfig, warm_start
from rlvr_core.training import check_and_train

FULL = {"rollouts": 30000, "seeds": 3, "eval_every": 5, "eval_size": 400}  # behind benchmarks/results/ablation/

# label -> (allocator, train-section overrides, allocator params)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "grpo-lr2e-4": ("grpo", {"lr": 2e-4}, {}),
    "grpo-lr1e-4": ("grpo", {"lr": 1e-4}, {}),
    "dapo-lr2e-4": ("dapo", {"lr": 2e-4}, {"max_gen_batches": 4}),
    "dapo-lr1e-4": ("dapo", {"lr": 1e-4}, {"max_gen_batches": 4}),
    "sara-lr2e-4": ("sara", {"lr": 2e-4}, {}),
    "sara-lr1e-4": ("sara", {"lr": 1e-4}, {}),
    "vigor-lr2e-4": ("vigor", {"lr": 2e-4}, {}),
    "vigor-lr1e-4": ("vigor", {"lr": 1e-4}, {}),
    "vigor-budget512": ("vigor", {"lr": 2e-4}, {"budget": 512}),
}


def data_and_policy(work: Path, quick: bool = False) -> tuple[Any, Path]:
    """The arithmetic DatasetDict of the first studies and its warm-started policy folder under ``work``
    (warm-started there on first use, reused after)."""
    ds = make_arithmetic(20000, 1000, seed=0, digits=(1, 2, 3))
    # the easy setting (benchmarks/study/plan.py EASY): the teacher sloppy (0.6) on 2- and 3-digit cells
    easy = {"noise": 0.6, "noisy_difficulties": (2, 3)}
    ws = WarmStartConfig(steps=60, **easy) if quick else WarmStartConfig(**easy)
    policy = work / ("policy_quick" if quick else "policy")
    if not (policy / "config.json").exists():
        print(f"warm start: {ws.steps} steps ...", flush=True)
        warm_start(ds["train"], **ws.sft_kwargs(), out_dir=policy)
    return ds, policy


def plot(curves: pd.DataFrame, labels: list[str], path: Path) -> None:
    """Seed-mean accuracy against cumulative rollouts: one colour per allocator, dashed at lr 1e-4,
    dotted for vigor-budget512."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    allocs = list(dict.fromkeys(VARIANTS[v][0] for v in labels))
    fig, ax = plt.subplots(figsize=(8, 5))
    for label in labels:
        c = curves[curves.variant == label]
        grid = np.linspace(0, c.cum_rollouts.max(), 40)
        ys = np.vstack([np.interp(grid, g.cum_rollouts, g.greedy_acc) for _, g in c.groupby("seed")])
        alloc, overrides, aparams = VARIANTS[label]
        style = ":" if aparams.get("budget") else "--" if overrides["lr"] == 1e-4 else "-"
        ax.plot(grid, ys.mean(0), style, color=f"C{allocs.index(alloc)}", label=label)
    ax.set_xlabel("cumulative rollouts")
    ax.set_ylabel("held-out greedy accuracy (mean over seeds)")
    ax.set_title("tiny policy, arithmetic: lr 2e-4 (solid) vs 1e-4 (dashed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    save_figure(fig, path)


def train_variant(label: str, seed: int, args: argparse.Namespace, ds: Any, policy: Path
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One run of a variant: its evaluation points and its per-step row."""
    alloc, overrides, aparams = VARIANTS[label]
    cfg = TrainConfig(allocator=alloc, steps=100000, max_rollouts=args.rollouts, seed=seed,
                      eval_every=args.eval_every, eval_size=args.eval_size, eval_samples=0,
                      checkpoint_every=100000, allocator_params={alloc: aparams} if aparams else {},
                      **overrides)
    t0 = time.perf_counter()
    res = check_and_train(cfg, policy_dir=policy, train_rows=ds["train"], test_rows=ds["test"],
                          run_dir=args.work / f"ablation-{label}-s{seed}", resume=False)
    steps = [r for r in res.metrics if r["step"] > 0]
    late = steps[len(steps) * 2 // 3:]
    row = {"variant": label, "seed": seed, "steps": len(steps),
           "groups_per_step": float(np.mean([r["groups"] for r in steps])),
           "effective_per_step": float(np.mean([r["effective_groups"] for r in steps])),
           "effective_per_step_late": float(np.mean([r["effective_groups"] for r in late])),
           "steps_without_effective": sum(r["effective_groups"] == 0 for r in steps),
           "rollouts_per_step": float(np.mean([r["rollouts"] for r in steps]))}
    points = [{"variant": label, "seed": seed, "step": r["step"], "cum_rollouts": r["cum_rollouts"],
               "greedy_acc": r["eval/greedy_acc"]} for r in res.metrics if "eval/greedy_acc" in r]
    accs = [p["greedy_acc"] for p in points]
    print(f"{label:16s} seed {seed}: {len(steps)} steps, acc {accs[0]:.3f} -> {accs[-1]:.3f} "
          f"(best {max(accs):.3f}) in {time.perf_counter() - t0:.0f} s", flush=True)
    return points, row


def markdown(curves: pd.DataFrame, per_step: pd.DataFrame, labels: list[str], args: argparse.Namespace) -> str:
    lines = [f"Variants on the tiny policy: {args.rollouts:,} rollouts per run, {args.seeds} seed(s), held-out greedy "
             f"accuracy on {args.eval_size} problems; means over the seeds (best acc: the best of any seed).", "",
             "| variant | steps | rollouts/step | groups/step | effective groups/step (last third) | "
             "steps without an effective group | final acc | best acc | acc over the last third |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label in labels:
        c, s = curves[curves.variant == label], per_step[per_step.variant == label]
        finals = c.sort_values("step").groupby("seed").greedy_acc.last()
        late = c[c.cum_rollouts >= c.cum_rollouts.max() * 2 / 3].greedy_acc
        lines.append(f"| {label} | {s.steps.mean():.0f} | {s.rollouts_per_step.mean():.0f} | "
                     f"{s.groups_per_step.mean():.1f} | {s.effective_per_step.mean():.1f} "
                     f"({s.effective_per_step_late.mean():.1f}) | {s.steps_without_effective.sum()} | "
                     f"{finals.mean():.3f} | {c.greedy_acc.max():.3f} | {late.mean():.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=FULL["rollouts"])
    ap.add_argument("--seeds", type=int, default=FULL["seeds"])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--eval-every", type=int, default=FULL["eval_every"])
    ap.add_argument("--eval-size", type=int, default=FULL["eval_size"])
    ap.add_argument("--work", type=Path, default=Path("runs/benchmark"))
    ap.add_argument("--out", type=Path, default=None,
                    help="results root, written under its ablation/ (default benchmarks/results for the full "
                         "protocol, else a temporary one)")
    ap.add_argument("--plot-only", action="store_true", help="redraw ablation.png from an existing ablation.csv")
    args = ap.parse_args(argv)
    labels = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in labels:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; valid: {', '.join(VARIANTS)}")
    if args.plot_only:
        out = output_dir(args.out or RESULTS, "ablation")
        curves = pd.read_csv(out / "ablation.csv")
        plot(curves, [v for v in labels if v in set(curves.variant)], out / "ablation.png")
        return 0
    full = labels == list(VARIANTS) and all(getattr(args, key) == v for key, v in FULL.items())
    out = output_dir(results_dir(args.out, full, "ablation"), "ablation")
    ds, policy = data_and_policy(args.work)  # the first studies' data and warm start
    points, steps_rows = [], []
    for label in labels:
        for seed in range(args.seeds):
            pts, row = train_variant(label, seed, args, ds, policy)
            points += pts
            steps_rows.append(row)
    curves, per_step = pd.DataFrame(points), pd.DataFrame(steps_rows)
    curves.to_csv(out / "ablation.csv", index=False)
    per_step.to_csv(out / "ablation_runs.csv", index=False)
    md = markdown(curves, per_step, labels, args)
    (out / "ablation.md").write_text(md)
    print(md, end="")
    plot(curves, labels, out / "ablation.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
