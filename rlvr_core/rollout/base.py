"""The RolloutEngine protocol (DESIGN 3.1, 3.2)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from rlvr_core.registry import Registry
from rlvr_core.types import Requests, Rollouts


@runtime_checkable
class RolloutEngine(Protocol):
    """Answers one allocation round with rollouts.

    ``generate(requests)`` returns, for each ``prompt_id -> n`` in ``requests``,
    exactly n rollouts (rows in any order), with rewards filled in where the
    engine scores them itself (simulated) or left at 0.0 for the caller's
    verifier (model engines: the payload carries the completion text).
    ``update_weights(...)`` is called after every policy update.
    """

    def generate(self, requests: Requests) -> Rollouts: ...

    def update_weights(self, state: Any = None) -> None: ...


ENGINES: Registry[type] = Registry("engine")


def make_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered as ``name``."""
    return ENGINES.get(name)(**kwargs)
