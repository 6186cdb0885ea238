"""Cases that run inside .venv-verl (verl 0.9.1, TransferQueue 0.1.11, Ray, CPU); tests/integrations/test_verl.py
runs them with ``.venv-verl/bin/python -m pytest``. Not collected by the main suite (no ``test_`` prefix).

What is real and what stands in:
- real: a local Ray instance and TransferQueue (controller and one SimpleStorage unit, as verl's trainer starts
  them); ``PPOTrainer._build_replay_buffer``, ``._submit_batch_to_rollout``, ``._add_prompts_to_generate`` and
  ``._compute_advantage`` (verl's functions, called on a stand-in trainer object that holds only the
  attributes they read); ``AgentLoopWorkerTQ.generate_sequences`` and ``._run_prompt`` (the class inside
  verl's Ray actor, run in this process on an event loop thread); ``collate_fn``; ``KVBatchMeta``.
- stand-in: the agent loop itself (``_run_agent_loop``: no model, no LLM server, no reward worker). It writes
  one trajectory per session into TransferQueue with the fields and tags ``_agent_loop_postprocess`` writes
  that the sampler and the advantage read (key ``{uid}_{session}_0``, ``rm_scores`` with the reward on the
  last token, ``response_mask``, ``uid``, ``response_len``), and a reward drawn from the prompt's pass rate.
"""

from __future__ import annotations

import asyncio
import threading
import zlib

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from rlvr_core.grpo.advantages import grpo_advantages
from rlvr_core.integrations import verl as rv

POOL = 40
K = 4
PASS = [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.5]  # pass rate of prompt q: PASS[q % 8]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    tq.close()
    ray.shutdown()


class FakeWorker(AgentLoopWorkerTQ.__ray_metadata__.modified_class):
    """verl's AgentLoopWorkerTQ with the agent loop replaced (see the module docstring); __init__ skipped."""

    def __init__(self, config):  # noqa: D107 - the real one starts LLM server clients
        self.config = config
        self.background_tasks = set()
        self.sessions: dict[str, list[int]] = {}

    async def _run_agent_loop(self, sampling_params, trajectory, trace=False, session_id=0, **kw):
        uid, q = kw["uid"], int(kw["index"])
        self.sessions.setdefault(uid, []).append(session_id)
        seed = zlib.crc32(f"{uid}:{session_id}".encode())
        reward = float(np.random.default_rng(seed).random() < PASS[q % len(PASS)])
        length = 3 + (seed % 4)
        scores = torch.zeros(length)
        scores[-1] = reward
        fields = TensorDict({
            "rm_scores": torch.nested.nested_tensor([scores], layout=torch.jagged),
            "response_mask": torch.nested.nested_tensor([torch.ones(length, dtype=torch.int64)],
                                                        layout=torch.jagged),
            "uid": NonTensorStack(uid),
        }, batch_size=[1])
        tag = {"status": "success", "prompt_len": 2, "response_len": length, "seq_len": 2 + length,
               "global_steps": kw["global_steps"]}
        await tq.async_kv_batch_put(keys=[f"{uid}_{session_id}_0"], fields=fields, tags=[tag], partition_id="train")


class FakeManager:
    """AgentLoopManagerTQ.generate_sequences without Ray actors: the worker's real generate_sequences, on a loop."""

    def __init__(self, worker, loop):
        self.worker, self.loop = worker, loop

    def generate_sequences(self, batch):
        asyncio.run_coroutine_threadsafe(self.worker.generate_sequences(batch), self.loop).result()


