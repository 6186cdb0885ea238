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

After ``finish_step``, ``step_beliefs`` holds, for each prompt of the step
that got a rollout, what the allocator believed of it: ``prior``, its mean
pass rate before the step's rollouts (a Beta prior's or posterior's mean, an
estimate from its history), and ``p_eff``, the probability at its decision
that its full group ends mixed (SARA). NaN where the allocator holds no such
value; allocators that hold none (GRPO, DAPO, ...) leave it empty. The
training loop writes them to the decision log (``rlvr_core.rollout_log``).

The reward contract (docs/design.md §3.2) is checked here, once, for every
allocator, as each round's rewards come in (``observe``): a reward must be a
finite number; a pass is a reward above ``reward_threshold``; with the threshold
unset, an allocator whose decisions read passes (``reward_contract`` PASS_FAIL)
takes only 1 (pass) and 0 (fail). Any other reward raises ``RewardError``,
naming the prompt, the value and the round; nothing of that round is kept.
A group is effective (mixed) by its rewards themselves (std above
``reward_eps``), whatever the threshold.
"""

from __future__ import annotations

import copy
import math
import numbers
import types
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rlvr_core.allocation.source import PromptSource
from rlvr_core.errors import ConfigError, RewardError, from_mapping, require, short_repr
from rlvr_core.types import Rollouts, StepStats, TrainBatch


@dataclass(frozen=True)
class AllocatorParams:
    """Parameters every allocator takes.

    k: rollouts per full group (GRPO group size), >= 2
    batch_size: B, whose meaning is each allocator's: prompts per step for grpo, pods, ar3po and
        reinforce-ada; mixed (or committed) groups to fill for dapo, greso and sara in groups mode; committed
        prompts for pilot-commit; the default budget B * k rollouts for vigor and sara in rollouts mode
    reward_eps: a group is effective (mixed) when its reward std exceeds this
    seed: seeds the allocator's own randomness (prompt selection, skipping)
    reward_threshold: a pass is a reward above it; unset (None), rewards are pass/fail, 1 or 0, and an
        allocator that reads passes refuses any other reward (the reward contract, docs/design.md §3.2)
    """

    k: int = 8
    batch_size: int = 32
    reward_eps: float = 1e-6
    seed: int = 0
    reward_threshold: float | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.k, (int, np.integer)) and self.k >= 2, "k",
                f"got {self.k!r}; a group needs at least 2 rollouts to compare (set k >= 2)")
        require(isinstance(self.batch_size, (int, np.integer)) and self.batch_size >= 1, "batch_size",
                f"got {self.batch_size!r}; set batch_size >= 1")
        require(self.reward_eps >= 0, "reward_eps", f"got {self.reward_eps}; must be >= 0")
        t = self.reward_threshold
        require(t is None or (isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, bool)
                              and math.isfinite(t)), "reward_threshold",
                f"got {t!r}; give a number (a pass is a reward above it) or leave it unset for pass/fail rewards")

    @property
    def pass_above(self) -> float:
        """A reward above this is a pass: ``reward_threshold``, or 0.5 for pass/fail rewards (1 passes, 0 fails)."""
        return 0.5 if self.reward_threshold is None else float(self.reward_threshold)

    def host_items(self) -> dict[str, int]:
        """{field: items} of the per-step host arrays, besides the step's rollouts, that a field of these
        parameters sizes (none here). ``TrainConfig`` checks them, 8 bytes an item, with the step's rollouts
        (``Allocator.max_rollouts_per_step``) against the machine's memory (``rlvr_core.config.limits``)."""
        return {}


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
        self.s = np.zeros(0, np.float64)  # passes per slot (rewards above the pass threshold)
        self.ref = np.zeros(0, np.float64)  # first reward seen per slot: the moments below are shifted by it
        self.d1 = np.zeros(0, np.float64)  # sum of (reward - ref) per slot
        self.d2 = np.zeros(0, np.float64)  # sum of (reward - ref)**2 per slot: exactly 0 for a constant group
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
        self.ref = np.concatenate([self.ref, np.zeros(m)])
        self.d1 = np.concatenate([self.d1, np.zeros(m)])
        self.d2 = np.concatenate([self.d2, np.zeros(m)])
        self.tokens = np.concatenate([self.tokens, np.zeros(m, np.int64)])
        return np.arange(start, start + m)

    def slots(self, prompt_ids: np.ndarray) -> np.ndarray:
        return np.fromiter((self.slot_of[q] for q in np.asarray(prompt_ids).tolist()), np.int64, len(prompt_ids))

    def add(self, rollouts: Rollouts, passed: np.ndarray | None = None) -> np.ndarray:
        """Add a round's rows; ``passed`` (1.0 or 0.0 a row) is what ``s`` counts, the rewards themselves when
        not given (pass/fail rewards, and the states of earlier releases, whose ``s`` summed the rewards)."""
        slots = self.slots(rollouts.prompt_id)
        reward = np.asarray(rollouts.reward, np.float64)
        first_slot, first_row = np.unique(slots, return_index=True)
        new = self.n[first_slot] == 0
        self.ref[first_slot[new]] = reward[first_row[new]]
        d = reward - self.ref[slots]
        np.add.at(self.n, slots, 1)
        np.add.at(self.s, slots, reward if passed is None else np.asarray(passed, np.float64))
        np.add.at(self.d1, slots, d)
        np.add.at(self.d2, slots, d * d)
        np.add.at(self.tokens, slots, rollouts.tokens)
        self.parts.append(rollouts)
        self.row_slot.append(slots)
        return slots

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> StepLedger:
        """A ledger from ``Allocator.state_dict()["ledger"]``; a state saved before the shifted moments existed
        (with a sum of squares ``s2`` instead) has them rebuilt from its rows."""
        led = cls()
        for k, v in state.items():
            if k != "s2":
                setattr(led, k, v)
        if "d2" not in state:
            parts = led.parts
            led.parts, led.row_slot = [], []
            led.n, led.s, led.tokens = (np.zeros_like(led.n), np.zeros_like(led.s), np.zeros_like(led.tokens))
            led.ref, led.d1, led.d2 = (np.zeros(led.num_slots) for _ in range(3))
            for part in parts:
                led.add(part)
        return led

    def variance(self, slots: np.ndarray | None = None) -> np.ndarray:
        """Population reward variance per slot (0 where n == 0, and exactly 0 for a constant group).

        Computed from moments shifted by each slot's first reward, so that rewards far from 0 (100.1, 100.1, ...)
        do not cancel into a spurious positive variance.
        """
        idx = slice(None) if slots is None else slots
        nn = np.maximum(self.n[idx], 1)
        d1, d2 = self.d1[idx], self.d2[idx]
        return np.maximum(d2 / nn - (d1 / nn) ** 2, 0.0)

    def all_rows(self) -> tuple[Rollouts, np.ndarray]:
        rows = Rollouts.concat(self.parts)
        slot = np.concatenate(self.row_slot) if self.row_slot else np.zeros(0, np.int64)
        return rows, slot


