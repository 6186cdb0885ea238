"""CurES: prompts drawn by a difficulty score, rollouts in proportion to the gradient's standard deviation
(docs/allocators/cures.md).

Source: "CurES: From Gradient Analysis to Efficient Curriculum Learning for Reasoning LLMs" (arXiv:2510.01037); its
code, ZexuSun/CurES (epic/epic_sampler.py ``EpicSampler``; epic/stage_0_init_difficulty_sample_size.py
``EPICInitializer``), is what the rule and constants below were read from.

Every prompt carries a counter of its rollouts and passes over the run; its pass rate is the mean of Beta(passes + 1,
fails + 1) (the source's ``difficulty``).

- *Prompts.* The source samples each batch from the whole dataset with probability proportional to
  exp(sqrt(p (1 - p)) / t), t = (passes + 1) / ``temperature`` (``temperature`` 0.01). Here ``candidates_factor`` x B
  candidates come from the epoch-shuffled prompt stream and B of them are drawn without replacement with those
  weights (a Gumbel top-B); at the source's temperature the weights differ by less than 0.5%, so the default,
  ``candidates_factor`` 1, takes the stream's B as they come.
- *Rollouts.* The source fixes each prompt's rollouts before training in proportion to sigma, the standard deviation
  of its policy-gradient estimate, sigma^2 = p (1-p)^2 E[g_c^2] + p^2 (1-p) E[g_w^2] - p^2 (1-p)^2 (E g_c - E g_w)^2,
  with g_c and g_w the gradient norms of log-likelihoods of correct and wrong answers (its eq. 127), under a budget of
  B x ``n_max`` (16). An allocator sees no gradients: with g_c = g_w, sigma is proportional to sqrt(p (1 - p)), and
  each step's B x k rollouts are shared among its B prompts in proportion to it, within [``n_min``, ``n_max``]
  (``apportion``), from the counter as it stands (the source computes the sizes once, from a pre-training pass of 4
  rollouts for every prompt of the dataset; that pass is not run here, so the counter starts empty and every prompt
  starts at p = 1/2).

Every prompt's rows are one group. A pass is a reward above ``reward_threshold``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.base import PASS_FAIL, Allocator, AllocatorParams
from rlvr_core.allocation.greedy import greedy_fill
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require


@dataclass(frozen=True)
class CurESParams(AllocatorParams):
    """CurES's knobs (docs/allocators/cures.md).

    temperature: the prompt weights are exp(sqrt(p(1-p)) * temperature / (passes + 1)) (the source's 1e-2), > 0
    candidates_factor: candidates drawn per step, in units of B, >= 1
    n_min: the fewest rollouts a prompt gets (ours: a group needs 2 to compare), in [2, k]
    n_max: the most rollouts a prompt gets (the source's num_rollout_max), >= k
    """

    temperature: float = 0.01
    candidates_factor: int = 1
    n_min: int = 2
    n_max: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        require(isinstance(self.temperature, (int, float)) and 0 < self.temperature < float("inf"), "temperature",
                f"got {self.temperature!r}; give a finite number > 0")
        require(self.candidates_factor >= 1, "candidates_factor", f"got {self.candidates_factor}; set it >= 1")
        require(2 <= self.n_min <= self.k, "n_min", f"got {self.n_min}; it must lie in [2, k={self.k}] (the step "
                "budget is B * k, so every prompt's least must fit in k)")
        require(self.n_max >= self.k, "n_max", f"got {self.n_max}; it must be >= k={self.k}")

    def host_items(self) -> dict[str, int]:
        """The candidate prompt ids drawn per step: candidates_factor * B."""
        return {**super().host_items(), "candidates_factor": self.candidates_factor * self.batch_size}


def apportion(weights: np.ndarray, budget: int, lo: int, hi: int) -> np.ndarray:
    """Rollouts per prompt summing to ``budget`` (which must lie in [len * lo, len * hi]), each in [lo, hi], as near
    ``budget * weights / sum(weights)`` as the bounds allow: from ``lo``, each further rollout to the prompt furthest
    below its share (ties to the lower index). Equal weights give equal shares."""
    w = np.asarray(weights, np.float64)
    share = budget * (w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w)))
    base = np.full(len(w), lo, np.int64)
    n, _ = greedy_fill(lambda i, m: float(share[i] - m), base, hi, budget - int(base.sum()))
    return n


@ALLOCATORS.register("cures")
class CurESAllocator(Allocator):
    """One round: B prompts drawn by CurES's weights, B x k rollouts shared in proportion to sqrt(p(1-p))."""

    name = "cures"
    Params = CurESParams
    reward_contract = PASS_FAIL  # its counter counts passes

    def __init__(self, params: CurESParams) -> None:
        super().__init__(params)
        self.passes: dict[int, int] = {}
        self.total: dict[int, int] = {}

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.batch_size * self.params.k

    def pass_rate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the mean of Beta(passes + 1, fails + 1), passes) per prompt id."""
        q = np.asarray(ids).tolist()
        a = np.array([self.passes.get(i, 0) for i in q], np.float64)
        n = np.array([self.total.get(i, 0) for i in q], np.float64)
        return (a + 1) / (n + 2), a

    def select(self, cand: np.ndarray) -> np.ndarray:
        """B of the candidates (in stream order), drawn without replacement with the source's weights."""
        p, passes = self.pass_rate(cand)
        log_w = np.sqrt(p * (1 - p)) * self.params.temperature / (passes + 1)
        keys = log_w + self.rng.gumbel(size=len(cand))
        keep = np.argsort(-keys, kind="stable")[: self.params.batch_size]
        return cand[np.sort(keep)]

    def _propose(self) -> dict[int, int]:
        if self.ledger.num_slots:
            return {}
        pr = self.params
        cand = self._fresh(pr.batch_size * pr.candidates_factor)
        ids = self.select(cand) if pr.candidates_factor > 1 else cand
        self._counters["skipped"] += len(cand) - len(ids)
        self.ledger.add_prompts(ids)
        p, _ = self.pass_rate(ids)
        n = apportion(np.sqrt(p * (1 - p)), len(ids) * pr.k, pr.n_min, pr.n_max)
        return dict(zip(ids.tolist(), n.tolist()))

    def _beliefs(self) -> tuple[np.ndarray, float]:
        """Each prompt's pass rate from its counter before the step (the one its rollouts were shared by)."""
        return self.pass_rate(self.ledger.prompt)[0], np.nan

    def _on_finish(self) -> None:
        led = self.ledger
        for q, n, s in zip(led.prompt.tolist(), led.n.tolist(), np.rint(led.s).tolist()):
            self.passes[q] = self.passes.get(q, 0) + int(s)
            self.total[q] = self.total.get(q, 0) + int(n)

    def _extra_state(self) -> dict[str, Any]:
        return {"passes": dict(self.passes), "total": dict(self.total)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.passes = {int(q): int(v) for q, v in state["passes"].items()}
        self.total = {int(q): int(v) for q, v in state["total"].items()}
