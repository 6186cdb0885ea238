"""Contract tests run over every registered allocator (docs/design.md §4.9)."""

import copy

import numpy as np
import pytest

from rlvr_core.allocation import ALLOCATORS, PromptSource, make_allocator, run_allocation_step
from rlvr_core.rollout.simulated import SimulatedEngine

NAMES = ALLOCATORS.names()
EXTRA = {"sara": [{}, {"mode": "rollouts"}, {"prior": "carry+eb"}, {"prior": "context"},
                  {"prior": "carry+context", "mode": "rollouts"}, {"prior": "eb", "stop_rule": "floor"}],
         "sara+dps": [{}, {"prior": "carry+context"}, {"prior": "carry+context", "stop_rule": "floor"}],
         "reinforce-ada": [{}, {"rule": "positive"}], "ar3po": [{}, {"reuse": False}]}
CASES = [(n, kw) for n in NAMES for kw in EXTRA.get(n, [{}])]
# every source carries per-prompt context keys (what the training loop gives); allocators without a
# contextual prior ignore them
CONTEXT = [f"key{q % 7}" for q in range(600)]


def build(name, kw, seed=0, scenario="ushape"):
    eng = SimulatedEngine(scenario, seed=seed, pool_size=600)
    src = PromptSource(eng.pool_size, seed=seed, context=CONTEXT)
    alloc = make_allocator(name, k=8, batch_size=16, seed=seed, **kw)
    return alloc, eng, src


def test_every_design_allocator_is_registered():
    assert set(NAMES) >= {"grpo", "dapo", "sara", "vigor", "pods", "greso", "sara+dps", "pilot-commit", "ar3po",
                          "reinforce-ada"}


@pytest.mark.parametrize("name,kw", CASES)
def test_budget_never_exceeded_and_groups_well_formed(name, kw):
    alloc, eng, src = build(name, kw)
    for _ in range(6):
        batch, st = run_allocation_step(alloc, eng, src)
        eng.update_weights()
        assert 0 < st.rollouts <= alloc.max_rollouts_per_step
        assert st.tokens > 0
        r = batch.rollouts
        assert len(r) == len(batch.group_id)
        assert batch.num_groups == st.groups
        sizes = batch.group_sizes()
        assert (sizes >= 1).all()
        for g in range(batch.num_groups):  # one prompt per group, effective iff mixed
            rows = batch.group_id == g
            assert len(np.unique(r.prompt_id[rows])) == 1
            rew = r.reward[rows]
            assert batch.effective[g] == (rew.min() != rew.max())
        assert len(np.unique(r.prompt_id)) == batch.num_groups  # no prompt twice in a step
        assert st.effective_groups == int(batch.effective.sum())
        assert st.useful_rollouts == int(sizes[batch.effective].sum())


@pytest.mark.parametrize("name,kw", CASES)
def test_empty_proposal_ends_the_step(name, kw):
    alloc, eng, src = build(name, kw)
    alloc.start_step(src)
    rounds = 0
    while req := alloc.propose():
        alloc.observe(eng.generate(req))
        rounds += 1
        assert rounds < 100
    assert alloc.propose() == {}  # stays ended
    alloc.finish_step()


@pytest.mark.parametrize("name,kw", CASES)
def test_same_seed_same_batch(name, kw):
    outs = []
    for _ in range(2):
        alloc, eng, src = build(name, kw, seed=3)
        for _ in range(3):
            batch, st = run_allocation_step(alloc, eng, src)
            eng.update_weights()
        outs.append((batch, st))
    (b1, s1), (b2, s2) = outs
    np.testing.assert_array_equal(b1.rollouts.prompt_id, b2.rollouts.prompt_id)
    np.testing.assert_array_equal(b1.rollouts.reward, b2.rollouts.reward)
    np.testing.assert_array_equal(b1.group_id, b2.group_id)
    s1.extra.pop("generate_seconds"), s2.extra.pop("generate_seconds")
    s1.extra.pop("verify_seconds"), s2.extra.pop("verify_seconds")
    assert s1 == s2


def _finish(alloc, eng, src, steps):
    out = []
    for _ in range(steps):
        batch, st = run_allocation_step(alloc, eng, src)
        eng.update_weights()
        out.append((batch.rollouts.prompt_id.tolist(), batch.rollouts.reward.tolist(), st.rollouts))
    return out


@pytest.mark.parametrize("name,kw", CASES)
def test_state_dict_round_trip_between_steps(name, kw):
    alloc, eng, src = build(name, kw)
    _finish(alloc, eng, src, 3)
    snap = (alloc.state_dict(), eng.state_dict(), src.state_dict())
    ref = _finish(alloc, eng, src, 3)
    alloc2, eng2, src2 = build(name, kw, seed=99)  # different seed: the state must override it
    alloc2.load_state_dict(snap[0])
    eng2 = SimulatedEngine("ushape", seed=0, pool_size=600)
    eng2.load_state_dict(snap[1])
    src2.load_state_dict(snap[2])
    assert _finish(alloc2, eng2, src2, 3) == ref


