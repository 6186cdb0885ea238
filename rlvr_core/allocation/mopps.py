"""MoPPS: pick the step's prompts by Thompson draws from a decayed Beta posterior (docs/allocators/mopps.md).

Source: Model Predictive Prompt Selection (MoPPS; Qu et al., arXiv:2507.04632), code thu-rllab/MoPPS
(recipe/ours/mopps.py, ``PosteriorSampler``).

Each prompt carries Beta(alpha, beta) on its pass rate, from Beta(a0, b0). Each step draws
``candidates_factor * B`` candidates from the prompt stream, draws one pass rate per candidate from its
posterior and keeps the B whose draws lie closest to ``target`` (the source's "topk" strategy); the others
are skipped for this pass over the pool. The kept prompts get k rollouts each in one round (no extra
rollouts). After the step, each trained prompt's posterior is decayed towards the prior and takes the
step's evidence: alpha <- decay * alpha + (1 - decay) * a0 + passes, beta likewise with fails.

The decay acts per update of the prompt, as in the source, not per training step; that is why this keeps
its own two numbers per prompt instead of ``PromptPosterior``, whose carried evidence decays per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.base import PASS_FAIL, Allocator, AllocatorParams
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require


@dataclass(frozen=True)
class MoPPSParams(AllocatorParams):
    """MoPPS's knobs (the source's no-warm-up "topk" scripts; docs/allocators/mopps.md).

    candidates_factor: candidates drawn per step, in units of B (the source's ts_ratio), >= 1
    decay: per-update weight on a prompt's past posterior (the source's bandit_decay_ratio), in (0, 1]
    target: the pass rate the draws are ranked against (bandit_target_mean), in (0, 1)
    a0, b0: the Beta prior every prompt starts from and decays towards, > 0
    """

    candidates_factor: int = 8
    decay: float = 0.5
    target: float = 0.5
    a0: float = 1.0
    b0: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.candidates_factor >= 1, "candidates_factor", f"got {self.candidates_factor}; set it >= 1")
        require(0.0 < self.decay <= 1.0, "decay", f"got {self.decay}; it must lie in (0, 1]")
        require(0.0 < self.target < 1.0, "target", f"got {self.target}; it must lie in (0, 1)")
        require(self.a0 > 0 and self.b0 > 0, "a0", f"got a0={self.a0}, b0={self.b0}; both must be > 0")

    def host_items(self) -> dict[str, int]:
        """The candidate prompt ids drawn per step: candidates_factor * B."""
        return {**super().host_items(), "candidates_factor": self.candidates_factor * self.batch_size}


@ALLOCATORS.register("mopps")
class MoPPSAllocator(Allocator):
    """One round: the B of candidates_factor * B candidates whose Thompson draws lie closest to the target,
    k rollouts each; every prompt is a group."""

    name = "mopps"
    Params = MoPPSParams
    reward_contract = PASS_FAIL  # its posterior counts passes

    def __init__(self, params: MoPPSParams) -> None:
        super().__init__(params)
        self.alpha: dict[int, float] = {}
        self.beta: dict[int, float] = {}

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.batch_size * self.params.k

    def posterior(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Beta(alpha, beta) per prompt id (the prior for a prompt never trained)."""
        q = np.asarray(ids).tolist()
        return (np.array([self.alpha.get(i, self.params.a0) for i in q], np.float64),
                np.array([self.beta.get(i, self.params.b0) for i in q], np.float64))

    def select(self, cand: np.ndarray) -> np.ndarray:
        """The B candidates (in stream order) whose draws lie closest to the target."""
        draws = self.rng.beta(*self.posterior(cand))
        keep = np.argsort((draws - self.params.target) ** 2, kind="stable")[: self.params.batch_size]
        return cand[np.sort(keep)]

    def _propose(self) -> dict[int, int]:
        if self.ledger.num_slots:
            return {}
        p = self.params
        cand = self._fresh(p.batch_size * p.candidates_factor)
        ids = self.select(cand)
        self._counters["skipped"] += len(cand) - len(ids)
        self.ledger.add_prompts(ids)
        return dict.fromkeys(ids.tolist(), p.k)

    def _beliefs(self) -> tuple[np.ndarray, float]:
        """The mean of each prompt's Beta posterior before the step (the one its Thompson draw was taken from)."""
        a, b = self.posterior(self.ledger.prompt)
        return a / (a + b), np.nan

    def _on_finish(self) -> None:
        p, led = self.params, self.ledger
        a, b = self.posterior(led.prompt)
        passes = np.rint(led.s)
        a = p.decay * a + (1 - p.decay) * p.a0 + passes
        b = p.decay * b + (1 - p.decay) * p.b0 + (led.n - passes)
        for q, x, y in zip(led.prompt.tolist(), a.tolist(), b.tolist()):
            self.alpha[q], self.beta[q] = x, y

    def _extra_state(self) -> dict[str, Any]:
        return {"alpha": dict(self.alpha), "beta": dict(self.beta)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.alpha = {int(q): float(v) for q, v in state["alpha"].items()}
        self.beta = {int(q): float(v) for q, v in state["beta"].items()}
