"""Supervised warm start of the tiny policy on a sloppy teacher's answers (arithmetic, Countdown).

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

Each task with a warm start declares its teacher in ``rlvr_core.tasks`` (``Task.teacher``):
``arithmetic_targets`` as above, and ``countdown_targets``, whose sloppy teacher writes a random
expression over the problem's numbers instead of the recorded solution (difficulty: how many
numbers, so the default noisy difficulties (2, 3) make the 3-number problems noisy). Tasks
without one (math, code: text the character vocabulary cannot write) start from a pretrained
model (``base_model``). ``warm_start`` receives the teacher (``rlvr_core.tasks.warm_start_teacher``
looks a task's up) and, for held-out figures, an evaluation function: this module sits on the
models floor, below the task registry and the evaluation (docs/design.md §2.1).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from rlvr_core.data.arithmetic import OPS, apply_op, format_answer
from rlvr_core.errors import require
from rlvr_core.models.integrity import write_policy_record
from rlvr_core.models.tiny import build_tiny_policy, num_parameters, save_policy
from rlvr_core.models.tokenizer import EOS_ID, PAD_ID, encode_prompts
from rlvr_core.models.warmstart_config import WarmStartConfig

Progress = Callable[[int, dict[str, float]], None]
Evaluate = Callable[[Any, Any], Mapping[str, Any]]  # (model, tokenizer) -> held-out figures


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


@dataclass(frozen=True)
class TeacherTargets:
    """What the warm start trains on, one entry per training row.

    prompts:    the row's prompt (what the tiny policy reads)
    clean:      the teacher's correct completion (without ``<eos>``)
    sloppy:     the sloppy teacher's completion, written instead with probability ``noise``
                on rows whose difficulty is in ``noisy_difficulties``
    difficulty: the row's difficulty (arithmetic: operand digits; Countdown: numbers given)
    """

    prompts: list[str]
    clean: list[str]
    sloppy: list[str]
    difficulty: list[int]


Teacher = Callable[[Any], TeacherTargets]  # a task's warm-start teacher: training rows -> targets


def _columns(rows: Any, names: Sequence[str], made_by: str) -> dict[str, list]:
    if hasattr(rows, "column_names"):  # datasets.Dataset
        missing = [c for c in names if c not in rows.column_names]
        if missing:
            raise ValueError(f"train_rows: missing columns {missing}; expected rows from {made_by}")
        return {c: list(rows[c]) for c in names}
    cols: dict[str, list] = {c: [] for c in names}
    for i, r in enumerate(rows):
        for c in cols:
            if c not in r:
                raise ValueError(f"train_rows[{i}]: missing field {c!r}; expected rows from {made_by}")
            cols[c].append(r[c])
    return cols


def arithmetic_targets(rows: Any) -> TeacherTargets:
    """Arithmetic: the answer's digits reversed (``format_answer``), sloppily with every carry/borrow dropped."""
    cols = _columns(rows, ("prompt", "a", "b", "op", "difficulty"), "make_arithmetic")
    triples = list(zip(cols["a"], cols["op"], cols["b"]))
    return TeacherTargets(
        prompts=cols["prompt"],
        clean=[format_answer(apply_op(int(a), op, int(b))) for a, op, b in triples],
        sloppy=[format_answer(sloppy_value(int(a), op, int(b))) for a, op, b in triples],
        difficulty=[int(d) for d in cols["difficulty"]],
    )


