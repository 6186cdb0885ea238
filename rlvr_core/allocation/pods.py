"""PODS: generate n rollouts per prompt, train on the m with the largest reward variance.

Max-variance down-sampling: for rewards sorted in order, the size-m subset of
maximal variance is the top i plus the bottom m - i for some i, so checking
the m + 1 splits finds it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlvr_core.allocation.base import SCALAR, Allocator, AllocatorParams
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require
from rlvr_core.types import Rollouts


@dataclass(frozen=True)
class PODSParams(AllocatorParams):
    """PODS: ``batch_size`` prompts, ``n_generate`` rollouts each, the k most varied kept.

    n_generate: rollouts generated per prompt (default 2 * k), >= k
    """

    n_generate: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.n_generate is None or self.n_generate >= self.k, "n_generate",
                f"got {self.n_generate}; it must be >= k={self.k} (PODS keeps k of them)")

    @property
    def n(self) -> int:
        return int(self.n_generate or 2 * self.k)


def max_variance_subset(rewards: np.ndarray, m: int) -> np.ndarray:
    """Indices of the size-m subset of ``rewards`` (1-D) with the largest variance."""
    order = np.argsort(rewards, kind="stable")
    r = rewards[order]
    n = len(r)
    if m >= n:
        return order
    best, best_var = 0, -1.0
    for i in range(m + 1):  # i from the top, m - i from the bottom
        sub = np.concatenate([r[: m - i], r[n - i:]])
        v = float(sub.var())
        if v > best_var + 1e-12:
            best, best_var = i, v
    return np.concatenate([order[: m - best], order[n - best:]])


@ALLOCATORS.register("pods")
class PODSAllocator(Allocator):
    """One round of n rollouts per prompt; max-variance down-sampling to k per group."""

    name = "pods"
    Params = PODSParams
    reward_contract = SCALAR  # reads the rewards' spread only: any finite reward

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.batch_size * self.params.n

    def _propose(self) -> dict[int, int]:
        if self.ledger.num_slots:
            return {}
        ids = self._fresh(self.params.batch_size)
        self.ledger.add_prompts(ids)
        return dict.fromkeys(ids.tolist(), self.params.n)

    def _batch_rows(self, rows: Rollouts, row_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = []
        for slot in range(self.ledger.num_slots):
            idx = np.flatnonzero(row_slot == slot)
            keep.append(idx[np.sort(max_variance_subset(rows.reward[idx], self.params.k))])
        idx = np.concatenate(keep) if keep else np.zeros(0, np.int64)
        return idx, row_slot[idx]
