"""One allocation step: the allocator/engine conversation of DESIGN 3.1."""

from __future__ import annotations

import time
from typing import Callable

from rlvr_core.allocation.base import Allocator
from rlvr_core.allocation.source import PromptSource
from rlvr_core.rollout.base import RolloutEngine
from rlvr_core.types import Rollouts, StepStats, TrainBatch

# Fills rollouts.reward in place (a verifier over the payloads); None when the engine scores itself.
Scorer = Callable[[Rollouts], None]


def run_allocation_step(allocator: Allocator, engine: RolloutEngine, source: PromptSource,
                        score: Scorer | None = None) -> tuple[TrainBatch, StepStats]:
    """Run rounds until the allocator proposes nothing; return its batch and counters.

    ``stats.extra`` gains ``generate_seconds`` and ``verify_seconds``.
    """
    gen_s = ver_s = 0.0
    allocator.start_step(source)
    while requests := allocator.propose():
        t0 = time.perf_counter()
        rollouts = engine.generate(requests)
        t1 = time.perf_counter()
        if score is not None:
            score(rollouts)
        ver_s += time.perf_counter() - t1
        gen_s += t1 - t0
        allocator.observe(rollouts)
    batch, stats = allocator.finish_step()
    stats.extra["generate_seconds"] = gen_s
    stats.extra["verify_seconds"] = ver_s
    return batch, stats
