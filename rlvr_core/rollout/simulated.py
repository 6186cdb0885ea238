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
- ``replay``: the pass rates a real policy produced, read from a training run's rollout log
  (``rollouts.parquet``, ``rlvr_core.rollout_log``); by default the committed log of one uniform GRPO
  run of the study's ``hard`` regime (benchmarks/replay/hard_grpo_s0.parquet). See below.

Replay. Like ``drift``, the pool's pass rates move with the engine's policy updates: the log's S logged
steps are mapped onto ``horizon`` updates, and at update t the pool takes its pass rates from logged step
number round(min(t, horizon) / horizon * (S - 1)) (in step order). In real runs prompts rarely recur, so a
log holds no per-prompt trajectory to replay; what it holds, per step, is the population of pass rates the
policy had then. So each logged prompt j of that step gives one smoothed pass rate, a draw from
Beta(a + passes_j, b + fails_j), where Beta(a, b) is the step's population fitted by empirical Bayes
(``fit_beta_moments``, binomial noise removed) — the posterior of j's pass rate under its own step's
population, so that the draws are spread like the population itself rather than like the raw passes/n of
8 rollouts (which put a 0/8 prompt at exactly 0 and overstate the all-fail share of a fresh group), and
rather than under a flat Jeffreys prior (Beta(passes + 0.5, fails + 0.5), ``replay_prior="jeffreys"``),
which pulls a 0/8 prompt up to a mean of 1/17 whatever the step's population says. Simulated prompt q holds
a fixed quantile u_q ~ U(0, 1) and takes the step's draw of rank floor(u_q * n): its pass rate follows the
logged population over time while its rank in it stays fixed, as a prompt's difficulty stays fixed in
``drift``. The draws are seeded by (seed, logged step), so a seed gives the same pool at the same update.
The default pool has the size of the logged run's training split (20,000), so that prompts recur in a
benchmark run about as rarely as in the logged run (none of its 5,024 prompts recurred); in a pool of 4,096
an allocator that screens ~200 prompts a step meets each prompt again every ~20 steps, which the real run
never offered (per-prompt carried evidence then pays off more than it could there).

Token lengths are drawn per rollout from a gamma distribution around a
per-prompt length scale; failures are longer than passes (``fail_length_ratio``).
Deterministic by seed: the same seed and the same sequence of requests give
the same rollouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_core.beta_moments import fit_beta_moments
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
    replay: str | None = None  # pass rates from this rollout log (rollouts.parquet), moving with updates
    replay_prior: str = "eb"  # smoothing of a logged prompt's pass rate: "eb" or "jeffreys" (module docstring)

    def __post_init__(self) -> None:
        require(self.pool_size >= 1, "pool_size", "a scenario needs at least one prompt")
        require(self.drift or self.replay is not None or self.beta is not None, "beta",
                "a static scenario needs Beta parameters")
        require(self.replay_prior in ("eb", "jeffreys"), "replay_prior",
                f"got {self.replay_prior!r}; use 'eb' or 'jeffreys'")


# the committed rollout log of the default replay scenario (benchmarks/replay/README.md says how it was made)
REPLAY_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "replay" / "hard_grpo_s0.parquet"


SCENARIOS: dict[str, Scenario] = {
    "early": Scenario("early", 4096, beta=(0.4, 2.5)),
    "late": Scenario("late", 4096, beta=(2.5, 0.4)),
    "ushape": Scenario("ushape", 4096, beta=(0.25, 0.25)),
    "uniform": Scenario("uniform", 4096, beta=(1.0, 1.0)),
    "drift": Scenario("drift", 512, drift=True),
    # the pool of the logged run's training split (20,000 prompts), so prompts recur as rarely as they did there
    "replay": Scenario("replay", 20000, replay=str(REPLAY_FILE)),
}


