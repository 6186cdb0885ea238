"""The round-based Allocator protocol and the bookkeeping every allocator shares.

One training step is a conversation between an allocator and an engine
(docs/design.md §3.1)::

    allocator.start_step(source)
    while (requests := allocator.propose()):   # {prompt_id: n_new}
        rollouts = engine.generate(requests)   # one batched call per round
        ... verifier fills rollouts.reward ...
        allocator.observe(rollouts)
    batch, stats = allocator.finish_step()     # ragged groups + counters

Subclasses implement ``_propose`` (the next round's requests), optionally
``_on_observe`` (decisions after a round) and ``_batch_rows`` (which rows form
which training group). The base class checks the protocol, the step budget,
keeps the step's rollouts in a ledger with per-prompt counts, and builds the
``TrainBatch`` and ``StepStats``.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rlvr_core.allocation.source import PromptSource
from rlvr_core.errors import from_mapping, require
from rlvr_core.types import Rollouts, StepStats, TrainBatch


@dataclass(frozen=True)
class AllocatorParams:
    """Parameters every allocator takes.

    k: rollouts per full group (GRPO group size), >= 2
    batch_size: prompts per step (uniform) or effective groups wanted per step
    reward_eps: a group is effective (mixed) when its reward std exceeds this
    seed: seeds the allocator's own randomness (prompt selection, skipping)
    """

    k: int = 8
    batch_size: int = 32
    reward_eps: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.k, (int, np.integer)) and self.k >= 2, "k",
                f"got {self.k!r}; a group needs at least 2 rollouts to compare (set k >= 2)")
        require(isinstance(self.batch_size, (int, np.integer)) and self.batch_size >= 1, "batch_size",
                f"got {self.batch_size!r}; set batch_size >= 1")
        require(self.reward_eps >= 0, "reward_eps", f"got {self.reward_eps}; must be >= 0")


class StepLedger:
    """All rollouts of the current step plus per-prompt ("slot") running sums.

    Slots are numbered in the order prompts first appear; arrays are indexed by slot.
    """

    def __init__(self) -> None:
        self.parts: list[Rollouts] = []
        self.row_slot: list[np.ndarray] = []
        self.slot_of: dict[int, int] = {}
        self.prompt = np.zeros(0, np.int64)
        self.n = np.zeros(0, np.int64)  # rollouts per slot
        self.s = np.zeros(0, np.float64)  # reward sum per slot (passes for binary rewards)
        self.s2 = np.zeros(0, np.float64)  # reward sum of squares per slot
        self.tokens = np.zeros(0, np.int64)
        self.rounds = 0

    @property
    def num_slots(self) -> int:
        return len(self.prompt)

    @property
    def total_rollouts(self) -> int:
        return int(self.n.sum())

    def add_prompts(self, prompt_ids: np.ndarray) -> np.ndarray:
        """Register new prompts; returns their slot indices."""
        start = self.num_slots
        ids = np.asarray(prompt_ids, np.int64)
        for j, q in enumerate(ids.tolist()):
            if q in self.slot_of:
                raise ValueError(f"prompt {q} already has a slot in this step")
            self.slot_of[q] = start + j
        m = len(ids)
        self.prompt = np.concatenate([self.prompt, ids])
        self.n = np.concatenate([self.n, np.zeros(m, np.int64)])
        self.s = np.concatenate([self.s, np.zeros(m)])
        self.s2 = np.concatenate([self.s2, np.zeros(m)])
        self.tokens = np.concatenate([self.tokens, np.zeros(m, np.int64)])
        return np.arange(start, start + m)

    def slots(self, prompt_ids: np.ndarray) -> np.ndarray:
        return np.fromiter((self.slot_of[q] for q in np.asarray(prompt_ids).tolist()), np.int64, len(prompt_ids))

    def add(self, rollouts: Rollouts) -> np.ndarray:
        slots = self.slots(rollouts.prompt_id)
        np.add.at(self.n, slots, 1)
        np.add.at(self.s, slots, rollouts.reward)
        np.add.at(self.s2, slots, rollouts.reward**2)
        np.add.at(self.tokens, slots, rollouts.tokens)
        self.parts.append(rollouts)
        self.row_slot.append(slots)
        return slots

    def variance(self, slots: np.ndarray | None = None) -> np.ndarray:
        """Population reward variance per slot (0 where n == 0)."""
        n = self.n if slots is None else self.n[slots]
        s = self.s if slots is None else self.s[slots]
        s2 = self.s2 if slots is None else self.s2[slots]
        nn = np.maximum(n, 1)
        return np.maximum(s2 / nn - (s / nn) ** 2, 0.0)

    def all_rows(self) -> tuple[Rollouts, np.ndarray]:
        rows = Rollouts.concat(self.parts)
        slot = np.concatenate(self.row_slot) if self.row_slot else np.zeros(0, np.int64)
        return rows, slot


class Allocator(ABC):
    """Base class of every allocator; see the module docstring for the protocol."""

    name: ClassVar[str]
    Params: ClassVar[type[AllocatorParams]] = AllocatorParams

    def __init__(self, params: AllocatorParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.ledger = StepLedger()
        self.source: PromptSource | None = None
        self._pending: dict[int, int] | None = None
        self._done = True
        self._counters: dict[str, int] = {}

    # ----- what subclasses provide -------------------------------------------------
    @property
    @abstractmethod
    def max_rollouts_per_step(self) -> int:
        """The most rollouts one step may generate (the step budget or cap)."""

    @abstractmethod
    def _propose(self) -> dict[int, int]:
        """The next round's requests {prompt_id: n_new}; empty ends the step."""

    def _on_start(self) -> None:  # noqa: B027 - optional hook, deliberately not abstract
        """Reset per-step state (called by start_step)."""

    def _on_observe(self, slots: np.ndarray) -> None:  # noqa: B027 - optional hook, deliberately not abstract
        """Decide after a round; ``slots`` are the ledger slots of the new rows."""

    def _batch_rows(self, rows: Rollouts, row_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, group id per row) of the training batch. Default: every slot is a group."""
        return np.arange(len(rows)), row_slot

    def _on_finish(self) -> None:  # noqa: B027 - optional hook, deliberately not abstract
        """Update cross-step state (histories, posteriors) at the end of a step."""

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook, deliberately not abstract
        """Restore what ``_extra_state`` saved (default: nothing to restore)."""

    def _fresh(self, n: int) -> np.ndarray:
        """Up to n prompts from the source that have no slot in this step yet.

        A small pool can wrap into its next epoch inside one step; prompts
        already sampled this step are passed over rather than sampled twice.
        """
        out: list[int] = []
        seen = set(self.ledger.slot_of)
        for _ in range(4):
            if len(out) >= n:
                break
            for q in self.source.take(n - len(out)).tolist():
                if q not in seen:
                    seen.add(q)
                    out.append(q)
        return np.asarray(out, np.int64)

    # ----- the protocol --------------------------------------------------------------
    def start_step(self, source: PromptSource) -> None:
        """Begin a step drawing fresh prompts from ``source``."""
        if not isinstance(source, PromptSource):
            raise TypeError(f"start_step needs a PromptSource, got {type(source).__name__}")
        self.source = source
        self.ledger = StepLedger()
        self._pending = None
        self._done = False
        self._counters = {"committed": 0, "abandoned": 0, "skipped": 0, "hit_cap": 0}
        self._on_start()

    def propose(self) -> dict[int, int]:
        """Requests for the next synchronous round; an empty dict means the step is over."""
        if self.source is None:
            raise RuntimeError("call start_step() before propose()")
        if self._pending is not None:
            raise RuntimeError("observe() the rollouts of the previous proposal before proposing again")
        req = {} if self._done else {int(q): int(n) for q, n in self._propose().items() if n > 0}
        if not req:
            self._done = True
            return {}
        total = self.ledger.total_rollouts + sum(req.values())
        if total > self.max_rollouts_per_step:
            raise AssertionError(
                f"{self.name}: proposal would exceed the step budget ({total} > {self.max_rollouts_per_step})")
        self._pending = req
        self.ledger.rounds += 1
        return dict(req)

    def observe(self, rollouts: Rollouts) -> None:
        """Take the rollouts generated for the last proposal (rewards filled in)."""
        if self._pending is None:
            raise RuntimeError("observe() called without a pending proposal")
        ids, counts = np.unique(rollouts.prompt_id, return_counts=True)
        got = dict(zip(ids.tolist(), counts.tolist()))
        if got != self._pending:
            missing = {q: n for q, n in self._pending.items() if got.get(q) != n}
            raise ValueError(f"{self.name}: rollouts do not answer the proposal; mismatched prompts (wanted): "
                             f"{dict(list(missing.items())[:5])}")
        self._pending = None
        slots = self.ledger.add(rollouts)
        self._on_observe(slots)

    def finish_step(self) -> tuple[TrainBatch, StepStats]:
        """The ragged training batch and the step's counters."""
        if self._pending is not None:
            raise RuntimeError("finish_step() called with a proposal still pending")
        rows, row_slot = self.ledger.all_rows()
        idx, gkey = self._batch_rows(rows, row_slot)
        keys, group_id = np.unique(gkey, return_inverse=True)
        batch_rows = rows.select(idx)
        G = len(keys)
        cnt = np.bincount(group_id, minlength=G).astype(np.float64)
        mean = np.bincount(group_id, weights=batch_rows.reward, minlength=G) / np.maximum(cnt, 1)
        sq = np.bincount(group_id, weights=batch_rows.reward**2, minlength=G) / np.maximum(cnt, 1)
        std = np.sqrt(np.maximum(sq - mean**2, 0.0))
        effective = (std > self.params.reward_eps) & (cnt >= 2)
        useful = effective[group_id] if len(group_id) else np.zeros(0, bool)
        c = self._counters
        stats = StepStats(
            rollouts=len(rows), tokens=int(rows.tokens.sum()), rounds=self.ledger.rounds,
            prompts=int((self.ledger.n > 0).sum()), groups=G, effective_groups=int(effective.sum()),
            useful_rollouts=int(useful.sum()), useful_tokens=int(batch_rows.tokens[useful].sum()),
            committed=c["committed"], abandoned=c["abandoned"], skipped=c["skipped"], hit_cap=c["hit_cap"],
            extra={k: v for k, v in c.items() if k not in ("committed", "abandoned", "skipped", "hit_cap")},
        )
        self._on_finish()
        self.source = None
        self._done = True
        return TrainBatch(batch_rows, group_id.astype(np.int64), effective), stats

    # ----- state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically, mid-step or between steps.

        The prompt source is not included (it belongs to the caller); pass the
        restored source back through ``resume_step``.
        """
        led = self.ledger
        return copy.deepcopy({
            "name": self.name, "rng": self.rng.bit_generator.state, "pending": self._pending,
            "done": self._done, "counters": self._counters, "in_step": self.source is not None,
            "ledger": {k: getattr(led, k) for k in ("parts", "row_slot", "slot_of", "prompt", "n", "s", "s2",
                                                     "tokens", "rounds")},
            "extra": self._extra_state(),
        })

    def load_state_dict(self, state: dict[str, Any], source: PromptSource | None = None) -> None:
        """Restore ``state_dict()``; a mid-step state needs the step's prompt source."""
        if state.get("name") != self.name:
            raise ValueError(f"state belongs to allocator {state.get('name')!r}, not {self.name!r}")
        state = copy.deepcopy(state)
        self.rng.bit_generator.state = state["rng"]
        self._pending = state["pending"]
        self._done = state["done"]
        self._counters = state["counters"]
        self.ledger = StepLedger()
        for k, v in state["ledger"].items():
            setattr(self.ledger, k, v)
        if state["in_step"] and source is None:
            raise ValueError("this state was saved mid-step: pass the step's PromptSource")
        self.source = source if state["in_step"] else None
        self._load_extra_state(state["extra"])


def build_params(cls: type[AllocatorParams], name: str, params: dict[str, Any]) -> AllocatorParams:
    """Construct ``cls(**params)``; errors read "<allocator>.<field>: why and how to fix"."""
    return from_mapping(cls, params, name)
