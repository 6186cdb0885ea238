"""VIGOR: variance-guided online rollout allocation (docs/allocators/vigor.md).

Per step, N prompts start with m0 rollouts each. For T refinement iterations
the active prompts are ranked by the reward variance of all their rollouts so
far; the top alpha fraction stays active and its per-prompt budget grows by
gamma (m_{t+1} = gamma * m_t), generating the difference. Generation stops
early when the step budget is spent. Every accumulated rollout goes to the
GRPO update, as groups of different sizes (a prompt's gradient norm is
bounded by M * sigma, which is why variance is the selection signal).

Only prompts with positive variance are grown: a zero-variance group has no
gradient, and the paper's ranking would put it last anyway.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.allocation.base import SCALAR, Allocator, AllocatorParams
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require


@dataclass(frozen=True)
class VIGORParams(AllocatorParams):
    """VIGOR's knobs.

    budget: rollouts per step (default batch_size * k, the same as uniform GRPO)
    m0: initial rollouts per prompt, >= 2 (default k // 2: small next to the full group)
    T: refinement iterations, >= 0
    alpha: fraction of active prompts kept each iteration, in (0, 1]
    gamma: budget growth factor per iteration, > 1
    num_prompts: prompts started per step (default: as many as the budget
        covers when every iteration keeps exactly alpha of the prompts)
    fill: when the T iterations end with budget left (zero-variance prompts are
        not grown, so a step usually ends under budget), start another wave of
        fresh prompts at m0 and refine it the same way, until less than m0 is left;
        the step then spends its whole budget, as uniform GRPO's does (default
        false: the source's single wave)
    """

    budget: int | None = None
    m0: int | None = None
    T: int = 3
    alpha: float = 0.5
    gamma: float = 2.0
    num_prompts: int | None = None
    fill: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.m0 is None:
            object.__setattr__(self, "m0", max(2, self.k // 2))
        require(self.m0 >= 2, "m0", f"got {self.m0}; a prompt needs >= 2 rollouts for a variance")
        require(self.T >= 0, "T", f"got {self.T}; set T >= 0")
        require(0.0 < self.alpha <= 1.0, "alpha", f"got {self.alpha}; it must lie in (0, 1]")
        require(self.gamma > 1.0, "gamma", f"got {self.gamma}; it must be > 1 for budgets to grow")
        require(self.step_budget >= self.m0, "budget",
                f"{self.step_budget} rollouts cannot give one prompt m0={self.m0}; raise budget or lower m0")
        require(self.num_prompts is None or self.num_prompts >= 1, "num_prompts", "set it >= 1 or leave it unset")
        require(self.T * math.log(self.gamma) < math.log(sys.float_info.max / self.m0), "T",
                f"got {self.T}; m0 * gamma**T overflows a float (a size past 1e308 rollouts, where any size past the "
                "step budget is never requested); lower T")

    def host_items(self) -> dict[str, int]:
        """The T + 1 per-prompt sizes (``sizes``), listed at each refinement iteration."""
        return {"T": self.T + 1}

    @property
    def step_budget(self) -> int:
        return int(self.budget if self.budget is not None else self.batch_size * self.k)

    def sizes(self) -> list[int]:
        """Per-prompt budget m_t for t = 0..T."""
        return [int(round(self.m0 * self.gamma**t)) for t in range(self.T + 1)]

    @property
    def prompts_per_step(self) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        m = self.sizes()
        per_prompt = m[0] + sum(self.alpha**t * (m[t] - m[t - 1]) for t in range(1, self.T + 1))
        return max(1, int(self.step_budget // per_prompt))


@ALLOCATORS.register("vigor")
class VIGORAllocator(Allocator):
    """Variance-guided iterative budget growth; see the module docstring."""

    name = "vigor"
    Params = VIGORParams
    reward_contract = SCALAR  # reads the rewards' spread only: any finite reward

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.step_budget

    def _on_start(self) -> None:
        self.iteration = -1
        self.active = np.zeros(0, np.int64)
        self.wave_started = False

    def _propose(self) -> dict[int, int]:
        p, led = self.params, self.ledger
        left = p.step_budget - led.total_rollouts
        if self.iteration < 0:
            n = min(p.prompts_per_step, left // p.m0)
            ids = self._fresh(n)
            self.active = led.add_prompts(ids)
            self.iteration = 0
            self.wave_started = len(ids) > 0  # an exhausted source ends the step (no endless empty waves)
            return dict.fromkeys(ids.tolist(), p.m0)
        while self.iteration < p.T and len(self.active):
            req = self._grow(left)
            if req:
                return req
        if p.fill and left >= p.m0 and self.wave_started:
            self.iteration = -1  # another wave on fresh prompts
            return self._propose()
        return {}

    def _grow(self, left: int) -> dict[int, int]:
        """One refinement iteration: keep the top alpha of the active prompts by variance and request what
        brings each kept prompt to the iteration's size. A kept prompt that already holds that size stays
        active with no request (gamma near 1 rounds sizes such as [2, 2, 3, 3])."""
        p, led = self.params, self.ledger
        var = led.variance(self.active)
        n_keep = math.ceil(p.alpha * len(self.active))
        order = np.argsort(-var, kind="stable")[:n_keep]
        keep = self.active[order][var[order] > p.reward_eps**2]
        self.iteration += 1
        target = p.sizes()[self.iteration]
        req: dict[int, int] = {}
        chosen = []
        for slot in keep.tolist():  # highest variance first, until the budget is spent
            need = target - int(led.n[slot])
            if need > left:
                self._counters["hit_cap"] = 1
                break
            if need > 0:
                req[int(led.prompt[slot])] = need
                left -= need
            chosen.append(slot)
        self.active = np.asarray(chosen, np.int64)
        return req

    def _extra_state(self) -> dict[str, Any]:
        return {"iteration": getattr(self, "iteration", -1), "active": getattr(self, "active", np.zeros(0, np.int64)),
                "wave_started": getattr(self, "wave_started", False)}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.iteration = int(state["iteration"])
        self.active = np.asarray(state["active"], np.int64).copy()
        self.wave_started = bool(state.get("wave_started", False))