def countdown_targets(rows: Any) -> TeacherTargets:
    """Countdown: the generator's recorded expression; the sloppy teacher writes a random expression over
    the same numbers (seeded by the row id, so the same every run), which reaches the target only by chance.

    Like the arithmetic teacher's dropped carries, the sloppy answer is well formed (every number once,
    only ``+ - * /`` and parentheses) but mostly wrong, so the right answers are among the policy's
    samples without being all of them.
    """
    import random

    from rlvr_core.data.countdown import random_expression

    cols = _columns(rows, ("id", "prompt", "numbers", "answer"), "make_countdown")
    sloppy = []
    for ident, numbers, answer in zip(cols["id"], cols["numbers"], cols["answer"]):
        rng = random.Random(f"sloppy-{ident}")
        expr = None
        for _ in range(100):  # a division by zero draws again
            if (expr := random_expression(list(numbers), rng)) is not None:
                break
        sloppy.append(expr[1] if expr is not None else answer)
    return TeacherTargets(prompts=cols["prompt"], clean=[str(a) for a in cols["answer"]], sloppy=sloppy,
                          difficulty=[len(n) for n in cols["numbers"]])


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


def _lr_at(cfg: WarmStartConfig, step: int) -> float:
    """The learning rate of ``step``: linear warm-up to ``cfg.lr``, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass(frozen=True)
class _SFTData:
    """The encoded targets of both teachers, padded to one width, and what batches draw from them.

    clean_ids, clean_mask, sloppy_ids, sloppy_mask: (N, L) as ``_encode_targets`` returns them
    noisy_row: (N,) bool, the row's difficulty is one the teacher is sloppy on
    differs:   (N,) bool, the sloppy completion differs from the clean one
    """

    clean_ids: torch.Tensor
    clean_mask: torch.Tensor
    sloppy_ids: torch.Tensor
    sloppy_mask: torch.Tensor
    noisy_row: torch.Tensor
    differs: torch.Tensor

    @classmethod
    def build(cls, targets: TeacherTargets, tok: Any, noisy_difficulties: Sequence[int]) -> "_SFTData":
        prompt_ids = encode_prompts(tok, targets.prompts)
        clean, sloppy = targets.clean, targets.sloppy
        clean_ids, clean_mask = _encode_targets(prompt_ids, clean, tok)
        sloppy_ids, sloppy_mask = _encode_targets(prompt_ids, sloppy, tok)
        width = max(clean_ids.shape[1], sloppy_ids.shape[1])
        pad = torch.nn.functional.pad
        clean_ids, sloppy_ids = (pad(x, (0, width - x.shape[1]), value=PAD_ID) for x in (clean_ids, sloppy_ids))
        clean_mask, sloppy_mask = (pad(x, (0, width - x.shape[1]), value=False) for x in (clean_mask, sloppy_mask))
        noisy_row = torch.as_tensor([int(d) in noisy_difficulties for d in targets.difficulty])
        differs = torch.as_tensor([c != s for c, s in zip(clean, sloppy)])
        return cls(clean_ids, clean_mask, sloppy_ids, sloppy_mask, noisy_row, differs)

    def batch(self, rng: np.random.Generator, batch_size: int, noise: float) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Draw ``batch_size`` rows with replacement, each noisy row sloppy with probability ``noise``.

        Returns (ids, mask) trimmed of the right padding the whole batch shares, and how
        many drawn targets differ from the clean answer.
        """
        idx = torch.as_tensor(rng.integers(0, self.clean_ids.shape[0], size=batch_size))
        coin = torch.as_tensor(rng.random(batch_size) < noise) & self.noisy_row[idx]
        n_sloppy = int((coin & self.differs[idx]).sum())
        ids = torch.where(coin[:, None], self.sloppy_ids[idx], self.clean_ids[idx])
        mask = torch.where(coin[:, None], self.sloppy_mask[idx], self.clean_mask[idx])
        used = int(mask.any(0).nonzero().max()) + 2
        return ids[:, :used], mask[:, :used], n_sloppy


