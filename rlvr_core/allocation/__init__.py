"""Rollout allocators, selectable by name: ``make_allocator(name, **params)``.

Registered: grpo, dapo, sara, vigor, pods, greso, sara+dps, pilot-commit, ar3po, reinforce-ada, knapsack-rl,
vip, mopps, cures, valor.
"""

# registration
from rlvr_core.allocation import (  # noqa: F401
    ar3po,
    cures,
    dapo,
    greso,
    grpo,
    knapsack_rl,
    mopps,
    pilot_commit,
    pods,
    reinforce_ada,
    sara,
    valor,
    vigor,
    vip,
)
from rlvr_core.allocation.base import Allocator, AllocatorParams
from rlvr_core.allocation.beta_binomial import p_effective
from rlvr_core.allocation.loop import run_allocation_step
from rlvr_core.allocation.posterior import PriorConfig, PromptPosterior
from rlvr_core.allocation.registry import ALLOCATORS, make_allocator
from rlvr_core.allocation.source import PromptSource

__all__ = [
    "ALLOCATORS", "Allocator", "AllocatorParams", "PriorConfig", "PromptPosterior", "PromptSource",
    "make_allocator", "p_effective", "run_allocation_step",
]
