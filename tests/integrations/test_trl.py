"""AllocatedGRPOTrainer: rlvr_core's allocators inside TRL 1.16's GRPOTrainer, on CPU with a tiny local model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from rlvr_core.errors import ConfigError  # noqa: E402
from rlvr_core.integrations.trl import STATE_DIR, AllocatedGRPOTrainer  # noqa: E402
from rlvr_core.registry import UnknownNameError  # noqa: E402
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("allocation_seconds", "generate_seconds", "verify_seconds", "step")
PASS = {r["id"]: r["pass_rate"] for r in arithmetic_rows(48)}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory.mktemp("trl") / "chat")


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return Dataset.from_list(arithmetic_rows(48))


def spy_batches(trainer) -> list[dict]:
    """Capture what TRL's loss receives (the output of _generate_and_score_completions)."""
    seen: list[dict] = []
    orig = trainer._generate_and_score_completions

    def spy(inputs):
        out = orig(inputs)
        seen.append({k: (v.detach().cpu().clone() if hasattr(v, "detach") else v) for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = spy
    return seen


def by_step(rows: list[tuple[int, str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for step, q in rows:
        out.setdefault(step, []).append(q)
    return out


def test_import_rlvr_core_does_not_import_trl():
    code = ("import sys, rlvr_core, rlvr_core.allocation, rlvr_core.grpo.advantages, rlvr_core.integrations; "
            "bad = [m for m in sys.modules if m == 'trl' or m.startswith('trl.')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("allocator,params", [("grpo", {}), ("dapo", {}), ("sara", {}), ("vigor", {})])
def test_allocators_train_and_log_their_counters(tmp_path, model_dir, dataset, allocator, params):
    reward = ScriptedReward()
    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[reward], args=grpo_config(tmp_path, max_steps=3),
                              train_dataset=dataset, allocator=allocator, allocator_params=params)
    batches = spy_batches(tr)
    tr.train()
    hist = tr.allocation_history
    assert len(hist) == 3 and len(batches) == 3
    logged = [rec for rec in tr.state.log_history if "allocation/rollouts" in rec]
    assert len(logged) == 3
    scored = by_step(reward.rows)
    B = 2  # generation_batch_size 8 / num_generations 4
    for step, (h, log, out) in enumerate(zip(hist, logged, batches)):
        # what TRL logged is the allocator's own StepStats
        for key in ("rollouts", "tokens", "rounds", "prompts", "groups", "effective_groups", "useful_rollouts",
                    "committed", "abandoned", "skipped", "hit_cap", "padding_rows"):
            assert log[f"allocation/{key}"] == h[key], (step, key)
        # every rollout the allocator counted was scored once by the trainer's reward function
        ids = scored[step]
        assert len(ids) == h["rollouts"] + h["padding_rollouts"]
        mixed = {q for q in set(ids) if PASS[q] == 0.5}
        if allocator in ("grpo", "vigor"):  # every prompt of the step is a group
            assert h["groups"] == h["prompts"] and h["effective_groups"] == len(mixed)
        else:  # dapo, sara: the first B mixed prompts make the batch
            assert h["effective_groups"] == min(B, len(mixed)) == h["groups"]
        # the update sees exactly the allocator's rows; only effective groups carry advantages
        batch_rows = h["rollouts"] if allocator in ("grpo", "vigor") else h["useful_rollouts"]
        real = out["completion_mask"].sum(1) > 0
        assert int(real.sum()) == batch_rows
        assert len(out["advantages"]) == batch_rows + h["padding_rows"]
        assert int((out["advantages"] != 0).sum()) == h["useful_rollouts"]
    if allocator == "grpo":
        assert all(h["rollouts"] == 8 and h["rounds"] == 1 for h in hist)
    if allocator == "dapo":
        assert all(h["rollouts"] % 8 == 0 for h in hist)
    if allocator == "sara":
        assert sum(h["abandoned"] for h in hist) > 0 and all(h["committed"] == 2 for h in hist)
    if allocator == "vigor":
        assert max(h["rounds"] for h in hist) > 1 and all(h["rollouts"] <= 8 for h in hist)


def test_pilot_commit_trains_on_the_prompts_its_pilot_found_informative(tmp_path, model_dir, dataset):
    """k = 4, so pilots of 2: a 0.5 prompt's pilot is [1, 0] and survives; 0 prompts are deferred, 1 prompts
    skipped and evicted (never drawn again); survivors beyond the 2 a step needs are committed in the next."""
    reward = ScriptedReward()
    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[reward], args=grpo_config(tmp_path, max_steps=3),
                              train_dataset=dataset, allocator="pilot-commit")
    batches = spy_batches(tr)
    tr.train()
    hist, scored = tr.allocation_history, by_step(reward.rows)
    assert len(hist) == 3
    evicted: set[str] = set()
    for step, (h, out) in enumerate(zip(hist, batches)):
        counts = Counter(scored[step])
        assert not evicted & set(counts)  # an evicted prompt is never piloted again
        evicted |= {q for q in counts if PASS[q] == 1.0}
        # only informative prompts train: every committed group is a 0.5 prompt's, hence mixed
        assert h["committed"] == 2 and h["groups"] == 2 and h["effective_groups"] == 2
        own = {q for q, n in counts.items() if n == 4}  # pilot 2 + commit 2 in this step
        assert all(PASS[q] == 0.5 for q in own) and len(own) + h["carried"] == 2
        assert all(n == 2 for q, n in counts.items() if PASS[q] != 0.5)  # the others: pilot only
        # a survivor carried from an earlier step trains on its commit (2) only
        assert int((out["completion_mask"].sum(1) > 0).sum()) == h["useful_rollouts"] == 4 * len(own) + 2 * h["carried"]
    assert evicted and sum(h["carried"] for h in hist) > 0


def test_reinforce_ada_samples_until_a_pass_and_a_fail(tmp_path, model_dir, dataset):
    """k = 4, rounds of 4: a 0.5 prompt has 2 passes and 2 fails after one round and stops; a 0 or 1 prompt
    never meets the rule and runs all 4 rounds; every prompt trains on a group of 4."""
    reward = ScriptedReward()
    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[reward], args=grpo_config(tmp_path, max_steps=2),
                              train_dataset=dataset, allocator="reinforce-ada")
    batches = spy_batches(tr)
    tr.train()
    hist, scored = tr.allocation_history, by_step(reward.rows)
    for step, (h, out) in enumerate(zip(hist, batches)):
        counts = Counter(scored[step])
        assert len(counts) == 2 and h["groups"] == 2
        assert all(n == (4 if PASS[q] == 0.5 else 16) for q, n in counts.items())
        assert h["effective_groups"] == sum(PASS[q] == 0.5 for q in counts)
        assert int((out["completion_mask"].sum(1) > 0).sum()) == 8


@pytest.mark.parametrize("allocator", ["knapsack-rl", "vip", "mopps", "cures"])
def test_value_baselines_train_inside_trl(tmp_path, model_dir, dataset, allocator):
    """The value-based baselines (docs/allocators/knapsack-rl.md, vip.md, mopps.md, cures.md) at k = 4, B = 2: one
    round of B x k rollouts a step, every prompt one group, and TRL's update sees exactly those rows; mopps keeps 2 of
    its 16 candidates."""
    reward = ScriptedReward()
    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[reward], args=grpo_config(tmp_path, max_steps=2),
                              train_dataset=dataset, allocator=allocator)
    batches = spy_batches(tr)
    tr.train()
    hist, scored = tr.allocation_history, by_step(reward.rows)
    assert len(hist) == 2
    for step, (h, out) in enumerate(zip(hist, batches)):
        assert h["rollouts"] == 8 and h["rounds"] == 1 and h["groups"] == h["prompts"] == 2
        assert len(scored[step]) == 8 + h["padding_rollouts"]
        assert int((out["completion_mask"].sum(1) > 0).sum()) == 8
        assert h["skipped"] == (14 if allocator == "mopps" else 0)


def test_ar3po_reuse_is_refused_inside_trl(tmp_path, dataset):
    with pytest.raises(ConfigError, match="reuse"):
        AllocatedGRPOTrainer(model="unused", args=grpo_config(tmp_path), train_dataset=dataset, allocator="ar3po")
    with pytest.raises(ConfigError, match="valor's response reuse"):
        AllocatedGRPOTrainer(model="unused", args=grpo_config(tmp_path), train_dataset=dataset, allocator="valor",
                             allocator_params={"reuse": True})


def test_valor_trains_inside_trl(tmp_path, model_dir, dataset):
    """VALOR (docs/allocators/valor.md) at k = 4, B = 2: a budget of 8, pilots of 2; a mixed pilot grows to 4;
    every prompt is a group and TRL's update sees exactly its rows."""
    reward = ScriptedReward()
    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[reward], args=grpo_config(tmp_path, max_steps=2),
                              train_dataset=dataset, allocator="valor")
    batches = spy_batches(tr)
    tr.train()
    hist, scored = tr.allocation_history, by_step(reward.rows)
    assert len(hist) == 2
    for step, (h, out) in enumerate(zip(hist, batches)):
        counts = Counter(scored[step])
        assert h["rollouts"] <= 8 and h["groups"] == h["prompts"] and h["rounds"] >= 2
        assert all(n == 4 for q, n in counts.items() if PASS[q] == 0.5)  # a mixed pilot goes on
        assert h["effective_groups"] == sum(PASS[q] == 0.5 for q in counts)
        assert int((out["completion_mask"].sum(1) > 0).sum()) == h["rollouts"]


def test_grpo_allocator_matches_plain_grpotrainer(tmp_path, model_dir, dataset):
    runs = {}
    for name in ("plain", "grpo"):
        reward = ScriptedReward()
        args = grpo_config(tmp_path / name, max_steps=3)
        if name == "plain":
            tr = GRPOTrainer(model=model_dir, reward_funcs=[reward], args=args, train_dataset=dataset)
        else:
            tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[reward], args=args, train_dataset=dataset,
                                      allocator="grpo")
        batches = spy_batches(tr)
        tr.train()
        runs[name] = (by_step(reward.rows), batches)
    (plain_ids, plain_out), (ours_ids, ours_out) = runs["plain"], runs["grpo"]
    assert set(plain_ids) == set(ours_ids) == {0, 1, 2}
    for step in plain_ids:
        assert Counter(plain_ids[step]) == Counter(ours_ids[step])  # same prompts, same multiplicities
        assert all(n == 4 for n in Counter(ours_ids[step]).values())
    for a, b in zip(plain_out, ours_out):
        np.testing.assert_allclose(np.sort(a["advantages"].numpy()), np.sort(b["advantages"].numpy()), atol=1e-6)
        assert a["completion_ids"].shape[0] == b["completion_ids"].shape[0] == 8


