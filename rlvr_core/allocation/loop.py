"""One allocation step: the allocator/engine conversation of docs/design.md §3.1.

A round whose ``engine.generate`` raises is retried (``retries`` times, with a
growing delay) after the engine's sampling state is restored, so a retried
round draws exactly what the first attempt would have drawn; the allocator only
sees a round once it succeeded. When the retries are spent the step fails with
``EngineError`` and nothing of the failed round reaches the allocator.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from rlvr_core.allocation.base import Allocator
from rlvr_core.allocation.source import PromptSource
from rlvr_core.errors import RewardError, is_out_of_memory
from rlvr_core.rollout.base import RolloutEngine
from rlvr_core.types import Requests, Rollouts, StepStats, TrainBatch

# Fills rollouts.reward in place (a verifier over the payloads; the training loop passes its
# rlvr_core.rewards.scoring.Scorer); None when the engine scores itself.
ScoreFn = Callable[[Rollouts], None]

log = logging.getLogger(__name__)

# Errors in the request itself: retrying cannot help, so they propagate at once.
_NOT_RETRIED: tuple[type[BaseException], ...] = (ValueError, TypeError)


class EngineError(RuntimeError):
    """``engine.generate`` kept failing after its retries; the message names the round and the last error."""


def generate_with_retry(engine: RolloutEngine, requests: Requests, *, retries: int = 0, retry_delay_s: float = 0.0,
                        round_index: int = 0) -> tuple[Rollouts, int]:
    """``engine.generate(requests)``, retried up to ``retries`` more times on failure.

    Before each retry the engine's ``state_dict()`` from before the first attempt
    is loaded back (an engine without sampling state keeps the default ``{}``), so a failure
    that advanced the sampling counter does not shift later samples. Attempt a
    waits ``retry_delay_s * 2**(a-1)`` seconds. ValueError and TypeError (a bad
    request) and out-of-memory errors (``rlvr_core.errors.is_out_of_memory``) are
    not retried.

    Returns:
        (rollouts, number of retries used)
    Raises:
        EngineError: every attempt failed (chained to the last error).
    """
    if retries < 0:
        raise ValueError(f"retries: need >= 0, got {retries}")
    snapshot = engine.state_dict()
    for attempt in range(retries + 1):
        if attempt:
            engine.load_state_dict(snapshot)
            time.sleep(retry_delay_s * 2 ** (attempt - 1))
        try:
            return engine.generate(requests), attempt
        except _NOT_RETRIED:
            raise
        except Exception as e:  # noqa: BLE001 - any other engine fault (lost server, ...) is retried
            if is_out_of_memory(e):  # deterministic: the same round would run out of memory again
                engine.load_state_dict(snapshot)
                raise
            if attempt == retries:
                engine.load_state_dict(snapshot)
                raise EngineError(f"engine.generate failed in round {round_index} of this step after "
                                  f"{retries + 1} attempt(s); last error: {e.__class__.__name__}: {e}") from e
            log.warning("engine.generate failed in round %d (attempt %d of %d): %s: %s; retrying",
                        round_index, attempt + 1, retries + 1, e.__class__.__name__, e)
    raise AssertionError("unreachable")


def run_allocation_step(allocator: Allocator, engine: RolloutEngine, source: PromptSource,
                        score: ScoreFn | None = None, *, retries: int = 0,
                        retry_delay_s: float = 0.0, step: int | None = None) -> tuple[TrainBatch, StepStats]:
    """Run rounds until the allocator proposes nothing; return its batch and counters.

    ``retries``/``retry_delay_s``: see ``generate_with_retry``.
    ``stats.extra`` gains ``generate_seconds``, ``verify_seconds`` and
    ``engine_retries`` (retries used in this step).
    A reward outside the allocator's contract raises ``RewardError`` (``Allocator.observe``), its message led
    by "step {step}" when ``step`` is given.
    """
    gen_s = ver_s = 0.0
    used = 0
    allocator.start_step(source)
    round_index = 0
    while requests := allocator.propose():
        t0 = time.perf_counter()
        rollouts, n = generate_with_retry(engine, requests, retries=retries, retry_delay_s=retry_delay_s,
                                          round_index=round_index)
        used += n
        t1 = time.perf_counter()
        if score is not None:
            score(rollouts)
        ver_s += time.perf_counter() - t1
        gen_s += t1 - t0
        try:
            allocator.observe(rollouts)
        except RewardError as e:
            if step is None:
                raise
            raise e.where(f"step {step}") from None
        round_index += 1
    batch, stats = allocator.finish_step()
    stats.extra["generate_seconds"] = gen_s
    stats.extra["verify_seconds"] = ver_s
    stats.extra["engine_retries"] = used
    return batch, stats
