"""The reward contract every allocator keeps (docs/design.md §3.2): finite rewards; pass/fail (1 or 0) unless
``reward_threshold`` says what a pass is; anything else refused where rewards enter, naming the prompt and value."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rlvr_core.allocation import ALLOCATORS, PromptSource, make_allocator, run_allocation_step
from rlvr_core.allocation.base import PASS_FAIL, SCALAR
from rlvr_core.errors import ConfigError, RewardError
from rlvr_core.rollout.base import RolloutEngine
from rlvr_core.rollout.simulated import SimulatedEngine
from rlvr_core.types import Rollouts

NAMES = ALLOCATORS.names()
SCALAR_NAMES = {"grpo", "dapo", "vigor", "pods"}  # read only the rewards' spread
AR3PO = {"reuse": False}  # reuse adds rows that were not generated this step; compared separately below
# (how a pass/fail reward r becomes the scalar reward, the threshold that splits it back into passes)
MAPS = {"-1/+1": (lambda r: 2.0 * r - 1.0, 0.0), "0/2": (lambda r: 2.0 * r, 1.0),
        "0.25/0.75": (lambda r: 0.25 + 0.5 * r, 0.5)}


class MappedEngine(RolloutEngine):
    """The simulated engine's pass/fail rewards put through ``f`` (an engine or a verifier with other rewards)."""

    def __init__(self, scenario: str, f, seed: int = 0, pool_size: int | None = 600) -> None:
        self.inner, self.f = SimulatedEngine(scenario, seed=seed, pool_size=pool_size), f
        self.pool_size = self.inner.pool_size

    def generate(self, requests):
        r = self.inner.generate(requests)
        return Rollouts(r.prompt_id, self.f(r.reward), r.tokens, r.payload)

    def update_weights(self, state=None) -> None:
        self.inner.update_weights()


def run(name: str, f, steps: int = 3, scenario: str = "ushape", pool_size: int = 600, **kw):
    """(per-step StepStats dicts without timings, per-step batch layout) of ``steps`` steps."""
    eng = MappedEngine(scenario, f, pool_size=pool_size)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator(name, k=8, batch_size=16, seed=0, **({**AR3PO, **kw} if name == "ar3po" else kw))
    stats, layout = [], []
    for _ in range(steps):
        batch, st = run_allocation_step(alloc, eng, src)
        eng.update_weights()
        stats.append({k: v for k, v in st.as_dict().items() if not k.endswith("_seconds")})
        layout.append((batch.rollouts.prompt_id.tolist(), batch.group_id.tolist(), batch.effective.tolist()))
    return stats, layout


def identity(r):
    return r


def test_every_allocator_states_its_contract():
    for name in NAMES:
        assert ALLOCATORS.get(name).reward_contract == (SCALAR if name in SCALAR_NAMES else PASS_FAIL), name


def test_scaled_rewards_make_sara_commit_groups_that_are_not_effective_no_more():
    """The measurement: rewards 0.25/0.75 (uniform pool, k=8, 32 groups a step, 5 steps) made SARA commit 160
    groups of which 121 were effective (a group of four 0.25s sums to one "pass"). Now they are refused unless
    reward_threshold says what a pass is; with it, every committed group is effective, as with 0/1 rewards."""
    f, t = MAPS["0.25/0.75"]

    def totals(**kw):
        eng = MappedEngine("uniform", f if kw else identity, pool_size=None)
        src = PromptSource(eng.pool_size, seed=0)
        alloc = make_allocator("sara", k=8, batch_size=32, seed=0, **kw)
        sts = [run_allocation_step(alloc, eng, src)[1] for _ in range(5)]
        return sum(s.committed for s in sts), sum(s.effective_groups for s in sts)

    with pytest.raises(RewardError, match=r"sara: reward 0\.[27]5 of prompt \d+ .*not pass/fail.*reward_threshold"):
        run("sara", f)
    committed, effective = totals(reward_threshold=t)
    assert committed == effective == 160
    assert (committed, effective) == totals()  # the same decisions as on the 0/1 rewards


@pytest.mark.parametrize("kind", list(MAPS))
@pytest.mark.parametrize("name", sorted(set(NAMES) - SCALAR_NAMES))
def test_allocators_that_read_passes_refuse_other_rewards_until_a_threshold_splits_them(name, kind):
    """-1/+1 and 0/2 rewards raised ``p_effective needs 0 <= s <= n <= k`` inside SARA (and were miscounted by
    pilot-commit and greso); now the first such reward is refused, naming the allocator, the prompt, the value
    and the fix; with the threshold that splits them into the same passes, every decision is the 0/1 run's."""
    f, t = MAPS[kind]
    with pytest.raises(RewardError) as e:
        run(name, f, steps=1)
    msg = str(e.value)
    assert f"{name}: reward " in msg and "of prompt " in msg and "round 1" in msg and "reward_threshold" in msg
    assert e.value.value in (f(0.0), f(1.0)) and e.value.value not in (0.0, 1.0)
    assert run(name, f, reward_threshold=t) == run(name, identity)


