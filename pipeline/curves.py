"""A run's held-out accuracy curve from its step records (metrics.jsonl): the train flow's curve.csv and the
report's input."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rlvr_core.safefs import write_text_atomic

CURVE_FIELDS = ("step", "cum_rollouts", "cum_tokens", "greedy_acc")


def curve_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows (step, cum_rollouts, cum_tokens, greedy_acc) at every evaluated step of a run's step records."""
    return [{"step": r["step"], "cum_rollouts": r["cum_rollouts"], "cum_tokens": r["cum_tokens"],
             "greedy_acc": r["eval/greedy_acc"]} for r in history if "eval/greedy_acc" in r]


def read_history(metrics_jsonl: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]


def eval_curve(metrics_jsonl: Path) -> list[dict[str, Any]]:
    """``curve_rows`` of a run's metrics.jsonl."""
    return curve_rows(read_history(metrics_jsonl))


def write_curve(history: list[dict[str, Any]], path: Path) -> None:
    """One run's held-out accuracy curve as CSV (a DVC plot: x cum_rollouts, y greedy_acc)."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=CURVE_FIELDS)
    w.writeheader()
    w.writerows(curve_rows(history))
    write_text_atomic(path, buf.getvalue())  # never through a planted link (rlvr_core.safefs)
