"""Supervised warm start of the tiny policy on worked arithmetic answers.

The warm start stands in for the pretrained base model of a real RLVR run, and
it is deliberately *flawed*: a "sloppy teacher" writes a fraction ``noise`` of
the targets of the noisy difficulties (default 2- and 3-digit problems) with
every carry (``+``, ``*``) or borrow (``-``) dropped, e.g.

    0047+0083=  clean 130 -> "031"   sloppy 20 (7+3 -> 0, 4+8 -> 2) -> "02"
    0083-0047=  clean 36  -> "63"    sloppy 46 (3-7 -> 6, 8-4 -> 4) -> "64"
    0047*0003=  clean 141 -> "141"   sloppy 21 (7*3 -> 1, 4*3 -> 2) -> "12"

This is a model of a flawed base policy, not a claim about real ones: it puts
the right behaviour into the policy's samples but not into its mode (greedy
answers), which is the regime where RL with verifiable rewards visibly helps
and where prompts split into all-pass, all-fail and mixed groups. A clean
warm start instead leaves *missing* skills (carried digits at chance) that
GRPO barely moves in minutes of CPU time.

The teacher is stochastic: every time a noisy-difficulty row is drawn into a
batch it is written sloppily with probability ``noise`` (problems without a
carry or borrow come out the same either way). Training is plain next-token
cross-entropy on the completion (answer digits + ``<eos>``), AdamW with linear
warm-up and cosine decay. Everything is deterministic by ``seed``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from rlvr_core.data.arithmetic import OPS, apply_op, format_answer
from rlvr_core.errors import from_mapping, require
from rlvr_core.models.tiny import build_tiny_policy, num_parameters, save_policy
from rlvr_core.models.tokenizer import EOS_ID, PAD_ID, encode_prompts

Progress = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class WarmStartConfig:
    """Knobs of the warm start (defaults: the measured CPU default, ~3 minutes).

    Measured on 1-3 digit problems (held-out, 900 rows, 1 thread, noise 0.6):
    lr 3e-3 and 1.5e-3 trained much worse (loss 0.84 / 0.64) than 1e-3 and 7e-4
    (0.34 / 0.32 after 2400 steps); 7e-4 keeps a margin from that cliff.

    steps:         optimiser steps
    batch_size:    sequences per step
    lr:            peak AdamW learning rate
    warmup:        linear warm-up steps (then cosine decay to ``min_lr_ratio * lr``)
    min_lr_ratio:  final learning rate as a fraction of ``lr``
    weight_decay:  AdamW weight decay
    noise:         probability that the teacher drops carries/borrows on a noisy-difficulty row
    noisy_difficulties: difficulties (operand digit counts) the teacher is sloppy on
    seed:          model init, batch order and teacher coins
    hidden, layers, heads, intermediate: tiny policy size (see ``build_tiny_policy``)
    log_every:     steps between progress reports / loss-curve points
    base_model:    a pretrained causal LM (hub id such as "Qwen/Qwen2.5-1.5B-Instruct", or a
                   local folder) to start RL from instead of the tiny policy: the warm-start
                   stage then trains nothing and snapshots that model and its tokenizer
                   (``rlvr_core.models.policy.snapshot_base_model``); the other knobs are unused.
                   null (default): the supervised warm start above.
    """

    steps: int = 2400
    batch_size: int = 64
    lr: float = 7e-4
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    noise: float = 0.8
    noisy_difficulties: tuple[int, ...] = (2, 3, 4)
    seed: int = 0
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 512
    log_every: int = 100
    base_model: str | None = None

    def __post_init__(self) -> None:
        require(self.base_model is None or (isinstance(self.base_model, str) and self.base_model.strip() != ""),
                "base_model", f"got {self.base_model!r}; give a hub id, a local model folder, or null")
        require(isinstance(self.steps, int) and self.steps >= 1, "steps", f"must be an int >= 1, got {self.steps!r}")
        require(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size", f"must be an int >= 1, got {self.batch_size!r}")
        require(0 < self.lr < 1, "lr", f"must be in (0, 1), got {self.lr!r}")
        require(isinstance(self.warmup, int) and 0 <= self.warmup, "warmup", f"must be an int >= 0, got {self.warmup!r}")
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio!r}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay!r}")
        require(0 <= self.noise <= 1, "noise", f"must be a probability in [0, 1], got {self.noise!r}")
        object.__setattr__(self, "noisy_difficulties", tuple(self.noisy_difficulties))
        require(
            all(isinstance(d, int) and 1 <= d <= 4 for d in self.noisy_difficulties),
            "noisy_difficulties",
            f"must be difficulties in 1..4, got {self.noisy_difficulties!r}",
        )
        require(isinstance(self.log_every, int) and self.log_every >= 1, "log_every", f"must be an int >= 1, got {self.log_every!r}")
        # the model size is validated by tiny_config when the policy is built

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "WarmStartConfig":
        """Build from a mapping (e.g. a params.yaml section); unknown keys are rejected."""
        return from_mapping(cls, d, "warmstart")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sft_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``warm_start``: every field but ``base_model``, which replaces the SFT."""
        return {k: v for k, v in self.to_dict().items() if k != "base_model"}


