"""A seeded, epoch-shuffled stream of prompt ids that allocators draw from."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rlvr_core.errors import ConfigError


class PromptSource:
    """Infinite stream over a pool of prompt ids, reshuffled every epoch.

    ``take(n)`` returns the next n ids; ``give_back(ids)`` returns unused ids to
    the front of the stream (prompt selection looks at candidates it does not
    keep). Deterministic by seed; ``state_dict`` captures the exact position.

    ``context`` (optional): one key per prompt id, in the order of the ids, naming
    the prompt's features (``rlvr_core.data.context``); allocators with a
    contextual prior read it through ``context_keys``. It is data, not state: it
    is not part of ``state_dict``. Without it every prompt has the key "".
    """

    def __init__(self, prompt_ids: np.ndarray | list[int] | int, seed: int = 0,
                 context: Sequence[Any] | np.ndarray | None = None) -> None:
        ids = np.arange(prompt_ids) if isinstance(prompt_ids, (int, np.integer)) else np.asarray(prompt_ids)
        ids = ids.astype(np.int64).reshape(-1)
        if ids.size == 0:
            raise ConfigError("prompt pool: it is empty; give at least one prompt")
        if np.unique(ids).size != ids.size:
            raise ConfigError("prompt pool: it holds duplicated prompt ids; ids must be unique")
        self.ids = ids
        self._context: dict[int, str] | None = None
        if context is not None:
            keys = [str(c) for c in context]
            if len(keys) != ids.size:
                raise ConfigError(f"prompt pool: context has {len(keys)} keys for {ids.size} prompts; "
                                  "give one key per prompt, in the order of the ids")
            self._context = dict(zip(ids.tolist(), keys))
        self._rng = np.random.default_rng(seed)
        self.epoch = 0
        self._order = self._rng.permutation(self.ids)
        self._pos = 0
        self._front: list[int] = []

    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def has_context(self) -> bool:
        return self._context is not None

    def context_keys(self, ids: np.ndarray | list[int]) -> list[str]:
        """The context key of each id ("" for every id when the pool has no context)."""
        ids = np.asarray(ids).tolist()
        if self._context is None:
            return [""] * len(ids)
        return [self._context.get(int(q), "") for q in ids]

    def take(self, n: int) -> np.ndarray:
        """The next n prompt ids (crossing epoch boundaries as needed)."""
        out: list[int] = []
        while self._front and len(out) < n:
            out.append(self._front.pop(0))
        while len(out) < n:
            if self._pos >= len(self._order):
                self.epoch += 1
                self._order = self._rng.permutation(self.ids)
                self._pos = 0
            m = min(n - len(out), len(self._order) - self._pos)
            out.extend(self._order[self._pos:self._pos + m].tolist())
            self._pos += m
        return np.asarray(out, dtype=np.int64)

    def give_back(self, ids: np.ndarray | list[int]) -> None:
        """Put ids back at the front of the stream, in the given order."""
        self._front = [int(i) for i in ids] + self._front

    def state_dict(self) -> dict[str, Any]:
        return {
            "ids": self.ids.copy(), "rng": self._rng.bit_generator.state, "epoch": self.epoch,
            "order": self._order.copy(), "pos": self._pos, "front": list(self._front),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ids = np.asarray(state["ids"], np.int64).copy()
        self._rng.bit_generator.state = state["rng"]
        self.epoch = int(state["epoch"])
        self._order = np.asarray(state["order"], np.int64).copy()
        self._pos = int(state["pos"])
        self._front = list(state["front"])
