"""What Pilot-Commit, AR3PO and Reinforce-Ada promise (docs/allocators/pilot-commit.md, ar3po.md and
reinforce-ada.md), on scripted engines."""

import numpy as np
import pytest

from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
from rlvr_core.rollout import RolloutEngine
from rlvr_core.rollout.simulated import SimulatedEngine
from rlvr_core.types import Rollouts


class ScriptedEngine(RolloutEngine):
    """Rollout i of prompt q (counted over the whole run) has reward script(q, i); every rollout is 3 tokens
    long and carries a payload naming its prompt and index."""

    def __init__(self, script):
        self.script = script
        self.seen: dict[int, int] = {}

    def generate(self, requests):
        q_all, r_all, pay = [], [], []
        for q, n in requests.items():
            for _ in range(n):
                i = self.seen.get(q, 0)
                self.seen[q] = i + 1
                q_all.append(q)
                r_all.append(float(self.script(q, i)))
                pay.append({"prompt": q, "index": i})
        return Rollouts(np.array(q_all), np.array(r_all), np.full(len(q_all), 3), pay)

    def state_dict(self):
        return {"seen": dict(self.seen)}

    def load_state_dict(self, state):
        self.seen = dict(state["seen"])


def group_of(batch, q):
    return batch.rollouts.reward[batch.rollouts.prompt_id == q]


# ----------------------------------------------------------------------------------------- reinforce-ada

def test_reinforce_ada_stops_a_prompt_once_it_has_its_passes_and_fails():
    """balanced, k=8, rounds of 4: an alternating prompt has 2+2 after round 1, 4+4 after round 2, then stops;
    an all-fail prompt runs all rounds; a prompt whose first pass comes late stops as soon as it has 4 of each."""
    script = {0: lambda i: i % 2, 1: lambda i: 0, 2: lambda i: i >= 8}
    eng = ScriptedEngine(lambda q, i: script[q](i))
    alloc = make_allocator("reinforce-ada", k=8, batch_size=3, round_size=4, max_rounds=4)
    batch, st = run_allocation_step(alloc, eng, PromptSource(3, seed=0))
    assert eng.seen == {0: 8, 1: 16, 2: 12}
    assert st.rollouts == 36 and st.rounds == 4
    assert st.committed == 2 and st.abandoned == 1
    assert sorted(group_of(batch, 0).tolist()) == [0] * 4 + [1] * 4  # balanced: k // 2 of each
    assert sorted(group_of(batch, 2).tolist()) == [0] * 4 + [1] * 4  # 8 fails then 4 passes: 4 of each kept
    assert group_of(batch, 1).tolist() == [0.0] * 8  # never met its rule: k of what it has
    assert batch.effective.sum() == 2


def test_reinforce_ada_positive_rule_stops_at_the_first_pass():
    eng = ScriptedEngine(lambda q, i: i == 5 if q == 0 else 1.0)
    alloc = make_allocator("reinforce-ada", k=8, batch_size=2, round_size=4, rule="positive")
    batch, st = run_allocation_step(alloc, eng, PromptSource(2, seed=0))
    assert eng.seen == {0: 8, 1: 4}  # prompt 0 passes in its second round, prompt 1 in its first
    assert sorted(group_of(batch, 0).tolist()) == [0.0] * 7 + [1.0]
    assert batch.group_sizes().max() <= 8


def test_reinforce_ada_recovers_signal_grpo_misses_on_a_hard_population():
    """Its promise: more effective groups out of the same prompts (at a higher rollout cost), never over budget."""
    def totals(name, **kw):
        eff = rollouts = 0
        for seed in range(3):
            eng = SimulatedEngine("early", seed=seed)
            src = PromptSource(eng.pool_size, seed=seed)
            alloc = make_allocator(name, k=8, batch_size=32, seed=seed, **kw)
            for _ in range(4):
                _, st = run_allocation_step(alloc, eng, src)
                eng.update_weights()
                eff += st.effective_groups
                rollouts += st.rollouts
        return eff, rollouts
    (eff_ada, cost_ada), (eff_grpo, cost_grpo) = totals("reinforce-ada"), totals("grpo")
    assert eff_ada > eff_grpo
    assert cost_grpo <= cost_ada <= 4 * cost_grpo