class StandInTrainer:
    """The attributes of verl's PPOTrainer that the methods borrowed below read."""

    _build_replay_buffer = PPOTrainer._build_replay_buffer
    _submit_batch_to_rollout = PPOTrainer._submit_batch_to_rollout
    _add_prompts_to_generate = PPOTrainer._add_prompts_to_generate
    _compute_advantage = PPOTrainer._compute_advantage
    prepare_step = PPOTrainer.prepare_step

    def __init__(self, loop, allocator, params, tmp_path):
        self.config = OmegaConf.create({
            "trainer": {"v1": {"trainer_mode": "sync", "sampler": {
                "max_off_policy_threshold": None, "max_off_policy_strategy": "drop",
                "custom_sampler": {"path": "pkg://rlvr_core.integrations.verl", "name": "AllocatorReplayBuffer"},
                "sampler_kwargs": {"allocator": allocator, "allocator_params": params}}},
                "default_local_dir": str(tmp_path), "resume_mode": "auto"},
            "data": {"train_batch_size": 4, "seed": 7},
            "actor_rollout_ref": {"rollout": {"n": K, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                              "calculate_log_probs": False, "val_kwargs": {"n": 1},
                                              "agent": {"default_agent_loop": "single_turn_agent"}}},
            "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False, "gamma": 1.0, "lam": 1.0,
                          "norm_adv_by_std_in_grpo": True},
        })
        self.trainer_mode = "sync"
        self.global_steps = 1
        self.train_dataset = [{"raw_prompt": [{"role": "user", "content": f"q{q}"}], "index": q,
                               "data_source": "toy"} for q in range(POOL)]
        self.worker = FakeWorker(self.config)
        self.agent_loop_manager = FakeManager(self.worker, loop)
        self.replay_buffer = self._build_replay_buffer()
        self.replay_buffer.poll_interval = 0.05


def _advantages(trainer, batch):
    """verl's PPOTrainer._compute_advantage on the batch; the per-row advantage (first response token)."""
    trainer._compute_advantage(batch, metrics={})
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages", "rm_scores", "uid"])
    adv = np.array([float(a[0]) for a in data["advantages"]])
    reward = np.array([float(r.sum()) for r in data["rm_scores"]])
    return adv, reward, [str(u) for u in data["uid"]]


