"""GRESO: skip prompts before rollout when their history predicts zero variance.

Built on DAPO dynamic sampling. A prompt whose groups came out all-pass
("easy") or all-fail ("hard") in its last z consecutive appearances is kept
for rollout with probability p_easy**z or p_hard**z, otherwise skipped without
spending anything. After each step the two exploration probabilities move by
``p_step`` towards keeping the share of zero-variance groups among those
generated near ``target_zero_share``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.base import PASS_FAIL
from rlvr_core.allocation.dapo import DAPOAllocator, DAPOParams
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require


@dataclass(frozen=True)
class GRESOParams(DAPOParams):
    """GRESO's knobs on top of DAPO's.

    p_explore: initial keep probability base for easy and hard prompts, in (0, 1]
    p_min, p_max: bounds of the adapted keep probabilities
    p_step: adjustment per step
    target_zero_share: wanted share of zero-variance groups among generated ones
    max_candidates_factor: at most this many times gen_batch_size candidates are
        examined to fill one generation batch
    """

    p_explore: float = 0.5
    p_min: float = 0.05
    p_max: float = 1.0
    p_step: float = 0.05
    target_zero_share: float = 0.25
    max_candidates_factor: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 < self.p_min <= self.p_explore <= self.p_max <= 1.0, "p_explore",
                "need 0 < p_min <= p_explore <= p_max <= 1")
        require(0.0 < self.p_step < 1.0, "p_step", f"got {self.p_step}; it must lie in (0, 1)")
        require(0.0 <= self.target_zero_share < 1.0, "target_zero_share", "it must lie in [0, 1)")
        require(self.max_candidates_factor >= 1, "max_candidates_factor", "set it >= 1")


@ALLOCATORS.register("greso")
class GRESOAllocator(DAPOAllocator):
    """DAPO with probabilistic pre-rollout filtering; see the module docstring."""

    name = "greso"
    Params = GRESOParams
    reward_contract = PASS_FAIL  # its streaks tell all-pass from all-fail groups

    def __init__(self, params: GRESOParams) -> None:
        super().__init__(params)
        self.p_easy = params.p_explore
        self.p_hard = params.p_explore
        self.streak: dict[int, int] = {}  # prompt -> consecutive zero-variance appearances
        self.kind: dict[int, int] = {}  # prompt -> +1 all-pass, -1 all-fail

    def _fresh_prompts(self, n: int) -> np.ndarray:
        kept: list[int] = []
        examined = 0
        limit = n * self.params.max_candidates_factor
        while len(kept) < n and examined < limit:
            cand = self._fresh(min(n - len(kept), limit - examined))
            cand = cand[~np.isin(cand, kept)]
            if len(cand) == 0:
                break
            examined += len(cand)
            z = np.fromiter((self.streak.get(q, 0) for q in cand.tolist()), np.float64, len(cand))
            easy = np.fromiter((self.kind.get(q, 0) > 0 for q in cand.tolist()), bool, len(cand))
            keep_p = np.where(easy, self.p_easy, self.p_hard) ** z
            keep = self.rng.random(len(cand)) < keep_p
            kept.extend(cand[keep].tolist())
            self._counters["skipped"] += int((~keep).sum())
        return np.asarray(kept, np.int64)

    def _on_finish(self) -> None:
        led, p = self.ledger, self.params
        done = led.n >= p.k
        zero = done & (led.variance() <= p.reward_eps**2)
        passed = led.s >= led.n  # all-pass
        for q, z, d, ps in zip(led.prompt.tolist(), zero.tolist(), done.tolist(), passed.tolist()):
            if not d:
                continue
            if z:
                self.streak[q] = self.streak.get(q, 0) + 1
                self.kind[q] = 1 if ps else -1
            else:
                self.streak[q] = 0
                self.kind[q] = 0
        for sign, attr in ((1, "p_easy"), (-1, "p_hard")):
            n_done = max(int(done.sum()), 1)
            share = float((zero & (passed if sign > 0 else ~passed)).sum()) / n_done
            target = p.target_zero_share / 2
            cur = getattr(self, attr)
            cur = cur - p.p_step if share > target else cur + p.p_step
            setattr(self, attr, float(np.clip(cur, p.p_min, p.p_max)))

    def _extra_state(self) -> dict[str, Any]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, "streak": dict(self.streak), "kind": dict(self.kind)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.p_easy, self.p_hard = float(state["p_easy"]), float(state["p_hard"])
        self.streak = {int(k): int(v) for k, v in state["streak"].items()}
        self.kind = {int(k): int(v) for k, v in state["kind"].items()}
