"""SARA's contextual prior (docs/allocators/sara.md): one Beta prior per feature key, fitted to the recent pass
rates of the prompts sharing the key, shrunk towards the population prior."""

import numpy as np
import pytest

from rlvr_core.allocation import PriorConfig, PromptPosterior, PromptSource, make_allocator, run_allocation_step
from rlvr_core.data import make_arithmetic
from rlvr_core.data.context import context_key, context_keys
from rlvr_core.errors import ConfigError
from rlvr_core.rollout.simulated import SimulatedEngine

POOL = 3000
# key j = prompt id % 5 has this pass rate: all-pass, all-fail, mixed, mostly pass, mostly fail
KEY_RATES = np.array([1.0, 0.0, 0.5, 0.9, 0.1])


def mean(a, b):
    return a / (a + b)


def record_step(post, rng, rates, per_key=20, n=8, first_id=0):
    """One step of finished prompts: per_key prompts of every key, n rollouts each at the key's rate."""
    ids, keys, passes = [], [], []
    for j, p in enumerate(rates):
        for i in range(per_key):
            ids.append(first_id + j * per_key + i)
            keys.append(f"k{j}")
            passes.append(rng.binomial(n, p))
    post.record(np.array(ids), np.array(passes), np.full(len(ids), n), keys)
    post.end_step()


def keyed_run(name, prior, *, steps, warm, seed=0, context=True):
    """Train-free allocation steps on a pool whose pass rate is fixed by the key; per key: rollouts
    spent and prompts started after ``warm`` steps."""
    eng = SimulatedEngine("uniform", seed=seed, pool_size=POOL)
    eng.base_rate = KEY_RATES[np.arange(POOL) % len(KEY_RATES)]
    src = PromptSource(POOL, seed=seed, context=[str(q % len(KEY_RATES)) for q in range(POOL)] if context else None)
    alloc = make_allocator(name, k=8, batch_size=16, seed=seed, **({} if prior is None else {"prior": prior}))
    rollouts = np.zeros(len(KEY_RATES))
    started = np.zeros(len(KEY_RATES))
    eff = spent = skipped = 0
    for t in range(steps):
        _, st = run_allocation_step(alloc, eng, src)
        if t >= warm:
            key = alloc.ledger.prompt % len(KEY_RATES)
            np.add.at(rollouts, key, alloc.ledger.n)
            np.add.at(started, key, alloc.ledger.n > 0)
            eff += st.effective_groups
            spent += st.rollouts
            skipped += st.skipped
    return {"alloc": alloc, "rollouts": rollouts, "started": started, "eff": eff, "spent": spent,
            "skipped": skipped}


# ----- the per-key prior ------------------------------------------------------------------------------
def test_key_priors_follow_the_keys_pass_rates():
    post = PromptPosterior(PriorConfig(kind="context"))
    rng = np.random.default_rng(0)
    for _ in range(10):
        record_step(post, rng, [0.9, 0.1, 0.5])
    a, b = post.prior(np.array([10**6, 10**6 + 1, 10**6 + 2]), ["k0", "k1", "k2"])  # prompts never seen
    m = mean(a, b)
    # 20 prompts a step at decay 0.9 weigh ~130 against the 8 of the population prior (mean ~0.5)
    assert abs(m[0] - 0.9) < 0.05 and abs(m[1] - 0.1) < 0.05 and abs(m[2] - 0.5) < 0.05, m
    # the spread is the key's: every prompt of a key has the same rate, so the keys are far more
    # concentrated than the population, which mixes three rates
    assert ((a + b) > 4 * (post.a_pop + post.b_pop)).all(), (a + b, post.a_pop + post.b_pop)


def test_unseen_key_falls_back_to_the_population_prior():
    post = PromptPosterior(PriorConfig(kind="context"))
    rng = np.random.default_rng(1)
    for _ in range(4):
        record_step(post, rng, [0.9, 0.1])
    assert post.a_pop != 1.0  # the population prior was fitted (80 prompts > eb_min_prompts)
    a, b = post.prior(np.array([7, 8]), ["never-seen", "k0"])
    assert (a[0], b[0]) == (post.a_pop, post.b_pop)
    assert mean(a[1], b[1]) > 0.8
    assert post.has_evidence(np.array([7, 8]), ["never-seen", "k0"]).tolist() == [False, True]
    # no keys given: every prompt shares the key "", which was never recorded here
    a, b = post.prior(np.array([7]))
    assert (a[0], b[0]) == (post.a_pop, post.b_pop)


