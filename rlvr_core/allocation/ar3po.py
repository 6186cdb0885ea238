"""AR3PO: adaptive rollout (stop a prompt at its first correct response) plus response reuse
(docs/allocators/ar3po.md).

Source: Zhang, Yao, Yu, Liu, Yin, Yin, Yun and Li, "Improving Sampling Efficiency in RLVR through Adaptive
Rollout and Response Reuse" (arXiv:2509.25808). No public code was found; this module follows the paper's
description as summarised in its abstract and public summaries (the full text was not reachable from here),
so stage sizes and the buffer policy are ours where the summaries are silent.

Adaptive rollout: per step ``batch_size`` fresh prompts get ``stage_size`` rollouts each; after each stage a
prompt with a correct response (a pass: a reward above ``reward_threshold``, or 1 of pass/fail rewards) stops,
the others get another stage, for at most ``max_stages`` stages. Easy prompts cost one stage, hard ones up to
stage_size * max_stages. Every prompt's rollouts go to the update as one group.

Response reuse (``reuse=True``): after each step the allocator keeps, per prompt, the latest correct
completion it generated (payload included) in a buffer of at most ``buffer_prompts`` prompts, the least
recently refreshed dropped first. When a prompt's new rollouts in a later step all fail, its buffered
completion joins the group, which then has a correct response and a gradient. The row's payload is marked
``reused``; the trainer takes its importance ratio against the current policy (docs/allocators/ar3po.md).
Reused rows are not generated: ``StepStats.rollouts`` (and so rollouts-to-target) counts new rollouts only,
``StepStats.tokens`` counts the tokens of both, and ``extra`` carries ``reused_rollouts`` and
``reused_tokens``. The buffer is part of ``state_dict``, so it is in every checkpoint.

Knobs (defaults): ``stage_size`` (max(1, k // 4)), ``max_stages`` (4: at most k rollouts per prompt),
``reuse`` (True), ``buffer_prompts`` (4096); a pass is the base
``reward_threshold``'s (docs/design.md §3.2; this allocator's ``pass_threshold`` of earlier releases, 0.5).
The step budget is batch_size * stage_size * max_stages.

Departures from the source: stage sizes and the buffer bound are ours (see above); one buffered completion
per prompt joins a failing group (the paper's summaries speak of reusing earlier correct responses without a
number that could be read here).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rlvr_core.allocation.base import Allocator, AllocatorParams, mixed_groups
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require
from rlvr_core.types import Rollouts, StepStats, TrainBatch


@dataclass(frozen=True)
class AR3POParams(AllocatorParams):
    """AR3PO's knobs.

    stage_size: rollouts per active prompt per stage (default max(1, k // 4)), >= 1
    max_stages: stages per step, >= 1
    reuse: add a buffered correct completion to a group whose new rollouts all fail
    buffer_prompts: the most prompts the reuse buffer holds (one completion each), >= 1
    """

    stage_size: int | None = None
    max_stages: int = 4
    reuse: bool = True
    buffer_prompts: int = 4096

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "pass_threshold": "replaced by reward_threshold, which every allocator takes (a pass is a reward above it; "
                          "unset, rewards must be 1 or 0); write reward_threshold"}

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.stage_size is None or self.stage_size >= 1, "stage_size",
                f"got {self.stage_size}; set it >= 1 or leave it unset (= max(1, k // 4))")
        require(self.max_stages >= 1, "max_stages", f"got {self.max_stages}; set it >= 1")
        require(isinstance(self.reuse, bool), "reuse", f"got {self.reuse!r}; give true or false")
        require(self.buffer_prompts >= 1, "buffer_prompts", f"got {self.buffer_prompts}; set it >= 1")

    @property
    def per_stage(self) -> int:
        return int(self.stage_size or max(1, self.k // 4))


def mark_reused(row: Rollouts) -> Rollouts:
    """A copy of a one-row ``Rollouts`` whose payload (when a mapping) says ``reused=True``."""
    payload = None
    if row.payload is not None:
        payload = [dict(p, reused=True) if isinstance(p, Mapping) else p for p in row.payload]
    return Rollouts(row.prompt_id.copy(), row.reward.copy(), row.tokens.copy(), payload)


def refresh_buffer(buffer: OrderedDict[int, Rollouts], rows: Rollouts, pass_above: float, cap: int) -> None:
    """Keep, per prompt, its latest correct completion among ``rows`` (payload included), the most recently
    refreshed last; then drop the least recently refreshed beyond ``cap`` prompts."""
    for i in np.flatnonzero(rows.reward > pass_above).tolist():
        q = int(rows.prompt_id[i])
        buffer.pop(q, None)
        buffer[q] = rows.select([i])
    while len(buffer) > cap:
        buffer.popitem(last=False)


def with_reused(batch: TrainBatch, stats: StepStats, failing: list[tuple[int, Rollouts]],
                eps: float) -> tuple[TrainBatch, StepStats]:
    """``batch`` with each (prompt, buffered row) of ``failing`` joined to that prompt's group (marked reused),
    and ``stats`` recounted: reused rows add tokens, not rollouts (``extra``: reused_rollouts, reused_tokens)."""
    stats.extra["reused_rollouts"] = 0
    stats.extra["reused_tokens"] = 0
    if not failing:
        return batch, stats
    ro, gid = batch.rollouts, batch.group_id
    group_of = {int(q): int(g) for q, g in zip(ro.prompt_id.tolist(), gid.tolist())}
    reused = Rollouts.concat([mark_reused(row) for _, row in failing])
    rows = Rollouts.concat([ro, reused])
    group_id = np.concatenate([gid, np.array([group_of[q] for q, _ in failing], np.int64)])
    effective = mixed_groups(rows.reward, group_id, batch.num_groups, eps)
    useful = effective[group_id]
    n_tok = int(reused.tokens.sum())
    stats.tokens += n_tok
    stats.effective_groups = int(effective.sum())
    stats.useful_rollouts = int(useful.sum())
    stats.useful_tokens = int(rows.tokens[useful].sum())
    stats.extra["reused_rollouts"] = len(reused)
    stats.extra["reused_tokens"] = n_tok
    return TrainBatch(rows, group_id, effective), stats


@ALLOCATORS.register("ar3po")
class AR3POAllocator(Allocator):
    """Stages until a prompt's first correct response, plus response reuse; see the module docstring."""

    name = "ar3po"
    Params = AR3POParams

    def __init__(self, params: AR3POParams) -> None:
        super().__init__(params)
        self.buffer: OrderedDict[int, Rollouts] = OrderedDict()  # prompt -> its latest correct completion

    @property
    def max_rollouts_per_step(self) -> int:
        p = self.params
        return p.batch_size * p.per_stage * p.max_stages

    def _on_start(self) -> None:
        self.active = np.zeros(0, np.int64)

    def _propose(self) -> dict[int, int]:
        p, led = self.params, self.ledger
        if led.rounds == 0:
            self.active = led.add_prompts(self._fresh(p.batch_size))
        elif led.rounds >= p.max_stages or len(self.active) == 0:
            return {}
        return dict.fromkeys(led.prompt[self.active].tolist(), p.per_stage)

    def _solved(self) -> np.ndarray:
        rows, slot = self.ledger.all_rows()
        out = np.zeros(self.ledger.num_slots, bool)
        out[slot[rows.reward > self.params.pass_above]] = True
        return out

    def _on_observe(self, slots: np.ndarray) -> None:
        solved = self._solved()[self.active]
        self._counters["committed"] += int(solved.sum())
        self.active = self.active[~solved]
        if self.ledger.rounds >= self.params.max_stages:
            self._counters["abandoned"] = len(self.active)

    def _on_finish(self) -> None:
        """Refresh the buffer with each prompt's latest correct completion of this step, then bound it."""
        if self.params.reuse:
            refresh_buffer(self.buffer, self.ledger.all_rows()[0], self.params.pass_above, self.params.buffer_prompts)

    def finish_step(self) -> tuple[TrainBatch, StepStats]:
        """The base batch, plus one buffered correct completion for each group whose new rollouts all fail."""
        failing = self._failing_with_buffer()  # read before _on_finish refreshes the buffer
        batch, stats = super().finish_step()
        return with_reused(batch, stats, failing, self.params.reward_eps)

    def _failing_with_buffer(self) -> list[tuple[int, Rollouts]]:
        """(prompt, buffered row) for this step's prompts with no correct response and a buffered one."""
        if not self.params.reuse or self._pending is not None or self.ledger.num_slots == 0:
            return []
        solved = self._solved()
        led = self.ledger
        return [(q, self.buffer[q]) for q, s, n in zip(led.prompt.tolist(), solved.tolist(), led.n.tolist())
                if not s and n > 0 and q in self.buffer]

    def _extra_state(self) -> dict[str, Any]:
        return {"active": getattr(self, "active", np.zeros(0, np.int64)),
                "buffer": [(q, row) for q, row in self.buffer.items()]}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.active = np.asarray(state["active"], np.int64).copy()
        self.buffer = OrderedDict((int(q), row) for q, row in state["buffer"])