def _sft_step(model: Any, opt: torch.optim.Optimizer, ids: torch.Tensor, mask: torch.Tensor, lr: float) -> float:
    """One AdamW step at ``lr`` on the cross-entropy of the masked next tokens (grad norm clipped to 1); its loss."""
    for g in opt.param_groups:
        g["lr"] = lr
    logits = model(input_ids=ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits[mask[:, :-1]], ids[:, 1:][mask[:, :-1]])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _train(targets: TeacherTargets, cfg: WarmStartConfig, progress: Progress | None) -> tuple[Any, Any, dict[str, Any]]:
    """Build the tiny policy and train it on ``targets`` for ``cfg.steps`` steps.

    Returns (model, tokenizer, metrics) with params, steps, train_seconds, final_loss,
    loss_curve, sloppy_fraction and config (see ``warm_start``).
    """
    model, tok = build_tiny_policy(cfg.hidden, cfg.layers, cfg.heads, cfg.intermediate, seed=cfg.seed)
    data = _SFTData.build(targets, tok, cfg.noisy_difficulties)
    rng = np.random.default_rng(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    model.train()
    loss_curve: list[list[float]] = []
    window: list[float] = []
    n_sloppy = 0
    t_train = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for step in range(cfg.steps):
            ids, mask, drawn_sloppy = data.batch(rng, cfg.batch_size, cfg.noise)
            n_sloppy += drawn_sloppy
            window.append(_sft_step(model, opt, ids, mask, _lr_at(cfg, step)))
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                mean_loss = float(np.mean(window))
                loss_curve.append([step + 1, mean_loss])
                window = []
                if progress is not None:
                    progress(step + 1, {"loss": mean_loss, "lr": _lr_at(cfg, step)})
    model.eval()
    metrics: dict[str, Any] = {
        "params": num_parameters(model),
        "steps": cfg.steps,
        "train_seconds": time.perf_counter() - t_train,
        "final_loss": loss_curve[-1][1],
        "loss_curve": loss_curve,
        "sloppy_fraction": n_sloppy / (cfg.steps * cfg.batch_size),
        "config": cfg.sft_kwargs(),
    }
    return model, tok, metrics


def _heldout_metrics(model: Any, tok: Any, evaluate: Evaluate) -> dict[str, Any]:
    """``evaluate(model, tok)``'s figures as heldout_*, and eval_seconds."""
    t_eval = time.perf_counter()
    metrics: dict[str, Any] = {f"heldout_{k}": v for k, v in evaluate(model, tok).items()}
    metrics["eval_seconds"] = time.perf_counter() - t_eval
    return metrics


def warm_start(
    train_rows: Any,
    *,
    teacher: Teacher = arithmetic_targets,
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
    evaluate: Evaluate | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train a fresh tiny policy on sloppy-teacher answers to ``train_rows``.

    Args:
        train_rows: rows the teacher reads (arithmetic: ``make_arithmetic(...)["train"]`` or mappings
            with prompt, a, b, op, difficulty; countdown: ``make_countdown``'s rows with id,
            prompt, numbers, answer); batches are drawn with replacement.
        teacher: writes the targets (``TeacherTargets``) from ``train_rows``: a task's
            ``Task.teacher`` (``rlvr_core.tasks.warm_start_teacher(name)``; arithmetic's by default).
        steps ... log_every: see ``WarmStartConfig`` (validated there).
        out_dir: if given, the policy is saved there with ``save_policy``, with its ``sha256.json``
            (``rlvr_core.models.integrity``).
        progress: called as ``progress(step, {"loss": ..., "lr": ...})`` every
            ``log_every`` steps and after the last one.
        evaluate: optional ``evaluate(model, tokenizer) -> {name: value}`` run on the trained policy
            (e.g. ``evaluate_policy`` on held-out rows); its figures become ``heldout_*`` metrics.
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
    targets = teacher(train_rows)
    require(len(targets.prompts) > 0, "train_rows", "is empty")
    model, tok, metrics = _train(targets, cfg, progress)
    if evaluate is not None:
        metrics.update(_heldout_metrics(model, tok, evaluate))
    if out_dir is not None:
        save_policy(model, tok, out_dir)
        write_policy_record(out_dir)  # sha256.json: checked before a run trains on the folder
    metrics["seconds"] = time.perf_counter() - t_start
    return model, tok, metrics


__all__ = ["Teacher", "TeacherTargets", "WarmStartConfig", "arithmetic_targets", "countdown_targets", "sloppy_value",
           "warm_start"]
