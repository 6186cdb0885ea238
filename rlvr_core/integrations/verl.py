"""rlvr_core's allocators inside verl 0.9.1's v1 trainer (``verl/trainer/ppo/v1/``, sync mode).

A verl user loads the sampler below with two config lines (examples/verl/)::

    trainer.v1.sampler.custom_sampler.path=pkg://rlvr_core.integrations.verl
    trainer.v1.sampler.custom_sampler.name=AllocatorReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.allocator=sara
    trainer.checkpoint_callback_class=rlvr_core.integrations.verl.AllocatorCheckpointCallback

Any allocator registered in ``rlvr_core.allocation.ALLOCATORS`` runs; its parameters go in
``sampler_kwargs.allocator_params``. ``import rlvr_core`` never imports verl; this module imports it only
when ``AllocatorReplayBuffer`` or ``AllocatorCheckpointCallback`` is first looked up (module ``__getattr__``),
so the module itself imports without verl.

How a step runs. verl's ``PPOTrainer._step_once`` calls ``replay_buffer.sample(global_steps, "train",
batch_size)``; ``AllocatorReplayBuffer.sample`` runs one allocation step (docs/design.md §3.1) inside it:

1. ``allocator.start_step(source)``; the ``PromptSource`` holds the indices of ``trainer.train_dataset``.
2. Each round ``{prompt index: n}`` is dispatched as verl dispatches a batch: the dataset rows are
   collated by ``verl.utils.dataset.rl_dataset.collate_fn``, get a fresh ``uid`` each, ``global_steps``
   and ``__rollout_n__ = n`` (``set_rollout_n``), and go to ``PPOTrainer._submit_batch_to_rollout``, which
   registers the prompts in TransferQueue and calls ``AgentLoopManagerTQ.generate_sequences``; each
   ``AgentLoopWorkerTQ._run_prompt`` reads ``n = prompt.pop("__rollout_n__", config.n)`` and runs n sessions.
3. The buffer polls TransferQueue (``ReplayBuffer._sync_metadata_from_transfer_queue``, every
   ``poll_interval`` s, ``ReplayBuffer._wait_for_next_poll``) until every prompt of the round is
   ``finished``; reads each session's reward as verl's own DAPO filter does (``rm_scores`` summed, from
   ``tq.kv_batch_get``) and its length from the ``response_len`` tag; ``allocator.observe``.
   One round per poll cycle: the round's prompts are all dispatched at once, and the next round starts
   when all of them are back (the synchronous rounds of the allocation loop).
4. ``allocator.finish_step()`` gives the ragged groups. A group whose rows came in several rounds has
   several dispatch uids; the ``uid`` field of its rows is rewritten to one uid (``tq.kv_batch_put`` with
   fields), because verl's GRPO advantage (``core_algos.compute_grpo_outcome_advantage``, called through
   ``v1/utils.compute_advantage_for_multi_trajectories`` by ``PPOTrainer._compute_advantage``) groups rows
   by that field. The rollouts outside the batch (abandoned prompts, DAPO's uniform groups) and the prompt
   entries are cleared (``tq.kv_clear``); ``sample`` returns the batch as a ``transfer_queue.KVBatchMeta``
   and the step's counters as ``allocation/<counter>`` metrics, which verl logs with its own.

Why verl's refill path is not enough. ``refill_fn`` is ``PPOTrainer._add_prompts_to_generate(num_prompts)``:
it takes the next ``num_prompts`` rows of verl's dataloader, each with the config's ``rollout.n`` (or a
``__rollout_n__`` column of the data), under new uids. It cannot choose the prompts, cannot give another
round to a prompt already sampled, and the sync ``ReplayBuffer.sample`` uses it for DAPO's "evict k, refill
2k". So the buffer dispatches through ``_submit_batch_to_rollout`` itself, and replaces the trainer's
``prepare_step`` (which would dispatch ``train_batch_size`` dataloader prompts at the start of every step)
with one that dispatches nothing. These two private methods of ``PPOTrainer`` are the adapter's
dependency beyond the custom-sampler hook. Validation (``partition_id="val"``) is verl's own sampling.

Checkpoints: ``AllocatorCheckpointCallback.on_save`` (verl's ``trainer.checkpoint_callback_class`` hook,
``verl/trainer/ppo/checkpoint_callback.py``) writes ``global_step_N/allocator_state/`` in the pickle-free
format of ``rlvr_core.checkpoint`` (``save_state_folder``), the same fields as the TRL integration's; ``params``
holds every parameter the allocator was built with (``allocator_params`` with verl's ``rollout.n``, batch size and
``data.seed`` filled in). On a resumed run (the first ``sample`` call at step N > 1) it reads ``allocator_state``
back (``read_state``) from the folder verl's ``PPOTrainer._load_checkpoint`` resumed from (``resume_folder``):
``trainer.default_local_dir/global_step_{N-1}`` under ``resume_mode=auto``, ``trainer.resume_from_path`` under
``resume_mode=resume_path``. A resume is refused before the step's first dispatch when that folder has no
allocator state (FileNotFoundError naming the path looked at), when the state is another allocator's, or when any
of its parameters differs from this run's (ConfigError naming each, with the checkpoint's value and this run's).
A state written before ``params`` held the filled-in values (it holds ``allocator_params`` alone) is compared
with this run's ``allocator_params`` and resumed with a warning that the rest was not recorded.

Sync trainer only (``trainer.v1.trainer_mode=sync``): the async trainers' ``ReplayBufferAsync`` mixes steps'
prompts, while an allocation step is one policy version. Multi-turn agent loops: a session's reward is its
final output's, as verl's ``compute_advantage_for_multi_trajectories`` takes it.

verl 0.9.1 (TransferQueue 0.1.11) code this module depends on:
- ``verl/trainer/ppo/v1/replay_buffer.py``: ``ReplayBuffer.__init__``, ``.sample`` (the call signature),
  ``._sync_metadata_from_transfer_queue``, ``._wait_for_next_poll``, ``.partitions``, ``.finished_keys``,
  ``.failure_keys``, the key format ``{uid}_{session_id}_{index}``;
- ``verl/trainer/ppo/v1/trainer_base.py``: ``PPOTrainer._build_replay_buffer`` (loads the class,
  ``refill_fn=self._add_prompts_to_generate``, whose ``__self__`` is the trainer), ``._submit_batch_to_rollout``,
  ``.prepare_step``, ``.train_dataset``, ``.config``, ``._step_once``, ``._save_checkpoint`` (calls the callback);
- ``verl/trainer/ppo/v1/agent_loop_tq.py``: ``AgentLoopWorkerTQ.generate_sequences`` and ``._run_prompt``
  (``__rollout_n__``);
- ``verl/utils/dataset/rl_dataset.py``: ``collate_fn``; ``verl/utils/tensordict_utils.py``: ``get_tensordict``,
  ``assign_non_tensor_data``;
- ``verl/trainer/ppo/checkpoint_callback.py``: ``CheckpointCallback``;
- ``transfer_queue``: ``kv_list``, ``kv_batch_get``, ``kv_batch_put``, ``kv_clear``, ``KVBatchMeta``.
"""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rlvr_core.allocation import ALLOCATORS, PromptSource, make_allocator
from rlvr_core.checkpoint import read_state, save_state_folder
from rlvr_core.errors import ConfigError
from rlvr_core.integrations.state import allocation_state, check_allocation_state, restore_allocation_state
from rlvr_core.types import Rollouts

