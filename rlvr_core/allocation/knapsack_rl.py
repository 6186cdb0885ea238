"""Knapsack RL: per-prompt rollout budgets from a knapsack over the step's prompts (docs/allocators/knapsack-rl.md).

Source: Li et al., "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation"
(arXiv:2509.25849), code liziniu/KnapsackRL (verl/trainer/ppo/exploration_utils.py, the dataset's
per-prompt reward states in verl/utils/dataset/rl_dataset.py).

Each step draws B fresh prompts and spends B * k rollouts on them in one round. A prompt's pass rate is
estimated from its earlier steps (the rollouts of its last appearance, or its last ``window`` rollouts when
that appearance had fewer); a prompt with fewer than ``min_count`` rollouts behind it has no estimate and
gets k. Prompts estimated strictly between 0 and 1 start at ``min_n``, those at 0 at ``negative_n``, those
at 1 at ``positive_n``. What is left is spent on the prompts in (0, 1), up to ``max_n`` each, to maximise
the summed value of their groups, ``v(n) = P(a group of n is mixed) * p * (1 - p)**2``. Its marginal value
``p (1-p)**2 (p**n (1-p) + (1-p)**n p)`` falls with n, so adding rollouts one at a time where they add the
most (``greedy_budgets``) is exactly optimal. Before that, as in the source, the rollouts the prompts in
(0, 1) are expected to need (each ``log(1 - alpha) / log(max(p, 1 - p))``, capped at ``max_n``) are
summed; budget beyond that sum goes, in equal shares, to the prompts at 0 (else to the other prompts
outside (0, 1)). With no prompt in (0, 1) the budget goes to the prompts at 0, or uniformly to all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.base import PASS_FAIL, Allocator, AllocatorParams
from rlvr_core.allocation.beta_binomial import group_mixed_probability
from rlvr_core.allocation.greedy import greedy_fill
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require


@dataclass(frozen=True)
class KnapsackRLParams(AllocatorParams):
    """Knapsack RL's knobs (the source's defaults; docs/allocators/knapsack-rl.md).

    min_n: rollouts a prompt estimated in (0, 1) starts with, in [1, k]
    max_n: the most rollouts the knapsack gives a prompt in (0, 1), >= min_n
    negative_n: rollouts of a prompt estimated at 0 before any leftover (default min_n), in [1, k]
    positive_n: rollouts of a prompt estimated at 1 (default min_n), in [1, k]
    alpha: confidence of the expected-cost estimate that decides the leftover, in (0, 1)
    fallback: send the budget beyond the expected cost to the prompts at 0 (the source's allow_fallback)
    min_count: rollouts a prompt needs behind it before its estimate is used, >= 1
    window: the estimate averages the last appearance, or the last ``window`` rollouts when that
        appearance had fewer, >= 1
    """

    min_n: int = 2
    max_n: int = 128
    negative_n: int | None = None
    positive_n: int | None = None
    alpha: float = 0.9
    fallback: bool = True
    min_count: int = 8
    window: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("min_n", "negative_n", "positive_n"):
            v = getattr(self, name)
            require(v is None or 1 <= v <= self.k, name, f"got {v}; it must lie in [1, k={self.k}] (the step "
                    "budget is B * k, so every prompt's starting rollouts must fit in k)")
        require(self.max_n >= self.min_n, "max_n", f"got {self.max_n}; it must be >= min_n={self.min_n}")
        require(0.0 < self.alpha < 1.0, "alpha", f"got {self.alpha}; it must lie in (0, 1)")
        require(isinstance(self.fallback, bool), "fallback", f"got {self.fallback!r}; give true or false")
        require(self.min_count >= 1, "min_count", f"got {self.min_count}; set it >= 1")
        require(self.window >= 1, "window", f"got {self.window}; set it >= 1")

    @property
    def n_zero(self) -> int:
        return int(self.min_n if self.negative_n is None else self.negative_n)

    @property
    def n_one(self) -> int:
        return int(self.min_n if self.positive_n is None else self.positive_n)


def group_value(p: np.ndarray | float, n: np.ndarray | int) -> np.ndarray:
    """Knapsack RL's value of a group of n rollouts at pass rate p: P(mixed) * p * (1 - p)**2."""
    p = np.asarray(p, np.float64)
    return group_mixed_probability(p, n) * p * (1.0 - p) ** 2


def greedy_budgets(p: np.ndarray, base: np.ndarray, cap: int, budget: int) -> tuple[np.ndarray, int]:
    """(rollouts per prompt, budget left): from ``base``, each of ``budget`` rollouts goes to the prompt whose
    next rollout adds the most ``group_value`` (ties to the lower index), no prompt beyond ``cap``. The
    marginal value p (1-p)**2 (p**n (1-p) + (1-p)**n p) falls with n, so this maximises the summed value
    exactly."""
    p = np.asarray(p, np.float64).tolist()

    def gain(i: int, n: int) -> float:
        q = p[i]
        return q * (1 - q) ** 2 * (q**n * (1 - q) + (1 - q) ** n * q)

    return greedy_fill(gain, base, cap, budget)


def _spread(n: np.ndarray, where: np.ndarray, amount: int) -> None:
    """Add ``amount`` rollouts in equal shares to the prompts ``where`` is True, the remainder to the first."""
    idx = np.flatnonzero(where)
    share, rem = divmod(int(amount), len(idx))
    n[idx] += share
    n[idx[:rem]] += 1


def knapsack_budgets(p: np.ndarray, valid: np.ndarray, params: KnapsackRLParams) -> np.ndarray:
    """Rollouts per prompt for one step (they sum to len(p) * k): the source's rule, module docstring."""
    pr, k = params, params.k
    p = np.asarray(p, np.float64)
    valid = np.asarray(valid, bool)
    eff, zero, one = valid & (p > 0) & (p < 1), valid & (p <= 0), valid & (p >= 1)
    n = np.select([eff, zero, one], [pr.min_n, pr.n_zero, pr.n_one], k).astype(np.int64)
    left = len(p) * k - int(n.sum())
    if left <= 0:
        return n
    if not eff.any():
        if zero.any():
            _spread(n, zero, left)
        else:
            n[:] = k
        return n
    pe = p[eff]
    cost = math.log(1 - pr.alpha) / np.log(np.maximum(pe, 1 - pe))
    expected = int(np.minimum(pr.max_n, cost).astype(np.int64).sum())
    outside = zero if zero.any() else ~eff
    if pr.fallback and expected < left and outside.any():
        _spread(n, outside, left - expected)
        left = expected
    n_eff, rest = greedy_budgets(pe, n[eff], pr.max_n, left)
    n[eff] = n_eff
    if rest:  # every prompt in (0, 1) at max_n: the source spreads the rest over them
        _spread(n, eff, rest)
    return n


@ALLOCATORS.register("knapsack-rl")
class KnapsackRLAllocator(Allocator):
    """One round: B fresh prompts, B * k rollouts shared by ``knapsack_budgets``; every prompt is a group."""

    name = "knapsack-rl"
    Params = KnapsackRLParams
    reward_contract = PASS_FAIL  # its estimates count passes

    def __init__(self, params: KnapsackRLParams) -> None:
        super().__init__(params)
        self.recent: dict[int, list[int]] = {}  # prompt -> its latest pass bits, oldest first
        self.last_n: dict[int, int] = {}  # prompt -> rollouts of its last appearance
        self.count: dict[int, int] = {}  # prompt -> rollouts behind it

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.batch_size * self.params.k

    def estimates(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pass-rate estimate, whether it is used) per prompt id."""
        w, need = self.params.window, self.params.min_count
        p = np.zeros(len(ids))
        valid = np.zeros(len(ids), bool)
        for i, q in enumerate(np.asarray(ids).tolist()):
            if self.count.get(q, 0) >= need:
                bits = self.recent[q]
                p[i] = float(np.mean(bits[-self.last_n[q]:] if self.last_n[q] >= w else bits[-w:]))
                valid[i] = True
        return p, valid

    def _propose(self) -> dict[int, int]:
        if self.ledger.num_slots:
            return {}
        ids = self._fresh(self.params.batch_size)
        self.ledger.add_prompts(ids)
        n = knapsack_budgets(*self.estimates(ids), self.params)
        return dict(zip(ids.tolist(), n.tolist()))

    def _beliefs(self) -> tuple[np.ndarray, float]:
        """Each prompt's pass-rate estimate from its history (NaN: too few rollouts behind it to be used)."""
        p, used = self.estimates(self.ledger.prompt)
        return np.where(used, p, np.nan), np.nan

    def _on_finish(self) -> None:
        rows, slot = self.ledger.all_rows()
        passed = (rows.reward > self.params.pass_above).astype(int)
        keep = max(self.params.window, int(self.ledger.n.max(initial=0)))
        for s, q in enumerate(self.ledger.prompt.tolist()):
            bits = passed[slot == s].tolist()
            if not bits:
                continue
            self.recent[q] = (self.recent.get(q, []) + bits)[-keep:]
            self.last_n[q] = len(bits)
            self.count[q] = self.count.get(q, 0) + len(bits)

    def _extra_state(self) -> dict[str, Any]:
        return {"recent": {q: list(b) for q, b in self.recent.items()}, "last_n": dict(self.last_n),
                "count": dict(self.count)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.recent = {int(q): [int(x) for x in b] for q, b in state["recent"].items()}
        self.last_n = {int(q): int(v) for q, v in state["last_n"].items()}
        self.count = {int(q): int(v) for q, v in state["count"].items()}
