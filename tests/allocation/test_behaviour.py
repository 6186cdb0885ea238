"""What the allocators promise, checked by simulation."""

import numpy as np
import pytest

from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
from rlvr_core.allocation.pods import max_variance_subset
from rlvr_core.allocation.sara import ABANDONED
from rlvr_core.rollout import RolloutEngine
from rlvr_core.rollout.simulated import SimulatedEngine


@pytest.mark.parametrize("k,tau_low", [(8, 0.5), (16, 0.5), (8, 0.7)])
def test_sara_abandonment_reliability_under_its_prior(k, tau_low):
    """Pass rates drawn from SARA's own uniform prior: of the prompts SARA abandons,
    the share whose full group of k would have been mixed stays under tau_low."""
    eng = SimulatedEngine("uniform", seed=1, pool_size=20000)
    src = PromptSource(eng.pool_size, seed=1)
    alloc = make_allocator("sara", k=k, batch_size=64, tau_low=tau_low, prior="uniform", seed=1)
    rng = np.random.default_rng(0)
    would_mix = []
    for _ in range(40):
        alloc.start_step(src)
        while req := alloc.propose():
            alloc.observe(eng.generate(req))
        led = alloc.ledger
        ab = np.flatnonzero(alloc.status == ABANDONED)
        p = eng.pass_rate(led.prompt[ab])
        s = np.rint(led.s[ab]) + rng.binomial(k - led.n[ab], p)  # the rollouts SARA saved, drawn now
        would_mix.extend(((s > 0) & (s < k)).tolist())
        alloc.finish_step()
    would_mix = np.asarray(would_mix)
    assert len(would_mix) > 500
    tol = 3 * np.sqrt(tau_low * (1 - tau_low) / len(would_mix))
    assert would_mix.mean() < tau_low + tol


@pytest.mark.parametrize("scenario,strict", [("early", True), ("late", True), ("ushape", True),
                                             ("uniform", False), ("drift", False)])
def test_sara_fixed_budget_yields_at_least_uniform(scenario, strict):
    """Same rollout budget per step: SARA's effective groups >= uniform GRPO's.

    On skewed populations SARA must win outright; where pass rates are spread
    evenly (uniform, drift) abandonment gains little and the two may tie, so
    there SARA must stay within sampling noise (2 sigma) of GRPO.
    """
    def effective(name, **kw):
        tot = 0
        for seed in range(4):
            eng = SimulatedEngine(scenario, seed=seed)
            src = PromptSource(eng.pool_size, seed=seed)
            alloc = make_allocator(name, k=8, batch_size=32, seed=seed, **kw)
            for _ in range(25):
                _, st = run_allocation_step(alloc, eng, src)
                assert st.rollouts <= 32 * 8
                eng.update_weights()
                tot += st.effective_groups
        return tot

    sara, grpo = effective("sara", mode="rollouts"), effective("grpo")
    if strict:
        assert sara > grpo
    else:
        assert sara >= grpo - 2 * np.sqrt(grpo)


def test_sara_spends_fewer_rollouts_per_prompt_than_k():
    eng = SimulatedEngine("ushape", seed=0)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("sara", k=16, batch_size=32, seed=0)
    rollouts = prompts = 0
    for _ in range(10):
        _, st = run_allocation_step(alloc, eng, src)
        rollouts += st.rollouts
        prompts += st.prompts
    assert rollouts / prompts < 16


def test_sara_groups_mode_commits_exactly_the_batch():
    eng = SimulatedEngine("uniform", seed=0)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("sara", k=8, batch_size=32, seed=0)
    batch, st = run_allocation_step(alloc, eng, src)
    assert st.effective_groups == st.groups == 32
    assert (batch.group_sizes() == 8).all()
    assert 2 <= st.rounds <= 6
    assert st.committed == 32


def test_dapo_cap_ends_step_without_error():
    eng = SimulatedEngine("early", seed=0)  # few mixed groups
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("dapo", k=8, batch_size=64, gen_batch_size=8, max_gen_batches=2, seed=0)
    batch, st = run_allocation_step(alloc, eng, src)
    assert st.hit_cap == 1
    assert st.rollouts == 2 * 8 * 8
    assert st.effective_groups < 64 and batch.effective.all()