def test_a_key_with_little_evidence_is_shrunk_towards_the_population():
    post = PromptPosterior(PriorConfig(kind="context", context_strength=8.0))
    rng = np.random.default_rng(2)
    ids = np.arange(200)
    post.record(ids, rng.binomial(8, 0.5, 200), np.full(200, 8), ["pop"] * 200)
    post.record(np.array([500, 501]), np.array([8, 8]), np.array([8, 8]), ["few", "few"])  # 2 all-pass prompts
    post.end_step()
    m_pop = post.a_pop / (post.a_pop + post.b_pop)
    a, b = post.prior(np.array([900]), ["few"])
    # mean (2 * 1 + 8 * m_pop) / 10; below context_min_prompts the concentration is the population's
    assert mean(a[0], b[0]) == pytest.approx((2 + 8 * m_pop) / 10)
    assert a[0] + b[0] == pytest.approx(post.a_pop + post.b_pop)
    assert not post.has_evidence(np.array([900]), ["few"])[0]


def test_decay_forgets_old_pass_rates():
    post = PromptPosterior(PriorConfig(kind="context", context_decay=0.8))
    rng = np.random.default_rng(3)
    for _ in range(8):  # key k0 passes 90%
        record_step(post, rng, [0.9, 0.5])
    assert mean(*post.prior(np.array([0]), ["k0"]))[0] > 0.8
    for t in range(16):  # the policy drifts: k0 now passes 10%
        record_step(post, rng, [0.1, 0.5])
        if t == 0:  # one step in, the old rate still dominates
            assert mean(*post.prior(np.array([0]), ["k0"]))[0] > 0.6
    # evidence 16 steps old weighs 0.8**16 = 3%: the key mean is ~0.12, shrunk a little towards the population
    assert mean(*post.prior(np.array([0]), ["k0"]))[0] < 0.2
    # a key that stops getting evidence fades towards the population prior and loses its evidence
    w0 = post.key_weight("k0")
    for _ in range(25):
        post.record(np.arange(40), rng.binomial(8, 0.5, 40), np.full(40, 8), ["k1"] * 40)
        post.end_step()
    assert post.key_weight("k0") == pytest.approx(w0 * 0.8**25)
    assert not post.has_evidence(np.array([0]), ["k0"])[0]
    m_pop = post.a_pop / (post.a_pop + post.b_pop)
    assert abs(mean(*post.prior(np.array([0]), ["k0"]))[0] - m_pop) < 0.1


def test_non_contextual_kinds_ignore_keys():
    for kind in ("uniform", "eb", "carry+eb"):
        post = PromptPosterior(PriorConfig(kind=kind))
        rng = np.random.default_rng(4)
        for _ in range(3):
            record_step(post, rng, [0.9, 0.1])
        a, b = post.prior(np.array([999, 998]), ["k0", "k1"])
        assert a[0] == a[1] == post.a_pop and b[0] == b[1] == post.b_pop
        assert post.state_dict()["keys"] == {}


def test_carry_plus_context_adds_the_prompts_own_evidence():
    post = PromptPosterior(PriorConfig(kind="carry+context"))
    rng = np.random.default_rng(5)
    for _ in range(5):
        record_step(post, rng, [0.5])
    a0, b0 = post.prior(np.array([10**6]), ["k0"])
    post.record(np.array([10**6]), np.array([0]), np.array([8]), ["k0"])  # this prompt failed 8 of 8
    post.end_step()
    a1, b1 = post.prior(np.array([10**6]), ["k0"])
    a_key, b_key = post.prior(np.array([10**6 + 1]), ["k0"])
    # its 8 fails count decay = 0.9 one step later
    assert a1[0] == pytest.approx(a_key[0]) and b1[0] == pytest.approx(b_key[0] + 0.9 * 8)
    assert mean(a1, b1)[0] < mean(a0, b0)[0] - 0.05


def test_posterior_state_round_trips():
    post = PromptPosterior(PriorConfig(kind="carry+context"))
    rng = np.random.default_rng(6)
    for _ in range(6):
        record_step(post, rng, [0.9, 0.1, 0.5])
    twin = PromptPosterior(PriorConfig(kind="carry+context"))
    twin.load_state_dict(post.state_dict())
    ids, keys = np.array([0, 5, 10**6, 10**6 + 1]), ["k0", "k1", "k2", "new"]
    for p in (post, twin):  # one more identical step on both
        p.record(np.array([1, 2]), np.array([3, 8]), np.array([8, 8]), ["k0", "k2"])
        p.end_step()
    np.testing.assert_array_equal(np.stack(post.prior(ids, keys)), np.stack(twin.prior(ids, keys)))
    assert post.state_dict() == twin.state_dict()
    # a state written before the contextual prior existed (no "keys") still loads
    old = {k: v for k, v in post.state_dict().items() if k not in ("keys", "key_prior")}
    PromptPosterior(PriorConfig(kind="context")).load_state_dict(old)


# ----- in the allocators ------------------------------------------------------------------------------
def test_sara_dps_starts_prompts_of_mixed_keys_more_often():
    ctx = keyed_run("sara+dps", "carry+context", steps=12, warm=4)
    base = keyed_run("sara+dps", None, steps=12, warm=4)  # carry+eb: no feature information
    share = ctx["started"] / ctx["started"].sum()
    share_base = base["started"] / base["started"].sum()
    # keys 0 (all pass) and 1 (all fail) give no mixed group; key 2 (rate 0.5) almost always does
    assert share[2] > 2 * max(share[0], share[1]), share
    assert share[0] + share[1] < 0.5 * (share_base[0] + share_base[1]), (share, share_base)
    assert ctx["skipped"] > 0
    # the same effective groups for fewer rollouts
    assert ctx["eff"] == base["eff"] and ctx["spent"] < 0.8 * base["spent"], (ctx["spent"], base["spent"])


