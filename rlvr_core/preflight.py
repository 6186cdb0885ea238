"""Every check a training run can fail before it loads weights or generates anything, done once.

``preflight`` checks a run's inputs and returns them as ``CheckedInputs``, with what the checks resolved
and built: the device (``"auto"`` resolved), the allocator's parameters (e.g. ``SARAParams``, built and
checked from ``train.allocator_params``) and the training split's digest. ``rlvr_core.training.train``
takes that object and checks nothing again; called without it, ``train`` runs ``preflight`` itself. The
train flow calls ``preflight`` before MLflow opens a run, so a bad input fails before anything is tracked.

The checks, in order:

- the splits (``rlvr_core.data.validate.validate_splits`` with the task's row schema);
- the policy folder (``check_policy_folder``), and the prompts against its tokenizer and position limit
  (``check_against_policy``: every prompt encodes, characters outside the tiny policy's vocabulary
  included, and prompt + ``max_new_tokens`` fits the model's positions; only the tokenizer and
  config.json are read, no weights);
- the device (cuda on a machine without one fails here);
- the allocator parameters;
- a checkpoint in the run folder written in the refused pickle format, with other trajectory settings
  (``TRAJECTORY_KEYS``), on other data (``data_digest``), or further than ``train.steps``
  (``check_resumable``).

The settings themselves (names, ranges) were checked when the ``TrainConfig`` was built.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlvr_core.allocation import ALLOCATORS
from rlvr_core.allocation.base import AllocatorParams, build_params
from rlvr_core.checkpoint import check_format, latest_manifest
from rlvr_core.config import TrainConfig
from rlvr_core.data.validate import DataError, validate_splits
from rlvr_core.errors import ConfigError, short_repr
from rlvr_core.models.policy import check_policy_folder, is_tiny_policy, policy_prompts, resolve_device
from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.models.tiny import load_policy as load_tiny
from rlvr_core.models.tokenizer import check_text, vocabulary_problems
from rlvr_core.rollout.base import encode_prompt_pool
from rlvr_core.tasks import TASKS

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
                    step: int | None = None) -> None:
    """Raise ConfigError unless a checkpoint (its state, or its manifest's meta) was written under ``cfg``'s
    trajectory settings (``TRAJECTORY_KEYS``), on the same training split (``data_digest``), and at a
    ``step`` no later than ``cfg.steps`` (a shorter run cannot be had from a longer one). A checkpoint that
    does not record every trajectory key and the digest is refused: what it does not record could differ."""
    old, new = saved.get("config"), asdict(cfg)
    missing = [k for k in TRAJECTORY_KEYS if not isinstance(old, Mapping) or k not in old]
    if missing or not isinstance(saved.get("data_digest"), str):  # a setting it does not record could differ
        what = f"train.{', train.'.join(missing[:4])}{', ...' if len(missing) > 4 else ''}" if missing else \
            "the training split's digest"
        raise ConfigError(f"{where}: cannot resume, the checkpoint does not record {what}, so a changed setting "
                          "could not be told; start a fresh run folder")
    changed = [k for k in TRAJECTORY_KEYS if _plain(old[k]) != _plain(new[k])]
    if changed:
        diffs = ", ".join(f"train.{k}={short_repr(old[k])} there, {short_repr(new[k])} now" for k in changed)
        raise ConfigError(f"{where}: cannot resume, the run was started with other settings ({diffs}); "
                          "use the same settings, or start a fresh run folder")
    if saved["data_digest"] != digest:
        raise ConfigError(f"{where}: cannot resume, the run was trained on a different training split "
                          "(prompt digest differs); use the same data, or start a fresh run folder")
    if step is not None and step > cfg.steps:
        raise ConfigError(f"{where}: cannot resume, the run already has {step} steps done, more than "
                          f"train.steps={cfg.steps}; ask for {step} or more steps, or start a fresh run folder")


def _plain(v: Any) -> Any:
    """Tuples and lists compare alike (a config read back from a checkpoint or YAML)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


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
    requested_device: str | None = None
    given: tuple[Any, Any] = field(default=(None, None), repr=False)  # the row objects preflight was handed

    def make_allocator(self) -> Any:
        """A fresh allocator of ``cfg.allocator`` with the checked parameters."""
        return self.allocator_cls(self.allocator_params)

    def differences(self, cfg: TrainConfig, task: str, policy_dir: str | os.PathLike, run_dir: str | os.PathLike,
                    train_rows: Any, test_rows: Any, device: str | None) -> list[str]:
        """The arguments of a ``train`` call that are not those these inputs were checked for (empty: none)."""
        same = {"cfg": cfg == self.cfg, "task": task == self.task, "policy_dir": Path(policy_dir) == self.policy_dir,
                "run_dir": Path(run_dir) == self.run_dir, "device": device in (None, self.requested_device),
                "train_rows": any(train_rows is r for r in (self.train_rows, self.given[0])),
                "test_rows": any(test_rows is r for r in (self.test_rows, self.given[1]))}
        return [name for name, ok in same.items() if not ok]


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
    given = (train_rows, test_rows)
    train_rows = train_rows if isinstance(train_rows, list) else list(train_rows)
    test_rows = test_rows if isinstance(test_rows, list) else list(test_rows)
    validate_splits(train_rows, test_rows, TASKS.get(task) if task in TASKS else None, source=source)
    check_policy_folder(policy_dir)  # PolicyLoadError names the folder and what is wrong with it
    # prompts outside the tokenizer's vocabulary, or too long for the model's positions (a certain OOM)
    check_against_policy(train_rows, test_rows, policy_dir, task, max_new_tokens=cfg.max_new_tokens, source=source)
    resolved = resolve_device(cfg.device if device is None else device)  # cuda on a machine without one fails here
    cls = ALLOCATORS.get(cfg.allocator)  # the name TrainConfig checked
    params = build_params(cls.Params, cfg.allocator, cfg.allocator_kwargs())  # allocator_params are checked here
    digest = data_digest(train_rows)
    if resume and (latest := latest_manifest(Path(run_dir) / "checkpoints")) is not None:
        check_format(*latest)  # CheckpointError for a pickle-format checkpoint
        check_resumable(latest[1].get("meta", {}), cfg, digest, str(latest[0]), step=latest[1].get("step"))
    return CheckedInputs(cfg, task, Path(policy_dir), Path(run_dir), train_rows, test_rows, resolved, cls, params,
                         digest, requested_device=device, given=given)