def _clear_train():
    keys = list((tq.kv_list("train") or {}).get("train", {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id="train")


@pytest.mark.parametrize("allocator,params", [("grpo", {}), ("sara", {}), ("dapo", {}), ("vigor", {})])
def test_step_through_verl(cluster, tmp_path, allocator, params):
    """verl loads the sampler from its config; a step runs the allocator's rounds through verl's dispatch and
    worker; the sample is a KVBatchMeta of the allocator's groups; verl's advantages equal rlvr_core's."""
    _clear_train()
    tr = StandInTrainer(cluster, allocator, params, tmp_path)
    buf = tr.replay_buffer
    assert type(buf).__name__ == "AllocatorReplayBuffer" and buf.trainer is tr
    assert tr.prepare_step() == {}  # the trainer's own per-step dispatch is off
    batch, metrics = buf.sample(global_steps=1, partition_id="train", batch_size=4)
    assert type(batch).__name__ == "KVBatchMeta" and batch.partition_id == "train"
    assert len(batch.keys) == len(batch.tags) <= metrics["allocation/rollouts"]
    assert metrics["allocation/groups"] >= 1 and "allocation/effective_groups" in metrics
    # every session verl's worker ran came from a __rollout_n__ the allocator asked for
    asked = sum(len(s) for s in tr.worker.sessions.values())
    assert asked == metrics["allocation/rollouts"]
    # what is left in TransferQueue is exactly the batch (prompt entries and unused rollouts cleared)
    assert set((tq.kv_list("train") or {}).get("train", {})) == set(batch.keys)
    adv, reward, uid = _advantages(tr, batch)
    groups = {u: i for i, u in enumerate(dict.fromkeys(uid))}
    gid = np.array([groups[u] for u in uid])
    sizes = np.bincount(gid)
    assert len(groups) == metrics["allocation/groups"]
    ours, _ = grpo_advantages(reward, gid)
    multi = sizes[gid] > 1
    np.testing.assert_allclose(adv[multi], ours[multi], atol=1e-5)
    # a group of one: verl's compute_grpo_outcome_advantage uses mean 0, std 1 (advantage = reward);
    # rlvr_core gives 0 (no signal). Recorded, not hidden.
    np.testing.assert_allclose(adv[~multi], reward[~multi] / (1 + 1e-6), atol=1e-6)
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_sara_regroups_across_rounds(cluster, tmp_path):
    """SARA's committed groups span rounds (a pilot, then the rest up to k): one uid per group after sampling."""
    _clear_train()
    tr = StandInTrainer(cluster, "sara", {}, tmp_path)
    batch, metrics = tr.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    assert metrics["allocation/rounds"] >= 2
    _, _, uid = _advantages(tr, batch)
    dispatch = [k.split("_")[0] for k in batch.keys]
    assert any(u != d for u, d in zip(uid, dispatch)), "no group spanned two dispatches: nothing regrouped"
    sizes = np.unique(uid, return_counts=True)[1]
    assert (sizes == K).all(), sizes  # sara trains on committed groups of k
    tq.kv_clear(keys=batch.keys, partition_id="train")


def test_rollout_n_read_by_verl_worker(cluster, tmp_path):
    """__rollout_n__ per prompt, read back by verl's AgentLoopWorkerTQ._run_prompt (sessions per uid)."""
    _clear_train()
    tr = StandInTrainer(cluster, "grpo", {}, tmp_path)
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    rows = collate_fn([tr.train_dataset[q] for q in (3, 5, 8)])
    rows["uid"] = np.array(["a1", "b2", "c3"], dtype=object)
    batch = tu.get_tensordict(rows)
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    rv.set_rollout_n(batch, [1, 3, 6])
    tr._submit_batch_to_rollout(batch)
    import time

    for _ in range(200):
        tags = (tq.kv_list("train") or {}).get("train", {})
        if all(tags.get(u, {}).get("status") == "finished" for u in ("a1", "b2", "c3")):
            break
        time.sleep(0.05)
    assert {u: sorted(s) for u, s in tr.worker.sessions.items()} == {
        "a1": [0], "b2": [0, 1, 2], "c3": [0, 1, 2, 3, 4, 5]}
    with pytest.raises(ValueError, match="counts"):
        rv.set_rollout_n(batch, [1, 2])
    _clear_train()


def test_checkpoint_round_trip(cluster, tmp_path):
    """verl's checkpoint hook writes allocator_state/; a resumed buffer makes the uninterrupted run's next step."""
    _clear_train()
    a = StandInTrainer(cluster, "sara", {}, tmp_path / "a")
    b1, _ = a.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    tq.kv_clear(keys=b1.keys, partition_id="train")
    callback = rv.AllocatorCheckpointCallback(config=a.config)
    ckpt = tmp_path / "a" / "global_step_1"
    callback.on_save(trainer=a, global_step=1, checkpoint_dir=str(ckpt))
    assert sorted(p.name for p in (ckpt / rv.STATE_DIR).iterdir()) == [
        "manifest.json", "state.json", "tensors.safetensors"]
    state = a.replay_buffer.allocation_state()
    # a fresh trainer on the same checkpoint root resumes at step 2 from global_step_1/allocator_state
    b = StandInTrainer(cluster, "sara", {}, tmp_path / "a")
    b.replay_buffer._ensure_allocator(4)
    b.replay_buffer._maybe_resume(2)
    got = b.replay_buffer.allocation_state()
    assert got["source"]["pos"] == state["source"]["pos"] and got["totals"] == state["totals"]
    assert got["history"] == state["history"]
    np.testing.assert_array_equal(got["source"]["order"], state["source"]["order"])
    # the next step's prompts are the same for the resumed and the uninterrupted buffer
    ra = a.replay_buffer.prompt_source.take(6).tolist()
    rb = b.replay_buffer.prompt_source.take(6).tolist()
    assert ra == rb
    # a checkpoint folder without allocator state is refused
    (tmp_path / "c" / "global_step_1").mkdir(parents=True)
    c = StandInTrainer(cluster, "sara", {}, tmp_path / "c")
    c.replay_buffer._ensure_allocator(4)
    with pytest.raises(FileNotFoundError, match="no allocator state"):
        c.replay_buffer._maybe_resume(2)
    # another allocator's state is refused, naming the field
    d = StandInTrainer(cluster, "dapo", {}, tmp_path / "a")
    d.replay_buffer._ensure_allocator(4)
    with pytest.raises(ValueError, match="field 'allocator'"):
        d.replay_buffer._maybe_resume(2)


def test_resume_reads_verls_folder_and_refuses_other_parameters(cluster, tmp_path):
    """resume_mode=resume_path outside default_local_dir restores that folder's state; a folder without one, or
    other allocator_params, is refused at the first sample, before anything is dispatched, naming both."""
    from rlvr_core.errors import ConfigError

    _clear_train()
    a = StandInTrainer(cluster, "sara", {}, tmp_path / "a")
    b1, _ = a.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    tq.kv_clear(keys=b1.keys, partition_id="train")
    ckpt = tmp_path / "elsewhere" / "global_step_1"
    rv.AllocatorCheckpointCallback(config=a.config).on_save(trainer=a, global_step=1, checkpoint_dir=str(ckpt))
    state = a.replay_buffer.allocation_state()
    assert state["params"] == {"k": K, "batch_size": 4, "seed": 7, "reward_threshold": 0.0}

    def resumed(params, folder, name="b"):
        tr = StandInTrainer(cluster, "sara", params, tmp_path / name)  # its own default_local_dir, empty
        tr.config.trainer.resume_mode = "resume_path"
        tr.config.trainer.resume_from_path = str(folder)
        return tr

    b = resumed({}, ckpt)
    b.replay_buffer._ensure_allocator(4)
    b.replay_buffer._maybe_resume(2)
    assert b.replay_buffer.allocation_history == state["history"] and len(state["history"]) == 1
    assert b.replay_buffer.allocation_state()["totals"] == state["totals"]
    bare = tmp_path / "bare" / "global_step_1"
    bare.mkdir(parents=True)
    c = resumed({}, bare, "c")
    with pytest.raises(FileNotFoundError, match=str(bare / rv.STATE_DIR)):
        c.replay_buffer.sample(global_steps=2, partition_id="train", batch_size=4)
    d = resumed({"tau_low": 0.05}, ckpt, "d")
    with pytest.raises(ConfigError, match="tau_low=absent there, 0.05 now") as e:
        d.replay_buffer.sample(global_steps=2, partition_id="train", batch_size=4)
    assert str(ckpt / rv.STATE_DIR) in str(e.value)
    assert c.worker.sessions == {} and d.worker.sessions == {}  # refused before the step's first dispatch
    assert not (tq.kv_list("train") or {}).get("train")


def test_refuses_async_and_unknown(cluster, tmp_path):
    tr = StandInTrainer(cluster, "grpo", {}, tmp_path)
    cls = type(tr.replay_buffer)
    kw = dict(trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop", refill_fn=None)
    with pytest.raises(Exception, match="sync trainer only"):
        cls(trainer_mode="async", sampler_kwargs={"allocator": "grpo"}, **kw)
    with pytest.raises(Exception, match="is not an allocator"):
        cls(trainer_mode="sync", sampler_kwargs={"allocator": "nope"}, **kw)
    tr2 = StandInTrainer(cluster, "grpo", {"k": 8}, tmp_path)
    with pytest.raises(Exception, match="disagrees with verl's actor_rollout_ref.rollout.n"):
        tr2.replay_buffer._ensure_allocator(4)


def test_example_overrides_compose_with_verls_config(cluster, tmp_path):
    """examples/verl/allocator_overrides.txt on verl's own ppo_trainer config (Hydra compose); verl's
    _build_replay_buffer and build_checkpoint_callback then load our classes from the composed config."""
    from pathlib import Path

    import verl.trainer.config as verl_config
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    root = Path(__file__).resolve().parents[2]
    lines = (root / "examples/verl/allocator_overrides.txt").read_text().splitlines()
    overrides = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    with initialize_config_dir(config_dir=str(Path(verl_config.__file__).parent), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "sync"
    tr = StandInTrainer(cluster, "grpo", {}, tmp_path)
    tr.config.trainer.v1.sampler = cfg.trainer.v1.sampler
    buf = tr._build_replay_buffer()
    assert type(buf).__name__ == "AllocatorReplayBuffer" and buf.allocator_name == "sara"
    assert buf.allocator_params == {"tau_low": 0.5}
    callback = build_checkpoint_callback(cfg)
    assert type(callback).__name__ == "AllocatorCheckpointCallback"
