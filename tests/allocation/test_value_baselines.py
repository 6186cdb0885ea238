"""What the value-based baselines decide (docs/allocators/knapsack-rl.md, vip.md, mopps.md and cures.md), on small
hand-computed cases and scripted engines; the generic contract is tests/allocation/test_contract.py's."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
from rlvr_core.allocation.cures import apportion
from rlvr_core.allocation.knapsack_rl import greedy_budgets, group_value, knapsack_budgets
from rlvr_core.allocation.vip import vip_budgets, vip_objective, vip_terms
from rlvr_core.errors import ConfigError
from tests.allocation.test_published_baselines import ScriptedEngine, group_of


def brute_force(value, base: list[int], cap: int, budget: int) -> float:
    """The best summed value over every way to add ``budget`` rollouts to ``base``, none beyond ``cap``."""
    best = -math.inf
    for extra in itertools.product(range(budget + 1), repeat=len(base)):
        n = [b + e for b, e in zip(base, extra)]
        if sum(extra) == budget and max(n) <= cap:
            best = max(best, sum(value(i, m) for i, m in enumerate(n)))
    return best


# ----------------------------------------------------------------------------------------- knapsack-rl

@pytest.mark.parametrize("p,budget,cap", [([0.5, 0.1, 0.8], 9, 12), ([0.05, 0.5, 0.95, 0.3], 8, 5),
                                          ([0.2, 0.2, 0.6], 12, 16)])
def test_knapsack_greedy_matches_the_brute_force_optimum(p, budget, cap):
    base = [2] * len(p)
    n, left = greedy_budgets(np.array(p), np.array(base), cap, budget)
    assert left == 0 and n.sum() == sum(base) + budget and n.max() <= cap
    got = float(group_value(np.array(p), n).sum())
    assert got == pytest.approx(brute_force(lambda i, m: float(group_value(p[i], m)), base, cap, budget), abs=1e-12)


def test_knapsack_value_is_p_mixed_times_p_one_minus_p_squared():
    # p = 0.5, n = 2: P(mixed) = 1/2, value 1/2 * 1/2 * 1/4
    assert float(group_value(0.5, 2)) == pytest.approx(1 / 16)
    assert float(group_value(0.0, 8)) == 0.0 and float(group_value(1.0, 8)) == 0.0


def test_knapsack_budgets_follow_the_source_rule():
    pr = make_allocator("knapsack-rl", k=8, batch_size=4).params
    # p = 0.5 and 0.1 in (0, 1) start at 2; 0 and 1 at 2; 24 left. Expected costs: log(0.1)/log(0.5) -> 3,
    # log(0.1)/log(0.9) -> 21: 24, not below what is left, so no fallback; the greedy shares the 24
    n = knapsack_budgets(np.array([0.5, 0.0, 1.0, 0.1]), np.ones(4, bool), pr)
    assert n.tolist()[1:3] == [2, 2] and n.sum() == 32
    ref, _ = greedy_budgets(np.array([0.5, 0.1]), np.array([2, 2]), 128, 24)
    assert [n[0], n[3]] == ref.tolist()
    # only p = 0.5 in (0, 1): expected cost 3 of 24 left, so 21 go to the prompt at 0, 3 to the knapsack
    n = knapsack_budgets(np.array([0.5, 0.0, 1.0, 1.0]), np.ones(4, bool), pr)
    assert n.tolist() == [5, 23, 2, 2]
    # without fallback the knapsack gets everything
    nf = knapsack_budgets(np.array([0.5, 0.0, 1.0, 1.0]), np.ones(4, bool),
                          make_allocator("knapsack-rl", k=8, batch_size=4, fallback=False).params)
    assert nf.tolist() == [26, 2, 2, 2]
    # no estimate yet: k each; nothing in (0, 1): the rest to the prompts at 0, in equal shares
    assert knapsack_budgets(np.array([0.5, 0.1, 0.0, 1.0]), np.zeros(4, bool), pr).tolist() == [8] * 4
    assert knapsack_budgets(np.array([0.0, 0.0, 1.0, 1.0]), np.ones(4, bool), pr).tolist() == [14, 14, 2, 2]
    assert knapsack_budgets(np.array([1.0, 1.0]), np.ones(2, bool), pr).tolist() == [8, 8]


def test_knapsack_estimates_from_the_last_appearance_and_spends_b_times_k():
    """Prompt 0 always passes, 1 alternates, 2 always fails (pool of 3, B = 3): after step 1 (k = 8 each, 8
    rollouts behind each) prompt 0 is at 1 and 2 at 0 (2 each), prompt 1 at 0.5 (2 + its expected cost 3),
    and the rest goes to prompt 2."""
    eng = ScriptedEngine(lambda q, i: {0: 1, 1: i % 2, 2: 0}[q])
    alloc = make_allocator("knapsack-rl", k=8, batch_size=3)
    src = PromptSource(3, seed=0)
    _, st = run_allocation_step(alloc, eng, src)
    assert eng.seen == {0: 8, 1: 8, 2: 8} and st.rollouts == 24
    batch, st = run_allocation_step(alloc, eng, src)
    assert st.rollouts == 24 and st.rounds == 1
    assert {q: len(group_of(batch, q)) for q in range(3)} == {0: 2, 1: 5, 2: 17}
    p, valid = alloc.estimates(np.array([0, 1, 2]))
    assert valid.all() and p.tolist() == [1.0, 6 / 13, 0.0]  # prompt 1: its last 5 < 16: all 13 rollouts


@pytest.mark.parametrize("kw,field", [({"min_n": 9}, "min_n"), ({"max_n": 1}, "max_n"), ({"alpha": 1.0}, "alpha"),
                                      ({"negative_n": 0}, "negative_n"), ({"window": 0}, "window")])
def test_knapsack_bad_params_are_named(kw, field):
    with pytest.raises(ConfigError, match=field):
        make_allocator("knapsack-rl", k=8, **kw)


# ----------------------------------------------------------------------------------------- vip

@pytest.mark.parametrize("p", [[0.5, 0.1, 0.95], [0.3, 0.3, 0.7, 0.02], [0.5, 0.5, 0.5]])
def test_vip_greedy_matches_the_brute_force_optimum(p):
    var, lin = np.array(p) * (1 - np.array(p)), 0.05 * np.log(p)  # a larger weight than 4e-4: the term matters
    budget, n_min, n_max = 8 * len(p), 4, 14
    n = vip_budgets(var, lin, budget, n_min, n_max)
    assert n.sum() == budget and n.min() >= n_min and n.max() <= n_max
    best = -brute_force(lambda i, m: -vip_objective(var[i:i + 1], lin[i:i + 1], np.array([m])),
                        [n_min] * len(p), n_max, budget - n_min * len(p))
    assert vip_objective(var, lin, n) == pytest.approx(best, abs=1e-12)


def test_vip_spends_b_times_k_within_its_bounds_and_favours_uncertain_and_hard_prompts():
    a, b = np.array([50.0, 1.0, 99.0, 10.0, 90.0]), np.array([50.0, 99.0, 1.0, 90.0, 10.0])  # p ~ .5 .01 .99 .1 .9
    n = vip_budgets(*vip_terms(a, b, 0.0), 5 * 8, 4, 32)  # variance alone
    assert n.sum() == 40 and n.min() >= 4 and n.max() <= 32
    assert n[0] == n.max() and n[1] == n[2] == 4 and abs(n[3] - n[4]) <= 1  # p(1-p) decides (a tie to the first)
    n = vip_budgets(*vip_terms(a, b, 4e-4), 5 * 8, 4, 32)  # the source's weight
    assert n.sum() == 40 and n[2] == 4 and n[3] > n[4]  # the log term moves rollouts towards hard prompts
    # at p ~ 0.01 it outweighs the variance term: b = 4e-4 log 0.01 ~ -1.8e-3 per rollout, about what the
    # tenth rollout of the prompt at 0.5 lowers its variance term by (0.25 (10/121 - 9/100) ~ -1.9e-3)
    assert n[1] > n[0] > n[3]


def test_vip_expectations_are_under_the_beta_posterior():
    var, lin = vip_terms(np.array([1.0]), np.array([1.0]), 1.0)  # uniform: E[p(1-p)] = 1/6, E[log p] = -1
    assert var[0] == pytest.approx(1 / 6) and lin[0] == pytest.approx(-1.0)


def test_vip_allocates_by_its_posterior_in_training():
    """Prompt 0 alternates, 1 always passes, 2 always fails (B = 3, k = 8): after a few steps prompt 0 holds
    the most rollouts, every prompt at least n_min, and each step B * k."""
    eng = ScriptedEngine(lambda q, i: {0: i % 2, 1: 1, 2: 0}[q])
    alloc = make_allocator("vip", k=8, batch_size=3, prior="carry")
    src = PromptSource(3, seed=0)
    for _ in range(4):
        batch, st = run_allocation_step(alloc, eng, src)
        assert st.rollouts == 24 and st.rounds == 1
    sizes = {q: len(group_of(batch, q)) for q in range(3)}
    assert sizes[0] > max(sizes[1], sizes[2]) and min(sizes.values()) >= 4


@pytest.mark.parametrize("kw,field", [({"n_min": 2}, "n_min"), ({"n_min": 9}, "n_min"), ({"n_max": 6}, "n_min"),
                                      ({"cost_weight": -1.0}, "cost_weight"), ({"prior": "gp"}, "prior")])
def test_vip_bad_params_are_named(kw, field):
    with pytest.raises(ConfigError, match=field):
        make_allocator("vip", k=8, **kw)


# ----------------------------------------------------------------------------------------- mopps

def test_mopps_picks_the_candidates_whose_draws_are_nearest_the_target():
    """Posteriors so concentrated that each draw is its mean: of 8 candidates (B = 2, factor 4, a pool of 8)
    the two nearest 0.5 are kept and the other 6 skipped."""
    means = {0: 0.05, 1: 0.45, 2: 0.9, 3: 0.6, 4: 0.2, 5: 0.99, 6: 0.7, 7: 0.0}
    alloc = make_allocator("mopps", k=4, batch_size=2, candidates_factor=4)
    alloc.alpha = {q: 1e6 * m + 1e-3 for q, m in means.items()}
    alloc.beta = {q: 1e6 * (1 - m) + 1e-3 for q, m in means.items()}
    eng = ScriptedEngine(lambda q, i: i % 2)
    batch, st = run_allocation_step(alloc, eng, PromptSource(8, seed=0))
    assert sorted(eng.seen) == [1, 3] and st.skipped == 6 and st.rollouts == 8
    assert batch.group_sizes().tolist() == [4, 4]


def test_mopps_target_moves_the_pick():
    means = {0: 0.1, 1: 0.5, 2: 0.85}
    alloc = make_allocator("mopps", k=4, batch_size=1, candidates_factor=3, target=0.8)
    alloc.alpha = {q: 1e6 * m for q, m in means.items()}
    alloc.beta = {q: 1e6 * (1 - m) for q, m in means.items()}
    eng = ScriptedEngine(lambda q, i: 0)
    run_allocation_step(alloc, eng, PromptSource(3, seed=0))
    assert list(eng.seen) == [2]


def test_mopps_posterior_decays_towards_the_prior_per_update():
    """decay 0.5, prior Beta(1, 1): a prompt with 3 passes of 4 goes to (0.5 + 0.5 + 3, 0.5 + 0.5 + 1) =
    (4, 2), and after a second step of 4 fails to (2 + 0.5, 1 + 0.5 + 4) = (2.5, 5.5)."""
    outcomes = iter([1, 1, 1, 0, 0, 0, 0, 0])
    eng = ScriptedEngine(lambda q, i: next(outcomes))
    alloc = make_allocator("mopps", k=4, batch_size=1, candidates_factor=1)
    src = PromptSource([7], seed=0)
    run_allocation_step(alloc, eng, src)
    assert (alloc.alpha[7], alloc.beta[7]) == (4.0, 2.0)
    run_allocation_step(alloc, eng, src)
    assert (alloc.alpha[7], alloc.beta[7]) == (2.5, 5.5)


@pytest.mark.parametrize("kw,field", [({"candidates_factor": 0}, "candidates_factor"), ({"decay": 0.0}, "decay"),
                                      ({"target": 1.0}, "target"), ({"a0": 0.0}, "a0")])
def test_mopps_bad_params_are_named(kw, field):
    with pytest.raises(ConfigError, match=field):
        make_allocator("mopps", k=8, **kw)


# ----------------------------------------------------------------------------------------- cures

def test_cures_apportion_is_proportional_within_its_bounds():
    assert apportion(np.array([1.0, 2.0, 3.0, 2.0]), 64, 2, 64).tolist() == [8, 16, 24, 16]
    assert apportion(np.ones(4), 32, 2, 16).tolist() == [8, 8, 8, 8]
    n = apportion(np.array([0.5, 0.1, 0.3, 0.0]), 32, 2, 16)  # the first is capped, the last kept at the floor
    assert n.sum() == 32 and n[0] == 16 and n[3] == 2 and n[2] > n[1] >= 2


def test_cures_shares_the_budget_by_sqrt_p_one_minus_p_of_its_counter():
    """k = 8, B = 2: a first step gives both prompts 8 (the counter is empty: p = 1/2 each). After prompt 0 passed 1 of
    8 (p = 2/10) and prompt 1 4 of 8 (p = 1/2), their shares of 16 are in the ratio sqrt(.16) : sqrt(.25) = 4 : 5."""
    eng = ScriptedEngine(lambda q, i: int(i < (1 if q == 0 else 4)))
    alloc = make_allocator("cures", k=8, batch_size=2)
    src = PromptSource(2, seed=0)
    batch, st = run_allocation_step(alloc, eng, src)
    assert st.rollouts == 16 and sorted(batch.group_sizes().tolist()) == [8, 8]
    assert alloc.passes == {0: 1, 1: 4} and alloc.total == {0: 8, 1: 8}
    batch, st = run_allocation_step(alloc, eng, src)
    sizes = {int(q): int(n) for q, n in zip(*np.unique(batch.rollouts.prompt_id, return_counts=True))}
    assert st.rollouts == 16 and sizes == {0: 7, 1: 9}  # 16 x 4/9 = 7.1, 16 x 5/9 = 8.9


def test_cures_draws_its_prompts_by_the_sources_weights():
    """At the source's temperature the weights are flat: of 2 candidates a prompt with 50 passes and one with none
    are drawn about equally often; at a temperature of 100 the unsolved one (weight exp(50) against exp(~1)) wins."""
    def share(temperature: float) -> float:
        alloc = make_allocator("cures", k=4, batch_size=1, candidates_factor=2, temperature=temperature, seed=3)
        alloc.passes, alloc.total = {0: 50, 1: 0}, {0: 100, 1: 0}
        return float(np.mean([alloc.select(np.array([0, 1]))[0] == 1 for _ in range(2000)]))

    assert 0.45 < share(0.01) < 0.55
    assert share(100.0) == 1.0


@pytest.mark.parametrize("kw,field", [({"temperature": 0}, "temperature"), ({"candidates_factor": 0},
                                      "candidates_factor"), ({"n_min": 1}, "n_min"), ({"n_max": 4}, "n_max")])
def test_cures_bad_params_are_named(kw, field):
    with pytest.raises(ConfigError, match=field):
        make_allocator("cures", k=8, **kw)
