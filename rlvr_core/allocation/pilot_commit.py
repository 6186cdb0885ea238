"""Pilot-Commit: a small pilot per prompt, then the full group only for prompts the pilot shows to be
informative (docs/allocators/pilot-commit.md).

Source: Kim, Yang, Yan and Liu, "Spend Your Rollouts Where It Counts: Rollout Allocation for Group-Based RL
Post-Training" (arXiv:2605.26606) and its verl recipe (github databricks/pilot-commit, ``recipe/pc/``:
``RayPCTrainer.fit``, ``select_prompts``, ``ReplayBuffer``), read for this module.

A step runs rounds. Each round may carry two kinds of requests:

- a pilot: ``gen_batch_size`` fresh prompts get ``n_pilot`` rollouts each. A prompt whose pilot pass rate m
  lies in [lower, 1 - upper] survives and waits in the survivor buffer; m < lower is deferred (too hard: it
  comes back when the prompt stream does), m > 1 - upper is skipped (too easy), and m >= ``exclude`` evicts
  the prompt from all later steps. A pass is a reward above ``reward_threshold`` (docs/design.md §3.2); under a
  threshold, a pilot whose rewards differ though all pass (or all fail) survives too: it carries a gradient;
- a commit: survivors from the buffer, highest pilot variance first and then the most recent, get k -
  ``n_pilot`` more rollouts, until ``batch_size`` prompts are committed.

A committed prompt's group is its pilot plus its commit (k rollouts), as in the source. Rounds go on until
``batch_size`` prompts are committed or ``max_gen_batches`` pilots were drawn (then the step ends with what
it has and sets ``hit_cap``; the source raises instead). Survivors not committed this step stay in the buffer
for at most ``max_off_steps`` later steps.

Knobs (defaults): ``n_pilot`` (k // 4, at least 2: the source's 32 of 128 and 16 of 64), ``lower`` (0.125)
and ``upper`` (0.25, a cut-off at 1 - 0.25 = 0.75), the source's scripts' thresholds, ``exclude`` (1.0; None
keeps every prompt),
``gen_batch_size`` (3 * batch_size, the source's ratio), ``max_gen_batches`` (10), ``max_off_steps`` (4).
The step budget is max_gen_batches * gen_batch_size * n_pilot + batch_size * (k - n_pilot).

Departures from the source:

- A survivor committed in a later step than its pilot trains on its commit rollouts only (k - n_pilot):
  its pilot rollouts were scored by an earlier policy and this allocator's batch holds only the step's own
  rollouts. The source puts the stale pilot into the group (verl recomputes the old log-probs under the
  current policy). Survivors committed in their own step, the common case, train on pilot + commit.
- Eviction applies at once (the next time the stream offers the prompt) rather than at the end of the epoch.
- Deferred prompts are not held anywhere: the stream offers them again in its next epoch, as the source's
  dataloader does.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.base import Allocator, AllocatorParams
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require
from rlvr_core.types import Rollouts


@dataclass(frozen=True)
class PilotCommitParams(AllocatorParams):
    """Pilot-Commit's knobs.

    n_pilot: pilot rollouts per prompt (default max(2, k // 4)), in [1, k)
    lower: a pilot pass rate below it defers the prompt (too hard)
    upper: a margin below a pass rate of 1, not a cut-off: a pilot pass rate above 1 - upper skips the prompt
        (too easy), so the default upper=0.25 skips prompts above 0.75
    exclude: a pilot pass rate at or above it evicts the prompt from later steps (None: never)
    gen_batch_size: prompts per pilot (default 3 * batch_size)
    max_gen_batches: pilots per step, >= 1
    max_off_steps: steps a survivor may wait in the buffer, >= 0
    """

    n_pilot: int | None = None
    lower: float = 0.125
    upper: float = 0.25
    exclude: float | None = 1.0
    gen_batch_size: int | None = None
    max_gen_batches: int = 10
    max_off_steps: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_pilot is None:
            object.__setattr__(self, "n_pilot", min(max(2, self.k // 4), self.k - 1))
        require(1 <= self.n_pilot < self.k, "n_pilot",
                f"got {self.n_pilot}; it must lie in [1, k={self.k}) so that the commit adds rollouts")
        require(0.0 <= self.lower <= 1.0 - self.upper <= 1.0, "lower",
                f"need 0 <= lower <= 1 - upper <= 1, got lower={self.lower}, upper={self.upper}")
        require(self.exclude is None or 0.0 < self.exclude <= 1.0, "exclude",
                f"got {self.exclude}; it must lie in (0, 1] or be unset")
        require(self.gen_batch_size is None or self.gen_batch_size >= 1, "gen_batch_size",
                f"got {self.gen_batch_size}; set it >= 1 or leave it unset (= 3 * batch_size)")
        require(self.max_gen_batches >= 1, "max_gen_batches", f"got {self.max_gen_batches}; set it >= 1")
        require(self.max_off_steps >= 0, "max_off_steps", f"got {self.max_off_steps}; set it >= 0")

    @property
    def gen_batch(self) -> int:
        return int(self.gen_batch_size or 3 * self.batch_size)


@ALLOCATORS.register("pilot-commit")
class PilotCommitAllocator(Allocator):
    """Pilot rollouts screen prompts; survivors are committed to the full group; see the module docstring."""

    name = "pilot-commit"
    Params = PilotCommitParams

    def __init__(self, params: PilotCommitParams) -> None:
        super().__init__(params)
        self.step = 0
        self.survivors: dict[int, tuple[int, float]] = {}  # prompt -> (step of its pilot, pilot reward std)
        self.evicted: set[int] = set()

    @property
    def max_rollouts_per_step(self) -> int:
        p = self.params
        return p.max_gen_batches * p.gen_batch * p.n_pilot + p.batch_size * (p.k - p.n_pilot)

    def _on_start(self) -> None:
        for key in ("pilots", "survived", "deferred", "too_easy", "evicted", "carried"):
            self._counters[key] = 0
        self.piloting = np.zeros(0, np.int64)  # slots whose pilot is out
        self.committed_slots: list[int] = []

    def _pilot_prompts(self, n: int) -> np.ndarray:
        """Up to n fresh prompts that are neither evicted nor waiting in the buffer."""
        out: dict[int, None] = {}  # ordered, and a set for the membership test
        for _ in range(4):
            if len(out) >= n:
                break
            cand = self._fresh(n - len(out)).tolist()
            if not cand:
                break
            evicted = [q in self.evicted for q in cand]
            self._counters["skipped"] += sum(evicted)
            out.update((q, None) for q, ev in zip(cand, evicted) if not ev and q not in self.survivors and q not in out)
        return np.asarray(list(out), np.int64)

    def _commit_requests(self) -> dict[int, int]:
        p, led = self.params, self.ledger
        need = p.batch_size - len(self.committed_slots)
        if need <= 0 or not self.survivors:
            return {}
        order = heapq.nsmallest(need, self.survivors.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
        req = {}
        for q, _ in order:
            del self.survivors[q]
            if q not in led.slot_of:
                led.add_prompts(np.array([q]))
                self._counters["carried"] += 1
            self.committed_slots.append(led.slot_of[q])
            req[q] = p.k - p.n_pilot
        self._counters["committed"] += len(req)
        return req

    def _propose(self) -> dict[int, int]:
        p = self.params
        req = self._commit_requests()
        if len(self.committed_slots) >= p.batch_size:
            return req
        if self._counters["pilots"] >= p.max_gen_batches:
            self._counters["hit_cap"] = 1
            return req
        ids = self._pilot_prompts(p.gen_batch)
        if len(ids):
            self._counters["pilots"] += 1
            self.piloting = self.ledger.add_prompts(ids)
            req.update(dict.fromkeys(ids.tolist(), p.n_pilot))
        return req

    def _on_observe(self, slots: np.ndarray) -> None:
        p, led = self.params, self.ledger
        if not len(self.piloting):
            return
        piloted = self.piloting
        self.piloting = np.zeros(0, np.int64)
        rate = led.s[piloted] / np.maximum(led.n[piloted], 1)
        std = np.sqrt(led.variance(piloted))
        # a scalar reward (reward_threshold set) whose pilot rewards differ while all pass or all fail carries a
        # gradient whatever the threshold says: it survives (with pass/fail rewards this never happens)
        spread = (std > p.reward_eps) & ((rate == 0.0) | (rate == 1.0))
        keep = ((rate >= p.lower) & (rate <= 1.0 - p.upper)) | spread
        self._counters["survived"] += int(keep.sum())
        self._counters["deferred"] += int(((rate < p.lower) & ~spread).sum())
        self._counters["too_easy"] += int(((rate > 1.0 - p.upper) & ~spread).sum())
        self._counters["abandoned"] += int((~keep).sum())
        prompts = led.prompt[piloted]
        self.survivors.update((q, (self.step, sd)) for q, sd in zip(prompts[keep].tolist(), std[keep].tolist()))
        if p.exclude is not None:
            gone = prompts[(rate >= p.exclude) & ~spread].tolist()
            self.evicted.update(gone)
            self._counters["evicted"] += len(gone)

    def _batch_rows(self, rows: Rollouts, row_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.flatnonzero(np.isin(row_slot, self.committed_slots))
        return idx, row_slot[idx]

    def _on_finish(self) -> None:
        self.step += 1
        limit = self.params.max_off_steps
        self.survivors = {q: v for q, v in self.survivors.items() if self.step - 1 - v[0] <= limit}

    def _extra_state(self) -> dict[str, Any]:
        return {"step": self.step, "survivors": dict(self.survivors), "evicted": sorted(self.evicted),
                "piloting": getattr(self, "piloting", np.zeros(0, np.int64)),
                "committed_slots": list(getattr(self, "committed_slots", []))}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.survivors = {int(q): (int(b), float(s)) for q, (b, s) in state["survivors"].items()}
        self.evicted = {int(q) for q in state["evicted"]}
        self.piloting = np.asarray(state["piloting"], np.int64).copy()
        self.committed_slots = [int(s) for s in state["committed_slots"]]