ROLLOUT_N_KEY = "__rollout_n__"  # popped per prompt by verl's AgentLoopWorkerTQ._run_prompt
STATE_DIR = "allocator_state"  # in each global_step_N/: the format of rlvr_core.checkpoint, loaded without pickle
PARTITION = "train"
TOTALS = ("rollouts", "tokens", "groups", "effective_groups", "useful_rollouts")  # the running totals it keeps
# the parameters filled in from verl's config (and the reward threshold's default) under allocator_params; a state
# whose params lacks one was written when params recorded allocator_params alone
FILLED_IN = ("k", "batch_size", "seed", "reward_threshold")


def set_rollout_n(batch: Any, counts: Sequence[int]) -> Any:
    """Give each prompt of a verl batch (a TensorDict) its own rollout count.

    verl's ``AgentLoopWorkerTQ._run_prompt`` pops ``__rollout_n__`` from each prompt and runs that many
    sessions (else ``actor_rollout_ref.rollout.n``). A single-round allocator's proposal ``{prompt: n}`` goes
    straight here. Returns the batch.
    """
    import torch

    counts = [int(c) for c in counts]
    if len(counts) != len(batch):
        raise ValueError(f"set_rollout_n: {len(counts)} counts for a batch of {len(batch)} prompts")
    if any(c < 1 for c in counts):
        raise ValueError(f"set_rollout_n: every count must be >= 1, got {counts}")
    batch[ROLLOUT_N_KEY] = torch.tensor(counts, dtype=torch.int64)
    return batch


def _plain(cfg: Any) -> dict[str, Any]:
    """A DictConfig (or None, or a dict) as a plain dict."""
    if cfg is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    return dict(cfg)