def test_vigor_groups_are_ragged_and_grow_high_variance_prompts():
    eng = SimulatedEngine("uniform", seed=0)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("vigor", k=8, batch_size=32, seed=0)
    batch, st = run_allocation_step(alloc, eng, src)
    sizes = batch.group_sizes()
    assert set(sizes.tolist()) >= {4, 8}
    assert sizes.max() <= 32
    grown = sizes > 4
    assert batch.effective[grown].all()  # only mixed prompts are grown
    assert st.rollouts <= 256 and st.rounds == 4  # m0, then T = 3 refinements


@pytest.mark.parametrize("scenario", ["uniform", "ushape"])
def test_vigor_fill_spends_the_whole_step_budget(scenario):
    """VIGOR's single wave ends under budget (zero-variance prompts are not grown); with fill it starts more
    waves of fresh prompts until less than m0 is left, so it spends B x k rollouts per step as GRPO does."""
    spent = {}
    for fill in (False, True):
        eng = SimulatedEngine(scenario, seed=0)
        src = PromptSource(eng.pool_size, seed=0)
        alloc = make_allocator("vigor", k=8, batch_size=32, seed=0, fill=fill)
        sizes = []
        for _ in range(5):
            batch, st = run_allocation_step(alloc, eng, src)
            assert st.rollouts <= 256
            sizes.append(st.rollouts)
        spent[fill] = sizes
    assert min(spent[False]) < 256 - 4  # the source's wave leaves budget unspent
    assert all(256 - 4 < s <= 256 for s in spent[True])


def test_vigor_fill_ends_when_the_source_runs_dry():
    eng = SimulatedEngine("ushape", seed=0, pool_size=6)  # fewer prompts than one wave wants
    alloc = make_allocator("vigor", k=8, batch_size=32, seed=0, fill=True)
    batch, st = run_allocation_step(alloc, eng, PromptSource(6, seed=0))
    assert 0 < st.rollouts <= 256 and len(set(batch.rollouts.prompt_id.tolist())) <= 6


def test_pods_keeps_max_variance_subset():
    r = np.array([1, 1, 1, 1, 1, 1, 0, 0], float)
    idx = max_variance_subset(r, 4)
    assert sorted(r[idx].tolist()) == [0, 0, 1, 1]
    rng = np.random.default_rng(0)
    from itertools import combinations
    for _ in range(20):
        x = rng.normal(size=7)
        best = max(np.var(x[list(c)]) for c in combinations(range(7), 3))
        assert np.var(x[max_variance_subset(x, 3)]) == pytest.approx(best)


def test_greso_skips_prompts_with_zero_variance_history():
    eng = SimulatedEngine("ushape", seed=0, pool_size=200)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("greso", k=8, batch_size=16, seed=0)
    skipped = 0
    for _ in range(30):
        _, st = run_allocation_step(alloc, eng, src)
        skipped += st.skipped
    assert skipped > 0
    assert max(alloc.streak.values()) >= 2


def test_carried_prior_learns_saturated_prompts():
    eng = SimulatedEngine("drift", seed=0)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("sara", k=8, batch_size=32, prior="carry", seed=0)
    for _ in range(15):
        run_allocation_step(alloc, eng, src)
        eng.update_weights()
    ids = eng.prompt_ids
    a, b = alloc.posterior.prior(ids)
    known = alloc.posterior.has_evidence(ids)
    assert known.sum() > 100
    rate = eng.pass_rate(ids)
    mean = a / (a + b)
    assert np.corrcoef(mean[known], rate[known])[0, 1] > 0.5


def test_sara_dps_prefers_predicted_effective_prompts():
    dps = make_allocator("sara+dps", k=8, batch_size=16, seed=0)
    sara = make_allocator("sara", k=8, batch_size=16, seed=0)
    def cost(alloc):
        e = SimulatedEngine("ushape", seed=0, pool_size=400)
        s = PromptSource(e.pool_size, seed=0)
        R = E = 0
        for _ in range(40):
            _, st = run_allocation_step(alloc, e, s)
            R += st.rollouts
            E += st.effective_groups
        return R / E
    assert cost(dps) < cost(sara)


def test_vigor_keeps_growing_when_gamma_near_one_rounds_a_size_flat():
    """m0=2, gamma=1.2 rounds the sizes to [2, 2, 3, 3]: iteration 1 needs nothing, yet prompts must grow to 3."""
    alloc = make_allocator("vigor", k=8, batch_size=8, m0=2, gamma=1.2, T=3, seed=0)
    assert alloc.params.sizes() == [2, 2, 3, 3]
    eng = SimulatedEngine("uniform", seed=0)
    src = PromptSource(eng.pool_size, seed=0)
    batch, st = run_allocation_step(alloc, eng, src)
    assert batch.group_sizes().max() == 3
    assert st.rounds == 2  # m0, then the growth to 3 (the flat iterations request nothing)