def _never(*a, **k):
    raise AssertionError("the reward function ran: the error came after generation")


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(allocator="sarah"), UnknownNameError, ["unknown allocator 'sarah'", "did you mean 'sara'", "valid names",
                                                 "dapo", "grpo", "vigor"]),
    (dict(allocator="sara", allocator_params={"k": 8}), ConfigError, ["num_generations=4", "num_generations=8"]),
    (dict(allocator="dapo", allocator_params={"batch_size": 3}), ConfigError,
     ["generation_batch_size=8", "per_device_train_batch_size", "3 x 4"]),
    (dict(allocator="sara", allocator_params={"tau_lo": 0.3}), ConfigError, ["sara.tau_lo", "did you mean 'tau_low'"]),
    (dict(allocator="vigor", allocator_params={"m0": 1}), ConfigError, ["vigor.m0"]),
])
def test_bad_input_fails_before_any_generation(tmp_path, dataset, kwargs, error, words):
    # a model path that does not exist: the check must come before TRL loads anything
    with pytest.raises(error) as e:
        AllocatedGRPOTrainer(model=str(tmp_path / "no-model"), reward_funcs=[_never], args=grpo_config(tmp_path),
                             train_dataset=dataset, **kwargs)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_dataset_without_prompt_column_fails_first(tmp_path):
    ds = Dataset.from_list([{"question": "1+1", "answer": "2"}] * 8)
    with pytest.raises(ValueError, match=r"no 'prompt' column \(columns: \['question', 'answer'\]\).*rename_column"):
        AllocatedGRPOTrainer(model=str(tmp_path / "no-model"), reward_funcs=[_never], args=grpo_config(tmp_path),
                             train_dataset=ds, allocator="sara")