def _session_of(key: str) -> str:
    """``{uid}_{session_id}_{index}`` -> ``{uid}_{session_id}``."""
    return key.rsplit("_", 1)[0]


def resume_folder(trainer_config: Any, global_steps: int) -> Path | None:
    """The checkpoint folder a verl run whose first step is ``global_steps`` resumed from, chosen as verl 0.9.1's
    ``PPOTrainer._load_checkpoint`` chooses it (which then sets the step to the folder's N, the first step being
    N + 1): None when nothing was resumed (step 1, or ``resume_mode=disable``), ``resume_from_path`` under
    ``resume_mode=resume_path``, else ``default_local_dir/global_step_{global_steps - 1}``; a relative path is
    taken from the working directory, as verl takes it."""
    mode = str(trainer_config.get("resume_mode", "auto"))
    if global_steps <= 1 or mode == "disable":
        return None
    if mode == "resume_path":
        folder = Path(str(trainer_config.get("resume_from_path")))
    else:
        folder = Path(str(trainer_config.default_local_dir)) / f"global_step_{global_steps - 1}"
    return folder if folder.is_absolute() else Path.cwd() / folder


def check_state(st: Any, where: str | Path) -> None:
    """Raise ValueError naming ``where`` and the field unless ``st`` has the shape ``allocation_state()`` writes
    (rlvr_core.integrations.state, as the TRL trainer's; the totals hold TOTALS)."""
    check_allocation_state(st, where, totals=TOTALS)


