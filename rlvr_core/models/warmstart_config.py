"""The ``warmstart`` section of params.yaml: ``WarmStartConfig``, apart from the warm start itself
(``rlvr_core.models.warmstart``) so that reading params imports neither torch nor transformers: a pipeline stage
that trains nothing (prepare, report) starts in half the time."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from rlvr_core.errors import from_mapping, require


@dataclass(frozen=True)
class WarmStartConfig:
    """Knobs of the warm start (the ``warmstart`` section; defaults: the measured CPU default).

    Measured on 1-3 digit problems (held-out, 900 rows, 1 thread, noise 0.6):
    lr 3e-3 and 1.5e-3 trained much worse (loss 0.84 / 0.64) than 1e-3 and 7e-4
    (0.34 / 0.32 after 2400 steps); 7e-4 keeps a margin from that cliff.

    Each field's ``help`` (field metadata) documents it, as in ``rlvr_core.config``.
    """

    steps: int = field(default=2400, metadata={"help": "Optimiser steps of the supervised warm start."})
    batch_size: int = field(default=64, metadata={"help": "Sequences per warm-start step."})
    lr: float = field(default=7e-4, metadata={"help": (
        "Peak AdamW learning rate of the warm start, in (0, 1). 3e-3 and 1.5e-3 train much worse (see the "
        "class docstring).")})
    warmup: int = field(default=100, metadata={"help": (
        "Linear warm-up steps, then cosine decay to `min_lr_ratio * lr`.")})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "Final learning rate as a fraction of `lr`."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay of the warm start."})
    noise: float = field(default=0.8, metadata={"help": (
        "Probability that the teacher writes a noisy-difficulty row sloppily. Arithmetic: every carry or "
        "borrow dropped; countdown: a random expression over the problem's numbers.")})
    noisy_difficulties: tuple[int, ...] = field(default=(2, 3, 4), metadata={"help": (
        "Difficulties the sloppy teacher writes (1 to 4). A row's difficulty: its operand digits (arithmetic), "
        "how many numbers it gives (countdown).")})
    seed: int = field(default=0, metadata={"help": "Model init, batch order and the teacher's coins."})
    hidden: int = field(default=128, metadata={"help": (
        "Hidden size of the tiny Llama policy (`build_tiny_policy`). Divisible by `heads`, with an even head "
        "size.")})
    layers: int = field(default=2, metadata={"help": "Decoder layers of the tiny policy."})
    heads: int = field(default=4, metadata={"help": "Attention heads of the tiny policy."})
    intermediate: int = field(default=512, metadata={"help": "MLP width of the tiny policy."})
    log_every: int = field(default=100, metadata={"help": "Steps between progress reports and loss-curve points."})
    base_model: str | None = field(default=None, metadata={"help": (
        "A pretrained causal LM to start RL from instead of the tiny policy (docs/gpu.md). A hub id such as "
        "`Qwen/Qwen2.5-1.5B-Instruct` or a local folder: the stage trains nothing and snapshots that model and "
        "its tokenizer (`rlvr_core.models.policy.snapshot_base_model`); the other warmstart keys are unused. "
        "Null: the supervised warm start.")})

    def __post_init__(self) -> None:
        require(self.base_model is None or (isinstance(self.base_model, str) and self.base_model.strip() != ""),
                "base_model", f"got {self.base_model!r}; give a hub id, a local model folder, or null")
        require(isinstance(self.steps, int) and self.steps >= 1, "steps", f"must be an int >= 1, got {self.steps!r}")
        require(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size",
                f"must be an int >= 1, got {self.batch_size!r}")
        require(0 < self.lr < 1, "lr", f"must be in (0, 1), got {self.lr!r}")
        require(isinstance(self.warmup, int) and 0 <= self.warmup, "warmup",
                f"must be an int >= 0, got {self.warmup!r}")
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio!r}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay!r}")
        require(0 <= self.noise <= 1, "noise", f"must be a probability in [0, 1], got {self.noise!r}")
        object.__setattr__(self, "noisy_difficulties", tuple(self.noisy_difficulties))
        require(
            all(isinstance(d, int) and 1 <= d <= 4 for d in self.noisy_difficulties),
            "noisy_difficulties",
            f"must be difficulties in 1..4, got {self.noisy_difficulties!r}",
        )
        require(isinstance(self.log_every, int) and self.log_every >= 1, "log_every",
                f"must be an int >= 1, got {self.log_every!r}")
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
