"""What the advisor computes from a log (docs/advisor.md): the pass-rate population of each phase of the run with
its screening floor, and every registered allocator replayed on the log by the simulated engine's ``replay``
scenario (``rlvr_core.rollout.simulated``), the same engine and loop as the allocation benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_core.advise.recurrence import CountingSource, FreshSource, GrowingEngine
from rlvr_core.allocation import ALLOCATORS, make_allocator, run_allocation_step
from rlvr_core.allocation.floor import screening_floor
from rlvr_core.beta_moments import fit_beta_moments
from rlvr_core.errors import ConfigError
from rlvr_core.rollout.simulated import ReplayLog, Scenario
from rlvr_core.types import TrainBatch

PHASES = ("early", "middle", "late")
FLOOR_CLASS = ("screening floor: bounds every allocator that decides from a prompt's own rewards (grpo, dapo, "
               "sara, vigor, pods); only prompt history or shared features go below it (greso, sara+dps, "
               "carried or contextual priors)")


@dataclass(frozen=True)
class PhaseStats:
    """One phase (a third of the logged steps) of the run. The population figures (``beta`` to
    ``floor_abandon_after_fails``) are None where the log cannot support them (``rlvr_core.advise.support``)."""

    name: str
    first_step: int
    last_step: int
    rows: int
    rollouts: int
    pass_share: float
    beta: tuple[float, float] | None  # the empirical-Bayes Beta fitted to the phase's per-prompt pass rates
    rate_quantiles: tuple[float, float, float] | None  # 10%, 50%, 90% of the smoothed pass rates
    logged_group_size: float  # median rollouts per (step, prompt) in the log
    zero_variance_logged: float | None  # logged groups (>= 2 rollouts) with all rewards equal; None without one
    zero_variance_at_k: float | None  # P(a group of k is all-pass or all-fail) under the smoothed rates
    floor_ratio_to_k: float | None  # the screening floor in units of k
    floor_abandon_after_fails: int | None


def phase_of(steps: np.ndarray) -> list[np.ndarray]:
    """The logged steps (sorted, unique) cut into early, middle and late thirds (empty thirds dropped)."""
    return [part for part in np.array_split(steps, len(PHASES)) if len(part)]


def _population(log: ReplayLog, part: np.ndarray, n: np.ndarray, s: np.ndarray, k: int, seed: int) -> tuple:
    """(beta, rate quantiles, zero-variance share at k, floor / k, floor rule) of one phase's logged steps."""
    pos = np.searchsorted(log.steps, part)
    rates = np.concatenate([log.rates(int(i), seed) for i in pos])
    a, b = fit_beta_moments(s / n, n.astype(np.float64))
    fl = screening_floor(k, rates=rates)
    return ((float(a), float(b)), tuple(float(q) for q in np.quantile(rates, [0.1, 0.5, 0.9])),
            1.0 - fl.mixed_probability, fl.ratio_to_k, fl.abandon_after_fails)


def phase_stats(log: ReplayLog | None, df: Any, k: int, seed: int = 0) -> list[PhaseStats]:
    """The population, zero-variance shares and screening floor of each phase of the logged run; without a
    ``log`` to replay (one the log cannot support), the population figures are None."""
    out = []
    for name, part in zip(PHASES, phase_of(np.unique(df["step"].to_numpy()))):
        rows = df[df["step"].isin(part)]
        n, s = rows["rollouts"].to_numpy(), rows["passes"].to_numpy()
        grouped = n >= 2
        zero_logged = float(np.mean((s[grouped] == 0) | (s[grouped] == n[grouped]))) if grouped.any() else None
        beta, quantiles, zero_k, floor, rule = (_population(log, part, n, s, k, seed) if log is not None
                                                else (None,) * 5)
        out.append(PhaseStats(name, int(part[0]), int(part[-1]), len(rows), int(n.sum()), float(s.sum() / n.sum()),
                              beta, quantiles, float(np.median(n)), zero_logged, zero_k, floor, rule))
    return out


def whole_run_floor(log: ReplayLog, k: int, seed: int = 0) -> Any:
    """The screening floor of every logged prompt's smoothed pass rate, all steps pooled."""
    return screening_floor(k, rates=np.concatenate([log.rates(i, seed) for i in range(len(log))]))


