"""The ``evaluate`` section: held-out evaluation of checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr_core.config.checks import _check_self
from rlvr_core.config.reading import short_repr
from rlvr_core.config.train import MAX_NEW_TOKENS
from rlvr_core.errors import require


@dataclass(frozen=True)
class EvaluateConfig:
    """Held-out evaluation of checkpoints: greedy accuracy and pass@k (the ``evaluate`` section)."""

    k: int = field(default=8, metadata={"help": "The k of the checkpoints' held-out pass@k."})
    n_samples: int = field(default=8, metadata={"help": (
        "Samples per held-out problem for pass@k (0: greedy accuracy only). Else at least `k`.")})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature of the pass@k samples (> 0)."})
    max_new_tokens: int = field(default=8, metadata={"help": (
        f"Longest completion in tokens, 1 to {MAX_NEW_TOKENS:,}. A task may need more (countdown: 16).")})

    def __post_init__(self) -> None:
        _check_self(self)
        require(self.k >= 1, "k", f"got {short_repr(self.k)}; need an int >= 1")
        require(self.n_samples == 0 or self.n_samples >= self.k, "n_samples",
                f"got {short_repr(self.n_samples)}; need 0 or an int >= k")
        require(self.temperature > 0, "temperature", f"got {short_repr(self.temperature)}; need > 0")
        require(1 <= self.max_new_tokens <= MAX_NEW_TOKENS, "max_new_tokens",
                f"got {self.max_new_tokens:,}; need 1 to {MAX_NEW_TOKENS:,} tokens (a 32k context)")

