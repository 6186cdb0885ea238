"""Task: comparison report from the runs' metrics.jsonl and the held-out evaluation."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

CURVE_FIELDS = ("step", "cum_rollouts", "cum_tokens", "greedy_acc")


def curve_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows (step, cum_rollouts, cum_tokens, greedy_acc) at every evaluated step of a run's step records."""
    return [{"step": r["step"], "cum_rollouts": r["cum_rollouts"], "cum_tokens": r["cum_tokens"],
             "greedy_acc": r["eval/greedy_acc"]} for r in history if "eval/greedy_acc" in r]


def eval_curve(metrics_jsonl: Path) -> list[dict[str, Any]]:
    """``curve_rows`` of a run's metrics.jsonl."""
    return curve_rows([json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()])


def write_curve(history: list[dict[str, Any]], path: Path) -> None:
    """One run's held-out accuracy curve as CSV (a DVC plot: x cum_rollouts, y greedy_acc)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        w.writeheader()
        w.writerows(curve_rows(history))


@task(retries=0, cache_policy=NO_CACHE)
def write_report(runs: dict[str, str], evaluation: dict[str, dict[str, Any]], out_dir: str) -> dict[str, Any]:
    """Plots (accuracy vs cumulative rollouts / tokens), curves.csv, comparison.md and metrics.json under ``out_dir``.

    ``runs`` maps allocator -> run folder; ``evaluation`` maps allocator -> held-out metrics.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    curves = {a: eval_curve(Path(d) / "metrics.jsonl") for a, d in runs.items()}
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["allocator", "step", "cum_rollouts", "cum_tokens", "greedy_acc"])
        w.writeheader()
        for a, rows in curves.items():
            for r in rows:
                w.writerow({"allocator": a, **r})
    for x, fname in (("cum_rollouts", "accuracy_vs_rollouts.png"), ("cum_tokens", "accuracy_vs_tokens.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for a, rows in curves.items():
            ax.plot([r[x] for r in rows], [r["greedy_acc"] for r in rows], marker="o", label=a)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel("held-out greedy accuracy")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100, metadata={"Software": None})
        plt.close(fig)
    metrics: dict[str, Any] = {}
    lines = ["| allocator | greedy acc (held-out) | pass@k | rollouts | tokens | acc gain per 1k rollouts |",
             "|---|---|---|---|---|---|"]
    for a, rows in curves.items():
        ev = evaluation.get(a, {})
        passk = next((v for k, v in ev.items() if k.startswith("pass_at_") and k != "pass_at_1"), None)
        first, last = rows[0], rows[-1]
        gain = (last["greedy_acc"] - first["greedy_acc"]) / max(last["cum_rollouts"], 1) * 1000
        metrics[a] = {"greedy_acc": ev.get("greedy_acc", last["greedy_acc"]), "pass_at_k": passk,
                      "rollouts": last["cum_rollouts"], "tokens": last["cum_tokens"], "gain_per_1k_rollouts": gain}
        lines.append(f"| {a} | {metrics[a]['greedy_acc']:.3f} | {'-' if passk is None else f'{passk:.3f}'} | "
                     f"{last['cum_rollouts']} | {last['cum_tokens']} | {gain:+.4f} |")
    (out / "comparison.md").write_text("# Allocator comparison\n\n" + "\n".join(lines) + "\n")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\n")
    return metrics
