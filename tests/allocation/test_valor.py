"""VALOR (rlvr_core/allocation/valor.py, docs/allocators/valor.md): its expected value is the posterior integral it
claims, its index ranks as the value says, it keeps its budget, and its novelty factor and reuse act."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import beta as beta_dist

from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
from rlvr_core.allocation.valor import VALORParams, expected_value
from rlvr_core.errors import ConfigError
from rlvr_core.rollout.simulated import SimulatedEngine
from rlvr_core.types import Rollouts


def _integral(n: int, s: int, size: int, a: float, b: float, params: VALORParams, rescued: bool = False) -> float:
    """The same expectation by quadrature: P(the grown group is mixed | prefix, p) under the Beta posterior."""
    m = size - n

    def mixed(p: float) -> float:
        if 0 < s < n:
            return 1.0
        no_pass_left = 0.0 if rescued else (1 - p) ** m
        if n == 0:
            return 1.0 - p**m - no_pass_left
        return 1.0 - (no_pass_left if s == 0 else p**m)

    post = beta_dist(a + s, b + n - s)
    f = lambda p: mixed(p) * p**params.value_a * (1 - p) ** params.value_b * post.pdf(p)  # noqa: E731
    return integrate.quad(f, 0, 1, limit=200)[0] * (size / params.k) ** params.size_exponent


@pytest.mark.parametrize("n,s,size,rescued", [(0, 0, 8, False), (2, 0, 8, False), (2, 2, 8, False), (2, 1, 8, False),
                                                (4, 0, 4, False), (2, 0, 8, True), (0, 0, 8, True), (3, 1, 5, False)])
@pytest.mark.parametrize("a,b", [(1.0, 1.0), (0.6, 2.5)])
def test_expected_value_is_the_posterior_integral(n, s, size, rescued, a, b) -> None:
    params = VALORParams(value_a=1.0, value_b=2.0, size_exponent=0.7)
    got = float(expected_value(np.array([n]), np.array([s]), size, np.array([a]), np.array([b]), params,
                               np.array([rescued]))[0])
    assert got == pytest.approx(_integral(n, s, size, a, b, params, rescued), rel=1e-6, abs=1e-12)


def _step_with(alloc, rewards: dict[int, list[float]]):
    """Start a step, answer the first round with the given rewards per prompt (others fail), observe."""
    src = PromptSource(1000, seed=0)
    alloc.start_step(src)
    req = alloc.propose()
    ids, rew = [], []
    for q, n in req.items():
        r = rewards.get(q, [0.0] * n)
        ids += [q] * n
        rew += r[:n]
    alloc.observe(Rollouts(np.array(ids), np.array(rew, float), np.full(len(ids), 5)))
    return req


def test_after_the_pilot_a_mixed_prompt_goes_on_and_an_all_pass_one_stops() -> None:
    alloc = make_allocator("valor", k=8, batch_size=4, prior="uniform")
    src = PromptSource(1000, seed=0)
    alloc.start_step(src)
    req = alloc.propose()
    assert set(req.values()) == {2} and len(req) == 4  # B x k / max_n prompts, each at the pilot
    q = list(req)
    rewards = {q[0]: [1.0, 0.0], q[1]: [1.0, 1.0], q[2]: [0.0, 0.0], q[3]: [1.0, 0.0]}
    ids = np.repeat(q, 2)
    alloc.observe(Rollouts(ids, np.concatenate([rewards[x] for x in q]), np.full(8, 5)))
    nxt = alloc.propose()
    assert nxt.get(q[0]) == 2 and nxt.get(q[3]) == 2  # mixed prefixes grow to the next size (4)
    assert q[1] not in nxt  # all passed: p is likely high, p(1-p)^2 small, below a fresh prompt's index
    assert sum(nxt.values()) + 8 <= 32


@pytest.mark.parametrize("profile", ["ushape", "uniform", "drift"])
def test_it_keeps_its_budget_and_every_prompt_is_a_group(profile) -> None:
    eng = SimulatedEngine(profile, seed=1)
    src = PromptSource(eng.pool_size, seed=1)
    alloc = make_allocator("valor", k=8, batch_size=16, seed=1)
    for _ in range(8):
        batch, stats = run_allocation_step(alloc, eng, src)
        assert stats.rollouts <= 16 * 8
        assert stats.groups == stats.prompts == len(np.unique(batch.rollouts.prompt_id))
        sizes = np.bincount(batch.group_id)
        assert sizes.max() <= 8 and sizes.min() >= 2


def test_the_novelty_factor_divides_the_index_by_one_plus_novelty_times_trainings() -> None:
    plain = make_allocator("valor", k=8, batch_size=4, prior="uniform")
    discounted = make_allocator("valor", k=8, batch_size=4, prior="uniform", novelty=0.5)
    for alloc in (plain, discounted):
        alloc.trained = {7: 2}
        alloc.start_step(PromptSource(1000, seed=0))
    ids = np.array([7, 8])
    a = b = np.ones(2)
    ratio = discounted._fresh_index(ids, a, b) / plain._fresh_index(ids, a, b)
    assert ratio == pytest.approx([1 / (1 + 0.5 * 2), 1.0])


def test_reuse_completes_an_all_fail_group_with_the_buffered_answer() -> None:
    alloc = make_allocator("valor", k=4, batch_size=1, reuse=True, prior="uniform", pilot=4)
    src = PromptSource(1, seed=0)  # one prompt: it recurs every step
    for rewards, reused in (([1.0, 0.0, 0.0, 0.0], 0), ([0.0, 0.0, 0.0, 0.0], 1)):
        alloc.start_step(src)
        req = alloc.propose()
        (q, n), = req.items()
        alloc.observe(Rollouts(np.full(n, q), np.array(rewards), np.full(n, 3)))
        assert alloc.propose() == {}
        batch, stats = alloc.finish_step()
        assert stats.extra["reused_rollouts"] == reused and stats.rollouts == 4
        assert bool(batch.effective[0])  # the second step's all-fail group is mixed by the buffered pass
        src = PromptSource(1, seed=0)


def test_state_round_trip_mid_step_continues_identically() -> None:
    eng = SimulatedEngine("uniform", seed=2)
    src = PromptSource(eng.pool_size, seed=2)
    alloc = make_allocator("valor", k=8, batch_size=8, seed=2, novelty=0.1)
    for _ in range(3):
        run_allocation_step(alloc, eng, src)
    state = alloc.state_dict()
    twin = make_allocator("valor", k=8, batch_size=8, seed=2, novelty=0.1)
    twin.load_state_dict(state)
    s1 = PromptSource(eng.pool_size, seed=5)
    s2 = PromptSource(eng.pool_size, seed=5)
    b1, st1 = run_allocation_step(alloc, SimulatedEngine("uniform", seed=9), s1)
    b2, st2 = run_allocation_step(twin, SimulatedEngine("uniform", seed=9), s2)
    assert np.array_equal(b1.rollouts.prompt_id, b2.rollouts.prompt_id) and st1.rollouts == st2.rollouts


@pytest.mark.parametrize("kw,field", [({"pilot": 9}, "pilot"), ({"size_exponent": 1.5}, "size_exponent"),
                                      ({"price": "seconds"}, "price"), ({"novelty": -1}, "novelty"),
                                      ({"value_b": float("nan")}, "value_b"), ({"budget": 4}, "budget"),
                                      ({"max_rounds": 2}, "max_rounds"), ({"reuse": "yes"}, "reuse")])
def test_bad_params_are_named(kw, field) -> None:
    with pytest.raises(ConfigError, match=field):
        make_allocator("valor", k=8, batch_size=4, **kw)


def test_the_defaults_are_the_committed_calibrations_declaration() -> None:
    """design.md §4.17: the constants are what `python -m benchmarks.group_value --calibration` declared on the
    calibration warm starts, not numbers typed apart from it."""
    import json
    from pathlib import Path

    cal = Path(__file__).resolve().parents[2] / "benchmarks/results/group_value/calibration/group_value.json"
    declared = json.loads(cal.read_text())["calibration"]["declared"]
    params = VALORParams()
    assert {k: getattr(params, k) for k in declared} == declared