def _strip(h):
    return {k: v for k, v in h.items() if k not in TIMING}


def test_resume_from_checkpoint_restores_allocator_state(tmp_path, model_dir, dataset):
    def make(out, **over):
        args = grpo_config(out, **{"max_steps": 4, "save_strategy": "steps", "save_steps": 2, **over})
        return AllocatedGRPOTrainer(model=model_dir, reward_funcs=[ScriptedReward()], args=args,
                                    train_dataset=dataset, allocator="sara")

    straight = make(tmp_path / "a")
    straight.train()
    ckpt = tmp_path / "a" / "checkpoint-2"
    assert (ckpt / STATE_DIR / "manifest.json").is_file()
    resumed = make(tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert len(straight.allocation_history) == len(resumed.allocation_history) == 4
    assert [_strip(h) for h in resumed.allocation_history] == [_strip(h) for h in straight.allocation_history]
    a, b = straight.allocator.state_dict(), resumed.allocator.state_dict()
    assert a["rng"] == b["rng"]
    pa, pb = a["extra"]["posterior"], b["extra"]["posterior"]
    assert pa.keys() == pb.keys()
    assert straight.prompt_source.state_dict()["pos"] == resumed.prompt_source.state_dict()["pos"]
    # a fresh trainer that did not resume would start the stream over, so the check above can fail
    fresh = make(tmp_path / "c", max_steps=2)
    fresh.train()
    assert [_strip(h) for h in fresh.allocation_history] != [_strip(h) for h in straight.allocation_history[2:]]


@pytest.mark.slow  # ~25 s of CPU, 2-3 min wall on a busy 2-core machine (two interpreters load torch + TRL)
def test_two_process_gloo_run_is_consistent(tmp_path, model_dir):
    # accelerate's multi-process launcher (torchrun underneath); GRPOConfig(use_cpu=True) makes it MULTI_CPU on gloo
    # (`accelerate launch --cpu` would start a single process)
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", "--num_processes", "2", "--num_machines", "1", "--multi_gpu", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1", "--main_process_port", "29517",
           str(ROOT / "tests" / "integrations" / "trl_dist_run.py"), model_dir, str(tmp_path), "sara", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert all(x["world"] == 2 and x["backend"] == "gloo" for x in ranks)
    h0, h1 = ([_strip(h) for h in x["history"]] for x in ranks)
    assert h0 == h1 and len(h0) == 2  # one global decision, replicated
    per_step = [Counter(s for s, _ in x["scored"]) for x in ranks]
    for step, h in enumerate(h0):
        # each rank scored its share of every round; the shares add up to the allocator's rollouts
        assert per_step[0][step] + per_step[1][step] == h["rollouts"] + h["padding_rollouts"]
        assert per_step[0][step] == per_step[1][step]  # equal shares (TRL's gathers need them)
        assert h["committed"] == 2 and h["effective_groups"] == 2
    assert ranks[0]["logged"][0]["allocation/rollouts"] == h0[0]["rollouts"]


def test_example_quick_mode_runs():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_sara.py"), "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "sara inside TRL: per step" in r.stdout
    total = [line for line in r.stdout.splitlines() if line.startswith("total: ")]
    assert total and int(total[0].split()[1]) > 0
