"""VALOR: value-of-rollout allocation, ours (docs/allocators/valor.md, docs/design.md §4.17).

Every other allocator here counts a mixed group as worth one. VALOR prices what a group teaches instead, with the
value measured in real training (benchmarks/group_value.py, design.md §4.11 and §4.17): a group of n rollouts of a
prompt at pass rate p is worth

    V(p, n) = P(the group is mixed) * p**value_a * (1 - p)**value_b * (n / k)**size_exponent / (1 + novelty * t)

where t is how many times the prompt was trained before in the run. Within a step, a fixed budget (default B x k
rollouts, as uniform GRPO spends) goes out in synchronous rounds. Every prompt carries a Beta posterior on p:
its prior (the population's, fitted by empirical Bayes, plus its own decayed evidence from earlier steps:
``prior``, as SARA's) updated by this step's rollouts (SARA's within-step evidence). A prompt's index is the
posterior-expected value its group gains by going on to ``max_n`` rollouts, per rollout still to spend (per
expected token under ``price="tokens"``); a fresh prompt's is its prior's, for a whole group. After each round a
live prompt whose index falls below a fresh prompt's stops (its rows still form a group, trained when mixed), the
others grow to the next size of the schedule (``pilot``, doubling, up to ``max_n``), and the budget that no live
prompt reserves starts fresh prompts at ``pilot`` rollouts. Fresh prompts start only while they can still reach
``max_n`` within ``max_rounds``.

``reuse=True`` (the variant ``valor[reuse]``): where prompts recur, a group whose rollouts all fail is completed
with the prompt's latest correct completion from an earlier step (AR3PO's response reuse, ar3po.py), and the
index counts that an all-fail group of a prompt with a buffered answer will be mixed.

The constants' defaults were fixed from the calibration measurement before any study cell of VALOR ran
(design.md §4.17).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import betaln

from rlvr_core.allocation.ar3po import refresh_buffer, with_reused
from rlvr_core.allocation.base import Allocator, AllocatorParams
from rlvr_core.allocation.posterior import PriorConfig, PromptPosterior, as_prior_config
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require
from rlvr_core.types import Rollouts, StepStats, TrainBatch

LIVE, DONE, STOPPED = 0, 1, 2


@dataclass(frozen=True)
class VALORParams(AllocatorParams):
    """VALOR's knobs (defaults: design.md §4.17, fixed from the calibration warm starts).

    budget: rollouts per step (default batch_size * k)
    pilot: rollouts a fresh prompt starts with, in [1, max_n]
    max_n: the most rollouts a prompt gets in a step (default k)
    max_rounds: cap on synchronous rounds per step
    value_a, value_b: the value's pass-rate form p**value_a * (1 - p)**value_b, each >= 0
    size_exponent: a mixed group of n is worth (n / k)**size_exponent of one of k, in [0, 1]
    novelty: the value is divided by 1 + novelty * (times the prompt was trained before), >= 0
    price: "rollouts", or "tokens" (a live prompt's rollouts cost its prefix's mean tokens over the step's mean,
        clipped to [1/2, 2]; a fresh prompt's cost 1)
    prior: each prompt's Beta prior (PriorConfig or its kind; default "carry+eb")
    reuse: complete an all-fail group with the prompt's buffered correct completion from an earlier step
    buffer_prompts: the most prompts the reuse buffer holds, >= 1
    """

    budget: int | None = None
    pilot: int = 2
    max_n: int | None = None
    max_rounds: int = 6
    value_a: float = 0.5
    value_b: float = 2.5
    size_exponent: float = 1.0
    novelty: float = 0.0
    price: str = "rollouts"
    prior: Any = field(default_factory=lambda: PriorConfig(kind="carry+eb"))
    reuse: bool = False
    buffer_prompts: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "prior", as_prior_config(self.prior, "carry+eb"))
        require(self.max_n is None or self.max_n >= 2, "max_n", f"got {self.max_n}; set it >= 2 or leave it unset")
        require(1 <= self.pilot <= self.cap, "pilot", f"got {self.pilot}; it must lie in [1, max_n={self.cap}]")
        require(self.step_budget >= self.cap, "budget", f"{self.step_budget} rollouts cannot hold one group of "
                f"max_n={self.cap}; set it >= max_n")
        require(self.max_rounds >= len(self.schedule), "max_rounds", f"got {self.max_rounds}; the schedule "
                f"{self.schedule} needs {len(self.schedule)} rounds")
        for name in ("value_a", "value_b", "novelty"):
            v = getattr(self, name)
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf"), name,
                    f"got {v!r}; give a finite number >= 0")
        require(isinstance(self.size_exponent, (int, float)) and 0 <= self.size_exponent <= 1, "size_exponent",
                f"got {self.size_exponent!r}; it must lie in [0, 1]")
        require(self.price in ("rollouts", "tokens"), "price", f"got {self.price!r}; use 'rollouts' or 'tokens'")
        require(isinstance(self.reuse, bool), "reuse", f"got {self.reuse!r}; give true or false")
        require(self.buffer_prompts >= 1, "buffer_prompts", f"got {self.buffer_prompts}; set it >= 1")

    @property
    def cap(self) -> int:
        return int(self.max_n if self.max_n is not None else self.k)

    @property
    def step_budget(self) -> int:
        return int(self.budget if self.budget is not None else self.batch_size * self.k)

    @property
    def schedule(self) -> tuple[int, ...]:
        """Cumulative sizes: pilot, doubling, ending at max_n."""
        sizes, n = [], int(self.pilot)
        while n < self.cap:
            sizes.append(n)
            n *= 2
        return (*sizes, self.cap)


def _moment(a: np.ndarray, b: np.ndarray, x: Any, y: Any) -> np.ndarray:
    """E[p**x (1 - p)**y] under Beta(a, b)."""
    return np.exp(betaln(a + x, b + y) - betaln(a, b))


def expected_value(n: np.ndarray, s: np.ndarray, size: Any, a: np.ndarray, b: np.ndarray, params: VALORParams,
                   rescued: np.ndarray | None = None) -> np.ndarray:
    """Posterior-expected V of a group grown from n rollouts (s passes) to ``size``, before the novelty factor.
    Beta(a, b) is the prompt's prior (this step's evidence is added here); ``rescued``: an all-fail group will be
    completed by a buffered correct answer (reuse)."""
    n, s = np.asarray(n, np.float64), np.asarray(s, np.float64)
    size = np.broadcast_to(np.asarray(size, np.float64), n.shape)
    al, be = np.asarray(a, np.float64) + s, np.asarray(b, np.float64) + n - s
    va, vb, m = params.value_a, params.value_b, size - n
    w = _moment(al, be, va, vb)
    rescued = np.zeros(n.shape, bool) if rescued is None else np.asarray(rescued, bool)
    all_fail = np.where(rescued, 0.0, _moment(al, be, va, vb + m))  # no pass among the rollouts still to come
    all_pass = _moment(al, be, va + m, vb)
    mixed = np.where((s > 0) & (s < n), w,
                     np.where(n == 0, w - all_fail - all_pass,
                              np.where(s == 0, w - all_fail, w - all_pass)))
    return np.maximum(mixed, 0.0) * (size / params.k) ** params.size_exponent


@ALLOCATORS.register("valor")
class VALORAllocator(Allocator):
    """Value-of-rollout allocation; see the module docstring."""

    name = "valor"
    Params = VALORParams

    def __init__(self, params: VALORParams) -> None:
        super().__init__(params)
        self.posterior = PromptPosterior(params.prior)
        self.trained: dict[int, int] = {}  # prompt -> updates that trained it (a mixed group)
        self.buffer: OrderedDict[int, Rollouts] = OrderedDict()  # prompt -> its latest correct completion

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.step_budget

    def _on_start(self) -> None:
        self.status = np.zeros(0, np.int8)
        self.a = np.zeros(0)
        self.b = np.zeros(0)

    def _keys(self, ids: np.ndarray) -> list[str] | None:
        return self.source.context_keys(ids) if self.params.prior.context and self.source is not None else None

    def _novelty(self, ids: np.ndarray) -> np.ndarray:
        t = np.array([self.trained.get(int(q), 0) for q in ids], np.float64)
        return 1.0 / (1.0 + self.params.novelty * t)

    def _rescued(self, ids: np.ndarray) -> np.ndarray:
        return np.array([self.params.reuse and int(q) in self.buffer for q in ids], bool)

    def _index(self, slots: np.ndarray) -> np.ndarray:
        """Per live slot: the expected value gained by growing to max_n, per rollout (or expected token) to spend."""
        p, led = self.params, self.ledger
        ids = led.prompt[slots]
        n, s = led.n[slots].astype(np.float64), np.rint(led.s[slots])
        resc = self._rescued(ids)
        now = np.where(((s > 0) & (s < n)) | (resc & (s == 0) & (n > 0)), 1.0, 0.0) * expected_value(
            n, s, n, self.a[slots], self.b[slots], p, np.ones(len(n), bool))
        gain = expected_value(n, s, p.cap, self.a[slots], self.b[slots], p, resc) - now
        return gain * self._novelty(ids) / (np.maximum(p.cap - n, 1.0) * self._cost(slots))

    def _cost(self, slots: np.ndarray) -> np.ndarray | float:
        led = self.ledger
        if self.params.price == "rollouts" or led.total_rollouts == 0 or led.tokens.sum() <= 0:
            return 1.0
        own = led.tokens[slots] / np.maximum(led.n[slots], 1)
        return np.clip(own / (float(led.tokens.sum()) / led.total_rollouts), 0.5, 2.0)

    def _fresh_index(self, ids: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        p, zero = self.params, np.zeros(len(ids))
        return expected_value(zero, zero, p.cap, a, b, p, self._rescued(ids)) * self._novelty(ids) / p.cap

    def _population_index(self) -> float:
        a, b = np.array([self.posterior.a_pop]), np.array([self.posterior.b_pop])
        return float(self._fresh_index(np.array([-1]), a, b)[0])

    def _propose(self) -> dict[int, int]:
        p, led = self.params, self.ledger
        sizes = np.asarray(p.schedule, np.int64)
        live = np.flatnonzero(self.status == LIVE)
        req: dict[int, int] = {}
        if len(live):
            nxt = sizes[np.searchsorted(sizes, led.n[live], side="right").clip(max=len(sizes) - 1)]
            req.update(zip(led.prompt[live].tolist(), (nxt - led.n[live]).tolist()))
        if led.rounds + len(sizes) <= p.max_rounds:
            reserved = int((p.cap - led.n[live]).sum())
            n_fresh = (p.step_budget - led.total_rollouts - reserved) // p.cap
            if n_fresh > 0:
                req.update(self._start(self._fresh(n_fresh)))
        return req

    def _start(self, ids: np.ndarray) -> dict[int, int]:
        if len(ids) == 0:
            return {}
        self.ledger.add_prompts(ids)
        a, b = self.posterior.prior(ids, self._keys(ids))
        self.status = np.concatenate([self.status, np.full(len(ids), LIVE, np.int8)])
        self.a, self.b = np.concatenate([self.a, a]), np.concatenate([self.b, b])
        return dict.fromkeys(ids.tolist(), int(self.params.pilot))

    def _on_observe(self, slots: np.ndarray) -> None:
        p, led = self.params, self.ledger
        live = np.flatnonzero(self.status == LIVE)
        full = led.n[live] >= p.cap
        self.status[live[full]] = DONE
        self._counters["committed"] += int(full.sum())
        live = live[~full]
        if len(live) == 0:
            return
        fresh_can_start = led.rounds + len(p.schedule) <= p.max_rounds
        stop = self._index(live) < self._population_index() if fresh_can_start else np.zeros(len(live), bool)
        self.status[live[stop]] = STOPPED
        self._counters["abandoned"] += int(stop.sum())
        if led.rounds >= p.max_rounds:  # the last round: whatever is still live ends here
            self.status[live[~stop]] = DONE

    def _beliefs(self) -> tuple[np.ndarray, float]:
        """The mean of each prompt's Beta prior of the step (VALOR prices values, not p_eff)."""
        return self.a / (self.a + self.b), np.nan

    def _on_finish(self) -> None:
        led = self.ledger
        rows, slot = led.all_rows()
        self.posterior.record(led.prompt, np.rint(led.s), led.n, self._keys(led.prompt))
        self.posterior.end_step()
        for q, n, s in zip(led.prompt.tolist(), led.n.tolist(), np.rint(led.s).tolist()):
            if 0 < s < n:
                self.trained[int(q)] = self.trained.get(int(q), 0) + 1
        if self.params.reuse:
            refresh_buffer(self.buffer, rows, self.params.pass_above, self.params.buffer_prompts)

    def finish_step(self) -> tuple[TrainBatch, StepStats]:
        """The base batch (every prompt one group), plus, with reuse, each all-fail group's buffered answer."""
        failing = self._failing_with_buffer()  # read before _on_finish refreshes the buffer
        batch, stats = super().finish_step()
        return with_reused(batch, stats, failing, self.params.reward_eps)

    def _failing_with_buffer(self) -> list[tuple[int, Rollouts]]:
        led = self.ledger
        if not self.params.reuse or self._pending is not None or led.num_slots == 0:
            return []
        return [(q, self.buffer[q]) for q, s, n in zip(led.prompt.tolist(), led.s.tolist(), led.n.tolist())
                if n > 0 and round(s) == 0 and q in self.buffer]

    def _extra_state(self) -> dict[str, Any]:
        st: dict[str, Any] = {"posterior": self.posterior.state_dict(), "trained": dict(self.trained),
                              "buffer": [(q, row) for q, row in self.buffer.items()]}
        if hasattr(self, "status"):
            st.update(status=self.status, a=self.a, b=self.b)
        return st

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.posterior.load_state_dict(state["posterior"])
        self.trained = {int(q): int(v) for q, v in state["trained"].items()}
        self.buffer = OrderedDict((int(q), row) for q, row in state["buffer"])
        for k in ("status", "a", "b"):
            if k in state:
                setattr(self, k, np.asarray(state[k]).copy())
