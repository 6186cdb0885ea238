"""Shared setup for the TRL integration tests: a tiny local chat model, arithmetic rows, scripted rewards."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.models.chat_model import build_chat_model

OPS = ("+", "-", "*")


def arithmetic_rows(n: int, *, chat: bool = True) -> list[dict[str, Any]]:
    """n distinct local arithmetic problems; ``pass_rate`` cycles 0, 0.5, 1.0 (used by the scripted reward)."""
    from rlvr_core.data.arithmetic import make_row

    rows = []
    for i in range(n):
        a, b, op = 10 + i, 3 + (i % 7), OPS[i % 3]
        row = make_row("train", i, a, op, b)
        if chat:
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
        row["pass_rate"] = (0.0, 0.5, 1.0)[i % 3]
        rows.append(row)
    return rows


class ScriptedReward:
    """Reward with known per-prompt pass rates, independent of the completion text.

    pass_rate 0 -> always 0; 1 -> always 1; 0.5 -> within each call, the rows of
    one prompt alternate 1, 0, 1, 0, ... so two or more rows of it in one round
    are mixed, half of them passing. Stateless across calls, so a resumed run
    scores as the uninterrupted one. Records (global_step, id) of every row.
    """

    __name__ = "scripted"

    def __init__(self) -> None:
        self.rows: list[tuple[int, str]] = []
        self.calls = 0

    def __call__(self, prompts, completions, id, pass_rate, trainer_state=None, **kw) -> list[float]:
        seen: dict[str, int] = defaultdict(int)
        out = []
        for q, p in zip(id, pass_rate):
            out.append((1.0 if seen[q] % 2 == 0 else 0.0) if p == 0.5 else float(p))
            seen[q] += 1
        step = trainer_state.global_step if trainer_state is not None else -1
        self.rows.extend((step, q) for q in id)
        self.calls += 1
        return out


def tiny_model(folder: Path) -> str:
    return str(build_chat_model(folder))


def grpo_config(out: Path, **over: Any):
    from trl import GRPOConfig

    kw = dict(output_dir=str(out), per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
              max_steps=2, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", seed=0,
              learning_rate=1e-4, dataloader_num_workers=0, disable_tqdm=True, bf16=False)
    kw.update(over)
    return GRPOConfig(**kw)