PASS_FAIL, SCALAR = "pass/fail", "scalar"  # the reward contracts (Allocator.reward_contract)


def check_rewards(rollouts: Rollouts, params: AllocatorParams, contract: str, who: str, round_index: int) -> None:
    """Raise RewardError unless every reward of the round is in the contract: a finite number, and under
    ``PASS_FAIL`` with ``reward_threshold`` unset exactly 1 or 0. The message names the first row outside it
    (prompt, value, row), the round and how many rows of the round are outside."""
    reward = np.asarray(rollouts.reward, np.float64)
    finite = np.isfinite(reward)
    binary = contract == PASS_FAIL and params.reward_threshold is None
    ok = finite & ((reward == 0.0) | (reward == 1.0)) if binary else finite
    if ok.all():
        return
    bad = np.flatnonzero(~ok)
    i = int(bad[0])
    value = float(reward[i])
    more = f"; {len(bad) - 1} more of the round's {len(reward)} rewards are outside too" if len(bad) > 1 else ""
    head = (f"{who}: reward {value!r} of prompt {int(rollouts.prompt_id[i])} (row {i} of round {round_index} of the "
            f"step{more})")
    if not finite[i]:
        why = ("is not a finite number; every reward must be one (score an unverifiable or failed rollout as a fail, "
               "not NaN)")
    else:
        why = (f"is not pass/fail: with reward_threshold unset, {who} takes rewards 1 (pass) and 0 (fail) only. "
               "For other rewards set reward_threshold, the value a pass must exceed (e.g. 0 for -1/+1 rewards, "
               "0.5 for rewards in [0, 1])")
    raise RewardError(f"{head} {why}", prompt=int(rollouts.prompt_id[i]), value=value, row=i)


def mixed_groups(reward: np.ndarray, group_id: np.ndarray, num_groups: int, eps: float) -> np.ndarray:
    """Per group: at least 2 rows whose rewards differ (max > min) with a two-pass std above ``eps``."""
    reward = np.asarray(reward, np.float64)
    cnt = np.bincount(group_id, minlength=num_groups).astype(np.float64)
    hi = np.full(num_groups, -np.inf)
    lo = np.full(num_groups, np.inf)
    np.maximum.at(hi, group_id, reward)
    np.minimum.at(lo, group_id, reward)
    mean = np.bincount(group_id, weights=reward, minlength=num_groups) / np.maximum(cnt, 1)
    dev = reward - mean[group_id]
    std = np.sqrt(np.bincount(group_id, weights=dev * dev, minlength=num_groups) / np.maximum(cnt, 1))
    return (cnt >= 2) & (hi > lo) & (std > eps)


