"""The uniform baseline: GRPO (B prompts x k, one round). DAPO dynamic sampling is in dapo.py."""

from __future__ import annotations

from rlvr_core.allocation.base import SCALAR, Allocator, AllocatorParams
from rlvr_core.allocation.registry import ALLOCATORS


@ALLOCATORS.register("grpo")
class GRPOAllocator(Allocator):
    """Uniform GRPO: ``batch_size`` fresh prompts, k rollouts each, one round, train on all."""

    name = "grpo"
    Params = AllocatorParams
    reward_contract = SCALAR  # reads the rewards' spread only: any finite reward

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.batch_size * self.params.k

    def _propose(self) -> dict[int, int]:
        if self.ledger.num_slots:
            return {}
        ids = self._fresh(self.params.batch_size)
        self.ledger.add_prompts(ids)
        return {q: self.params.k for q in ids.tolist()}
