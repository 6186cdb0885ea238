"""VIP: rollouts per prompt that minimise the expected gradient variance under a budget (docs/allocators/vip.md).

Source: Nguyen, Nguyen, Ma, Zhao, She and Nguyen, "Adaptive Rollout Allocation for Online Reinforcement
Learning with Verifiable Rewards" (arXiv:2602.01601). Its code (HieuNT91/VIP) held no implementation when
read; the rule follows the paper's statement as summarised in issue 37 and public summaries.

Each step draws B fresh prompts and spends B * k rollouts on them in one round, n_i per prompt in
[``n_min``, ``n_max``], chosen to minimise

    sum_i  a_i (n_i - 1) / n_i**2  +  b_i n_i,     a_i = E[p_i (1 - p_i)],  b_i = cost_weight * E[log p_i]

(Dr. GRPO's per-prompt gradient variance (n - 1)/n**2 * p(1 - p), up to a constant, plus a linear term
that, under the fixed budget, moves rollouts towards prompts with a low pass rate). VIP predicts p with a
Gaussian process over recent rollouts; **here a Beta posterior per prompt replaces the Gaussian process**
(``PromptPosterior``: by default the empirical-Bayes population prior plus the prompt's decayed evidence,
"carry+eb"), and the expectations are under it. For n >= 3 the variance term is convex in n, so adding
rollouts one at a time where they lower the objective most (``rlvr_core.allocation.greedy``) is exactly
optimal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import digamma

from rlvr_core.allocation.base import PASS_FAIL, Allocator, AllocatorParams
from rlvr_core.allocation.greedy import greedy_fill
from rlvr_core.allocation.posterior import PromptPosterior, as_prior_config
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require


@dataclass(frozen=True)
class VIPParams(AllocatorParams):
    """VIP's knobs (docs/allocators/vip.md).

    n_min, n_max: the bounds on a prompt's rollouts, 3 <= n_min <= k <= n_max (the step budget is B * k)
    cost_weight: the weight w of the linear term b_i = w E[log p_i], >= 0 (0: variance alone)
    prior: each prompt's Beta posterior, in place of the source's Gaussian process (a PriorConfig, its kind
        or a dict of its fields; default "carry+eb")
    """

    n_min: int = 4
    n_max: int = 32
    cost_weight: float = 4e-4
    prior: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "prior", as_prior_config(self.prior, "carry+eb"))
        require(self.n_min >= 3, "n_min", f"got {self.n_min}; set it >= 3 (the variance term (n-1)/n^2 is convex "
                "from n = 3, which the greedy's optimality needs)")
        require(self.n_min <= self.k <= self.n_max, "n_min",
                f"k={self.k} must lie in [n_min, n_max] = [{self.n_min}, {self.n_max}]: the step budget B * k "
                "must let every prompt have n_min and no prompt need more than n_max")
        require(self.cost_weight >= 0, "cost_weight", f"got {self.cost_weight}; set it >= 0")


def vip_terms(a: np.ndarray, b: np.ndarray, cost_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """(E[p(1-p)], cost_weight * E[log p]) per prompt under Beta(a, b)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a * b / ((a + b) * (a + b + 1)), cost_weight * (digamma(a) - digamma(a + b))


def vip_objective(var: np.ndarray, lin: np.ndarray, n: np.ndarray) -> float:
    """The objective VIP minimises: sum var_i (n_i - 1) / n_i**2 + lin_i n_i."""
    n = np.asarray(n, np.float64)
    return float(np.sum(var * (n - 1) / n**2 + lin * n))


def vip_budgets(var: np.ndarray, lin: np.ndarray, budget: int, n_min: int, n_max: int) -> np.ndarray:
    """Rollouts per prompt in [n_min, n_max] summing to ``budget`` (clipped to what the bounds allow) that
    minimise ``vip_objective``."""
    var, lin = np.asarray(var, np.float64).tolist(), np.asarray(lin, np.float64).tolist()

    def gain(i: int, n: int) -> float:  # what the (n+1)-th rollout lowers the objective by
        return -(var[i] * (n / (n + 1) ** 2 - (n - 1) / n**2) + lin[i])

    base = np.full(len(var), n_min, np.int64)
    n, _ = greedy_fill(gain, base, n_max, budget - int(base.sum()))
    return n


@ALLOCATORS.register("vip")
class VIPAllocator(Allocator):
    """One round: B fresh prompts, B * k rollouts shared by ``vip_budgets``; every prompt is a group."""

    name = "vip"
    Params = VIPParams
    reward_contract = PASS_FAIL  # its posterior counts passes

    def __init__(self, params: VIPParams) -> None:
        super().__init__(params)
        self.posterior = PromptPosterior(params.prior)

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.batch_size * self.params.k

    def _keys(self, ids: np.ndarray) -> list[str] | None:
        """Context keys of ``ids`` from the step's source (contextual priors only)."""
        if not self.params.prior.context or self.source is None:
            return None
        return self.source.context_keys(ids)

    def _propose(self) -> dict[int, int]:
        if self.ledger.num_slots:
            return {}
        p = self.params
        ids = self._fresh(p.batch_size)
        self.ledger.add_prompts(ids)
        var, lin = vip_terms(*self.posterior.prior(ids, self._keys(ids)), p.cost_weight)
        n = vip_budgets(var, lin, len(ids) * p.k, p.n_min, p.n_max)
        return dict(zip(ids.tolist(), n.tolist()))

    def _beliefs(self) -> tuple[np.ndarray, float]:
        """The mean of each prompt's Beta posterior before the step (the one its budgets were shared by)."""
        a, b = self.posterior.prior(self.ledger.prompt, self._keys(self.ledger.prompt))
        return a / (a + b), np.nan

    def _on_finish(self) -> None:
        led = self.ledger
        self.posterior.record(led.prompt, np.rint(led.s), led.n, self._keys(led.prompt))
        self.posterior.end_step()

    def _extra_state(self) -> dict[str, Any]:
        return {"posterior": self.posterior.state_dict()}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.posterior.load_state_dict(state["posterior"])