@pytest.mark.parametrize("name,kw", CASES)
def test_state_dict_round_trip_mid_step(name, kw):
    alloc, eng, src = build(name, kw)
    _finish(alloc, eng, src, 2)
    alloc.start_step(src)
    alloc.observe(eng.generate(alloc.propose()))  # one round into the step
    snap = copy.deepcopy((alloc.state_dict(), eng.state_dict(), src.state_dict()))

    def rest(a, e, s):
        while req := a.propose():
            a.observe(e.generate(req))
        batch, st = a.finish_step()
        e.update_weights()
        return (batch.rollouts.prompt_id.tolist(), batch.group_id.tolist(), st.rollouts), _finish(a, e, s, 2)

    ref = rest(alloc, eng, src)
    alloc2 = make_allocator(name, k=8, batch_size=16, seed=5, **kw)
    eng2 = SimulatedEngine("ushape", seed=0, pool_size=600)
    eng2.load_state_dict(snap[1])
    src2 = PromptSource(600, seed=7, context=CONTEXT)  # the context is data, not state: it comes from the rows
    src2.load_state_dict(snap[2])
    alloc2.load_state_dict(snap[0], source=src2)
    assert rest(alloc2, eng2, src2) == ref


def test_mid_step_state_needs_the_source():
    alloc, eng, src = build("sara", {})
    alloc.start_step(src)
    alloc.observe(eng.generate(alloc.propose()))
    state = alloc.state_dict()
    with pytest.raises(ValueError, match="mid-step"):
        make_allocator("sara", k=8, batch_size=16).load_state_dict(state)


def test_protocol_misuse_is_reported():
    alloc, eng, src = build("grpo", {})
    with pytest.raises(RuntimeError):
        alloc.propose()
    alloc.start_step(src)
    req = alloc.propose()
    with pytest.raises(RuntimeError):
        alloc.propose()
    short = dict(req)
    short[next(iter(short))] -= 1
    with pytest.raises(ValueError, match="do not answer"):
        alloc.observe(eng.generate(short))


def _held_prior(alloc, ids, src):
    """What ``alloc`` (a copy taken before the step) holds of each prompt's pass rate, by its own state; None: no
    such state."""
    name = alloc.name
    if name in ("sara", "sara+dps", "valor", "vip"):
        a, b = alloc.posterior.prior(ids, src.context_keys(ids) if alloc.params.prior.context else None)
        return a / (a + b)
    if name == "mopps":
        a, b = alloc.posterior(ids)
        return a / (a + b)
    if name == "cures":
        return alloc.pass_rate(ids)[0]
    if name == "knapsack-rl":
        p, used = alloc.estimates(ids)
        return np.where(used, p, np.nan)
    return None


@pytest.mark.parametrize("name,kw", CASES)
def test_step_beliefs_are_what_the_allocator_held_at_its_decisions(name, kw):
    """``step_beliefs`` (the decision log's prior and p_eff): for each prompt that got rollouts, the prior is the
    allocator's pass-rate belief before the step's evidence, and p_eff (SARA's) is 1 for a mixed prefix; an
    allocator that holds neither leaves it empty. A pool of 40 prompts, so that prompts recur within 10 steps."""
    eng = SimulatedEngine("ushape", seed=1, pool_size=40)
    src = PromptSource(eng.pool_size, seed=1, context=CONTEXT[:40])
    alloc = make_allocator(name, k=8, batch_size=8, seed=1, **kw)
    seen: set[float] = set()
    for _ in range(10):
        pre = copy.deepcopy(alloc)
        run_allocation_step(alloc, eng, src)
        eng.update_weights()
        led = alloc.ledger
        ids = led.prompt[led.n > 0]
        held = _held_prior(pre, ids, src)
        if held is None:
            assert alloc.step_beliefs == {}
            continue
        assert sorted(alloc.step_beliefs) == sorted(ids.tolist())
        prior = np.array([alloc.step_beliefs[q][0] for q in ids.tolist()])
        peff = np.array([alloc.step_beliefs[q][1] for q in ids.tolist()])
        np.testing.assert_allclose(prior, held, equal_nan=True)
        seen |= set(prior[np.isfinite(prior)].round(6).tolist())
        if name in ("sara", "sara+dps"):
            s = led.s[led.n > 0]
            mixed = (s > 0) & (s < led.n[led.n > 0])
            assert ((peff >= 0) & (peff <= 1)).all() and (peff[mixed] == 1.0).all()
        else:
            assert np.isnan(peff).all()
    if _held_prior(alloc, np.zeros(0, np.int64), src) is not None:  # the beliefs move with the evidence
        uniform = getattr(getattr(alloc.params, "prior", None), "kind", "") == "uniform"
        assert len(seen) == 1 if uniform else len(seen) > 1