def token_model(df: Any) -> tuple[float, float] | None:
    """(mean tokens of a passing rollout, fail / pass length ratio) fitted to the log's tokens by least squares
    (tokens = t_pass * passes + t_fail * fails over rows); None without a usable tokens column."""
    if "tokens" not in df.columns:
        return None
    s = df["passes"].to_numpy(np.float64)
    f = df["rollouts"].to_numpy(np.float64) - s
    t = df["tokens"].to_numpy(np.float64)
    if t.sum() <= 0:
        return None
    (tp, tf), *_ = np.linalg.lstsq(np.column_stack([s, f]), t, rcond=None)
    mean = t.sum() / (s.sum() + f.sum())
    tp = tp if tp > 0 else mean  # a log with (almost) no passes or fails leaves one side unfitted
    tf = tf if tf > 0 else mean
    return float(tp), float(tf / tp)


@dataclass
class SimRun:
    """One allocator replayed on the log with one seed: totals over the simulated steps."""

    allocator: str
    seed: int
    rollouts: float
    tokens: float
    effective_groups: float
    steps: int
    extra: dict[str, float] = field(default_factory=dict)
    trained_rows: float = 0.0  # rows of effective groups trained on, at most k a group, reused rows apart

    @property
    def rollouts_per_effective_group(self) -> float:
        return self.rollouts / self.effective_groups if self.effective_groups else math.inf

    @property
    def rollouts_per_trained_row(self) -> float:
        """The advisor's comparable unit (docs/advisor.md): rollouts generated per trained row (a generated row of
        an effective group, at most k of a group). With groups of k it is rollouts per effective group / k; a
        smaller group (AR3PO stops at its first pass) trains fewer rows, so it does not count as a cheaper one,
        and a group grown past k (VIGOR) does not count as more than one."""
        return self.rollouts / self.trained_rows if self.trained_rows else math.inf

    @property
    def tokens_per_effective_group(self) -> float:
        return self.tokens / self.effective_groups if self.effective_groups else math.inf


def simulate(path: Path, name: str, *, k: int, batch: int, seed: int, steps: int, pool: int | None,
             tokens: tuple[float, float] | None, params: dict[str, Any] | None = None) -> SimRun:
    """Replay ``steps`` allocation steps of allocator ``name`` (default parameters, or ``params``) on the log at
    ``path``: over a recurring pool of ``pool`` prompts, or (``pool`` None) over a stream of fresh prompts, each
    drawn in one step only (``rlvr_core.advise.recurrence``). ``extra`` holds ``prompts`` (prompts drawn from the
    stream) and ``recurring_prompts`` (those drawn in more than one step)."""
    mean, ratio = tokens if tokens is not None else (200.0, 1.6)
    engine = GrowingEngine(Scenario("replay", pool or steps * batch, replay=str(path)), seed=seed, horizon=steps,
                           mean_tokens=mean, fail_length_ratio=ratio)
    source = CountingSource(engine.pool_size, seed=seed) if pool else FreshSource(seed=seed)
    alloc = make_allocator(name, k=k, batch_size=batch, seed=seed, **(params or {}))
    tot = {"rollouts": 0.0, "tokens": 0.0, "effective_groups": 0.0}
    trained = 0.0
    for t in range(steps):
        source.step = t
        batch, st = run_allocation_step(alloc, engine, source)
        engine.update_weights()
        for key in tot:
            tot[key] += float(getattr(st, key))
        trained += trained_rows(batch, k) - float(st.extra.get("reused_rollouts", 0))
    return SimRun(name, seed, tot["rollouts"], tot["tokens"], tot["effective_groups"], steps,
                  {"prompts": float(source.drawn_ids), "recurring_prompts": float(len(source.recurring))}, trained)


def trained_rows(batch: TrainBatch, k: int) -> float:
    """Rows of the batch's effective groups, at most k counted per group: a group's rows beyond k (VIGOR's grown
    budgets) repeat a signal k rows already carry, so they are not counted as more of it."""
    sizes = batch.group_sizes()
    return float(np.minimum(sizes[batch.effective], k).sum()) if len(sizes) else 0.0


def registered_allocators(k: int, batch: int) -> tuple[list[str], dict[str, str]]:
    """Every registered allocator that builds with its default parameters at (k, batch), and why the others
    do not."""
    ok, skipped = [], {}
    for name in ALLOCATORS.names():
        try:
            make_allocator(name, k=k, batch_size=batch, seed=0)
        except (ConfigError, TypeError, ValueError) as e:
            skipped[name] = str(e)
        else:
            ok.append(name)
    return ok, skipped