# ----------------------------------------------------------------------------------------- pilot-commit

def pilot_script(q, i):
    """q % 4: 0 always fails, 1 always passes, 2 alternates, 3 passes once in four."""
    return {0: 0, 1: 1, 2: i % 2, 3: i % 4 == 0}[q % 4]


def test_pilot_commit_commits_only_prompts_whose_pilot_is_informative():
    eng = ScriptedEngine(pilot_script)
    alloc = make_allocator("pilot-commit", k=8, batch_size=4, n_pilot=4, gen_batch_size=8, max_gen_batches=1)
    batch, st = run_allocation_step(alloc, eng, PromptSource(8, seed=0))
    committed = set(np.unique(batch.rollouts.prompt_id).tolist())
    assert committed == {2, 3, 6, 7}  # pilot rates 1/2 and 1/4 lie in [0.125, 0.75]
    for q in committed:
        assert len(group_of(batch, q)) == 8 and eng.seen[q] == 8  # pilot + commit = k
    for q in (0, 1, 4, 5):
        assert eng.seen[q] == 4  # pilot only
    assert st.committed == 4 and st.extra["deferred"] == 2 and st.extra["too_easy"] == 2
    assert st.extra["evicted"] == 2 and st.rollouts == 8 * 4 + 4 * 4


def test_pilot_commit_evicts_solved_prompts_and_carries_survivors():
    eng = ScriptedEngine(pilot_script)
    src = PromptSource(8, seed=0)
    alloc = make_allocator("pilot-commit", k=8, batch_size=2, n_pilot=4, gen_batch_size=8, max_gen_batches=1)
    batch, st = run_allocation_step(alloc, eng, src)
    assert st.committed == 2 and len(alloc.survivors) == 2  # four survived, two wait for the next step
    waiting = set(alloc.survivors)
    batch2, st2 = run_allocation_step(alloc, eng, src)
    assert set(np.unique(batch2.rollouts.prompt_id).tolist()) == waiting  # committed before any new pilot
    assert st2.extra["carried"] == 2 and st2.rollouts == 2 * 4  # commit rollouts only: the pilot was paid
    assert batch2.group_sizes().tolist() == [4, 4]
    for _ in range(3):
        run_allocation_step(alloc, eng, src)
    assert eng.seen[1] == 4 and eng.seen[5] == 4  # all-pass prompts were evicted after their pilot
    assert eng.seen[0] > 4  # a deferred prompt comes back with the stream


def test_pilot_commit_drops_survivors_older_than_max_off_steps():
    eng = ScriptedEngine(lambda q, i: i % 2)
    src = PromptSource(64, seed=0)
    alloc = make_allocator("pilot-commit", k=8, batch_size=1, n_pilot=2, gen_batch_size=8, max_gen_batches=1,
                           max_off_steps=1)
    run_allocation_step(alloc, eng, src)
    born = dict(alloc.survivors)
    assert len(born) == 7
    run_allocation_step(alloc, eng, src)  # commits one survivor and pilots nothing: one is enough
    assert len(alloc.survivors) == 6 and set(alloc.survivors) < set(born)
    run_allocation_step(alloc, eng, src)  # commits one more; the rest are now two steps old
    assert alloc.survivors == {}


# ----------------------------------------------------------------------------------------- ar3po

def test_ar3po_stops_sampling_a_prompt_once_a_correct_response_appears():
    """stage_size 2: prompt 0 passes at once, prompt 1 at its 5th rollout (stage 3), prompt 2 never."""
    eng = ScriptedEngine(lambda q, i: {0: 1, 1: i == 4, 2: 0}[q])
    alloc = make_allocator("ar3po", k=8, batch_size=3, stage_size=2, max_stages=4)
    batch, st = run_allocation_step(alloc, eng, PromptSource(3, seed=0))
    assert eng.seen == {0: 2, 1: 6, 2: 8}
    assert st.rollouts == 16 and st.committed == 2 and st.abandoned == 1
    assert st.extra["reused_rollouts"] == 0  # nothing buffered yet


