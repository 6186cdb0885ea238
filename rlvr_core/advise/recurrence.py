"""How often a log's prompts recur, and a replay that keeps it (docs/advisor.md, "Recurrence").

An allocator that decides from a prompt's history (greso, sara+dps, a carried prior) saves only on prompts it
meets again. A replay over a pool of the log's prompts lets prompts recur even where the logged run never saw a
prompt twice, and credits those allocators with history the run would never have had. So the advisor measures
the log's recurrence (``measure``) and, for a log whose prompts never recur, replays a stream of fresh prompts
(``FreshSource``: every replayed prompt is new, so it is drawn in one step only); a log whose prompts recur, or a
replay given ``--pool N``, keeps the recurring pool. ``CountingSource`` counts, per replay, the prompts drawn in
more than one step, so the report can show what the replay offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation import PromptSource
from rlvr_core.rollout.simulated import SimulatedEngine
from rlvr_core.types import Requests, Rollouts


@dataclass(frozen=True)
class Recurrence:
    """The log's prompts across its steps: ``recurring`` prompts were logged at more than one step (``share``
    of the ``prompts`` distinct prompts); ``mean_gap`` is the mean number of training steps between a prompt's
    consecutive logged steps (None when nothing recurs)."""

    prompts: int
    recurring: int
    share: float
    mean_gap: float | None


def measure(df: Any) -> Recurrence:
    """The recurrence of the per-(step, prompt) log ``df`` (``load_log``: one row per (step, prompt))."""
    pairs = df[["prompt_id", "step"]].drop_duplicates().sort_values(["prompt_id", "step"], kind="stable")
    pid, step = pairs["prompt_id"].to_numpy(), pairs["step"].to_numpy(np.float64)
    ids, counts = np.unique(pid, return_counts=True)
    recurring = int(np.sum(counts > 1))
    same = pid[1:] == pid[:-1]  # consecutive rows of one prompt: the gaps between its logged steps
    gaps = (step[1:] - step[:-1])[same]
    return Recurrence(len(ids), recurring, recurring / len(ids) if len(ids) else 0.0,
                      float(gaps.mean()) if len(gaps) else None)


class CountingSource(PromptSource):
    """A ``PromptSource`` that counts its draws: ``drawn_ids`` (distinct ids handed out) and ``recurring`` (ids
    handed out in more than one step; ``step`` is set by the replay loop before each step)."""

    def __init__(self, prompt_ids: Any, seed: int = 0) -> None:
        super().__init__(prompt_ids, seed=seed)
        self.step = 0
        self._first: dict[int, int] = {}
        self.recurring: set[int] = set()

    def _draw(self, n: int) -> np.ndarray:
        return super().take(n)

    def take(self, n: int) -> np.ndarray:
        ids = self._draw(n)
        for q in ids.tolist():
            if self._first.setdefault(q, self.step) != self.step:
                self.recurring.add(q)
        return ids

    @property
    def drawn_ids(self) -> int:
        return len(self._first)


class FreshSource(CountingSource):
    """A prompt stream that never repeats: ``take(n)`` returns the next n ids of 0, 1, 2, ... (an id given back
    comes first again, as in ``PromptSource``; it had no rollout). ``drawn`` counts the ids handed out."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(1, seed=seed)
        self.drawn = 0

    def __len__(self) -> int:
        return self.drawn

    def _draw(self, n: int) -> np.ndarray:
        out = self._front[:n]
        self._front = self._front[n:]
        new = np.arange(self.drawn, self.drawn + n - len(out), dtype=np.int64)
        self.drawn += len(new)
        return np.concatenate([np.asarray(out, np.int64), new])

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn, "front": list(self._front)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn, self._front = int(state["drawn"]), list(state["front"])


class GrowingEngine(SimulatedEngine):
    """The replay engine with a pool that grows to any id asked of it (a ``FreshSource`` stream), each new prompt
    taking its own seeded quantile and length scale (the first ``pool_size`` prompts are those of
    ``SimulatedEngine``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._grow_rng = np.random.default_rng([self.seed, 4])

    def _grow(self, top: int) -> None:
        if top < self.pool_size:
            return
        extra = max(top + 1, 2 * self.pool_size) - self.pool_size
        self.quantile = np.concatenate([self.quantile, self._grow_rng.random(extra)])
        self.length_scale = np.concatenate([self.length_scale, self._grow_rng.lognormal(0.0, 0.3, extra)])
        self.pool_size += extra

    def generate(self, requests: Requests) -> Rollouts:
        if len(requests):
            self._grow(max(int(q) for q in requests))
        return super().generate(requests)