def test_sara_context_skips_never_seen_prompts_of_saturated_keys():
    ctx = keyed_run("sara", "context", steps=12, warm=4)
    eb = keyed_run("sara", "eb", steps=12, warm=4)
    # saturated keys (0 and 1) get a smaller share of the rollouts; some of their prompts are skipped unprobed
    sat = (ctx["rollouts"][:2].sum() / ctx["rollouts"].sum(), eb["rollouts"][:2].sum() / eb["rollouts"].sum())
    assert sat[0] < 0.7 * sat[1], sat
    assert ctx["skipped"] > 0 and eb["skipped"] == 0
    assert ctx["eff"] == eb["eff"] and ctx["spent"] < eb["spent"]
    # context_explore keeps probing some of them: the saturated keys' priors still meet new evidence
    assert ctx["started"][:2].min() > 0


def test_context_explore_zero_probes_no_prompt_the_key_rules_out():
    run = keyed_run("sara", {"kind": "context", "context_explore": 0.0}, steps=10, warm=6)
    # all-fail key: p_eff(0, 0) under its prior is far below tau_low once it holds evidence
    assert run["started"][1] == 0, run["started"]


def test_without_source_context_every_prompt_shares_one_key():
    run = keyed_run("sara", "context", steps=6, warm=0, context=False)
    post = run["alloc"].posterior
    assert list(post.state_dict()["keys"]) == [""]
    assert post.key_weight("") > 0


def test_allocators_without_a_contextual_prior_ignore_the_context():
    for name, prior in (("sara", "eb"), ("sara+dps", None), ("dapo", None)):
        runs = [keyed_run(name, prior, steps=4, warm=0, context=c) for c in (True, False)]
        assert runs[0]["spent"] == runs[1]["spent"]
        np.testing.assert_array_equal(runs[0]["started"], runs[1]["started"])


# ----- validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize("prior,field", [
    ({"kind": "ctx"}, "prior.kind"),
    ({"kind": "context", "context_decay": 0.0}, "prior.context_decay"),
    ({"kind": "context", "context_decay": 1.5}, "prior.context_decay"),
    ({"kind": "context", "context_strength": 0}, "prior.context_strength"),
    ({"kind": "context", "context_min_prompts": -1}, "prior.context_min_prompts"),
    ({"kind": "context", "context_explore": 1.2}, "prior.context_explore"),
    ({"kind": "context", "context_explore": "a lot"}, "prior.context_explore"),
])
def test_bad_context_params_are_named(prior, field):
    for name in ("sara", "sara+dps"):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            make_allocator(name, k=8, batch_size=16, prior=prior)


def test_unknown_prior_field_names_the_closest_valid_one():
    with pytest.raises(ConfigError, match=r"sara\.prior\.context_deacy: unknown key \(did you mean 'context_decay'"):
        make_allocator("sara", k=8, batch_size=16, prior={"kind": "context", "context_deacy": 0.5})


def test_source_context_must_give_one_key_per_prompt():
    with pytest.raises(ConfigError, match="one key per prompt"):
        PromptSource(10, context=["a"] * 9)
    src = PromptSource([5, 7, 9], context=[1, 2, 2])
    assert src.has_context and src.context_keys([9, 5]) == ["2", "1"]
    assert PromptSource(3).context_keys([0, 2]) == ["", ""]
    post = PromptPosterior(PriorConfig(kind="context"))
    with pytest.raises(ValueError, match="one key per prompt"):
        post.prior(np.arange(3), ["a"])


# ----- context keys from rows ---------------------------------------------------------------------------
def test_arithmetic_rows_key_on_difficulty_and_op():
    rows = list(make_arithmetic(600, 0, seed=0, digits=(1, 2, 3))["train"])
    keys = context_keys(rows, "arithmetic")
    assert len(set(keys)) == 9
    r = rows[0]
    assert keys[0] == f"difficulty={r['difficulty']}|op={r['op']}"


def test_math_rows_key_on_source_level_and_subject():
    assert context_key({"source": "math500", "difficulty": 3, "subject": "Algebra"}, "math") == \
        "source=math500|difficulty=3|subject=algebra"
    assert context_key({"source": "math", "difficulty": 5, "type": "Geometry"}, "math") == \
        "source=math|difficulty=5|subject=geometry"
    assert context_key({"source": "gsm8k", "difficulty": 0}, "math") == "source=gsm8k|difficulty=0"
    # no feature field at all: one shared key
    assert context_key({"prompt": "x", "answer": "1"}, "math") == context_key({}, "code") == ""