class _AllocatorSampling:
    """The allocation step of ``AllocatorReplayBuffer`` (which adds verl's ``ReplayBuffer`` as a base).

    Extra keyword arguments, for use without a verl trainer (tests, custom loops): ``dataset`` (indexable
    rows, as ``trainer.train_dataset``), ``submit`` (callable taking the dispatched TensorDict, as
    ``trainer._submit_batch_to_rollout``), ``rollout_n`` (the default group size ``k``), ``seed``.
    """

    def __init__(self, *args: Any, dataset: Any = None, submit: Callable[[Any], Any] | None = None,
                 rollout_n: int | None = None, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.trainer_mode != "sync":
            raise ConfigError(f"AllocatorReplayBuffer: trainer.v1.trainer_mode={self.trainer_mode!r}; an allocation "
                              "step is one policy version, so it runs in the sync trainer only (trainer_mode=sync)")
        kw = _plain(self.sampler_kwargs)
        self.allocator_name = str(kw.get("allocator", ""))
        if self.allocator_name not in ALLOCATORS:
            raise ConfigError(f"trainer.v1.sampler.sampler_kwargs.allocator: {self.allocator_name!r} is not an "
                              f"allocator; choose one of {sorted(ALLOCATORS)}")
        self.allocator_params = dict(kw.get("allocator_params") or {})
        self.built_params: dict[str, Any] | None = None  # allocator_params with verl's values filled in (first sample)
        self.trainer = getattr(self.refill_fn, "__self__", None)  # PPOTrainer._add_prompts_to_generate's trainer
        if self.trainer is not None:
            # the allocator picks every step's prompts: the trainer's own per-step dispatch would add
            # train_batch_size dataloader prompts the allocator never asked for
            self.trainer.prepare_step = lambda: {}
        self._dataset, self._submit, self._rollout_n, self._seed = dataset, submit, rollout_n, seed
        self.allocator = None
        self.prompt_source: PromptSource | None = None
        self.allocation_history: list[dict[str, Any]] = []
        self._totals: dict[str, int] = {k: 0 for k in TOTALS}
        self._resume_checked = False

    # ----- set-up, on the first sample (the trainer's dataset exists only after its init()) -----
    def _ensure_allocator(self, batch_size: int) -> None:
        if self.allocator is not None:
            return
        tr = self.trainer
        dataset = self._dataset if self._dataset is not None else tr.train_dataset
        k = self._rollout_n if self._rollout_n is not None else int(tr.config.actor_rollout_ref.rollout.n)
        seed = self._seed if self._seed is not None else int((tr.config.data.get("seed", None) or 0) if tr else 0)
        params = {"k": k, "batch_size": batch_size, "seed": seed, "reward_threshold": 0.0} | self.allocator_params
        for key, verl_key, want in (("k", "actor_rollout_ref.rollout.n", k),
                                    ("batch_size", "data.train_batch_size / parameter_sync_step", batch_size)):
            if int(params[key]) != want:
                raise ConfigError(f"{self.allocator_name}.{key}={params[key]} disagrees with verl's {verl_key} "
                                  f"({want}); drop it from allocator_params or change {verl_key}")
        self.allocator = make_allocator(self.allocator_name, **params)
        self.built_params = params
        self.prompt_source = PromptSource(len(dataset), seed=seed)
        self._dataset = dataset
        if self._submit is None:
            self._submit = tr._submit_batch_to_rollout

    def _maybe_resume(self, global_steps: int) -> None:
        """On a resumed verl run (first sample at step N > 1), load the allocator state of the folder verl resumed
        from (``resume_folder``); a folder without one is refused (``load_state``)."""
        if self._resume_checked:
            return
        self._resume_checked = True
        tr = self.trainer
        checkpoint = resume_folder(tr.config.trainer, global_steps) if tr is not None else None
        if checkpoint is not None:
            self.load_state(checkpoint / STATE_DIR)

    # ----- one round -----
    def _dispatch(self, request: dict[int, int], global_steps: int) -> dict[str, int]:
        """Send one round to verl's rollout; returns {uid: prompt index}."""
        from verl.utils import tensordict_utils as tu
        from verl.utils.dataset.rl_dataset import collate_fn

        prompts = sorted(request)
        uids = [str(uuid.uuid4()) for _ in prompts]  # no "_": verl splits keys on it
        batch_dict = collate_fn([self._dataset[int(q)] for q in prompts])
        batch_dict["uid"] = np.array(uids, dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", global_steps)
        set_rollout_n(batch, [request[q] for q in prompts])
        self._submit(batch)
        return dict(zip(uids, prompts))

    def _await_round(self, uid_prompt: dict[str, int]) -> Rollouts:
        """Poll TransferQueue until every prompt of the round is finished; its sessions as Rollouts."""
        import time

        import transfer_queue as tq

        uids, last = set(uid_prompt), time.time()
        while True:
            self._sync_metadata_from_transfer_queue()
            failed = uids & self.failure_keys[PARTITION]
            if failed:
                raise RuntimeError(f"AllocatorReplayBuffer: {len(failed)} prompt(s) of the round failed in verl's "
                                   f"rollout (uid {sorted(failed)[0]}); the allocator needs every rollout it asked for")
            if uids <= self.finished_keys[PARTITION]:
                break
            last = self._wait_for_next_poll(PARTITION, last)
        part = self.partitions[PARTITION]
        sessions: dict[str, list[str]] = {}
        for key in sorted(k for k in part if k.split("_")[0] in uids):
            sessions.setdefault(_session_of(key), []).append(key)
        names = sorted(sessions)
        finals = [max(sessions[s], key=lambda k: int(k.rsplit("_", 1)[1])) for s in names]
        data = tq.kv_batch_get(keys=finals, partition_id=PARTITION, select_fields=["rm_scores"])
        rewards = [float(v.sum().item()) for v in data["rm_scores"]]
        tokens = [sum(int(part[k].get("response_len", 0)) for k in sessions[s]) for s in names]
        return Rollouts(prompt_id=[uid_prompt[s.split("_")[0]] for s in names], reward=rewards, tokens=tokens,
                        payload=[sessions[s] for s in names])

    # ----- the step -----
    def _allocation_step(self, global_steps: int) -> tuple[list[list[str]], np.ndarray, dict[str, Any], set[str]]:
        """Run the allocator's rounds; (keys per row, group id per row, counters, every uid dispatched)."""
        self.allocator.start_step(self.prompt_source)
        dispatched: set[str] = set()
        while request := self.allocator.propose():
            uid_prompt = self._dispatch(request, global_steps)
            dispatched |= set(uid_prompt)
            self.allocator.observe(self._await_round(uid_prompt))
        batch, stats = self.allocator.finish_step()
        return list(batch.rollouts.payload or []), batch.group_id, stats.as_dict(), dispatched

    def _regroup(self, rows: list[list[str]], group_id: np.ndarray) -> None:
        """One ``uid`` field per group: the uid of the group's first row, written where a row differs."""
        import transfer_queue as tq
        from tensordict import NonTensorStack, TensorDict

        first: dict[int, str] = {}
        for keys, g in zip(rows, group_id.tolist()):
            first.setdefault(g, keys[0].split("_")[0])
        keys, uids = [], []
        for row_keys, g in zip(rows, group_id.tolist()):
            for key in row_keys:
                if key.split("_")[0] != first[g]:
                    keys.append(key)
                    uids.append(first[g])
        if keys:
            fields = TensorDict({"uid": NonTensorStack(*uids)}, batch_size=[len(keys)])
            tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=fields)

    def _record(self, counters: dict[str, Any]) -> dict[str, float]:
        # numbers only (a flag as 0/1), so that the state's check reads its own history back
        self.allocation_history.append({k: int(v) if isinstance(v, bool) else v for k, v in counters.items()
                                        if isinstance(v, (int, float))})
        for k in TOTALS:
            self._totals[k] = self._totals.get(k, 0) + int(counters.get(k, 0))
        metrics = {f"allocation/{k}": float(v) for k, v in self.allocation_history[-1].items()}
        metrics.update({f"allocation/total_{k}": float(v) for k, v in self._totals.items()})
        eff = self._totals["effective_groups"]
        metrics["allocation/rollouts_per_effective_group"] = self._totals["rollouts"] / eff if eff else float("nan")
        return metrics

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        """verl's sampling call: one allocation step for ``"train"``; verl's own sampling for ``"val"``."""
        if partition_id != PARTITION:
            return super().sample(global_steps, partition_id, batch_size)
        import transfer_queue as tq
        from transfer_queue import KVBatchMeta

        self._ensure_allocator(batch_size)
        self._maybe_resume(global_steps)
        rows, group_id, counters, dispatched = self._allocation_step(global_steps)
        self._regroup(rows, group_id)
        self._sync_metadata_from_transfer_queue()
        part = self.partitions[PARTITION]
        keys = [k for row in rows for k in row]
        kept = set(keys)
        unused = [k for k in part if k.split("_")[0] in dispatched and k not in kept]
        tq.kv_clear(keys=sorted(dispatched) + unused, partition_id=PARTITION)
        return KVBatchMeta(partition_id=PARTITION, keys=keys, tags=[part[k] for k in keys]), self._record(counters)

    # ----- state -----
    def allocation_state(self) -> dict[str, Any]:
        return allocation_state(self.allocator_name, self.built_params, self.allocator, self.prompt_source,
                                self.allocation_history, self._totals)

    def save_state(self, folder: str | Path, step: int) -> Path:
        """Write ``allocation_state()`` to ``folder`` (rlvr_core.checkpoint's format, no pickle)."""
        if self.allocator is None:
            raise RuntimeError("AllocatorReplayBuffer.save_state: no step has run yet, there is no allocator state")
        return save_state_folder(folder, self.allocation_state(), step=int(step),
                                 meta={"allocator": self.allocator_name})

    def load_state(self, folder: str | Path) -> None:
        """Restore what ``save_state`` wrote; raises naming ``folder`` and the field that does not fit, and refuses
        (ConfigError) a state of another allocator or written with other parameters (see the module docstring)."""
        folder = Path(folder)
        if not folder.exists():
            raise FileNotFoundError(f"{folder}: the checkpoint has no allocator state (was it written with "
                                    "AllocatorCheckpointCallback?); resume from a checkpoint that has one, or "
                                    "start afresh (trainer.resume_mode=disable)")
        st = read_state(folder)
        check_state(st, folder)
        params, unrecorded = self.built_params, [k for k in FILLED_IN if k not in st["params"]]
        if unrecorded:  # written when params held allocator_params alone: compare what it recorded
            params = self.allocator_params
        self.allocation_history, self._totals = restore_allocation_state(
            st, folder, name=self.allocator_name, params=params, allocator=self.allocator, source=self.prompt_source,
            totals=TOTALS)
        if unrecorded:
            warnings.warn(f"{folder}: the state records allocator_params only (an earlier rlvr-alloc wrote it), "
                          f"which match this run's; {', '.join(unrecorded)} (from verl's config) were not recorded, "
                          "so a change there cannot be told; the next checkpoint records them", stacklevel=2)


def _on_save(self: Any, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
             **kwargs: Any) -> None:
    """``CheckpointCallback.on_save``: the allocator state into ``global_step_N/allocator_state``."""
    buffer = getattr(trainer, "replay_buffer", None)
    if isinstance(buffer, _AllocatorSampling) and buffer.allocator is not None:
        buffer.save_state(Path(checkpoint_dir) / STATE_DIR, global_step)


_BUILT: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """Build the verl subclasses on first use, so that importing this module does not import verl."""
    if name not in ("AllocatorReplayBuffer", "AllocatorCheckpointCallback"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _BUILT:
        if name == "AllocatorReplayBuffer":
            from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

            cls = type(name, (_AllocatorSampling, ReplayBuffer), {"__doc__": _AllocatorSampling.__doc__,
                                                                   "__module__": __name__})
        else:
            from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

            cls = type(name, (CheckpointCallback,), {"on_save": _on_save, "__module__": __name__,
                                                     "__doc__": _on_save.__doc__})
        _BUILT[name] = cls
    return _BUILT[name]


__all__ = ["FILLED_IN", "ROLLOUT_N_KEY", "STATE_DIR", "check_state", "resume_folder", "set_rollout_n"]