def sloppy_value(a: int, op: str, b: int) -> int:
    """``a op b`` computed digit by digit with every carry / borrow dropped.

    ``+``: digit i is (a_i + b_i) mod 10; ``-``: (a_i - b_i) mod 10 (no borrow);
    ``*`` (b one digit): (a_i * b) mod 10; no carry-out digit is written.
    Equals the exact result when the problem has no carry or borrow.
    """
    if op not in OPS:
        raise ValueError(f"op: must be one of {OPS}, got {op!r}")
    da, db = str(a)[::-1], str(b)[::-1]
    width = max(len(da), len(db)) if op != "*" else len(da)
    digits = []
    for i in range(width):
        x = int(da[i]) if i < len(da) else 0
        if op == "*":
            digits.append((x * b) % 10)
        else:
            y = int(db[i]) if i < len(db) else 0
            digits.append((x + y) % 10 if op == "+" else (x - y) % 10)
    return int("".join(str(d) for d in reversed(digits)))


def _rows_columns(rows: Any) -> dict[str, list]:
    if hasattr(rows, "column_names"):  # datasets.Dataset
        missing = [c for c in ("prompt", "a", "b", "op", "difficulty") if c not in rows.column_names]
        if missing:
            raise ValueError(f"train_rows: missing columns {missing}; expected rows from make_arithmetic")
        return {c: list(rows[c]) for c in ("prompt", "a", "b", "op", "difficulty")}
    cols: dict[str, list] = {c: [] for c in ("prompt", "a", "b", "op", "difficulty")}
    for i, r in enumerate(rows):
        for c in cols:
            if c not in r:
                raise ValueError(f"train_rows[{i}]: missing field {c!r}; expected rows from make_arithmetic")
            cols[c].append(r[c])
    return cols