@pytest.mark.parametrize("kind", list(MAPS))
@pytest.mark.parametrize("name", sorted(SCALAR_NAMES))
def test_allocators_that_read_the_spread_take_any_finite_reward_with_or_without_a_threshold(name, kind):
    f, t = MAPS[kind]
    base = run(name, identity)
    assert run(name, f) == base
    assert run(name, f, reward_threshold=t) == base


def test_ar3po_reuse_counts_the_same_passes_under_a_threshold():
    f, t = MAPS["-1/+1"]
    a = run("ar3po", f, steps=6, scenario="uniform", pool_size=24, reuse=True, reward_threshold=t)
    assert a == run("ar3po", identity, steps=6, scenario="uniform", pool_size=24, reuse=True)
    assert sum(s["reused_rollouts"] for s in a[0]) > 0


class NaNEngine(SimulatedEngine):
    """One reward in ``every`` is NaN (a verifier that could not score), seeded by the row count so far."""

    def __init__(self, *a, every: int = 20, **kw) -> None:
        super().__init__(*a, **kw)
        self.every, self.rows = every, 0

    def generate(self, requests):
        r = super().generate(requests)
        bad = np.random.default_rng(self.rows).random(len(r)) < 1.0 / self.every
        self.rows += len(r)
        return Rollouts(r.prompt_id, np.where(bad, np.nan, r.reward), r.tokens)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_nan_is_refused_by_every_allocator_and_nothing_of_the_round_is_kept(name, threshold):
    """The measurement: NaN rewards crashed SARA (``cannot convert float NaN to integer``) while VIGOR trained on
    (125 groups in 5 steps, the NaN groups silently not effective). Now every allocator refuses the first NaN,
    under either contract, and its ledger holds nothing of that round."""
    eng = NaNEngine("uniform", seed=0, pool_size=600)
    src = PromptSource(eng.pool_size, seed=0)
    alloc = make_allocator(name, k=8, batch_size=16, seed=0, reward_threshold=threshold,
                           **(AR3PO if name == "ar3po" else {}))
    alloc.start_step(src)
    ro = eng.generate(alloc.propose())
    assert np.isnan(ro.reward).any()
    want = rf"^{re.escape(name)}: reward nan of prompt \d+ \(row \d+ of round 1 .*not a finite"
    with pytest.raises(RewardError, match=want):
        alloc.observe(ro)
    assert alloc.ledger.total_rollouts == 0 and alloc.ledger.rounds == 1


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_infinite_rewards_are_refused_too(value):
    alloc = make_allocator("vigor", k=8, batch_size=4, seed=0)
    alloc.start_step(PromptSource(50, seed=0))
    req = alloc.propose()
    q = next(iter(req))
    n = sum(req.values())
    reward = np.zeros(n)
    reward[3] = value
    ids = np.repeat(list(req), list(req.values()))
    with pytest.raises(RewardError) as e:
        alloc.observe(Rollouts(ids, reward, np.ones(n, np.int64)))
    assert e.value.row == 3 and e.value.prompt == int(ids[3]) and e.value.value == value and q in req


def test_the_training_loop_names_the_step():
    eng = NaNEngine("uniform", seed=0, pool_size=600)
    alloc = make_allocator("sara", k=8, batch_size=16, seed=0)
    with pytest.raises(RewardError, match=r"^step 7: sara: reward nan of prompt \d+"):
        run_allocation_step(alloc, eng, PromptSource(eng.pool_size, seed=0), step=7)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.5", True])
def test_a_threshold_that_is_not_a_number_is_refused(bad):
    with pytest.raises(ConfigError, match=r"^sara\.reward_threshold: got .*(give a number|need a number or null)"):
        make_allocator("sara", reward_threshold=bad)


@pytest.mark.parametrize("name", ["ar3po", "reinforce-ada"])
def test_the_old_pass_threshold_key_names_its_replacement(name):
    with pytest.raises(ConfigError, match=rf"^{name}\.pass_threshold: replaced by reward_threshold"):
        make_allocator(name, pass_threshold=0.5)
