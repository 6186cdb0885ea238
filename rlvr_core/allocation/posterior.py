"""Per-prompt evidence carried across steps, and a population prior (docs/design.md §4.6).

Ours, beyond the papers. The policy drifts while it trains, so evidence about
a prompt's pass rate ages: passes and fails seen ``t`` steps ago count
``decay ** t``. The population prior Beta(a, b) is either fixed (uniform by
default) or fitted by empirical Bayes to the pass rates of recently finished
prompts. A prompt's prior for SARA's p_eff and for prompt selection is the
population prior plus its decayed evidence.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.beta_binomial import fit_beta_moments
from rlvr_core.errors import require


@dataclass(frozen=True)
class PriorConfig:
    """How SARA and prompt selection form each prompt's Beta prior.

    kind: "uniform" (Beta(a0, b0) for every prompt, the paper's setting),
          "carry" (plus each prompt's decayed evidence from earlier steps),
          "eb" (population prior fitted to recent pass rates),
          "carry+eb" (both).
    """

    kind: str = "uniform"
    a0: float = 1.0  # population prior pseudo-passes (before any fitting)
    b0: float = 1.0  # population prior pseudo-fails
    decay: float = 0.9  # per-step weight on carried evidence, in (0, 1]
    max_evidence: float = 16.0  # cap on a prompt's carried pseudo-counts (a + b)
    eb_window: int = 512  # finished prompts used to fit the population prior
    eb_min_prompts: int = 32  # fit only once this many are available

    def __post_init__(self) -> None:
        require(self.kind in ("uniform", "carry", "eb", "carry+eb"), "prior.kind",
                f"got {self.kind!r}; use one of 'uniform', 'carry', 'eb', 'carry+eb'")
        require(self.a0 > 0 and self.b0 > 0, "prior.a0/b0", "Beta prior pseudo-counts must be > 0")
        require(0.0 < self.decay <= 1.0, "prior.decay", f"got {self.decay}; must lie in (0, 1]")
        require(self.max_evidence > 0, "prior.max_evidence", "must be > 0")
        require(self.eb_window >= 2, "prior.eb_window", "must be >= 2")
        require(self.eb_min_prompts >= 2, "prior.eb_min_prompts", "must be >= 2")

    @property
    def carry(self) -> bool:
        return self.kind in ("carry", "carry+eb")

    @property
    def empirical_bayes(self) -> bool:
        return self.kind in ("eb", "carry+eb")


class PromptPosterior:
    """Population prior plus per-prompt decayed evidence, keyed by prompt id."""

    def __init__(self, config: PriorConfig) -> None:
        self.config = config
        self.step = 0
        self.a_pop, self.b_pop = config.a0, config.b0
        self._passes: dict[int, float] = {}
        self._fails: dict[int, float] = {}
        self._seen: dict[int, int] = {}
        self._recent: deque[tuple[int, int]] = deque(maxlen=config.eb_window)

    def prior(self, prompt_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Beta(a, b) per prompt: arrays of shape (len(prompt_ids),)."""
        n = len(prompt_ids)
        a = np.full(n, self.a_pop)
        b = np.full(n, self.b_pop)
        if self.config.carry and self._seen:
            for i, q in enumerate(np.asarray(prompt_ids).tolist()):
                if q in self._seen:
                    w = self.config.decay ** (self.step - self._seen[q])
                    a[i] += w * self._passes[q]
                    b[i] += w * self._fails[q]
        return a, b

    def has_evidence(self, prompt_ids: np.ndarray) -> np.ndarray:
        """(len(prompt_ids),) bool: the prompt carries evidence from earlier steps."""
        if not self.config.carry:
            return np.zeros(len(prompt_ids), bool)
        return np.fromiter((q in self._seen for q in np.asarray(prompt_ids).tolist()), bool, len(prompt_ids))

    def record(self, prompt_ids: np.ndarray, passes: np.ndarray, counts: np.ndarray) -> None:
        """Add this step's evidence (passes of counts rollouts) for each prompt."""
        cap = self.config.max_evidence
        for q, s, n in zip(np.asarray(prompt_ids).tolist(), np.asarray(passes).tolist(), np.asarray(counts).tolist()):
            if n <= 0:
                continue
            self._recent.append((int(s), int(n)))
            if self.config.carry:
                w = self.config.decay ** (self.step - self._seen[q]) if q in self._seen else 0.0
                ps = w * self._passes.get(q, 0.0) + s
                fs = w * self._fails.get(q, 0.0) + (n - s)
                tot = ps + fs
                if tot > cap:
                    ps, fs = ps * cap / tot, fs * cap / tot
                self._passes[q], self._fails[q], self._seen[q] = ps, fs, self.step

    def end_step(self) -> None:
        """Advance the clock one training step and refit the population prior if asked."""
        self.step += 1
        if self.config.empirical_bayes and len(self._recent) >= self.config.eb_min_prompts:
            arr = np.asarray(self._recent, np.float64)
            self.a_pop, self.b_pop = fit_beta_moments(arr[:, 0] / arr[:, 1], arr[:, 1])

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "a_pop": self.a_pop, "b_pop": self.b_pop,
            "passes": dict(self._passes), "fails": dict(self._fails), "seen": dict(self._seen),
            "recent": list(self._recent),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.a_pop, self.b_pop = float(state["a_pop"]), float(state["b_pop"])
        self._passes = {int(k): float(v) for k, v in state["passes"].items()}
        self._fails = {int(k): float(v) for k, v in state["fails"].items()}
        self._seen = {int(k): int(v) for k, v in state["seen"].items()}
        self._recent = deque((tuple(x) for x in state["recent"]), maxlen=self.config.eb_window)
