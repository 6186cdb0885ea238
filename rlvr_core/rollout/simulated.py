"""Simulated rollout engine: Bernoulli rewards from hidden per-prompt pass rates.

The reference engine for allocator benchmarks (docs/design.md §2.5). Each scenario
fixes a pool of prompts and how their pass rates are drawn:

- ``early``:  most prompts too hard (pass rates ~ Beta(0.4, 2.5), mean 0.14)
- ``late``:   most prompts solved (Beta(2.5, 0.4), mean 0.86)
- ``ushape``: mass at both ends (Beta(0.25, 0.25))
- ``uniform``: Beta(1, 1), the prior SARA assumes by default
- ``drift``:  a policy under training: prompt q has difficulty d_q ~ N(0, 1.5^2)
  and pass rate sigmoid(skill(t) - d_q) with skill rising from -2 to +2 over
  ``horizon`` policy updates; the pool is small so prompts recur across epochs.

Token lengths are drawn per rollout from a gamma distribution around a
per-prompt length scale; failures are longer than passes (``fail_length_ratio``).
Deterministic by seed: the same seed and the same sequence of requests give
the same rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.errors import ConfigError, require
from rlvr_core.rollout.base import RolloutEngine
from rlvr_core.types import Requests, Rollouts


@dataclass(frozen=True)
class Scenario:
    """How a simulated prompt pool's pass rates are drawn."""

    name: str
    pool_size: int
    beta: tuple[float, float] | None = None  # static pass rates ~ Beta(a, b)
    drift: bool = False  # pass rates rise with policy updates instead

    def __post_init__(self) -> None:
        require(self.pool_size >= 1, "pool_size", "a scenario needs at least one prompt")
        require(self.drift or self.beta is not None, "beta", "a static scenario needs Beta parameters")


SCENARIOS: dict[str, Scenario] = {
    "early": Scenario("early", 4096, beta=(0.4, 2.5)),
    "late": Scenario("late", 4096, beta=(2.5, 0.4)),
    "ushape": Scenario("ushape", 4096, beta=(0.25, 0.25)),
    "uniform": Scenario("uniform", 4096, beta=(1.0, 1.0)),
    "drift": Scenario("drift", 512, drift=True),
}


class SimulatedEngine(RolloutEngine):
    """RolloutEngine answering requests with Bernoulli(p_q) rewards.

    Args:
        scenario: a name in SCENARIOS or a Scenario
        seed: seeds both the hidden pass rates and the draws
        pool_size: override the scenario's pool size
        horizon: drift scenario, policy updates over which skill rises
        mean_tokens: mean tokens of a passing rollout
        fail_length_ratio: failing rollouts are this much longer on average
    """

    def __init__(self, scenario: str | Scenario = "uniform", seed: int = 0, *, pool_size: int | None = None,
                 horizon: int = 60, mean_tokens: float = 200.0, fail_length_ratio: float = 1.6) -> None:
        if isinstance(scenario, str):
            if scenario not in SCENARIOS:
                raise ConfigError(f"scenario: unknown {scenario!r}; valid: {', '.join(sorted(SCENARIOS))}")
            scenario = SCENARIOS[scenario]
        require(horizon >= 1, "horizon", "set horizon >= 1")
        require(mean_tokens > 0 and fail_length_ratio > 0, "mean_tokens", "token lengths must be positive")
        self.scenario = scenario
        self.pool_size = int(pool_size or scenario.pool_size)
        self.horizon = horizon
        self.mean_tokens = mean_tokens
        self.fail_length_ratio = fail_length_ratio
        init = np.random.default_rng([seed, 1])
        if scenario.drift:
            self.difficulty = init.normal(0.0, 1.5, self.pool_size)
            self.base_rate = None
        else:
            self.base_rate = init.beta(*scenario.beta, self.pool_size)
        self.length_scale = init.lognormal(0.0, 0.3, self.pool_size)
        self.rng = np.random.default_rng([seed, 2])
        self.updates = 0

    @property
    def prompt_ids(self) -> np.ndarray:
        return np.arange(self.pool_size)

    def skill(self) -> float:
        return -2.0 + 4.0 * min(self.updates / self.horizon, 1.0)

    def pass_rate(self, prompt_ids: np.ndarray | None = None) -> np.ndarray:
        """The hidden pass rates now (for tests and oracle figures)."""
        ids = self.prompt_ids if prompt_ids is None else np.asarray(prompt_ids, np.int64)
        if self.scenario.drift:
            return 1.0 / (1.0 + np.exp(-(self.skill() - self.difficulty[ids])))
        return self.base_rate[ids]

    def generate(self, requests: Requests) -> Rollouts:
        ids = np.fromiter(requests.keys(), np.int64, len(requests))
        counts = np.fromiter(requests.values(), np.int64, len(requests))
        if len(ids) and (ids.min() < 0 or ids.max() >= self.pool_size):
            raise ValueError(f"prompt id outside the simulated pool [0, {self.pool_size})")
        if np.any(counts < 0):
            raise ValueError("negative rollout count requested")
        pid = np.repeat(ids, counts)
        reward = (self.rng.random(len(pid)) < self.pass_rate(pid)).astype(np.float64)
        mean = self.mean_tokens * self.length_scale[pid] * np.where(reward > 0, 1.0, self.fail_length_ratio)
        tokens = np.maximum(1, np.rint(self.rng.gamma(4.0, mean / 4.0))).astype(np.int64)
        return Rollouts(pid, reward, tokens)

    def update_weights(self, state: Any = None) -> None:
        """One policy update happened: the drift clock advances."""
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])