class Allocator(ABC):
    """Base class of every allocator; see the module docstring for the protocol."""

    name: ClassVar[str]
    Params: ClassVar[type[AllocatorParams]] = AllocatorParams
    # PASS_FAIL: decisions read passes (rewards above params.pass_above); SCALAR: they read the rewards' spread
    # only, so any finite reward will do (docs/design.md §3.2)
    reward_contract: ClassVar[str] = PASS_FAIL

    def __init__(self, params: AllocatorParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.ledger = StepLedger()
        self.source: PromptSource | None = None
        self._pending: dict[int, int] | None = None
        self._done = True
        self._counters: dict[str, int] = {}
        self.step_beliefs: dict[int, tuple[float, float]] = {}

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

    def _beliefs(self) -> tuple[np.ndarray | float, np.ndarray | float] | None:
        """Per ledger slot, (prior, p_eff) for ``step_beliefs``; NaN where the allocator holds no such value, and
        None (the default) where it holds neither. Called by ``finish_step`` before ``_on_finish``, so that a
        posterior has not yet taken the step's evidence."""
        return None

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
        self.step_beliefs = {}
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
        """Take the rollouts generated for the last proposal (rewards filled in).

        Raises RewardError, before anything of the round is kept, when a reward is outside the allocator's
        contract (``check_rewards``)."""
        if self._pending is None:
            raise RuntimeError("observe() called without a pending proposal")
        ids, counts = np.unique(rollouts.prompt_id, return_counts=True)
        got = dict(zip(ids.tolist(), counts.tolist()))
        if got != self._pending:
            missing = {q: n for q, n in self._pending.items() if got.get(q) != n}
            raise ValueError(f"{self.name}: rollouts do not answer the proposal; mismatched prompts (wanted): "
                             f"{dict(list(missing.items())[:5])}")
        check_rewards(rollouts, self.params, self.reward_contract, self.name, self.ledger.rounds)
        self._pending = None
        slots = self.ledger.add(rollouts, rollouts.reward > self.params.pass_above)
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
        effective = mixed_groups(batch_rows.reward, group_id, G, self.params.reward_eps)
        useful = effective[group_id] if len(group_id) else np.zeros(0, bool)
        c = self._counters
        stats = StepStats(
            rollouts=len(rows), tokens=int(rows.tokens.sum()), rounds=self.ledger.rounds,
            prompts=int((self.ledger.n > 0).sum()), groups=G, effective_groups=int(effective.sum()),
            useful_rollouts=int(useful.sum()), useful_tokens=int(batch_rows.tokens[useful].sum()),
            committed=c["committed"], abandoned=c["abandoned"], skipped=c["skipped"], hit_cap=c["hit_cap"],
            extra={k: v for k, v in c.items() if k not in ("committed", "abandoned", "skipped", "hit_cap")},
        )
        self.step_beliefs = self._step_beliefs()
        self._on_finish()
        self.source = None
        self._done = True
        return TrainBatch(batch_rows, group_id.astype(np.int64), effective), stats

    def _step_beliefs(self) -> dict[int, tuple[float, float]]:
        """{prompt: (prior, p_eff)} of the step's prompts that got a rollout, from ``_beliefs`` (empty: none)."""
        got = self._beliefs()
        if got is None:
            return {}
        led = self.ledger
        prior, peff = (np.broadcast_to(np.asarray(x, np.float64), (led.num_slots,)) for x in got)
        return {int(q): (float(prior[i]), float(peff[i])) for i, q in enumerate(led.prompt.tolist()) if led.n[i] > 0}

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
            "ledger": {k: getattr(led, k) for k in ("parts", "row_slot", "slot_of", "prompt", "n", "s", "ref", "d1",
                                                     "d2", "tokens", "rounds")},
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
        self.ledger = StepLedger.from_state(state["ledger"])
        if state["in_step"] and source is None:
            raise ValueError("this state was saved mid-step: pass the step's PromptSource")
        self.source = source if state["in_step"] else None
        self._load_extra_state(state["extra"])


def _needs(value: Any, hint: Any) -> str | None:
    """What a value of field annotation ``hint`` must be ("an int or null"), or None when ``value`` fits it.
    Checked: bool, int, float, str and their unions with None; other annotations are the class's to check."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        needs = [_needs(value, a) for a in args if a is not type(None)]
        if any(n is None for n in needs):
            return None
        return " or ".join(typing.cast(list[str], needs)) + (" or null" if type(None) in args else "")
    is_bool = isinstance(value, (bool, np.bool_))
    fits = {bool: (is_bool, "true or false"), str: (isinstance(value, str), "a string"),
            int: (isinstance(value, numbers.Integral) and not is_bool, "an int"),
            float: (isinstance(value, numbers.Real) and not is_bool, "a number")}
    ok, need = fits.get(hint, (True, ""))
    return None if ok else need


def build_params(cls: type[AllocatorParams], name: str, params: dict[str, Any]) -> AllocatorParams:
    """Construct ``cls(**params)``; errors read "<allocator>.<field>: why and how to fix". A value that does not
    fit its field's type ("0.5" for a float) is refused before the class's range checks compare it."""
    hints = typing.get_type_hints(cls)
    for key, value in params.items():
        if key in hints and (need := _needs(value, hints[key])) is not None:
            raise ConfigError(f"{name}.{key}: got {short_repr(value)}; need {need}")
    return from_mapping(cls, params, name)
