"""rlvr_core's allocators inside TRL's ``GRPOTrainer`` (TRL 1.16).

``AllocatedGRPOTrainer`` takes GRPOTrainer's arguments plus ``allocator`` (any
name in ``rlvr_core.allocation.ALLOCATORS``) and ``allocator_params``::

    trainer = AllocatedGRPOTrainer(model=model, reward_funcs=[correct], args=GRPOConfig(...),
                                   train_dataset=ds, allocator="sara", allocator_params={"tau_low": 0.5})
    trainer.train()

One generation step (every ``steps_per_generation * num_iterations`` micro-steps,
where TRL generates) runs the allocation loop of docs/design.md §3.1:

1. ``allocator.start_step(source)``; ``source`` yields dataset row indices in
   the order TRL's ``RepeatSampler`` would (a ``torch.randperm`` per epoch
   seeded with ``args.seed``, cut into chunks of ``generation_batch_size /
   num_generations`` prompts, incomplete last chunk dropped), so
   ``allocator="grpo"`` trains on the prompts plain GRPOTrainer would, and
   SARA's and DAPO's extra fresh prompts continue that stream.
2. Each round: the proposal ``{row: n}`` becomes a list of rows (row repeated
   n times), split into equal contiguous shares over the processes; each
   process calls TRL's own ``_generate`` on its share (transformers generate,
   continuous batching, or vLLM server/colocate: one batched call per round,
   every row asking for one completion). TRL's ``_calculate_rewards`` scores
   the share with the trainer's reward functions and gathers the scores; they
   are combined as TRL combines them (``reward_weights``, ``nansum``). The
   completions are gathered to every process (``gather_object``), so every
   process holds the same allocator and feeds it the same rollouts: there is
   one global decision, replicated, checked each round (a proposal that differs
   across ranks raises). The allocator's reward contract applies to the
   combined reward (docs/trl.md "Rewards"): a pass is a reward above
   ``allocator_params["reward_threshold"]``, by default ``REWARD_THRESHOLD``
   (0: a pass is a reward > 0); a completion that no reward function scored
   (NaN), or an infinite reward, stops training with a ``RewardError`` naming
   the step, the dataset row and each function's value.
3. ``allocator.finish_step()`` gives the ragged groups. Advantages are
   computed per group with ``rlvr_core.grpo.advantages`` following TRL's
   ``scale_rewards``: "group" -> (r - mean_g) / (std_g + 1e-4) (unbiased std, as
   TRL), "none" -> r - mean_g, "batch" -> (r - mean_g) / (std of the batch + 1e-4).
   Groups of any size (VIGOR) work; a constant group gets 0.
4. The batch's rows are split over the processes and handed to TRL's own
   ``_generate_and_score_completions`` with generation and scoring replayed
   (the overridden ``_generate`` / ``_calculate_rewards`` return the step's
   rollouts) and ``num_generations`` set to 1 for that call, so TRL builds the
   tensors, old and reference log-probs, the vLLM importance-sampling ratio and
   its logs exactly as usual; the advantages are then replaced by the
   per-group ones. TRL's loss (any ``loss_type``) sees exactly the allocator's
   groups.

Padding. Two places pad with rows that carry no training signal:
- a round's rows are padded to a multiple of the number of processes (TRL's
  gathers need equal shares); the padding rows are generated and scored, then
  dropped before the allocator sees the round (at most ``num_processes - 1``
  per round, logged as ``allocation/padding_rollouts``);
- the batch is padded to ``num_processes * L`` rows with L a multiple of
  ``steps_per_generation`` (TRL's ``split_tensor_dict`` drops a remainder);
  a padding row copies a real row with its completion mask zeroed and
  advantage 0 (logged as ``allocation/padding_rows``). With TRL's default
  ``loss_type="dapo"`` (normalised by the batch's token count) and "bnpo"
  they change nothing; losses that average over sequences ("grpo",
  "dr_grpo", ...) count them in the denominator. grpo, dapo and sara in groups
  mode fill ``generation_batch_size`` exactly and need no padding unless a
  step ends short (``hit_cap``); vigor usually pads.

Logged where TRL logs: per step, ``self._metrics["train"]["allocation/<counter>"]``
(rollouts, tokens, rounds, prompts, groups, effective_groups, useful_rollouts,
committed, abandoned, skipped, hit_cap, the allocator's extra counters,
padding, totals), so every ``report_to`` backend (mlflow included) receives
them; TRL averages them over ``logging_steps``. ``frac_reward_zero_std``
becomes the share of batch rows in zero-std groups. ``allocation_history``
keeps each step's ``StepStats`` as a dict.

State: ``_save_checkpoint`` writes the folder ``allocator_state/`` (the
allocator's ``state_dict``, the prompt stream's position, the history) into the
checkpoint folder, in the pickle-free format of ``rlvr_core.checkpoint``
(state.json, tensors.safetensors, a manifest of hashes); ``resume_from_checkpoint``
restores it in ``_load_optimizer_and_scheduler``, reading JSON and safetensors
only and checking every field. ``train`` refuses a checkpoint whose allocator state
is missing, or is the earlier release's ``allocator_state.pkl`` (unpickling it could
run code), before anything is loaded; a pickle the user trusts is converted by
``python -m rlvr_core.integrations.trl convert-state CHECKPOINT_DIR --trust-pickle``.
It refuses as well (``ConfigError``, before anything is loaded) a state written by
another allocator, or with other parameters: the state records every parameter the
allocator was built with (``allocator_params`` with TRL's ``num_generations``,
batch size and ``seed`` filled in), and each one that differs is named with its
value in the checkpoint and now.

TRL internals this relies on (all in ``trl/trainer/grpo_trainer.py`` 1.16):
``_generate_and_score_completions(inputs)`` (overridden; eval keeps TRL's),
``_generate(prompts)`` and its 8-tuple return, ``_generate_single_turn(...,
num_generations)`` (called with 1 during rounds, which makes vLLM server mode
send every row with n=1), ``_calculate_rewards(inputs, prompts, completions,
completion_ids)`` returning the gathered (rows, funcs) tensor,
``self.reward_weights``, ``self.num_generations`` (plain attribute),
``self.scale_rewards``, ``self.multi_objective_aggregation``,
``self.shuffle_dataset``, ``self._metrics``, ``self._logs["advantages"]``,
``RepeatSampler``'s ordering, ``split_tensor_dict`` (drops remainders),
``_save_checkpoint`` / ``_load_optimizer_and_scheduler`` and
``args.generation_batch_size`` / ``args.steps_per_generation`` as computed by
``GRPOConfig.__post_init__``.

``RolloutLogCallback`` (at the end of this module) writes the rollout log of a plain ``GRPOTrainer`` run
(``rollouts.parquet``), the input of ``rlvr-alloc advise`` (docs/advisor.md).

Not supported (refused at construction): tools, ``environment_factory``,
``rollout_func``, image columns, ``IterableDataset``,
``multi_objective_aggregation="normalize_then_sum"`` (it normalises per group
before the groups exist).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import pickle
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

try:  # the [trl] extra: the base install (the library alone) leaves TRL and accelerate out
    from accelerate.utils import gather, gather_object
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:
    raise ImportError(f"rlvr_core.integrations.trl needs TRL 1.16 and accelerate, which the base install of "
                      f"rlvr-alloc leaves out ({e}); install them with: pip install 'rlvr-alloc[trl]'") from e

from rlvr_core.allocation import ALLOCATORS, PromptSource, make_allocator
from rlvr_core.checkpoint import CheckpointError, read_state, save_state_folder
from rlvr_core.errors import ConfigError, RewardError
from rlvr_core.grpo.advantages import dr_grpo_advantages, grpo_advantages
from rlvr_core.integrations.state import allocation_state, check_same_allocator, restore_allocation_state
from rlvr_core.integrations.state import check_allocation_state as _check_state
from rlvr_core.types import Rollouts, StepStats, TrainBatch

STATE_DIR = "allocator_state"  # in each checkpoint-N/: the format of rlvr_core.checkpoint, loaded without pickle
LEGACY_STATE_FILE = "allocator_state.pkl"  # the earlier releases' pickle: refused (it could run code when loaded)
ADV_EPS = 1e-4  # TRL's epsilon in (r - mean) / (std + eps)
# a pass is a combined reward above this (allocator_params["reward_threshold"] overrides it; None: rewards must be
# 1 or 0): right for 0/1 rewards, -1/+1 rewards, TRL's cosine-scaled accuracy (correct > 0 > wrong) and
# accuracy plus penalties (soft overlong, repetition: <= 0); see docs/trl.md "Rewards"
REWARD_THRESHOLD = 0.0
COUNTERS = ("rollouts", "tokens", "rounds", "prompts", "groups", "effective_groups", "useful_rollouts",
            "useful_tokens", "committed", "abandoned", "skipped", "hit_cap")


class SamplerOrderSource(PromptSource):
    """Dataset row indices in the order TRL's ``RepeatSampler`` visits them.

    Each epoch is ``torch.randperm(n)`` from a generator seeded once with
    ``seed`` (``list(range(n))`` when ``shuffle`` is off), cut to a multiple of
    ``chunk`` (TRL drops the incomplete last chunk). ``take``/``give_back``
    behave as in ``PromptSource``.
    """

    def __init__(self, num_rows: int, chunk: int, *, shuffle: bool = True, seed: int = 0) -> None:
        if num_rows < chunk:
            raise ConfigError(f"train_dataset: {num_rows} rows cannot fill one generation batch of {chunk} prompts "
                              "(generation_batch_size / num_generations); "
                              "add rows or lower per_device_train_batch_size")
        super().__init__(num_rows, seed=seed)
        self.chunk = int(chunk)
        self.shuffle = bool(shuffle)
        self._gen = torch.Generator()
        self._gen.manual_seed(int(seed))
        self.epoch = -1
        self._order = np.zeros(0, np.int64)
        self._pos = 0
        self._new_epoch()

    def _new_epoch(self) -> None:
        n = len(self.ids)
        order = torch.randperm(n, generator=self._gen).numpy() if self.shuffle else np.arange(n)
        self._order = order[: (n // self.chunk) * self.chunk].astype(np.int64)
        self._pos = 0
        self.epoch += 1

    def take(self, n: int) -> np.ndarray:
        out: list[int] = []
        while self._front and len(out) < n:
            out.append(self._front.pop(0))
        while len(out) < n:
            if self._pos >= len(self._order):
                self._new_epoch()
            m = min(n - len(out), len(self._order) - self._pos)
            out.extend(self._order[self._pos:self._pos + m].tolist())
            self._pos += m
        return np.asarray(out, dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        st = super().state_dict()
        st.update(torch_gen=self._gen.get_state().clone(), chunk=self.chunk, shuffle=self.shuffle)
        return st

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._gen.set_state(state["torch_gen"])
        self.chunk, self.shuffle = int(state["chunk"]), bool(state["shuffle"])


def _resolve_params(name: str, args: GRPOConfig, params: dict[str, Any] | None) -> dict[str, Any]:
    """The allocator's parameters: TRL's batch settings as defaults, user overrides checked against them."""
    k = int(args.num_generations)
    prompts = int(args.generation_batch_size) // k
    user = dict(params or {})
    if "k" in user and int(user["k"]) != k:
        raise ConfigError(
            f"allocator_params['k']={user['k']} does not fit TRL's GRPOConfig.num_generations={k}: the allocator's "
            f"full group size is TRL's num_generations; set num_generations={user['k']} in GRPOConfig (keeping "
            f"generation_batch_size a multiple of it) or drop 'k' from allocator_params")
    if "batch_size" in user and int(user["batch_size"]) * k != int(args.generation_batch_size):
        raise ConfigError(
            f"allocator_params['batch_size']={user['batch_size']} does not fit TRL's batch settings: "
            f"batch_size * num_generations = {int(user['batch_size']) * k} must equal GRPOConfig.generation_batch_size="
            f"{args.generation_batch_size} "
            f"(per_device_train_batch_size={args.per_device_train_batch_size} x processes x "
            f"steps_per_generation={args.steps_per_generation}); set per_device_train_batch_size (or "
            f"generation_batch_size) so that it holds {user['batch_size']} x {k} completions, or drop 'batch_size' "
            f"(default: generation_batch_size / num_generations = {prompts})")
    if name in ("ar3po", "valor") and user.get("reuse", name == "ar3po"):
        raise ConfigError(
            f"allocator_params['reuse']: {name}'s response reuse is not supported inside TRL (a completion from an "
            "earlier step would enter TRL's generation output with stale sampling log-probs); pass "
            "allocator_params={'reuse': False} for its allocation alone, or train with rlvr_core.training")
    out = {"k": k, "batch_size": prompts, "seed": int(args.seed), "reward_threshold": REWARD_THRESHOLD}
    out.update(user)
    return out


def _check_dataset(ds: Any) -> None:
    from datasets import IterableDataset

    if ds is None:
        raise ValueError("train_dataset: AllocatedGRPOTrainer needs a training dataset with a 'prompt' column")
    if isinstance(ds, IterableDataset):
        raise ValueError("train_dataset: an IterableDataset cannot be drawn from by index; the allocators pick "
                         "prompts by row, so pass a map-style datasets.Dataset (e.g. Dataset.from_list(rows))")
    cols = list(getattr(ds, "column_names", None) or (ds[0].keys() if len(ds) else []))
    if "prompt" not in cols:
        raise ValueError(f"train_dataset: no 'prompt' column (columns: {cols}); TRL's GRPOTrainer reads prompts "
                         "from 'prompt' (text or a list of chat messages): rename your column, e.g. "
                         "ds.rename_column('question', 'prompt')")
    if "image" in cols or "images" in cols:
        raise ValueError("train_dataset: image columns are not supported by AllocatedGRPOTrainer (text prompts only)")


class AllocatedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation steps are run by an rlvr_core allocator; see the module docstring."""

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None,
                 train_dataset: Any = None, *pos: Any, allocator: str = "grpo",
                 allocator_params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # every check here runs before TRL builds anything (no model load, no generation)
        ALLOCATORS.get(allocator)  # unknown name: UnknownNameError listing the valid ones
        _check_dataset(train_dataset)
        for key in ("tools", "rollout_func", "environment_factory"):
            if kwargs.get(key) is not None:
                raise ValueError(f"{key}: not supported by AllocatedGRPOTrainer (single-turn text generation only)")
        if args is None:
            name = model if isinstance(model, str) else "model"
            args = GRPOConfig(f"{Path(str(name)).name}-GRPO")
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError("GRPOConfig.multi_objective_aggregation='normalize_then_sum' normalises each reward "
                             "within fixed groups before the allocator has formed them; use 'sum_then_normalize'")
        self.allocator_name = allocator
        self.allocator_params = _resolve_params(allocator, args, allocator_params)
        self.allocator = make_allocator(allocator, **self.allocator_params)  # ConfigError names the bad field
        super().__init__(model, reward_funcs, args, train_dataset, *pos, **kwargs)
        self.prompt_source = SamplerOrderSource(len(self.train_dataset), self.allocator_params["batch_size"],
                                                shuffle=self.shuffle_dataset, seed=self.args.seed)
        self.allocation_history: list[dict[str, float]] = []
        self._totals = {"rollouts": 0, "effective_groups": 0, "tokens": 0}
        self._replay: tuple | None = None
        self._replay_rewards: torch.Tensor | None = None
        self._in_rounds = False
        self._row_cache: dict[int, dict[str, Any]] = {}

    # ----- hooks into TRL's generation and scoring ---------------------------------------
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # during rounds every row is its own request (per-prompt n = how often the row repeats)
        n = 1 if self._in_rounds else num_generations
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, n, has_tool_images)

    def _generate(self, prompts: list):
        if self._replay is not None:
            return self._replay
        return super()._generate(prompts)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._replay_rewards is not None:
            return self._replay_rewards
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    @contextlib.contextmanager
    def _replaying(self, generated: tuple, rewards: torch.Tensor):
        saved = self.num_generations
        self._replay, self._replay_rewards, self.num_generations = generated, rewards, 1
        try:
            yield
        finally:
            self._replay, self._replay_rewards, self.num_generations = None, None, saved

    # ----- the allocation step ---------------------------------------------------------------
    def _rows(self, idxs: list[int]) -> list[dict[str, Any]]:
        """Dataset rows by index: one batched read per call for rows not read yet this step."""
        cache = self._row_cache
        want = sorted({int(i) for i in idxs} - cache.keys())
        if want:
            cols = self.train_dataset[want]  # column dict
            for j, i in enumerate(want):
                cache[i] = {k: v[j] for k, v in cols.items()}
        return [dict(cache[int(i)]) for i in idxs]

    def _check_same_proposal(self, requests: dict[int, int]) -> None:
        if self.accelerator.num_processes == 1:
            return
        digest = hashlib.sha1(repr(sorted(requests.items())).encode()).hexdigest()
        digests = gather_object([digest])
        if len(set(digests)) != 1:
            raise RuntimeError(f"allocator {self.allocator_name!r} proposed different rounds on different processes "
                               f"({digests}); its state must be identical on every rank")

    def _run_round(self, requests: dict[int, int]) -> tuple[Rollouts, int]:
        """Generate and score one proposal across the processes; every rank returns the same Rollouts."""
        W, rank = self.accelerator.num_processes, self.accelerator.process_index
        rows = [q for q, n in requests.items() for _ in range(n)]
        R = len(rows)
        share = math.ceil(R / W)
        mine = rows[rank * share:(rank + 1) * share]
        mine = mine + [rows[-1]] * (share - len(mine))  # padding rows (dropped below)
        inputs = self._rows(mine)
        prompts = [x["prompt"] for x in inputs]
        self._in_rounds = True
        try:
            (prompt_ids, completion_ids, tool_mask, completions, logprobs, _extra, _images,
             _tool_images) = self._generate(prompts)
        finally:
            self._in_rounds = False
        rpf = self._calculate_rewards(inputs, prompts, completions, completion_ids)  # gathered (W * share, F)
        device = rpf.device
        weighted = (rpf * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        weighted[torch.isnan(rpf).all(dim=1)] = torch.nan
        local = [{"row": int(q), "prompt_ids": list(p), "completion_ids": list(c), "completion": comp,
                  "logprobs": (list(lp) if logprobs is not None else None)}
                 for q, p, c, comp, lp in zip(mine, prompt_ids, completion_ids, completions,
                                              logprobs if logprobs is not None else [None] * len(mine))]
        everything = gather_object(local) if W > 1 else local
        rpf_all, weighted_all = rpf.cpu()[:R], weighted.cpu()[:R].double().numpy()
        payload = []
        for j in range(R):
            item = dict(everything[j])
            item["rewards_per_func"] = rpf_all[j]
            item["reward"] = float(weighted_all[j])
            payload.append(item)
        # a completion no reward function scored stays NaN: the allocator's reward contract refuses it
        tokens = np.asarray([len(x["completion_ids"]) for x in payload], np.int64)
        return Rollouts(np.asarray(rows, np.int64), weighted_all, tokens, payload), W * share - R

    def _reward_error(self, e: RewardError, rollouts: Rollouts) -> RewardError:
        """``e`` led by the training step, the dataset row and what each reward function gave the completion."""
        per_func = rollouts.payload[e.row]["rewards_per_func"].tolist()
        funcs = ", ".join(f"{name}: {v!r}" for name, v in zip(self.reward_func_names, per_func))
        hint = ""
        if not math.isfinite(e.value):
            hint = (" (NaN: every reward function returned None or NaN for this completion; plain GRPOTrainer "
                    "skips such a completion, but an allocator counts each one as a pass or a fail: return a reward "
                    "for it, or drop from train_dataset the rows no reward function can score)")
        return e.where(f"AllocatedGRPOTrainer, training step {int(self.state.global_step) + 1}, train_dataset row "
                       f"{e.prompt} (reward functions: {funcs}){hint}")

    def run_allocation_step(self) -> tuple[TrainBatch, StepStats]:
        """One allocator step over TRL's generation backend; identical on every process."""
        alloc = self.allocator
        pad = 0
        t0 = time.perf_counter()
        self._row_cache = {}
        alloc.start_step(self.prompt_source)
        while requests := alloc.propose():
            self._check_same_proposal(requests)
            rollouts, n_pad = self._run_round(requests)
            pad += n_pad
            try:
                alloc.observe(rollouts)
            except RewardError as e:
                raise self._reward_error(e, rollouts) from None
        batch, stats = alloc.finish_step()
        stats.extra["padding_rollouts"] = pad
        stats.extra["allocation_seconds"] = time.perf_counter() - t0
        return batch, stats

    def _advantages(self, batch: TrainBatch) -> np.ndarray:
        r = np.asarray([p["reward"] for p in batch.rollouts.payload], np.float64)  # finite: observe checked them
        gid = batch.group_id
        if len(r) == 0:
            return r
        if self.scale_rewards == "group":
            adv, _ = grpo_advantages(r, gid, eps=ADV_EPS)
        else:
            adv, _ = dr_grpo_advantages(r, gid)
            if self.scale_rewards == "batch":
                std = float(np.std(r, ddof=1)) if len(r) > 1 else 0.0
                adv = adv / (std + ADV_EPS)
        return np.asarray(adv, np.float64)

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # evaluation keeps TRL's fixed groups
            return super()._generate_and_score_completions(inputs)
        batch, stats = self.run_allocation_step()
        W, rank = self.accelerator.num_processes, self.accelerator.process_index
        spg = int(self.args.steps_per_generation)
        rows = list(batch.rollouts.payload or [])
        N = len(rows)
        L = max(spg, math.ceil(math.ceil(N / W) / spg) * spg)
        adv = self._advantages(batch)
        filler = rows[0] if rows else self._last_round_row()
        padded = rows + [filler] * (W * L - N)
        adv_padded = np.concatenate([adv, np.zeros(W * L - N)])
        is_pad = np.arange(W * L) >= N
        mine = slice(rank * L, (rank + 1) * L)
        local = padded[mine]
        logprobs = [p["logprobs"] for p in local]
        generated = ([p["prompt_ids"] for p in local], [p["completion_ids"] for p in local], None,
                     [p["completion"] for p in local], None if any(lp is None for lp in logprobs) else logprobs,
                     {}, None, [])
        device = self.accelerator.device
        rpf = torch.stack([p["rewards_per_func"] for p in padded]).to(device)
        local_inputs = self._rows([p["row"] for p in local])
        with self._replaying(generated, rpf):
            out = super()._generate_and_score_completions(local_inputs)
        pad_local = torch.as_tensor(is_pad[mine], device=device)
        out["advantages"] = torch.as_tensor(adv_padded[mine], dtype=torch.float32, device=device)
        out["completion_mask"] = out["completion_mask"] * (~pad_local).unsqueeze(1).to(out["completion_mask"].dtype)
        loss_mask = (out["completion_mask"] if out.get("tool_mask") is None
                     else out["completion_mask"] * out["tool_mask"])
        out["num_items_in_batch"] = gather(loss_mask.sum()).sum()
        self._record(batch, stats, adv_padded, W * L - N)
        self._row_cache = {}
        return out

    def _last_round_row(self) -> dict[str, Any]:
        parts = self.allocator.ledger.parts
        for part in reversed(parts):
            if len(part):
                return part.payload[0]
        raise RuntimeError("the allocator ended a step without generating anything")

    def _record(self, batch: TrainBatch, stats: StepStats, adv_padded: np.ndarray, pad_rows: int) -> None:
        m = self._metrics["train"]
        d = stats.as_dict() if hasattr(stats, "as_dict") else {}
        for key in COUNTERS:
            m[f"allocation/{key}"].append(float(getattr(stats, key)))
        for key, value in stats.extra.items():
            m[f"allocation/{key}"].append(float(value))
        m["allocation/padding_rows"].append(float(pad_rows))
        self._totals["rollouts"] += stats.rollouts
        self._totals["effective_groups"] += stats.effective_groups
        self._totals["tokens"] += stats.tokens
        for key, value in self._totals.items():
            m[f"allocation/total_{key}"].append(float(value))
        m["allocation/rollouts_per_effective_group"].append(
            stats.rollouts / stats.effective_groups if stats.effective_groups else float("nan"))
        # TRL's frac_reward_zero_std (rows in zero-std groups), over the allocator's groups
        eff_rows = batch.effective[batch.group_id] if len(batch.group_id) else np.zeros(0, bool)
        frac = float(1.0 - eff_rows.mean()) if len(eff_rows) else 1.0
        if m.get("frac_reward_zero_std"):
            m["frac_reward_zero_std"][-1] = frac
        n_adv = min(len(adv_padded), len(self._logs["advantages"]))
        for _ in range(n_adv):
            self._logs["advantages"].pop()
        self._logs["advantages"].extend(adv_padded[len(adv_padded) - n_adv:].tolist())
        rec = {key: float(getattr(stats, key)) for key in COUNTERS}
        rec.update({key: float(v) for key, v in stats.extra.items()}, padding_rows=float(pad_rows),
                   step=float(self.state.global_step))
        rec.update({k: v for k, v in d.items() if k not in rec and isinstance(v, (int, float))})
        self.allocation_history.append(rec)

    # ----- checkpoints -------------------------------------------------------------------------
    def allocation_state(self) -> dict[str, Any]:
        return allocation_state(self.allocator_name, self.allocator_params, self.allocator, self.prompt_source,
                                self.allocation_history, self._totals)

    def load_allocation_state(self, st: dict[str, Any], *, where: str | os.PathLike = "allocator state") -> None:
        """Restore ``allocation_state()``'s dict; a field that does not fit raises ValueError naming ``where``
        (the state's file) and the field."""
        self.allocation_history, self._totals = restore_allocation_state(
            st, where, name=self.allocator_name, params=self.allocator_params, allocator=self.allocator,
            source=self.prompt_source, totals=_TOTALS)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            save_state_folder(os.path.join(folder, STATE_DIR), self.allocation_state(), step=self.state.global_step,
                              meta={"allocator": self.allocator_name})

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        # refuse a checkpoint without allocator state, with the old pickle, or written by another allocator or
        # under other allocator parameters, before TRL loads anything from it
        ckpt = resume_from_checkpoint
        if ckpt is True:
            ckpt = get_last_checkpoint(self.args.output_dir)  # None: TRL raises its own "no valid checkpoint"
        if isinstance(ckpt, (str, os.PathLike)):
            check_same_allocator(read_allocation_state(ckpt), Path(ckpt) / STATE_DIR, name=self.allocator_name,
                                 params=self.allocator_params)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self.load_allocation_state(read_allocation_state(checkpoint), where=Path(checkpoint) / STATE_DIR)


# ----- the allocator state in a TRL checkpoint -------------------------------------------------------

_TOTALS = ("rollouts", "effective_groups", "tokens")


def allocation_state_folder(checkpoint: str | os.PathLike) -> Path:
    """``checkpoint/allocator_state``; raises CheckpointError when the checkpoint holds the earlier pickle instead
    (saying how to convert it), FileNotFoundError when it holds neither. Nothing is read here."""
    checkpoint = Path(checkpoint)
    folder = checkpoint / STATE_DIR
    if folder.exists():
        return folder
    legacy = checkpoint / LEGACY_STATE_FILE
    if legacy.exists():
        raise CheckpointError(
            f"{legacy}: the allocator state of this checkpoint is a pickle (written by an earlier rlvr-alloc), "
            "which can run code when loaded, so it is not loaded. If you trust the file (your own run wrote it), "
            f"convert it once with: python -m rlvr_core.integrations.trl convert-state {checkpoint} --trust-pickle "
            "and resume again; otherwise start the run fresh (docs/trl.md, 'Checkpoints').")
    raise FileNotFoundError(f"{folder}: the checkpoint has no allocator state (was it written by "
                            "AllocatedGRPOTrainer?); resume from one of its checkpoints")


def check_allocation_state(st: Any, where: str | os.PathLike) -> None:
    """Raise ValueError naming ``where`` and the field unless ``st`` has the shape ``allocation_state()`` writes
    (rlvr_core.integrations.state; the allocator's and the prompt stream's own dicts are checked when loaded)."""
    _check_state(st, where, totals=_TOTALS)


def read_allocation_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The allocator state of TRL checkpoint folder ``checkpoint``, read without pickle and checked.

    Raises CheckpointError for the earlier pickle (``allocation_state_folder``), FileNotFoundError when there is
    none, ValueError naming the file (and the field) when it is damaged or tampered with.
    """
    folder = allocation_state_folder(checkpoint)
    st = read_state(folder)
    check_allocation_state(st, folder)
    return st


def convert_state(checkpoint: str | os.PathLike, *, trust_pickle: bool) -> Path:
    """Convert ``checkpoint/allocator_state.pkl`` (earlier releases) into ``checkpoint/allocator_state/``.

    Unpickling runs whatever code the file names, so this refuses unless ``trust_pickle`` (the file is one your
    own run wrote). The pickle is left in place (training never reads it); delete it once resumed.
    """
    checkpoint = Path(checkpoint)
    legacy, folder = checkpoint / LEGACY_STATE_FILE, checkpoint / STATE_DIR
    if not legacy.is_file():
        raise FileNotFoundError(f"{legacy}: no such file (nothing to convert)")
    if not trust_pickle:
        raise CheckpointError(f"{legacy}: converting unpickles the file, which runs any code it names; pass "
                              "--trust-pickle only for a file your own run wrote")
    with open(legacy, "rb") as f:
        st = pickle.load(f)  # noqa: S301 - the user vouched for this file with --trust-pickle
    check_allocation_state(st, legacy)
    m = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", checkpoint.resolve().name)
    save_state_folder(folder, st, step=int(m.group(1)) if m else 0,
                      meta={"allocator": st["allocator"], "converted_from": LEGACY_STATE_FILE})
    read_allocation_state(checkpoint)  # what was written reads back
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvr_core.integrations.trl",
                                     description="Tools for AllocatedGRPOTrainer checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert-state", help=f"convert a checkpoint's {LEGACY_STATE_FILE} (earlier releases) "
                                                f"into the pickle-free {STATE_DIR}/")
    conv.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT_DIR", help="a TRL checkpoint-N folder")
    conv.add_argument("--trust-pickle", action="store_true",
                      help="required: the pickle is unpickled, which runs any code it names; only for your own files")
    args = parser.parse_args(argv)
    if not args.trust_pickle:
        conv.error(f"--trust-pickle is required: converting unpickles {LEGACY_STATE_FILE}, which runs any code "
                   "it names; pass it only for checkpoints your own run wrote")
    for ckpt in args.checkpoints:
        if (Path(ckpt) / STATE_DIR).exists():
            print(f"{Path(ckpt) / STATE_DIR}: already there; left as it is")
            continue
        try:
            out = convert_state(ckpt, trust_pickle=True)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"wrote {out} (from {Path(ckpt) / LEGACY_STATE_FILE}, which training no longer reads; "
              "delete it once the run resumes)")
    return 0


# ----- the rollout log of a plain GRPOTrainer -------------------------------------------------------


def stable_prompt_id(value: Any) -> int:
    """A prompt key as a non-negative int64: an int as it is, anything else (text, chat messages) hashed stably
    (the same id on every process and in every run)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) >= 0:
        return int(value)
    digest = hashlib.blake2b(repr(value).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class RolloutLogCallback(TrainerCallback):
    """Writes the rollout log of a plain ``GRPOTrainer`` run (``rollouts.parquet``, the schema of
    ``rlvr_core.rollout_log``: step, prompt_id, rollouts, passes, reward_sum, tokens), so that
    ``rlvr-alloc advise`` can say whether an allocator would pay on it (docs/advisor.md)::

        log = RolloutLogCallback("out/rollouts.parquet")
        trainer = GRPOTrainer(model=..., reward_funcs=[log.wrap(correct)], args=..., train_dataset=ds,
                              callbacks=[log])

    ``wrap(func)`` returns the reward function unchanged in what it returns to TRL; it records, per completion of
    a training step, the prompt's key (the dataset column ``id_column`` where it exists, else the prompt itself,
    hashed by ``stable_prompt_id``), the reward (a pass is a reward > 0) and the completion's token count. Wrap
    the pass/fail verifier, not a shaping reward. Calls outside a training step (evaluation) are not recorded.

    The file is rewritten atomically at every step end, checkpoint and at the end of training; a run resumed from
    the checkpoint of step s keeps the file's rows of steps <= s (``RolloutLog``). Under several processes each
    records its own share of the completions: process r > 0 writes ``<stem>.rank<r>.parquet`` beside ``path``.
    """

    def __init__(self, path: str | os.PathLike, *, id_column: str = "id") -> None:
        self.path = Path(path)
        self.id_column = id_column
        self.log: Any = None
        self._in_step = False
        self.unscored = 0  # completions the wrapped function returned None or a non-finite reward for (left out)
        self._warned = False

    def _rank_path(self) -> Path:
        rank = int(os.environ.get("RANK", "0"))
        return self.path if rank == 0 else self.path.with_name(f"{self.path.stem}.rank{rank}{self.path.suffix}")

    def wrap(self, func: Any) -> Any:
        """``func`` as a TRL reward function whose every call in a training step is recorded."""
        cb = self

        def recorded(prompts, completions, completion_ids=None, trainer_state=None, **kwargs):
            rewards = func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                           trainer_state=trainer_state, **kwargs)
            if cb._in_step and cb.log is not None and trainer_state is not None:
                keys = kwargs.get(cb.id_column) or prompts
                r = np.asarray([np.nan if x is None else float(x) for x in rewards], np.float64)
                ids = np.asarray([stable_prompt_id(q) for q in keys], np.int64)
                toks = np.asarray([len(c) for c in completion_ids] if completion_ids is not None
                                  else [len(str(c)) for c in completions], np.int64)
                keep = np.isfinite(r)
                if not keep.all():
                    cb.unscored += int((~keep).sum())
                    if not cb._warned:
                        cb._warned = True
                        warnings.warn(f"RolloutLogCallback: {recorded.__name__} returned None or a non-finite "
                                      f"reward for {int((~keep).sum())} completion(s) of step "
                                      f"{int(trainer_state.global_step) + 1}; they are left out of {cb.path} "
                                      "(counted in .unscored); wrap the pass/fail verifier", stacklevel=2)
                cb.log.add(int(trainer_state.global_step) + 1, Rollouts(ids[keep], r[keep], toks[keep]))
            return rewards

        recorded.__name__ = getattr(func, "__name__", type(func).__name__)
        return recorded

    def on_train_begin(self, args, state, control, **kwargs):
        from rlvr_core.rollout_log import RolloutLog

        self.log = RolloutLog(self._rank_path(), rows=[], upto=int(state.global_step))

    def on_step_begin(self, args, state, control, **kwargs):
        self._in_step = True

    def on_step_end(self, args, state, control, **kwargs):
        self._in_step = False
        if self.log is not None:
            self.log.end_step(int(state.global_step))
            self.log.flush()

    def on_save(self, args, state, control, **kwargs):
        if self.log is not None:
            self.log.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.log is not None:
            self.log.flush()


__all__ = ["AllocatedGRPOTrainer", "LEGACY_STATE_FILE", "REWARD_THRESHOLD", "RolloutLogCallback", "STATE_DIR",
           "SamplerOrderSource", "allocation_state_folder", "check_allocation_state", "convert_state",
           "read_allocation_state", "stable_prompt_id"]


if __name__ == "__main__":
    sys.exit(main())
