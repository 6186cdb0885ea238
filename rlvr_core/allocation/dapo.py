"""DAPO dynamic sampling: generation batches of G prompts x k until B groups are mixed (docs/allocators/dapo.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlvr_core.allocation.base import SCALAR, Allocator, AllocatorParams
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require
from rlvr_core.types import Rollouts


@dataclass(frozen=True)
class DAPOParams(AllocatorParams):
    """DAPO dynamic sampling.

    gen_batch_size: prompts per generation batch (default: batch_size)
    max_gen_batches: cap on generation batches per step; reaching it ends the
        step with the effective groups found so far (counter ``hit_cap``)
    """

    gen_batch_size: int | None = None
    max_gen_batches: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.gen_batch_size is None or self.gen_batch_size >= 1, "gen_batch_size",
                f"got {self.gen_batch_size}; set it >= 1 or leave it unset (= batch_size)")
        require(self.max_gen_batches >= 1, "max_gen_batches", f"got {self.max_gen_batches}; set it >= 1")

    @property
    def gen_batch(self) -> int:
        return self.gen_batch_size or self.batch_size


@ALLOCATORS.register("dapo")
class DAPOAllocator(Allocator):
    """Generate batches of G prompts x k, keep mixed groups, repeat until B mixed groups.

    Groups beyond the B-th mixed one are dropped (their rollouts count as spent),
    as in the DAPO recipe. Reaching ``max_gen_batches`` ends the step with what
    it has and sets ``hit_cap``; it never raises.
    """

    name = "dapo"
    Params = DAPOParams
    reward_contract = SCALAR  # reads the rewards' spread only: any finite reward

    @property
    def max_rollouts_per_step(self) -> int:
        p = self.params
        return p.max_gen_batches * p.gen_batch * p.k

    def _on_start(self) -> None:
        self._counters["gen_batches"] = 0

    def _mixed_slots(self) -> np.ndarray:
        led = self.ledger
        return np.flatnonzero((led.n >= self.params.k) & (led.variance() > self.params.reward_eps**2))

    def _fresh_prompts(self, n: int) -> np.ndarray:
        """Prompts for the next generation batch (GRESO filters them here)."""
        return self._fresh(n)

    def _propose(self) -> dict[int, int]:
        p = self.params
        if len(self._mixed_slots()) >= p.batch_size:
            return {}
        if self._counters["gen_batches"] >= p.max_gen_batches:
            self._counters["hit_cap"] = 1
            return {}
        ids = self._fresh_prompts(p.gen_batch)
        if len(ids) == 0:
            return {}
        self._counters["gen_batches"] += 1
        self.ledger.add_prompts(ids)
        return {q: p.k for q in ids.tolist()}

    def _batch_rows(self, rows: Rollouts, row_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = self._mixed_slots()[: self.params.batch_size]
        idx = np.flatnonzero(np.isin(row_slot, keep))
        return idx, row_slot[idx]