def test_ar3po_reuses_an_earlier_correct_completion_when_new_rollouts_all_fail():
    phase = {"step": 0}
    eng = ScriptedEngine(lambda q, i: float(phase["step"] == 0 and q == 0))
    src = PromptSource(2, seed=0)
    alloc = make_allocator("ar3po", k=8, batch_size=2, stage_size=2, max_stages=2)
    run_allocation_step(alloc, eng, src)
    assert set(alloc.buffer) == {0}
    phase["step"] = 1
    batch, st = run_allocation_step(alloc, eng, src)
    g0 = group_of(batch, 0)
    assert sorted(g0.tolist()) == [0.0] * 4 + [1.0]  # four new fails and the buffered pass
    reused = [p for p in batch.rollouts.payload if p.get("reused")]
    assert len(reused) == 1 and reused[0]["prompt"] == 0 and reused[0]["index"] < 2  # from step one
    assert st.rollouts == 8  # new rollouts only
    assert st.tokens == 9 * 3  # tokens of both
    assert st.extra["reused_rollouts"] == 1 and st.extra["reused_tokens"] == 3
    assert st.effective_groups == 1 and st.useful_rollouts == 5
    assert group_of(batch, 1).tolist() == [0.0] * 4  # nothing buffered for prompt 1


def test_ar3po_without_reuse_and_the_buffer_bound():
    eng = ScriptedEngine(lambda q, i: 1.0)
    alloc = make_allocator("ar3po", k=8, batch_size=4, stage_size=2, buffer_prompts=3)
    src = PromptSource(4, seed=0)
    run_allocation_step(alloc, eng, src)
    assert len(alloc.buffer) == 3
    off = make_allocator("ar3po", k=8, batch_size=4, stage_size=2, reuse=False)
    run_allocation_step(off, ScriptedEngine(lambda q, i: 1.0), PromptSource(4, seed=0))
    assert len(off.buffer) == 0


def test_ar3po_buffer_survives_a_state_round_trip():
    phase = {"step": 0}
    eng = ScriptedEngine(lambda q, i: float(phase["step"] == 0))
    src = PromptSource(3, seed=0)
    alloc = make_allocator("ar3po", k=8, batch_size=3, stage_size=2)
    run_allocation_step(alloc, eng, src)
    state, src_state = alloc.state_dict(), src.state_dict()
    phase["step"] = 1
    ref, ref_st = run_allocation_step(alloc, eng, src)
    alloc2 = make_allocator("ar3po", k=8, batch_size=3, stage_size=2, seed=9)
    alloc2.load_state_dict(state)
    src2 = PromptSource(3, seed=0)
    src2.load_state_dict(src_state)
    got, got_st = run_allocation_step(alloc2, eng, src2)
    assert got_st.extra["reused_rollouts"] == ref_st.extra["reused_rollouts"] == 3
    np.testing.assert_array_equal(got.rollouts.reward, ref.rollouts.reward)
    assert [p.get("reused", False) for p in got.rollouts.payload] == \
        [p.get("reused", False) for p in ref.rollouts.payload]


@pytest.mark.parametrize("name", ["pilot-commit", "ar3po", "reinforce-ada"])
def test_published_baselines_run_on_every_simulated_scenario(name):
    for scenario in ("early", "late", "ushape", "drift"):
        eng = SimulatedEngine(scenario, seed=0)
        src = PromptSource(eng.pool_size, seed=0)
        alloc = make_allocator(name, k=8, batch_size=16, seed=0)
        for _ in range(3):
            batch, st = run_allocation_step(alloc, eng, src)
            eng.update_weights()
            assert 0 < st.rollouts <= alloc.max_rollouts_per_step
            assert batch.num_groups > 0
