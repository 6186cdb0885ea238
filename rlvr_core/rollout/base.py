"""The RolloutEngine protocol (DESIGN 3.1, 3.2)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

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


def encode_prompt_pool(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt (special tokens such as <bos> added), for engines that index a pool."""
    texts = list(prompts)
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t:
            raise ValueError(f"prompt {i} must be a non-empty str, got {t!r}")
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=True)["input_ids"]
    return [list(map(int, ids)) for ids in enc]


def prompt_sequences(tokenizer: Any, pool_ids: Sequence[Sequence[int]], prompts: Sequence[Any]) -> list[list[int]]:
    """Token ids for ``prompts``: all strings (encoded now) or ids into a pool whose token ids are ``pool_ids``."""
    items = list(prompts)
    if all(isinstance(x, str) for x in items):
        return encode_prompt_pool(tokenizer, items)
    for x in items:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= int(x) < len(pool_ids):
            raise ValueError(f"greedy: prompt {x!r} is neither a str nor an id in [0, {len(pool_ids)})")
    return [list(pool_ids[int(x)]) for x in items]