class ReplayLog:
    """The per-step pass-rate populations of a rollout log, for the ``replay`` scenario.

    Args:
        path: a rollout log (columns step, prompt_id, rollouts, passes; see ``rlvr_core.rollout_log``)
        prior: "eb" (each step's fitted population) or "jeffreys" (Beta(0.5, 0.5)) behind the smoothing
    Raises:
        ConfigError naming the file when it is missing, unreadable, lacks a column or holds counts that
        cannot be rollouts and passes (negative, passes above rollouts, no rows).
    """

    def __init__(self, path: str | os.PathLike, prior: str = "eb") -> None:
        from rlvr_core.rollout_log import read_log

        self.path = Path(path)
        try:
            df = read_log(self.path)
        except FileNotFoundError as e:
            raise ConfigError(f"replay: {e}; give the path of a training run's rollouts.parquet "
                              "(SimulatedEngine(replay_path=...)), or see benchmarks/replay/README.md "
                              "for the command that makes the default one") from e
        except ValueError as e:
            raise ConfigError(f"replay: {e}") from e
        cols = {c: np.asarray(df[c]) for c in ("step", "rollouts", "passes")}
        bad = [c for c, v in cols.items() if not np.issubdtype(v.dtype, np.number) or not np.all(np.isfinite(v))]
        require(not bad, "replay", f"rollout log {self.path}: column(s) {bad} are not finite numbers")
        step, n, s = (v.astype(np.float64) for v in cols.values())
        require(len(step) > 0, "replay", f"rollout log {self.path} has no rows")
        require(bool(np.all(n >= 1)), "replay", f"rollout log {self.path}: rows with rollouts < 1")
        require(bool(np.all((s >= 0) & (s <= n))), "replay",
                f"rollout log {self.path}: rows with passes outside [0, rollouts]")
        self.prior = prior
        self.steps = np.unique(step).astype(np.int64)
        order = np.argsort(step, kind="stable")
        bounds = np.searchsorted(step[order], self.steps, side="left").tolist() + [len(step)]
        self._rows = [(s[order[a:b]], n[order[a:b]]) for a, b in zip(bounds[:-1], bounds[1:])]
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def index(self, updates: int, horizon: int) -> int:
        """The logged step (its position in step order) that policy update ``updates`` replays."""
        return int(round(min(max(updates, 0), horizon) / horizon * (len(self.steps) - 1)))

    def population(self, i: int) -> tuple[float, float]:
        """Beta(a, b) behind the smoothing of logged step number ``i``."""
        if self.prior == "jeffreys":
            return 0.5, 0.5
        s, n = self._rows[i]
        return fit_beta_moments(s / n, n)

    def rates(self, i: int, seed: int) -> np.ndarray:
        """The sorted smoothed pass rates of logged step number ``i`` (one per logged prompt), seeded."""
        key = (i, seed)
        if key not in self._cache:
            s, n = self._rows[i]
            a, b = self.population(i)
            rng = np.random.default_rng([seed, 3, int(self.steps[i])])
            self._cache[key] = np.sort(rng.beta(a + s, b + n - s))
        return self._cache[key]


class SimulatedEngine(RolloutEngine):
    """RolloutEngine answering requests with Bernoulli(p_q) rewards.

    Args:
        scenario: a name in SCENARIOS or a Scenario
        seed: seeds both the hidden pass rates and the draws
        pool_size: override the scenario's pool size
        horizon: drift scenario, policy updates over which skill rises; replay scenario, policy updates
            over which the logged steps are replayed
        replay_path: replay scenario, the rollout log to replay (None: the scenario's, by default the
            committed benchmarks/replay/hard_grpo_s0.parquet)
        mean_tokens: mean tokens of a passing rollout
        fail_length_ratio: failing rollouts are this much longer on average
    """

    def __init__(self, scenario: str | Scenario = "uniform", seed: int = 0, *, pool_size: int | None = None,
                 horizon: int = 60, mean_tokens: float = 200.0, fail_length_ratio: float = 1.6,
                 replay_path: str | os.PathLike | None = None) -> None:
        if isinstance(scenario, str):
            if scenario not in SCENARIOS:
                raise ConfigError(f"scenario: unknown {scenario!r}; valid: {', '.join(sorted(SCENARIOS))}")
            scenario = SCENARIOS[scenario]
        require(replay_path is None or scenario.replay is not None, "replay_path",
                f"only a replay scenario reads a rollout log, not {scenario.name!r}")
        require(horizon >= 1, "horizon", "set horizon >= 1")
        require(mean_tokens > 0 and fail_length_ratio > 0, "mean_tokens", "token lengths must be positive")
        self.scenario = scenario
        self.pool_size = int(pool_size or scenario.pool_size)
        self.horizon = horizon
        self.mean_tokens = mean_tokens
        self.fail_length_ratio = fail_length_ratio
        self.seed = seed
        init = np.random.default_rng([seed, 1])
        self.replay: ReplayLog | None = None
        self.base_rate = None
        if scenario.drift:
            self.difficulty = init.normal(0.0, 1.5, self.pool_size)
        elif scenario.replay is not None:
            self.replay = ReplayLog(replay_path if replay_path is not None else scenario.replay, scenario.replay_prior)
            self.quantile = init.random(self.pool_size)
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
        if self.replay is not None:
            rates = self.replay.rates(self.replay.index(self.updates, self.horizon), self.seed)
            return rates[np.minimum((self.quantile[ids] * len(rates)).astype(np.int64), len(rates) - 1)]
        return self.base_rate[ids]

    def logged_step(self) -> int | None:
        """Replay scenario: the logged training step whose pass rates the pool has now (else None)."""
        if self.replay is None:
            return None
        return int(self.replay.steps[self.replay.index(self.updates, self.horizon)])

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
        """One policy update happened: the drift and replay clock advances."""
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])
