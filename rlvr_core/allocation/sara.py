"""SARA: sequential adaptive rollout allocation (docs/allocators/sara.md).

Every live prompt carries a Beta posterior on its pass rate. After each
synchronous round SARA computes p_eff, the probability that the prompt's full
group of k ends mixed, and decides per prompt:

- COMMIT when the prefix is mixed (or p_eff >= tau_high): complete it to k
  rollouts; it goes into the training batch;
- ABANDON when p_eff < tau_low: stop sampling; its reserved budget returns to
  the pool and is spent on fresh prompts;
- CONTINUE otherwise: probe to the next size of the schedule.

Rounds follow a probe schedule (default k/2, k), so the engine always
sees large batches and a step takes a handful of rounds. Two budget modes:

- ``mode="rollouts"``: a fixed rollout budget per step (compare with grpo).
  Each live prompt reserves the rollouts it could still need (k - n), so the
  budget is never exceeded and every committed group can be completed.
- ``mode="groups"``: stop once ``batch_size`` groups are committed (compare
  with dapo), under a per-step rollout cap ``max_step_rollouts``.

Guarantee (under the prior SARA assumes): an abandoned prompt would have
ended mixed with probability p_eff < tau_low.

``stop_rule="floor"`` (groups mode) replaces the fixed tau_low by the rule that
prices an effective group at the screening floor of the population prior
(rlvr_core/allocation/floor.py, docs/design.md §4.10): a prompt with an unmixed
prefix goes on only while going on, at that price, is worth more than the
rollouts it may still cost, given its own posterior; a fresh prompt with a prior
of its own (carried or contextual) is started only when drawing it is worth it.

``price="tokens"`` (stop rule "tau") prices a prompt's continuation by the tokens
it is expected to cost instead of its rollouts: the k - n rollouts it may still
need are expected to be as long as its prefix's, so it is abandoned when p_eff <
tau_low x L_q / L, with L_q its prefix's mean generated tokens per rollout and L
the step's mean so far (the ratio clipped to [1/2, 2]). A prompt whose prefix
wandered long (on worked-answer tasks, failing traces run longer) is given up
sooner; a short one is kept longer. With an earlier probe (k/4) a long all-fail
prefix can be abandoned after k/4 rollouts, which tau_low alone never does under
the uniform prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rlvr_core.allocation.base import Allocator, AllocatorParams
from rlvr_core.allocation.beta_binomial import group_mixed_probability, p_effective
from rlvr_core.allocation.floor import go_on_values, screening_floor
from rlvr_core.allocation.posterior import PriorConfig, PromptPosterior, as_prior_config
from rlvr_core.allocation.registry import ALLOCATORS
from rlvr_core.errors import require
from rlvr_core.types import Rollouts

LIVE, COMMITTED, ABANDONED, DROPPED, SATURATED = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class SARAParams(AllocatorParams):
    """SARA's knobs (paper defaults where the paper gives them).

    mode: "groups" (stop at batch_size committed groups) or "rollouts" (fixed budget)
    budget: rollouts per step in "rollouts" mode (default batch_size * k)
    max_step_rollouts: rollout cap per step in "groups" mode (default 8 * batch_size * k); named so
        apart from train.max_rollouts, the whole run's budget (the old name is refused, naming this one)
    probe_schedule: cumulative probe sizes; floats in (0, 1] are fractions of k,
        ints are absolute counts; k is always the last size. The default
        (k/2, k) suits the uniform prior, under which a shorter all-fail prefix
        never falls below tau_low = 0.5 ((k - n)/(k + 1) >= 0.5 for n <= (k - 1)/2),
        so an earlier probe would only add a round; informative priors
        (carry, eb, context) can act on an earlier probe such as (0.25, 0.5, 1.0).
    tau_low: abandon when p_eff < tau_low, in [0, 1)
    tau_high: commit when p_eff >= tau_high (a mixed prefix always commits), in (tau_low, 1]
    max_rounds: cap on synchronous rounds per step
    max_new_prompts_per_round: cap on fresh prompts started in one round (default 8 * batch_size)
    prior: how each prompt's Beta prior is formed (PriorConfig or its kind as a string);
        default "uniform" in groups mode and "eb" (empirical Bayes) in rollouts mode
    stop_rule: "tau" (abandon when p_eff < tau_low) or "floor" (groups mode: abandon when going on is
        worth less than the screening floor's price of an effective group; see the module docstring)
    price: "rollouts" (every rollout costs the same) or "tokens" (stop rule "tau": tau_low scaled per prompt
        by its prefix's mean tokens per rollout over the step's; see the module docstring)
    """

    mode: str = "groups"
    budget: int | None = None
    max_step_rollouts: int | None = None
    probe_schedule: tuple = (0.5, 1.0)
    tau_low: float = 0.5
    tau_high: float = 1.0
    max_rounds: int = 6
    max_new_prompts_per_round: int | None = None
    prior: Any = None
    stop_rule: str = "tau"
    price: str = "rollouts"

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "max_rollouts": "renamed max_step_rollouts (the per-step cap of groups mode; train.max_rollouts is the "
                        "whole run's budget); write max_step_rollouts"}

    def __post_init__(self) -> None:
        super().__post_init__()
        # the uniform prior is the paper's; under a fixed budget its abandonments
        # never pay for themselves (see _on_observe), so that mode learns the population
        object.__setattr__(self, "prior", as_prior_config(self.prior, "eb" if self.mode == "rollouts" else "uniform"))
        require(self.mode in ("groups", "rollouts"), "mode", f"got {self.mode!r}; use 'groups' or 'rollouts'")
        require(self.stop_rule in ("tau", "floor"), "stop_rule", f"got {self.stop_rule!r}; use 'tau' or 'floor'")
        require(self.stop_rule == "tau" or self.mode == "groups", "stop_rule",
                "the floor rule prices effective groups, which only groups mode collects; use mode 'groups'")
        require(self.price in ("rollouts", "tokens"), "price", f"got {self.price!r}; use 'rollouts' or 'tokens'")
        require(self.price == "rollouts" or self.stop_rule == "tau", "price",
                "the token price scales tau_low, which stop_rule 'floor' does not use; use stop_rule 'tau'")
        require(0.0 <= self.tau_low < 1.0, "tau_low", f"got {self.tau_low}; it must lie in [0, 1)")
        require(self.tau_low < self.tau_high <= 1.0, "tau_high", f"got {self.tau_high}; it must lie in (tau_low, 1]")
        require(self.max_rounds >= 1, "max_rounds", f"got {self.max_rounds}; set it >= 1")
        sizes = self.schedule
        require(len(sizes) <= self.max_rounds, "max_rounds",
                f"{self.max_rounds} rounds cannot fit the {len(sizes)}-size probe schedule {sizes}; raise max_rounds")
        require(self.step_budget >= self.k, "budget" if self.mode == "rollouts" else "max_step_rollouts",
                f"{self.step_budget} rollouts cannot hold one group of k={self.k}; set it >= k")
        require(self.max_new_prompts_per_round is None or self.max_new_prompts_per_round >= 1,
                "max_new_prompts_per_round", "set it >= 1 or leave it unset")

    @property
    def schedule(self) -> tuple[int, ...]:
        """Cumulative probe sizes in rollouts, strictly increasing, ending at k."""
        sizes = []
        for x in tuple(self.probe_schedule):
            if isinstance(x, float):
                require(0.0 < x <= 1.0, "probe_schedule", f"fraction {x} must lie in (0, 1]")
                sizes.append(max(1, int(round(x * self.k))))
            else:
                require(1 <= int(x) <= self.k, "probe_schedule", f"size {x} must lie in [1, k={self.k}]")
                sizes.append(int(x))
        sizes = sorted(set(sizes) | {self.k})
        return tuple(sizes)

    @property
    def step_budget(self) -> int:
        if self.mode == "rollouts":
            return int(self.budget if self.budget is not None else self.batch_size * self.k)
        return int(self.max_step_rollouts if self.max_step_rollouts is not None else 8 * self.batch_size * self.k)


@ALLOCATORS.register("sara")
class SARAAllocator(Allocator):
    """Sequential adaptive rollout allocation; see the module docstring."""

    name = "sara"
    Params = SARAParams

    def __init__(self, params: SARAParams) -> None:
        super().__init__(params)
        self.posterior = PromptPosterior(params.prior)
        self._sizes = np.asarray(params.schedule, np.int64)

    @property
    def max_rollouts_per_step(self) -> int:
        return self.params.step_budget

    # ----- per-step state ------------------------------------------------------
    def _on_start(self) -> None:
        self.status = np.zeros(0, np.int8)
        self.stage = np.zeros(0, np.int64)  # index into the schedule of the size being probed
        self.a = np.zeros(0)
        self.b = np.zeros(0)
        self.peff = np.zeros(0)
        self._counters.update(dropped=0, resolved=0)

    def _keys(self, ids: np.ndarray) -> list[str] | None:
        """Context keys of ``ids`` from the step's source (contextual priors only)."""
        if not self.params.prior.context or self.source is None:
            return None
        return self.source.context_keys(ids)

    def _start_prompts(self, ids: np.ndarray) -> dict[int, int]:
        self.ledger.add_prompts(ids)
        a, b = self.posterior.prior(ids, self._keys(ids))
        m = len(ids)
        self.status = np.concatenate([self.status, np.full(m, LIVE, np.int8)])
        self.stage = np.concatenate([self.stage, np.zeros(m, np.int64)])
        self.a = np.concatenate([self.a, a])
        self.b = np.concatenate([self.b, b])
        self.peff = np.concatenate([self.peff, p_effective(0, 0, self.params.k, a, b)])
        return dict.fromkeys(ids.tolist(), int(self._sizes[0]))

    def _select_fresh(self, n: int) -> np.ndarray:
        """Fresh prompts to start (sara+dps ranks candidates here).

        With carried evidence the stopping rule already applies before the
        first probe: a prompt whose own history gives p_eff(0, 0) < tau_low
        is abandoned for this step without spending a rollout (``skipped``).
        With a contextual prior the same holds for a never-seen prompt whose key
        has evidence (``PromptPosterior.has_evidence``), except that such a
        prompt is probed anyway with probability ``prior.context_explore``, so
        a key's prior keeps meeting new evidence.
        """
        prior = self.params.prior
        if not (prior.carry or prior.context):
            return self._fresh(n)
        out: list[np.ndarray] = []
        got = 0
        for _ in range(4):
            cand = self._fresh(n - got)
            cand = cand[~np.isin(cand, np.concatenate(out))] if out else cand
            if len(cand) == 0:
                break
            keys = self._keys(cand)
            a, b = self.posterior.prior(cand, keys)
            known = self.posterior.has_evidence(cand, keys)
            if self.params.stop_rule == "floor":
                # an average prompt is worth exactly 0 at the floor's price: draw it (rounding aside)
                worth = self._go_on_value(np.zeros(len(cand), np.int64), np.zeros(len(cand)), a, b) > -1e-9
            else:
                worth = p_effective(0, 0, self.params.k, a, b) >= self.params.tau_low
            keep = ~known | worth
            if prior.context and prior.context_explore > 0 and not keep.all():
                keep |= self.rng.random(len(cand)) < prior.context_explore
            self._counters["skipped"] += int((~keep).sum())
            out.append(cand[keep])
            got += int(keep.sum())
            if got >= n:
                break
        return np.concatenate(out)[:n] if out else np.zeros(0, np.int64)

    def _num_fresh(self) -> int:
        p, led = self.params, self.ledger
        live = self.status == LIVE
        open_ = live | ((self.status == COMMITTED) & (led.n < p.k))
        reserved = int((p.k - led.n[open_]).sum())
        free = p.step_budget - led.total_rollouts - reserved
        n = free // p.k
        if p.mode == "groups":
            committed = int((self.status == COMMITTED).sum())
            need = p.batch_size - committed - float(self.peff[live].sum())
            if need <= 0:
                return 0
            # expected commit rate of a fresh prompt: the prior's, updated by this step's outcomes
            prior_rate = float(p_effective(0, 0, p.k, self.posterior.a_pop, self.posterior.b_pop))
            resolved = self._counters["resolved"]
            rate = (committed + 4 * prior_rate) / (resolved + 4)
            n = min(n, math.ceil(need / max(rate, 0.02)))
        cap = p.max_new_prompts_per_round or 8 * p.batch_size
        return int(max(0, min(n, cap)))

    def _propose(self) -> dict[int, int]:
        p, led = self.params, self.ledger
        # complete committed groups, advance continuing probes (in slot order)
        grow = np.flatnonzero(((self.status == COMMITTED) | (self.status == LIVE)) & (led.n < p.k))
        probe = self._sizes[np.minimum(self.stage[grow], len(self._sizes) - 1)]
        target = np.where(self.status[grow] == COMMITTED, p.k, probe)
        req: dict[int, int] = dict(zip(led.prompt[grow].astype(np.int64).tolist(),
                                       (target - led.n[grow]).astype(np.int64).tolist()))
        # fresh prompts only while they can still finish within the round cap
        if led.rounds + len(self._sizes) <= p.max_rounds:
            n_fresh = self._num_fresh()
            if n_fresh > 0:
                req.update(self._start_prompts(self._select_fresh(n_fresh)))
        if not req and (p.mode == "groups") and int((self.status == COMMITTED).sum()) < p.batch_size:
            self._counters["hit_cap"] = 1
        return req

    def _floor_price(self) -> float:
        """The screening floor of the population prior (the step's, as the posterior holds it)."""
        pop = (float(self.posterior.a_pop), float(self.posterior.b_pop))
        if getattr(self, "_price_of", None) != pop:
            self._price_of, self._price = pop, screening_floor(self.params.k, beta=pop).rollouts_per_effective_group
        return self._price

    def _go_on_value(self, n: np.ndarray, s: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Stop rule "floor": the value of going on with prompts whose n rewards (s passes) are all equal
        (n = 0: drawing a fresh prompt), when an effective group is worth the step's floor price and every
        later rollout is again decided the best way, one at a time (docs/design.md §4.10). Going on pays
        when the value is positive; a mixed prefix is never asked."""
        k = self.params.k
        n = np.asarray(n, np.int64)
        m = np.arange(k, dtype=np.float64)
        a, b = np.asarray(a, np.float64)[:, None], np.asarray(b, np.float64)[:, None]
        # under Beta(a, b) the next reward equals m fails (passes) before it with probability (b + m) / (a + b + m)
        go = go_on_values(((b + m) / (a + b + m), (a + m) / (a + b + m)), self._floor_price(), k)
        rows = np.arange(len(n))
        side = (np.asarray(s) > 0).astype(np.int64)
        out = go[side, rows, np.clip(n, 1, k - 1)]
        first_fail = b[:, 0] / (a[:, 0] + b[:, 0])  # n = 0: a fresh prompt, its first reward a fail or a pass
        fresh = -1.0 + first_fail * np.maximum(go[0, :, 1], 0.0) + (1.0 - first_fail) * np.maximum(go[1, :, 1], 0.0)
        return np.where(n == 0, fresh, np.where(n < k, out, -np.inf))

    def _token_price(self, live: np.ndarray) -> np.ndarray | float:
        """Per prompt, the factor on tau_low: 1 under price "rollouts"; under "tokens" the prompt's mean generated
        tokens per rollout over the step's mean so far, clipped to [1/2, 2]."""
        led = self.ledger
        if self.params.price == "rollouts" or led.total_rollouts == 0:
            return 1.0
        step_mean = float(led.tokens.sum()) / led.total_rollouts
        if step_mean <= 0:
            return 1.0
        own = led.tokens[live] / np.maximum(led.n[live], 1)
        return np.clip(own / step_mean, 0.5, 2.0)

    def _on_observe(self, slots: np.ndarray) -> None:
        p, led = self.params, self.ledger
        live = np.flatnonzero(self.status == LIVE)
        if len(live) == 0:
            return
        n, s = led.n[live], led.s[live]
        arrived = n >= self._sizes[self.stage[live]]  # this round's probe is in
        live, n, s = live[arrived], n[arrived], s[arrived]
        peff = p_effective(n, np.rint(s), p.k, self.a[live], self.b[live])
        self.peff[live] = peff
        # mixed: passes and fails, or (a scalar reward under reward_threshold) rewards that differ
        mixed = ((s > 0) & (s < n)) | (led.variance(live) > p.reward_eps**2)
        commit = mixed | (peff >= p.tau_high)
        if p.stop_rule == "floor":
            abandon = ~commit & (n < p.k) & (self._go_on_value(n, np.rint(s), self.a[live], self.b[live]) <= 0)
        else:
            abandon = ~commit & (peff < p.tau_low * self._token_price(live))
        if p.mode == "rollouts":
            # Under a fixed budget an abandoned prompt is worth dropping only if the
            # k - n rollouts it frees buy more expected effective groups elsewhere:
            # a fresh prompt yields p_eff(0, 0) / k effective groups per rollout.
            fresh_yield = p_effective(0, 0, p.k, self.posterior.a_pop, self.posterior.b_pop) / p.k
            abandon &= peff < (p.k - n) * fresh_yield
        full = ~commit & ~abandon & (n >= p.k)  # probed to k and still saturated
        cont = ~commit & ~abandon & ~full
        commit_slots = live[commit]
        if p.mode == "groups":  # commit no more than needed, cheapest (largest prefix) first
            room = max(0, p.batch_size - int((self.status == COMMITTED).sum()))
            order = commit_slots[np.argsort(-n[commit], kind="stable")]
            self.status[order[room:]] = DROPPED
            self._counters["dropped"] += len(order[room:])
            commit_slots = order[:room]
        self.status[commit_slots] = COMMITTED
        self.status[live[abandon]] = ABANDONED
        self.status[live[full]] = SATURATED
        self.stage[live[cont]] += 1
        self._counters["committed"] += len(commit_slots)
        self._counters["abandoned"] += int(abandon.sum())
        self._counters["resolved"] += len(commit_slots) + int(abandon.sum()) + int(full.sum())
        if p.mode == "groups" and int((self.status == COMMITTED).sum()) >= p.batch_size:
            rest = np.flatnonzero(self.status == LIVE)
            self.status[rest] = DROPPED
            self._counters["dropped"] += len(rest)

    def _batch_rows(self, rows: Rollouts, row_slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        keep = np.flatnonzero(self.status == COMMITTED)
        idx = np.flatnonzero(np.isin(row_slot, keep))
        return idx, row_slot[idx]

    def _on_finish(self) -> None:
        led = self.ledger
        self.posterior.record(led.prompt, np.rint(led.s), led.n, self._keys(led.prompt))
        self.posterior.end_step()

    def _beliefs(self) -> tuple[np.ndarray, np.ndarray]:
        """The mean of each prompt's Beta prior of the step, and p_eff as its last decision computed it."""
        return self.a / (self.a + self.b), self.peff

    def _extra_state(self) -> dict[str, Any]:
        st = {"posterior": self.posterior.state_dict()}
        if hasattr(self, "status"):
            st.update(status=self.status, stage=self.stage, a=self.a, b=self.b, peff=self.peff)
        return st

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.posterior.load_state_dict(state["posterior"])
        for k in ("status", "stage", "a", "b", "peff"):
            if k in state:
                setattr(self, k, np.asarray(state[k]).copy())


@dataclass(frozen=True)
class SARADPSParams(SARAParams):
    """SARA with predictive prompt selection (seed 001's SARA+DPS).

    candidates_factor: fresh prompts are chosen among this many times more
        candidates, ranked by a Thompson draw of their predicted effectiveness;
        candidates not chosen are skipped for this pass over the pool
    """

    prior: Any = field(default_factory=lambda: PriorConfig(kind="carry+eb"))
    probe_schedule: tuple = (0.25, 0.5, 1.0)
    max_rounds: int = 8
    candidates_factor: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.candidates_factor >= 1, "candidates_factor", f"got {self.candidates_factor}; set it >= 1")

    def host_items(self) -> dict[str, int]:
        """The candidate prompt ids drawn for one round's fresh prompts: candidates_factor times the most fresh
        prompts a round starts (``max_new_prompts_per_round``, and no more than the step budget's groups)."""
        fresh = min(self.max_new_prompts_per_round or 8 * self.batch_size, self.step_budget // self.k)
        return {**super().host_items(), "candidates_factor": fresh * self.candidates_factor}


@ALLOCATORS.register("sara+dps")
class SARADPSAllocator(SARAAllocator):
    """SARA inside; fresh prompts chosen by Thompson-sampled predicted effectiveness.

    For each candidate q a pass rate is drawn from its Beta prior (population
    prior plus carried evidence, or the prior of its context key when the
    prior is contextual) and scored by P(group of k mixed | p); the
    best-scoring candidates are started.
    """

    name = "sara+dps"
    Params = SARADPSParams

    def _select_fresh(self, n: int) -> np.ndarray:
        cand = self._fresh(n * self.params.candidates_factor)
        a, b = self.posterior.prior(cand, self._keys(cand))
        score = group_mixed_probability(self.rng.beta(a, b), self.params.k)
        keep = np.sort(np.argsort(-score, kind="stable")[:n])
        self._counters["skipped"] += len(cand) - len(keep)
        return cand[keep]