class ConstantEngine(RolloutEngine):
    """Rewards that are the same within each prompt's group but far from 0 (100.1), except for prompt 0."""

    def generate(self, requests):
        from rlvr_core.types import Rollouts
        ids, rewards = [], []
        for q, m in requests.items():
            ids += [q] * m
            rewards += [100.1 + (0.5 * (j % 2) if q == 0 else 0.0) for j in range(m)]
        return Rollouts(np.asarray(ids), np.asarray(rewards), np.ones(len(ids), np.int64))


@pytest.mark.parametrize("name", ["dapo", "vigor", "grpo"])
def test_a_constant_group_far_from_zero_is_never_mixed(name):
    """16 rewards of 100.1 have a naive variance of about 1.8e-12 (mean of squares minus the squared mean)."""
    s = s2 = 0.0
    for _ in range(16):  # running sums, as a per-slot ledger accumulates them
        s, s2 = s + 100.1, s2 + 100.1**2
    assert s2 / 16 - (s / 16) ** 2 > 1e-6**2  # the cancellation that made such a group count as mixed
    alloc = make_allocator(name, k=16, batch_size=4, seed=0, **({"max_gen_batches": 2} if name == "dapo" else {}))
    batch, st = run_allocation_step(alloc, ConstantEngine(), PromptSource(50, seed=0))
    mixed = batch.effective
    pid = batch.rollouts.prompt_id
    for g in np.flatnonzero(mixed):
        assert set(pid[batch.group_id == g].tolist()) == {0}
    if 0 in set(pid.tolist()):
        assert mixed.sum() == 1
    assert alloc.ledger.variance()[alloc.ledger.prompt != 0].max(initial=0.0) == 0.0


def test_a_ledger_saved_with_a_sum_of_squares_loads_with_its_moments_rebuilt():
    """Mid-step states written before the shifted moments existed carry ``s2``; loading rebuilds d1/d2/ref."""
    eng = SimulatedEngine("uniform", seed=0)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator("vigor", k=8, batch_size=8, seed=0)
    alloc.start_step(src)
    alloc.observe(eng.generate(alloc.propose()))
    state = alloc.state_dict()
    led = state["ledger"]
    want = alloc.ledger.variance()
    led["s2"] = sum(np.bincount(slot, weights=part.reward**2, minlength=len(led["n"]))
                    for part, slot in zip(led["parts"], led["row_slot"]))
    for key in ("ref", "d1", "d2"):
        del led[key]
    again = make_allocator("vigor", k=8, batch_size=8, seed=0)
    again.load_state_dict(state, source=src)
    assert np.array_equal(again.ledger.variance(), want) and want.max() > 0
    assert np.array_equal(again.ledger.n, alloc.ledger.n) and np.array_equal(again.ledger.s, alloc.ledger.s)


def test_sara_floor_rule_abandons_where_the_floor_says_and_no_earlier():
    """stop_rule "floor" under a population prior: a prompt is dropped after exactly as many equal rewards
    as the screening floor's best rule allows (one fail on 'early'-like pass rates, three on 'ushape')."""
    from rlvr_core.allocation.floor import screening_floor
    from rlvr_core.allocation.posterior import PriorConfig

    for beta in ((0.4, 2.5), (0.25, 0.25)):
        fl = screening_floor(8, beta=beta)
        alloc = make_allocator("sara", k=8, batch_size=4, seed=0, stop_rule="floor",
                               prior=PriorConfig(kind="uniform", a0=beta[0], b0=beta[1]),
                               probe_schedule=tuple(range(1, 9)), max_rounds=12)
        alloc.start_step(PromptSource(64, seed=0))
        n = np.arange(1, 8)
        a, b = np.full(7, beta[0]), np.full(7, beta[1])
        go_fail = alloc._go_on_value(n, np.zeros(7), a, b) > 0
        go_pass = alloc._go_on_value(n, n.astype(float), a, b) > 0
        assert go_fail.tolist() == [m < fl.abandon_after_fails for m in n]
        assert go_pass.tolist() == [m < fl.abandon_after_passes for m in n]
        # an average fresh prompt is worth exactly nothing at the floor's price, a promising one more
        fresh = alloc._go_on_value(np.zeros(2, np.int64), np.zeros(2), np.array([beta[0], 2.0]),
                                   np.array([beta[1], 2.0]))
        assert abs(fresh[0]) < 1e-9 < fresh[1]