def _encode_targets(prompt_ids: list[list[int]], targets: Sequence[str], tok: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``bos + prompt + target + eos`` and the loss mask.

    Returns ids (N, L) int64 and mask (N, L) bool, where mask[i, t] marks that
    position t predicts a target token (target or eos) at t + 1.
    """
    tgt = [tok.convert_tokens_to_ids(list(t)) + [EOS_ID] for t in targets]
    width = max(len(p) + len(t) for p, t in zip(prompt_ids, tgt))
    ids = torch.full((len(tgt), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(tgt), width), dtype=torch.bool)
    for i, (p, t) in enumerate(zip(prompt_ids, tgt)):
        ids[i, : len(p) + len(t)] = torch.as_tensor(p + t)
        mask[i, len(p) - 1 : len(p) + len(t) - 1] = True
    return ids, mask


def warm_start(
    train_rows: Any,
    *,
    steps: int = WarmStartConfig.steps,
    batch_size: int = WarmStartConfig.batch_size,
    lr: float = WarmStartConfig.lr,
    noise: float = WarmStartConfig.noise,
    seed: int = WarmStartConfig.seed,
    noisy_difficulties: Sequence[int] = WarmStartConfig.noisy_difficulties,
    warmup: int = WarmStartConfig.warmup,
    min_lr_ratio: float = WarmStartConfig.min_lr_ratio,
    weight_decay: float = WarmStartConfig.weight_decay,
    hidden: int = WarmStartConfig.hidden,
    layers: int = WarmStartConfig.layers,
    heads: int = WarmStartConfig.heads,
    intermediate: int = WarmStartConfig.intermediate,
    log_every: int = WarmStartConfig.log_every,
    out_dir: str | Path | None = None,
    progress: Progress | None = None,
    eval_rows: Any = None,
    eval_samples: int = 8,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train a fresh tiny policy on sloppy-teacher answers to ``train_rows``.

    Args:
        train_rows: arithmetic rows (``make_arithmetic(...)["train"]`` or mappings
            with prompt, a, b, op, difficulty); batches are drawn with replacement.
        steps ... log_every: see ``WarmStartConfig`` (validated there).
        out_dir: if given, the policy is saved there with ``save_policy``.
        progress: called as ``progress(step, {"loss": ..., "lr": ...})`` every
            ``log_every`` steps and after the last one.
        eval_rows: optional held-out rows; adds ``heldout_*`` metrics from
            ``evaluate_policy`` (greedy per difficulty, pass@1, pass@8, group shares).
    Returns:
        (model, tokenizer, metrics) with metrics: params, steps, seconds,
        train_seconds, final_loss, loss_curve (list of [step, loss]),
        sloppy_fraction (share of drawn targets that differed from the clean
        answer), config (the WarmStartConfig as a dict), and heldout_* values.
    """
    cfg = WarmStartConfig(
        steps=steps, batch_size=batch_size, lr=lr, warmup=warmup, min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay, noise=noise, noisy_difficulties=tuple(noisy_difficulties), seed=seed,
        hidden=hidden, layers=layers, heads=heads, intermediate=intermediate, log_every=log_every,
    )  # fmt: skip
    t_start = time.perf_counter()
    cols = _rows_columns(train_rows)
    n = len(cols["prompt"])
    require(n > 0, "train_rows", "is empty")
    model, tok = build_tiny_policy(cfg.hidden, cfg.layers, cfg.heads, cfg.intermediate, seed=cfg.seed)

    prompt_ids = encode_prompts(tok, cols["prompt"])
    clean = [format_answer(apply_op(int(a), op, int(b))) for a, op, b in zip(cols["a"], cols["op"], cols["b"])]
    sloppy = [format_answer(sloppy_value(int(a), op, int(b))) for a, op, b in zip(cols["a"], cols["op"], cols["b"])]
    clean_ids, clean_mask = _encode_targets(prompt_ids, clean, tok)
    sloppy_ids, sloppy_mask = _encode_targets(prompt_ids, sloppy, tok)
    width = max(clean_ids.shape[1], sloppy_ids.shape[1])
    clean_ids, sloppy_ids = (torch.nn.functional.pad(x, (0, width - x.shape[1]), value=PAD_ID) for x in (clean_ids, sloppy_ids))
    clean_mask, sloppy_mask = (torch.nn.functional.pad(x, (0, width - x.shape[1]), value=False) for x in (clean_mask, sloppy_mask))
    noisy_row = torch.as_tensor([int(d) in cfg.noisy_difficulties for d in cols["difficulty"]])
    differs = torch.as_tensor([c != s for c, s in zip(clean, sloppy)])

    rng = np.random.default_rng(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    loss_curve: list[list[float]] = []
    window: list[float] = []
    n_sloppy = 0
    t_train = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for step in range(cfg.steps):
            idx = torch.as_tensor(rng.integers(0, n, size=cfg.batch_size))
            coin = torch.as_tensor(rng.random(cfg.batch_size) < cfg.noise) & noisy_row[idx]
            n_sloppy += int((coin & differs[idx]).sum())
            ids = torch.where(coin[:, None], sloppy_ids[idx], clean_ids[idx])
            mask = torch.where(coin[:, None], sloppy_mask[idx], clean_mask[idx])
            # trim the right padding shared by the whole batch
            used = int(mask.any(0).nonzero().max()) + 2
            ids, mask = ids[:, :used], mask[:, :used]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            logits = model(input_ids=ids[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits[mask[:, :-1]], ids[:, 1:][mask[:, :-1]])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            window.append(float(loss.detach()))
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                mean_loss = float(np.mean(window))
                loss_curve.append([step + 1, mean_loss])
                window = []
                if progress is not None:
                    progress(step + 1, {"loss": mean_loss, "lr": lr_at(step)})
    model.eval()
    train_seconds = time.perf_counter() - t_train

    metrics: dict[str, Any] = {
        "params": num_parameters(model),
        "steps": cfg.steps,
        "train_seconds": train_seconds,
        "final_loss": loss_curve[-1][1],
        "loss_curve": loss_curve,
        "sloppy_fraction": n_sloppy / (cfg.steps * cfg.batch_size),
        "config": cfg.sft_kwargs(),
    }
    if eval_rows is not None:
        from rlvr_core.evaluation import evaluate_policy

        t_eval = time.perf_counter()
        ev = evaluate_policy((model, tok), eval_rows, "arithmetic", k=8, n_samples=eval_samples, seed=cfg.seed)
        metrics.update({f"heldout_{k}": v for k, v in ev.items()})
        metrics["eval_seconds"] = time.perf_counter() - t_eval
    if out_dir is not None:
        save_policy(model, tok, out_dir)
    metrics["seconds"] = time.perf_counter() - t_start
    return model, tok, metrics


__all__ = ["WarmStartConfig", "sloppy_value", "warm_start"]
