"""Every check a training run can fail before it loads weights or generates anything, done once.

``preflight`` checks a run's inputs and returns them as ``CheckedInputs``, with what the checks resolved
and built: the device (``"auto"`` resolved), the allocator's parameters (e.g. ``SARAParams``, built and
checked from ``train.allocator_params``) and the training split's digest. ``rlvr_core.training.train``
takes that object and checks nothing again; called without it, ``train`` runs ``preflight`` itself. The
train flow calls ``preflight`` before MLflow opens a run, so a bad input fails before anything is tracked.

The checks, in order:

- the splits (``rlvr_core.data.validate.validate_splits`` with the task's row schema);
- the policy folder: its files against the sha256 its ``sha256.json`` records (``check_policy_files``: a
  flipped bit is refused naming the file), then ``check_policy_folder``, and the prompts against its
  tokenizer and position limit (``check_against_policy``: every prompt encodes, characters outside the tiny
  policy's vocabulary included, and prompt + ``max_new_tokens`` fits the model's positions; only the
  tokenizer and config.json are read, no weights);
- the device (cuda on a machine without one fails here);
- the allocator parameters;
- a checkpoint in the run folder written in the refused pickle format, with other trajectory settings
  (``TRAJECTORY_KEYS``), on other data (``data_digest``), from another policy (``policy_digest``: the warm
  start was replaced since the run started), or further than ``train.steps``
  (``check_resumable``);
- the state of the checkpoint a resume would load (its trainer's tensors aside), even one whose hashes
  were recomputed after an edit: every restored counter a whole number >= 0 that metrics.jsonl accounts
  for, and the RNG, prompt source, engine and allocator states shaped as a run writes them
  (``check_restored_state``; ``train`` checks the state it restores again, the trainer's included).

The settings themselves (names, ranges) were checked when the ``TrainConfig`` was built.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from rlvr_core.allocation import ALLOCATORS, PromptSource
from rlvr_core.allocation.base import AllocatorParams, build_params
from rlvr_core.checkpoint import CheckpointError, check_format, latest_manifest, load_latest, step_folder_name
from rlvr_core.config import TrainConfig, limits
from rlvr_core.data.validate import DataError, validate_splits
from rlvr_core.errors import ConfigError, short_repr
from rlvr_core.models.integrity import check_policy_files
from rlvr_core.models.policy import check_policy_folder, is_tiny_policy, policy_prompts, resolve_device
from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.models.tiny import load_policy as load_tiny
from rlvr_core.models.tokenizer import check_text, vocabulary_problems
from rlvr_core.rollout import ENGINES
from rlvr_core.rollout.base import encode_prompt_pool
from rlvr_core.tasks import TASKS
from rlvr_core.types import plain

__all__ = ["CheckedInputs", "RESUMABLE_KEYS", "TRAJECTORY_KEYS", "check_against_policy", "check_prompts_fit",
           "check_resumable", "data_digest", "position_limit", "preflight"]

# Keys a resumed run may change: how long it runs and how it is kept, not what it computes. A device
# or threads change (a run moved to another machine) is allowed too. Every other train key (TRAJECTORY_KEYS) shapes
# the trajectory or what its records mean, and a checkpoint only resumes under the same values. That
# includes the evaluation keys (eval_every, eval_size, eval_samples): a run's eval curve is one evaluation
# set at one cadence, so a change is refused rather than recorded half-way through.
RESUMABLE_KEYS: tuple[str, ...] = ("allocators", "seeds", "steps", "max_rollouts", "checkpoint_every", "keep_last",
                                   "max_nonfinite", "engine_retries", "engine_retry_delay_s", "device",
                                   "compute_entropy", "max_verifier_error_share", "verifier_workers",
                                   "allow_no_update", "threads")
TRAJECTORY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TrainConfig) if f.name not in RESUMABLE_KEYS)


def data_digest(rows: Sequence[Mapping[str, Any]]) -> str:
    """sha256 over the prompts in order: identifies the training split a checkpoint belongs to."""
    h = hashlib.sha256()
    for r in rows:
        h.update(r["prompt"].encode())
        h.update(b"\0")
    return h.hexdigest()


def check_resumable(saved: Mapping[str, Any], cfg: TrainConfig, digest: str, where: str,
                    step: int | None = None, *, policy: str | None = None,
                    policy_dir: str | os.PathLike | None = None) -> None:
    """Raise ConfigError unless a checkpoint (its state, or its manifest's meta) was written under ``cfg``'s
    trajectory settings (``TRAJECTORY_KEYS``), on the same training split (``data_digest``), from the same
    policy (``policy``: the ``policy_digest`` of ``policy_dir``, when given) and at a ``step`` no later than
    ``cfg.steps`` (a shorter run cannot be had from a longer one). A checkpoint that does not record every
    trajectory key and the digests is refused: what it does not record could differ."""
    old, new = saved.get("config"), asdict(cfg)
    missing = [k for k in TRAJECTORY_KEYS if not isinstance(old, Mapping) or k not in old]
    if missing or not isinstance(saved.get("data_digest"), str):  # a setting it does not record could differ
        what = f"train.{', train.'.join(missing[:4])}{', ...' if len(missing) > 4 else ''}" if missing else \
            "the training split's digest"
        raise ConfigError(f"{where}: cannot resume, the checkpoint does not record {what}, so a changed setting "
                          "could not be told; start a fresh run folder")
    changed = [k for k in TRAJECTORY_KEYS if plain(old[k]) != plain(new[k])]
    if changed:
        diffs = ", ".join(f"train.{k}={short_repr(old[k])} there, {short_repr(new[k])} now" for k in changed)
        raise ConfigError(f"{where}: cannot resume, the run was started with other settings ({diffs}); "
                          "use the same settings, or start a fresh run folder")
    if saved["data_digest"] != digest:
        raise ConfigError(f"{where}: cannot resume, the run was trained on a different training split "
                          "(prompt digest differs); use the same data, or start a fresh run folder")
    if policy is not None:
        _check_same_policy(saved.get("policy_digest"), policy, where, policy_dir)
    if step is not None and step > cfg.steps:
        raise ConfigError(f"{where}: cannot resume, the run already has {step} steps done, more than "
                          f"train.steps={cfg.steps}; ask for {step} or more steps, or start a fresh run folder")


def _check_same_policy(started: Any, policy: str, where: str, policy_dir: str | os.PathLike | None) -> None:
    """ConfigError unless ``started`` (the policy digest a checkpoint records) is ``policy``: the warm start the
    run started from is still the one in ``policy_dir`` (its weights, config and tokenizer; the KL reference and
    the architecture come from there on resume)."""
    folder = f"policy folder {str(policy_dir)!r}" if policy_dir is not None else "the policy folder"
    if not isinstance(started, str):
        raise ConfigError(f"{where}: cannot resume, the checkpoint does not record the digest of the policy the "
                          f"run started from, so a changed {folder} could not be told; start a fresh run folder")
    if started != policy:
        raise ConfigError(f"{where}: cannot resume, the run started from another policy than {folder} holds now "
                          f"(policy digest {started} there, {policy} now: the warm start was replaced or changed); "
                          "put back the policy the run started from, or start a fresh run folder")


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def position_limit(model_config: Any, tokenizer: Any) -> int | None:
    """Most tokens (prompt + completion) the policy handles: the smaller of the model config's
    position limit and the tokenizer's ``model_max_length`` (ignored when it is the "unset" huge value)."""
    limits = []
    for key in _POSITION_KEYS:
        v = model_config.get(key) if isinstance(model_config, Mapping) else getattr(model_config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            limits.append(v)
            break
    v = getattr(tokenizer, "model_max_length", None)
    if isinstance(v, int) and 0 < v < 10**7:
        limits.append(v)
    return min(limits) if limits else None


def check_prompts_fit(rows: Sequence[Mapping[str, Any]], tokenizer: Any, task: str, split: str, *,
                      max_new_tokens: int, max_positions: int | None, source: str | None = None) -> None:
    """Raise DataError unless every row's prompt can be given to the policy and completed.

    The prompt is what the policy reads (``policy_prompts``: the chat template when the tokenizer
    has one). For the tiny character-level policy each character must be in its vocabulary
    (``check_text``); any tokenizer must encode it; and its tokens plus ``max_new_tokens`` must fit
    ``max_positions`` (None: no limit known). A prompt too long for the model would otherwise be a
    deterministic out-of-memory or garbage far past the trained positions.
    """
    where = f"{source}: " if source else ""
    texts = policy_prompts(tokenizer, rows, task)
    if not vocabulary_problems(tokenizer):  # the tiny character tokenizer: it fails opaquely on other characters
        for i, text in enumerate(texts):
            try:
                check_text(text, what="prompt")
            except (TypeError, ValueError) as e:
                raise DataError(f"{where}{split} row {i} ({rows[i].get('id')!r}): {str(e)[:400]}") from None
    try:
        ids = encode_prompt_pool(tokenizer, texts)
    except Exception:  # noqa: BLE001 - find the row that does not encode
        for i, text in enumerate(texts):
            try:
                encode_prompt_pool(tokenizer, [text])
            except Exception as e:  # noqa: BLE001
                raise DataError(f"{where}{split} row {i} ({rows[i].get('id')!r}): the prompt does not encode with "
                                f"the policy's tokenizer ({e.__class__.__name__}: {str(e)[:300]})") from None
        raise
    if max_positions is None:
        return
    for i, prompt_ids in enumerate(ids):
        if len(prompt_ids) + max_new_tokens > max_positions:
            longest = max(len(p) for p in ids)
            too_long = sum(len(p) + max_new_tokens > max_positions for p in ids)
            raise DataError(
                f"{where}{split} row {i} ({rows[i].get('id')!r}): the prompt is {len(prompt_ids)} tokens "
                f"({len(texts[i])} characters); with train.max_new_tokens={max_new_tokens} it needs "
                f"{len(prompt_ids) + max_new_tokens} positions, but the policy holds {max_positions} "
                f"({too_long} of {len(ids)} {split} rows are too long, the longest {longest} tokens): shorten or "
                "drop those rows, or lower train.max_new_tokens")


def check_against_policy(train_rows: Sequence[Mapping[str, Any]], test_rows: Sequence[Mapping[str, Any]],
                         policy_dir: str | Path, task: str, *, max_new_tokens: int, source: str | None = None) -> None:
    """``check_prompts_fit`` on both splits with the tokenizer and position limit of the policy folder
    (the tokenizer and config.json only: no weights are loaded for a pretrained model)."""
    from transformers import AutoTokenizer

    path = Path(policy_dir)
    try:
        config = json.loads((path / "config.json").read_text())
        tok = load_tiny(path)[1] if is_tiny_policy(path) else AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - check_policy_folder names folder problems; this is a fallback
        raise PolicyLoadError(f"policy folder {str(path)!r}: could not read its tokenizer or config "
                              f"({e.__class__.__name__}: {str(e)[:300]})") from e
    limit = position_limit(config, tok)
    check_prompts_fit(train_rows, tok, task, "train", max_new_tokens=max_new_tokens, max_positions=limit,
                      source=source)
    check_prompts_fit(test_rows, tok, task, "test", max_new_tokens=max_new_tokens, max_positions=limit, source=source)


@dataclass(frozen=True, eq=False)
class CheckedInputs:
    """A training run's inputs as ``preflight`` checked them, with what the checks resolved and built.

    cfg, task: the ``train`` section and the task (verifier) name
    policy_dir, run_dir: the policy folder and the run folder
    train_rows, test_rows: the splits, as lists
    device: the device the run uses (``cfg.device`` or the override, ``"auto"`` resolved)
    allocator_cls, allocator_params: the registered class of ``cfg.allocator`` and its ``Params``, built
        and checked from ``cfg.allocator_kwargs()`` (``make_allocator`` builds a fresh allocator from them)
    digest: ``data_digest(train_rows)``, which a checkpoint records
    policy_digest: the ``rlvr_core.models.integrity.policy_digest`` of ``policy_dir`` (its files checked against
        its ``sha256.json``), which a checkpoint records too
    """

    cfg: TrainConfig
    task: str
    policy_dir: Path
    run_dir: Path
    train_rows: list[Mapping[str, Any]]
    test_rows: list[Mapping[str, Any]]
    device: str
    allocator_cls: type
    allocator_params: AllocatorParams
    digest: str
    policy_digest: str = ""

    def make_allocator(self) -> Any:
        """A fresh allocator of ``cfg.allocator`` with the checked parameters."""
        return self.allocator_cls(self.allocator_params)


def preflight(cfg: TrainConfig, task: str, train_rows: Sequence[Mapping[str, Any]],
              test_rows: Sequence[Mapping[str, Any]], policy_dir: str | os.PathLike,
              run_dir: str | os.PathLike, *, source: str | None = None, device: str | None = None,
              resume: bool = True) -> CheckedInputs:
    """Check a run's inputs (see the module docstring) and return them with what the checks built.

    ``source`` names the data in error messages; ``device`` overrides ``cfg.device``; with ``resume``
    False the checkpoints in ``run_dir`` are not looked at (the run starts afresh).

    Raises:
        ConfigError (DataError, PolicyLoadError, CheckpointError) naming what is wrong and the fix.
    """
    train_rows = train_rows if isinstance(train_rows, list) else list(train_rows)
    test_rows = test_rows if isinstance(test_rows, list) else list(test_rows)
    validate_splits(train_rows, test_rows, TASKS.get(task) if task in TASKS else None, source=source)
    # its files against their sha256.json first: a damaged file is named before anything parses it
    policy = check_policy_files(policy_dir) if Path(policy_dir).is_dir() else ""
    check_policy_folder(policy_dir)  # PolicyLoadError names the folder and what is wrong with it
    # prompts outside the tokenizer's vocabulary, or too long for the model's positions (a certain OOM)
    check_against_policy(train_rows, test_rows, policy_dir, task, max_new_tokens=cfg.max_new_tokens, source=source)
    resolved = resolve_device(cfg.device if device is None else device)  # cuda on a machine without one fails here
    cls = ALLOCATORS.get(cfg.allocator)  # the name TrainConfig checked
    params = build_params(cls.Params, cfg.allocator, cfg.allocator_kwargs())  # allocator_params are checked here
    if resolved == "cpu":  # an update's logits in host memory: micro_batch's ceiling needs the policy's vocabulary
        check_update_memory(cfg, policy_dir, int(cls(params).max_rollouts_per_step))
    digest = data_digest(train_rows)
    if resume and (latest := latest_manifest(Path(run_dir) / "checkpoints")) is not None:
        check_format(*latest)  # CheckpointError for a pickle-format checkpoint
        check_resumable(latest[1].get("meta", {}), cfg, digest, str(latest[0]), step=latest[1].get("step"),
                        policy=policy, policy_dir=policy_dir)
        _check_checkpoint_state(cfg, Path(run_dir), cls(params), len(train_rows))
    return CheckedInputs(cfg, task, Path(policy_dir), Path(run_dir), train_rows, test_rows, resolved, cls, params,
                         digest, policy)


def check_update_memory(cfg: TrainConfig, policy_dir: str | os.PathLike, step_rollouts: int) -> None:
    """ConfigError when one forward pass of the update cannot fit the host: its float32 logits alone are
    min(micro_batch, the step's rollouts) x max_new_tokens x the policy's vocabulary x 4 bytes (a floor: the
    prompt's positions and the activations come on top). ``train.micro_batch`` is named, with the ceiling."""
    try:
        vocab = int(json.loads((Path(policy_dir) / "config.json").read_text()).get("vocab_size") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return  # check_policy_folder has read it; a folder without one is a hub id's snapshot resolved later
    rows = min(cfg.micro_batch, max(1, step_rollouts))
    per_row = cfg.max_new_tokens * max(vocab, 1) * 4
    limits.check_memory("micro_batch", cfg.micro_batch, rows * per_row,
                        f"an update's forward pass over {rows:,} sequences (float32 logits: {cfg.max_new_tokens:,} "
                        f"completion tokens x a vocabulary of {vocab:,} each)")


# ----------------------------------------------------------------------------- a checkpoint's restored state

RESUME_FIX = ("cannot resume: no run writes this (the file was edited, or damaged before a checkpoint's hashes were "
              "recorded); restore the run folder from a copy, or start a fresh run folder")
_WHOLE = "must be a whole number >= 0 (an int, not a bool or float)"


def resume_refused(where: str, problem: str, sep: str = ": ") -> CheckpointError:
    """The CheckpointError refusing a resume: ``where`` (a file), what is wrong there, and what to do."""
    return CheckpointError(f"{where}{sep}{problem}; {RESUME_FIX}")


def _whole(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _count_problem(value: Any, path: str) -> str | None:
    """None for a whole number >= 0, else what is wrong with ``value`` (at ``path``)."""
    return None if _whole(value) and value >= 0 else f"{path} = {short_repr(value)}: {_WHOLE}"


def _keys_problem(value: Mapping[Any, Any], example: Mapping[Any, Any], path: str, *,
                  more: bool = False) -> str | None:
    """What differs between the keys of ``value`` and of ``example`` (``more``: keys beyond the example's are fine)."""
    missing = [k for k in example if k not in value]
    extra = [] if more else [k for k in value if k not in example]
    if not missing and not extra:
        return None
    words = [f"missing {', '.join(sorted(map(repr, missing)))}"] if missing else []
    words += [f"unexpected {', '.join(sorted(map(short_repr, extra)))[:200]}"] if extra else []
    return f"{path}: {'; '.join(words)}"


def _leaf_problem(value: Any, example: Any, path: str) -> str | None:
    """``_conform`` for a value that is not a container: the same kind as ``example``."""
    if isinstance(example, (bool, np.bool_)):
        ok, why = isinstance(value, (bool, np.bool_)), "must be true or false"
    elif _whole(example):
        ok, why = _whole(value) and value >= 0, _WHOLE
    elif isinstance(example, (float, np.floating)):
        ok, why = isinstance(value, (float, np.floating)) and math.isfinite(value), "must be a finite float"
    elif isinstance(example, str):
        ok, why = value == example, f"must be {example!r}"
    elif example is None:
        ok, why = value is None, "must be None"
    elif isinstance(example, (np.ndarray, torch.Tensor)):
        ok = type(value) is type(example) and value.dtype == example.dtype and value.shape == example.shape
        why = f"must be {'an array' if isinstance(example, np.ndarray) else 'a tensor'} of {example.dtype} " \
              f"and shape {tuple(example.shape)}"
        value = f"{type(value).__name__}" + (f" of {value.dtype}, shape {tuple(value.shape)}"
                                             if hasattr(value, "dtype") and hasattr(value, "shape") else "")
        return None if ok else f"{path}: {value}: {why}"
    else:
        ok, why = type(value) is type(example), f"must be a {type(example).__name__}"
    return None if ok else f"{path} = {short_repr(value)}: {why}"


def _conform(value: Any, example: Any, path: str) -> str | None:
    """What makes ``value`` unlike ``example`` (a fresh component's state), None if nothing: mappings with the same
    keys, tuples of the same length, item by item; a list's items each like the example's first (any items when it
    is empty); leaves of the same kind (``_leaf_problem``: whole numbers >= 0, finite floats, equal strings, arrays
    and tensors of the same dtype and shape)."""
    if isinstance(example, Mapping):
        if not isinstance(value, Mapping):
            return f"{path} = {short_repr(value)}: must be a mapping"
        problem = _keys_problem(value, example, path)
        for key in example if problem is None else ():
            problem = problem or _conform(value[key], example[key], f"{path}.{key}")
        return problem
    if isinstance(example, (tuple, list)):
        if type(value) is not type(example) or (isinstance(example, tuple) and len(value) != len(example)):
            return f"{path} = {short_repr(value)}: must be a {type(example).__name__}" + \
                (f" of {len(example)} items" if isinstance(example, tuple) else "")
        items = example if isinstance(example, tuple) else [example[0]] * len(value) if example else []
        for i, (v, e) in enumerate(zip(value, items)):
            if (problem := _conform(v, e, f"{path}[{i}]")) is not None:
                return problem
        return None
    return _leaf_problem(value, example, path)


def _run_counters_problem(saved: Mapping[str, Any]) -> str | None:
    """What is wrong with the run's own counters (``RunState``, the scorer's counts), None if nothing."""
    for key in ("step", "nonfinite_run", "cum", "verifier_errors", "rng", "allocator", "source", "engine"):
        if key not in saved:
            return f"{key}: missing"
    for key in ("step", "nonfinite_run", "verifier_errors", "verifier_timeouts"):
        if key in saved and (problem := _count_problem(saved[key], key)) is not None:
            return problem
    cum = saved["cum"]
    if not isinstance(cum, Mapping):
        return f"cum = {short_repr(cum)}: must be a mapping of rollouts and tokens"
    if (problem := _keys_problem(cum, {"rollouts": 0, "tokens": 0}, "cum")) is not None:
        return problem
    return _count_problem(cum["rollouts"], "cum.rollouts") or _count_problem(cum["tokens"], "cum.tokens")


def _allocator_problem(value: Any, example: Mapping[str, Any]) -> str | None:
    """``allocator``: the keys of a fresh allocator's state, its name, RNG and flags, counters >= 0, the ledger's
    keys and at least the extra state's keys (``Allocator.state_dict``); a checkpoint is written between steps."""
    if not isinstance(value, Mapping):
        return f"allocator = {short_repr(value)}: must be a mapping"
    problem = _keys_problem(value, example, "allocator")
    for key in ("name", "rng", "done", "pending") if problem is None else ():
        problem = problem or _conform(value[key], example[key], f"allocator.{key}")
    if problem is not None:
        return problem
    if value["in_step"] is not False:
        return f"allocator.in_step = {short_repr(value['in_step'])}: must be False (checkpoints are written between " \
               "steps)"
    counters = value["counters"]
    if not isinstance(counters, Mapping) or not all(isinstance(k, str) for k in counters):
        return f"allocator.counters = {short_repr(counters)}: must be a mapping of names to counts"
    for name, count in counters.items():
        problem = problem or _count_problem(count, f"allocator.counters.{name}")
    for key, more in (("ledger", False), ("extra", True)):
        if problem is None and not isinstance(value[key], Mapping):
            problem = f"allocator.{key} = {short_repr(value[key])}: must be a mapping"
        problem = problem or _keys_problem(value[key], example[key], f"allocator.{key}", more=more)
    return problem


def _source_problem(value: Any, example: Mapping[str, Any]) -> str | None:
    """``source``: like a fresh ``PromptSource``'s state over the same prompts; its order a permutation of them,
    its position inside it, the prompts it gave back ids of the pool."""
    if (problem := _conform(value, example, "source")) is not None:
        return problem
    ids, order, pos = value["ids"], value["order"], value["pos"]
    if not np.array_equal(ids, example["ids"]):
        return f"source.ids: are not the training split's prompt ids 0..{len(example['ids']) - 1}"
    if not np.array_equal(np.sort(order), np.sort(ids)):
        return "source.order: must be a permutation of source.ids"
    if pos > len(order):
        return f"source.pos = {pos}: must be at most {len(order)} (the epoch's length)"
    pool = set(ids.tolist())
    for i, q in enumerate(value["front"]):
        if not _whole(q) or int(q) not in pool:
            return f"source.front[{i}] = {short_repr(q)}: must be a prompt id of the training split"
    return None


def _trainer_problem(value: Any, example: Mapping[str, Any]) -> str | None:
    """``trainer``: the keys of ``GRPOTrainer.state_dict``, the policy's weights by name, dtype and shape, a
    count of updates; the optimizer's state is checked by its ``load_state_dict``."""
    if not isinstance(value, Mapping):
        return f"trainer = {short_repr(value)}: must be a mapping"
    if (problem := _keys_problem(value, example, "trainer")) is not None:
        return problem
    if (problem := _conform(value["model"], example["model"], "trainer.model")) is not None:
        return problem
    if not isinstance(value["optimizer"], Mapping):
        return f"trainer.optimizer = {short_repr(value['optimizer'])}: must be a mapping"
    return _count_problem(value["steps"], "trainer.steps")


def _components_problem(saved: Mapping[str, Any], cfg: TrainConfig, examples: Mapping[str, Any]) -> str | None:
    """What is wrong with the restored components' states against ``examples`` (see ``check_restored_state``)."""
    rng_example = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    problem = _conform(saved["rng"], rng_example, "rng")
    problem = problem or _allocator_problem(saved["allocator"], examples["allocator"])
    problem = problem or _source_problem(saved["source"], examples["source"])
    engine, engine_example = saved["engine"], examples.get("engine")
    if problem is None and not isinstance(engine, Mapping):
        problem = f"engine = {short_repr(engine)}: must be a mapping"
    if problem is None and engine_example is not None:
        problem = _conform(engine, engine_example, "engine")
        if problem is None and "seed" in engine_example and engine["seed"] != cfg.seed:
            problem = f"engine.seed = {short_repr(engine['seed'])}: is not train.seed = {cfg.seed}"
    if problem is None and examples.get("trainer") is not None:
        problem = "trainer: missing" if "trainer" not in saved else _trainer_problem(saved["trainer"],
                                                                                      examples["trainer"])
    return problem


def _check_checkpoint_state(cfg: TrainConfig, run_dir: Path, allocator: Any, n_prompts: int) -> None:
    """``check_restored_state`` on the checkpoint a resume of ``run_dir`` would load, read without the trainer's
    tensors (the policy's weights and optimizer moments are checked when ``train`` restores them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # train's restore reports the damaged ones it skips
        latest = load_latest(run_dir / "checkpoints", without=("trainer",))
    if latest is None:
        return
    step, saved = latest
    fresh_engine = getattr(ENGINES.get(cfg.engine), "fresh_state", None)
    examples = {"allocator": allocator.state_dict(), "source": PromptSource(n_prompts, seed=cfg.seed).state_dict(),
                "engine": fresh_engine(cfg.seed) if fresh_engine is not None else None}
    check_restored_state(saved, run_dir / "checkpoints" / step_folder_name(step), run_dir / "metrics.jsonl", cfg,
                         examples)


def _step_record(line: str) -> dict[str, Any] | None:
    """A metrics.jsonl line as its record, None unless it is a JSON object with a whole-number ``step`` >= 0."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) and _whole(rec.get("step")) and rec["step"] >= 0 else None


def numbered_step_records(path: str | os.PathLike, upto: int) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) of every record of a metrics.jsonl-like file with ``step <= upto``, in file order.

    Every line must be a JSON object with a whole-number step, else CheckpointError names the line; only a last
    line without its newline (an append cut by a crash) may be anything, and is dropped unless it parses.
    A missing file has no records.
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise resume_refused(str(path), f"unreadable ({e.__class__.__name__}: {str(e)[:200]})") from None
    cut = lines.pop()  # "" when the file ends with a newline
    out = []
    for number, line in enumerate(lines, 1):
        if (rec := _step_record(line)) is None:
            raise resume_refused(f"{path} line {number}", f"not a JSON object with a whole-number step "
                                                          f"({short_repr(line, 80)})")
        if rec["step"] <= upto:
            out.append((number, rec))
    if cut and (rec := _step_record(cut)) is not None and rec["step"] <= upto:
        out.append((len(lines) + 1, rec))
    return out


def read_step_records(path: str | os.PathLike, upto: int) -> list[dict[str, Any]]:
    """The records of ``numbered_step_records``, without their line numbers."""
    return [rec for _, rec in numbered_step_records(path, upto)]


def _records_problem(records: Sequence[tuple[int, dict[str, Any]]], step: int) -> str | None:
    """What makes metrics.jsonl's records up to checkpoint ``step`` not one run's account of it (see
    ``check_restored_state``), as "line N (step S): ..." or "holds no ...", None if nothing."""
    rollouts = tokens = 0
    for expected, (line, rec) in enumerate(records):
        if rec["step"] != expected:
            return f"line {line}: step {rec['step']} follows step {expected - 1}" if expected else \
                f"line {line}: step {rec['step']} comes first, not step 0"
        at = f"line {line} (step {expected})"
        counts = ("rollouts", "tokens", "cum_rollouts", "cum_tokens", "verifier_errors") if expected else \
            ("cum_rollouts", "cum_tokens")
        for key in counts + (("verifier_timeouts",) if expected and "verifier_timeouts" in rec else ()):
            if (problem := _count_problem(rec.get(key), key)) is not None:
                return f"{at}: {problem}" if key in rec else f"{at}: {key}: missing"
        if expected and (isinstance(rec.get("nonfinite"), str) or rec.get("nonfinite") not in (0, 1)):
            return f"{at}: nonfinite = {short_repr(rec.get('nonfinite'))}: must be 0 or 1"
        rollouts, tokens = rollouts + rec.get("rollouts", 0), tokens + rec.get("tokens", 0)
        for key, total in (("cum_rollouts", rollouts), ("cum_tokens", tokens)):
            if rec[key] != total:
                return f"{at}: {key} = {rec[key]} is not the sum of the steps' {key[4:]} ({total})"
    if len(records) != step + 1:
        return f"holds no record of step {len(records)}, though the checkpoint is of step {step}"
    return None


def _disagreement(saved: Mapping[str, Any], records: Sequence[tuple[int, dict[str, Any]]], name: str) -> str | None:
    """The first restored counter that is not what metrics.jsonl's records say (they passed ``_records_problem``)."""
    line, last = records[-1]
    at = f"{name} line {line} (step {last['step']})"
    cum = saved["cum"]
    pairs = (("cum.rollouts", cum["rollouts"], "cum_rollouts"), ("cum.tokens", cum["tokens"], "cum_tokens"),
             ("verifier_errors", saved["verifier_errors"], "verifier_errors"),
             ("verifier_timeouts", saved.get("verifier_timeouts", 0), "verifier_timeouts"))
    for field_name, value, key in pairs:
        if value != last.get(key, 0):
            return f"{field_name} = {value} disagrees with {at}: {key} = {last.get(key, 0)}"
    run = 0
    for _, rec in reversed(records[1:]):
        if not rec.get("nonfinite"):
            break
        run += 1
    if saved["nonfinite_run"] != run:
        return f"nonfinite_run = {saved['nonfinite_run']} disagrees with {name}: {run} non-finite update(s) in a " \
               f"row end at step {last['step']}"
    return None


def check_restored_state(saved: Any, folder: str | os.PathLike, metrics_path: str | os.PathLike, cfg: TrainConfig,
                         examples: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Raise CheckpointError (``resume_refused``: the file, the field and its value) unless a checkpoint's state
    is one a run could have written and metrics.jsonl accounts for it; return metrics.jsonl's records up to it.

    - the run's counters (``step``, ``nonfinite_run``, ``cum.rollouts``, ``cum.tokens``, ``verifier_errors``,
      ``verifier_timeouts``): present, whole numbers >= 0 (a bool, a float, a NaN or a string is refused);
    - ``rng``, ``source``, ``engine`` and ``allocator`` (``trainer`` too when ``examples`` has it): shaped like the
      ``examples``, fresh components' ``state_dict()`` (the engine's may be None: any mapping), see ``_conform``;
      the engine's seed is ``train.seed``, the source's prompts the training split's;
    - metrics.jsonl (``metrics_path``): every line a record (``numbered_step_records``); steps 0..step, each once,
      in order, counts whole numbers >= 0, each ``cum_rollouts``/``cum_tokens`` the sum of the steps' so far;
      the last record's cumulative counts and verifier counts equal the state's, and its trailing non-finite
      updates are ``nonfinite_run``.
    """
    where = str(Path(folder) / "state.json")
    if not isinstance(saved, Mapping):
        raise resume_refused(where, f"the state is a {type(saved).__name__}, not a JSON object")
    problem = _run_counters_problem(saved) or _components_problem(saved, cfg, examples)
    if problem is not None:
        raise resume_refused(where, problem)
    metrics_path = Path(metrics_path)
    records = numbered_step_records(metrics_path, upto=saved["step"])
    if (problem := _records_problem(records, saved["step"])) is not None:
        raise resume_refused(str(metrics_path), problem, sep=" ")
    if (problem := _disagreement(saved, records, metrics_path.name)) is not None:
        raise resume_refused(where, problem)
    return [rec for _, rec in records]