def test_sara_floor_rule_spends_fewer_rollouts_than_its_tau_rule_on_a_u_shaped_population():
    """Same prior (population fitted by empirical Bayes) and probe schedule; only the stop rule differs. On
    'ushape' the floor goes on after two equal rewards where tau_low = 0.5 gives up (on 'early' both rules
    drop a prompt after its first two fails, and spend the same)."""
    def per_effective(rule):
        tot = eff = 0
        for seed in range(3):
            eng = SimulatedEngine("ushape", seed=seed)
            src = PromptSource(eng.pool_size, seed=seed)
            alloc = make_allocator("sara", k=8, batch_size=32, seed=seed, prior="eb", stop_rule=rule,
                                   probe_schedule=(0.25, 0.5, 1.0), max_rounds=8)
            for _ in range(15):
                _, st = run_allocation_step(alloc, eng, src)
                tot, eff = tot + st.rollouts, eff + st.effective_groups
        return tot / eff

    assert per_effective("floor") < per_effective("tau")


@pytest.mark.parametrize("kw, match", [({"stop_rule": "bayes"}, "use 'tau' or 'floor'"),
                                       ({"stop_rule": "floor", "mode": "rollouts"}, "only groups mode")])
def test_sara_stop_rule_is_checked(kw, match):
    from rlvr_core.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        make_allocator("sara", k=8, batch_size=4, **kw)


def _all_fail_round(alloc, long_ids, long_len=60, short_len=20):
    """Answer the pending proposal with fails only: ``long_ids``' rollouts long, every other prompt's short."""
    from rlvr_core.types import Rollouts

    req = alloc.propose()
    ids = np.repeat(np.fromiter(req, np.int64), list(req.values()))
    tokens = np.where(np.isin(ids, long_ids), long_len, short_len)
    alloc.observe(Rollouts(prompt_id=ids, reward=np.zeros(len(ids)), tokens=tokens))
    return req


@pytest.mark.parametrize("price", ["rollouts", "tokens"])
def test_sara_token_price_abandons_long_all_fail_prefixes_first(price):
    """Uniform prior, probes k/4, k/2, k at k = 8: an all-fail prefix of 2 has p_eff = 6/9 and one of 4 has
    4/9. Priced in rollouts, every prompt goes on after 2 fails and stops after 4. Priced in tokens, half the
    prompts writing 60 tokens and half 20 (step mean 40): the long ones face tau_low x 1.5 = 0.75 and stop after
    2 fails; the short ones face 0.5 x 0.5 = 0.25, and after 4 fails still less than 4/9 (their prefix stays
    shorter than 8/9 of the step's mean), so they are probed on."""
    from rlvr_core.allocation.sara import LIVE

    alloc = make_allocator("sara", k=8, batch_size=4, seed=0, probe_schedule=(0.25, 0.5, 1.0), max_rounds=8,
                           max_new_prompts_per_round=8, price=price)
    alloc.start_step(PromptSource(1000, seed=0))
    req = _all_fail_round(alloc, long_ids=[])
    first = np.fromiter(req, np.int64)
    long_ids = first[::2]
    # redo the first round with half the prefixes long
    alloc = make_allocator("sara", k=8, batch_size=4, seed=0, probe_schedule=(0.25, 0.5, 1.0), max_rounds=8,
                           max_new_prompts_per_round=8, price=price)
    alloc.start_step(PromptSource(1000, seed=0))
    assert np.array_equal(np.fromiter(_all_fail_round(alloc, long_ids), np.int64), first)
    led = alloc.ledger
    is_long = np.isin(led.prompt, long_ids)
    status = alloc.status[: len(first)]
    if price == "rollouts":
        assert (status == LIVE).all()
    else:
        assert (status[is_long[: len(first)]] == ABANDONED).all() and (status[~is_long[: len(first)]] == LIVE).all()
    _all_fail_round(alloc, long_ids)  # the survivors reach 4 fails (and fresh prompts start)
    survivors = alloc.status[: len(first)][~is_long[: len(first)]]
    assert (survivors == (ABANDONED if price == "rollouts" else LIVE)).all()


def test_sara_token_price_is_checked():
    from rlvr_core.errors import ConfigError

    with pytest.raises(ConfigError, match="use 'rollouts' or 'tokens'"):
        make_allocator("sara", k=8, batch_size=4, price="seconds")
    with pytest.raises(ConfigError, match="use stop_rule 'tau'"):
        make_allocator("sara", k=8, batch_size=4, price="tokens", stop_rule="floor")
