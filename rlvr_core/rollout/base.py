"""The RolloutEngine base class (docs/design.md §3.1, §2.5)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr_core.errors import require
from rlvr_core.registry import Registry
from rlvr_core.types import Requests, Rollouts


class RolloutEngine(ABC):
    """Answers one allocation round with rollouts; declares everything the training loop calls.

    ``generate(requests)`` returns, for each ``prompt_id -> n`` in ``requests``,
    exactly n rollouts (rows in any order), with rewards filled in where the
    engine scores them itself (simulated) or left at 0.0 for the caller's
    verifier (model engines: the payload carries the completion text).

    The rest have defaults for engines that need not do anything:

    - ``update_weights(state)``: called after every policy update (default: nothing,
      for an engine that shares the trainer's model object or has no weights);
    - ``sleep(level)`` / ``wake_up()``: free and restore accelerator memory; the loop
      calls ``sleep()`` before each update when ``enable_sleep_mode`` is true, and the
      engine wakes itself on its next call (default: nothing, the flag false);
    - ``state_dict()`` / ``load_state_dict(state)``: the sampling state that checkpoints
      keep and a retried round restores (default: none, ``{}``);
    - ``close()``: release what the engine started (a server); idempotent (default: nothing).
    """

    #: true when ``sleep()`` frees memory, so the training loop calls it before each update
    enable_sleep_mode: bool = False

    @abstractmethod
    def generate(self, requests: Requests) -> Rollouts: ...

    def update_weights(self, state: Any = None) -> None:  # noqa: B027 - a deliberate no-op default
        """The policy changed; ``state`` is its state dict, or None for the model the engine was given."""

    def sleep(self, level: int = 1) -> None:  # noqa: B027 - a deliberate no-op default
        """Free accelerator memory until the next call; nothing to free by default."""

    def wake_up(self) -> None:  # noqa: B027 - a deliberate no-op default
        """Restore what ``sleep`` freed; nothing by default."""

    def state_dict(self) -> dict[str, Any]:
        """Sampling state to checkpoint (the model weights are saved elsewhere); none by default."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - a deliberate no-op default
        """Restore ``state_dict()``'s state; nothing to restore by default."""

    @classmethod
    def fresh_state(cls, seed: int) -> dict[str, Any] | None:
        """What ``state_dict()`` returns for an engine of this class built with ``seed``, before its first
        call, without building one: a resume checks a checkpoint's engine state against it before anything
        is loaded (``rlvr_core.preflight.check_restored_state``). None (the default): not declared, and the
        state is checked against the built engine's ``state_dict()`` instead."""
        return None

    def close(self) -> None:  # noqa: B027 - a deliberate no-op default
        """Release what the engine started; idempotent, nothing by default."""


ENGINES: Registry[type] = Registry("engine")


def check_sampling(temperature: float, top_p: float, max_new_tokens: int) -> None:
    """ConfigError for sampling settings a model engine cannot use (the hf and vllm engines share them)."""
    require(temperature > 0, "temperature", f"must be > 0 (use greedy() for argmax decoding), got {temperature}")
    require(0 < top_p <= 1, "top_p", f"must be in (0, 1], got {top_p}")
    require(isinstance(max_new_tokens, int) and max_new_tokens >= 1, "max_new_tokens",
            f"must be an int >= 1, got {max_new_tokens!r}")


def make_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered as ``name``."""
    return ENGINES.get(name)(**kwargs)


def encode_prompt_pool(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt, for engines that index a pool.

    The tokenizer adds its special tokens (the tiny policy's ``<bos>``), except
    to a prompt that already starts with the tokenizer's bos token, as a rendered
    chat template does (Llama 3: ``<|begin_of_text|>``): it is encoded as written,
    so the bos token is not doubled. Special tokens written in a prompt
    (``<|im_start|>``) encode as their single ids.
    """
    texts = list(prompts)
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t:
            raise ValueError(f"prompt {i} must be a non-empty str, got {t!r}")
    if not texts:
        return []
    bos = getattr(tokenizer, "bos_token", None)
    written = [bool(bos) and t.startswith(bos) for t in texts]
    out: list[list[int] | None] = [None] * len(texts)
    for add, idx in ((True, [i for i, w in enumerate(written) if not w]),
                     (False, [i for i, w in enumerate(written) if w])):
        if idx:
            enc = tokenizer([texts[i] for i in idx], add_special_tokens=add)["input_ids"]
            for i, ids in zip(idx, enc):
                out[i] = list(map(int, ids))
    return out  # type: ignore[return-value]


def prompt_sequences(tokenizer: Any, pool_ids: Sequence[Sequence[int]], prompts: Sequence[Any]) -> list[list[int]]:
    """Token ids for ``prompts``: all strings (encoded now) or ids into a pool whose token ids are ``pool_ids``."""
    items = list(prompts)
    if all(isinstance(x, str) for x in items):
        return encode_prompt_pool(tokenizer, items)
    for x in items:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= int(x) < len(pool_ids):
            raise ValueError(f"greedy: prompt {x!r} is neither a str nor an id in [0, {len(pool_ids)})")
    return [list(pool_ids[int(x)]) for x in items]
