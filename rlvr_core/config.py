"""Typed, frozen configuration per params.yaml section, validated on load.

Each stage reads only its own section: ``prepare``, ``warmstart``, ``train``,
``evaluate``. Unknown keys are rejected with the closest valid key; impossible
values raise ConfigError naming ``section.key`` and how to fix it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from rlvr_core.errors import ConfigError, from_mapping, require
from rlvr_core.models.warmstart import WarmStartConfig

def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class PrepareConfig:
    """Task data: synthetic generation, or hub math datasets.

    task: "arithmetic" or "countdown" (synthetic), or "math" (hub rows verified by
        math-verify: MATH, GSM8K, MATH-500, AIME 2024 through ``rlvr_core.data.hub``)
    n_train, n_test: synthetic only, problems per split (disjoint)
    seed: synthetic only, generator seed
    digits: arithmetic only, operand digit counts to draw (the CPU default uses 1-3;
        the tiny policy does not learn 4-digit problems in its warm-start budget)
    digit_weights: arithmetic only, relative weight of each entry of ``digits``
    ops: arithmetic only, operators to draw from
    dataset: task math only, hub loader of the training split (math, gsm8k,
        math500, aime2024; null: math)
    path: hub name or local directory/file in the hub format (null: the loader's hub name)
    split: split of ``dataset`` used for training
    limit: first N training rows (null: all)
    eval_dataset, eval_path, eval_split, eval_limit: the same for the held-out split
        (eval_dataset null: ``dataset``; eval_split null: the loader's default split)
    """

    task: str = "arithmetic"
    n_train: int = 20000
    n_test: int = 1000
    seed: int = 0
    digits: tuple[int, ...] = (1, 2, 3)
    digit_weights: tuple[float, ...] | None = None
    ops: tuple[str, ...] = ("+", "-", "*")
    dataset: str | None = None
    path: str | None = None
    split: str = "train"
    limit: int | None = None
    eval_dataset: str | None = None
    eval_path: str | None = None
    eval_split: str | None = None
    eval_limit: int | None = None

    def __post_init__(self) -> None:
        require(self.task in SYNTHETIC_TASKS + HUB_TASKS, "task",
                f"got {self.task!r}; use 'arithmetic' or 'countdown' (synthetic) or 'math' (hub datasets)")
        self._check_hub_fields()
        require(_is_int(self.n_train) and self.n_train >= 1, "n_train", f"got {self.n_train!r}; need an int >= 1")
        require(_is_int(self.n_test) and self.n_test >= 1, "n_test", f"got {self.n_test!r}; need an int >= 1")
        require(_is_int(self.seed), "seed", f"got {self.seed!r}; need an int")
        object.__setattr__(self, "digits", tuple(self.digits))
        require(len(self.digits) > 0 and all(_is_int(d) and 1 <= d <= 4 for d in self.digits)
                and len(set(self.digits)) == len(self.digits), "digits", "give distinct digit counts in 1..4")
        if self.digit_weights is not None:
            object.__setattr__(self, "digit_weights", tuple(float(w) for w in self.digit_weights))
            require(len(self.digit_weights) == len(self.digits) and min(self.digit_weights) >= 0
                    and sum(self.digit_weights) > 0, "digit_weights",
                    "give one non-negative weight per entry of digits, not all zero")
        object.__setattr__(self, "ops", tuple(self.ops))
        require(len(self.ops) > 0 and set(self.ops) <= {"+", "-", "*"}, "ops", "choose among '+', '-', '*'")

    def _check_hub_fields(self) -> None:
        from rlvr_core.data.hub import DATASETS

        hub_keys = ("dataset", "path", "limit", "eval_dataset", "eval_path", "eval_split", "eval_limit")
        if self.task in SYNTHETIC_TASKS:
            given = [k for k in hub_keys if getattr(self, k) is not None]
            require(not given, given[0] if given else "dataset",
                    f"applies to task 'math' only; task {self.task!r} is generated, remove {given}")
            return
        names = DATASETS.names()
        for key in ("dataset", "eval_dataset"):
            v = getattr(self, key)
            require(v is None or v in names, key, f"unknown dataset {v!r}; valid names: {', '.join(names)}")
        for key in ("path", "eval_path", "eval_split"):
            v = getattr(self, key)
            require(v is None or (isinstance(v, str) and v.strip() != ""), key, f"got {v!r}; need a non-empty string or null")
        require(isinstance(self.split, str) and self.split.strip() != "", "split", f"got {self.split!r}; need a split name")
        for key in ("limit", "eval_limit"):
            v = getattr(self, key)
            require(v is None or (_is_int(v) and v >= 1), key, f"got {v!r}; need an int >= 1 or null")

    def hub_sources(self) -> dict[str, dict[str, Any]]:
        """Task math: {"train"|"test": {dataset, path, split, limit}} for ``rlvr_core.data.hub.load_hub_dataset``."""
        train = self.dataset or "math"
        return {
            "train": {"dataset": train, "path": self.path, "split": self.split, "limit": self.limit},
            "test": {"dataset": self.eval_dataset or train, "path": self.eval_path, "split": self.eval_split,
                     "limit": self.eval_limit},
        }


SYNTHETIC_TASKS: tuple[str, ...] = ("arithmetic", "countdown")
HUB_TASKS: tuple[str, ...] = ("math",)
DEVICES: tuple[str, ...] = ("cpu", "cuda", "auto")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")


@dataclass(frozen=True)
class TrainConfig:
    """One GRPO training run with an allocator (the ``train`` section).

    allocator: registered allocator name (grpo, dapo, sara, vigor, pods, greso, sara+dps)
    allocators: the allocators ``dvc repro`` and the report compare
    allocator_params: per-allocator parameter overrides, {name: {param: value}}
    k: rollouts per full group; batch_size: prompts (or effective groups) per step
    steps: training steps; seed: seeds allocator, sampler and prompt order
    max_rollouts: stop early once this many rollouts were generated (a fixed
        compute budget, for comparing allocators on rollouts rather than steps)
    lr, clip_eps, grad_clip, kl_coef, advantage, aggregation: the GRPO update
    temperature, top_p, max_new_tokens: sampling
    eval_every: steps between held-out evaluations (0: only at the end)
    eval_size: held-out problems per evaluation; eval_samples: samples each for pass@k
    checkpoint_every: steps between checkpoints; keep_last: checkpoints kept
    max_nonfinite: consecutive non-finite updates that stop the run
    engine: rollout engine name ("hf" in-process; "vllm" the rollout server, see docs/vllm.md)
    engine_options: extra keyword arguments for the engine (e.g. dtype, server_args, enable_sleep_mode)
    engine_retries, engine_retry_delay_s: retries of a failing generation round, and the pause between
    verifier_timeout_s: per-call verifier time limit (null: none); a timeout scores 0.0 and is counted
    max_verifier_error_share: the run stops when more than this share of a step's rollouts are
        verifier errors or timeouts (1: never)
    verifier_workers: helper processes that score a step's completions in parallel, for verifiers
        that run out of process (math); the others score in process
    device: where the policy trains and the HF engine samples: "cpu", "cuda" (or "cuda:N"),
        "auto" (cuda when visible, else cpu)
    dtype: "float32", or "bfloat16" (mixed precision: float32 weights and AdamW state,
        forward and backward passes under bfloat16 autocast)
    micro_batch: sequences per forward/backward of the update (gradients accumulate over the
        batch); lower it for large models: the logits of one micro-batch take
        micro_batch * sequence length * vocabulary size floats
    """

    allocator: str = "sara"
    allocators: tuple[str, ...] = ("grpo", "dapo", "sara", "vigor")
    allocator_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    k: int = 8
    batch_size: int = 32
    steps: int = 300
    seed: int = 0
    max_rollouts: int | None = None
    lr: float = 1e-4
    clip_eps: float = 0.2
    grad_clip: float = 1.0
    kl_coef: float = 0.0
    advantage: str = "grpo"
    aggregation: str = "token_mean"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    eval_every: int = 50
    eval_size: int = 500
    eval_samples: int = 8
    checkpoint_every: int = 50
    keep_last: int = 3
    max_nonfinite: int = 5
    engine: str = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    engine_retries: int = 2
    engine_retry_delay_s: float = 1.0
    verifier_timeout_s: float | None = None
    max_verifier_error_share: float = 0.5
    verifier_workers: int = 2
    device: str = "cpu"
    dtype: str = "float32"
    micro_batch: int = 256

    def __post_init__(self) -> None:
        from rlvr_core.allocation import ALLOCATORS
        from rlvr_core.rollout import ENGINES

        require(isinstance(self.device, str) and (self.device in DEVICES or re.fullmatch(r"cuda:\d+", self.device)),
                "device", f"got {self.device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'")
        require(self.dtype in DTYPES, "dtype", f"got {self.dtype!r}; use 'float32' or 'bfloat16'")

        for key in ("lr", "clip_eps", "grad_clip", "kl_coef", "temperature", "top_p", "engine_retry_delay_s"):
            v = getattr(self, key)
            require(_is_real(v), key, f"got {v!r}; need a number")
        require(self.verifier_timeout_s is None or (_is_real(self.verifier_timeout_s) and self.verifier_timeout_s > 0),
                "verifier_timeout_s", f"got {self.verifier_timeout_s!r}; need a positive number or null")
        require(self.engine in ENGINES and self.engine != "simulated", "engine",
                f"got {self.engine!r}; use 'hf' (in-process) or 'vllm' (rollout server)")
        require(isinstance(self.engine_options, Mapping), "engine_options", "give a mapping of engine keyword arguments")
        require(self.engine_retry_delay_s >= 0, "engine_retry_delay_s", "need >= 0")

        object.__setattr__(self, "allocators", tuple(self.allocators))
        for name in (self.allocator, *self.allocators):
            if name not in ALLOCATORS:
                raise ConfigError(f"allocator: unknown {name!r}; valid names: {', '.join(ALLOCATORS.names())}")
        require(isinstance(self.allocator_params, Mapping), "allocator_params", "give a mapping {allocator: {param: value}}")
        for name in self.allocator_params:
            require(name in ALLOCATORS, "allocator_params", f"unknown allocator {name!r}")
        for key, lo in (("k", 2), ("batch_size", 1), ("steps", 0), ("max_new_tokens", 1), ("eval_every", 0),
                        ("eval_size", 1), ("eval_samples", 0), ("checkpoint_every", 1), ("keep_last", 1),
                        ("max_nonfinite", 1), ("engine_retries", 0), ("micro_batch", 1)):
            v = getattr(self, key)
            require(_is_int(v) and v >= lo, key, f"got {v!r}; need an int >= {lo}")
        require(_is_int(self.seed), "seed", f"got {self.seed!r}; need an int")
        require(self.max_rollouts is None or (_is_int(self.max_rollouts) and self.max_rollouts >= 1), "max_rollouts",
                f"got {self.max_rollouts!r}; need an int >= 1 or null")
        require(0 < self.lr < 1, "lr", f"got {self.lr!r}; need 0 < lr < 1 (1e-4 is the tested default)")
        require(self.temperature > 0, "temperature", f"got {self.temperature!r}; need > 0")
        require(0 < self.top_p <= 1, "top_p", f"got {self.top_p!r}; need 0 < top_p <= 1")
        require(self.eval_samples == 0 or self.eval_samples >= self.k, "eval_samples",
                f"got {self.eval_samples}; need 0 or >= k={self.k} for pass@k")

    def allocator_kwargs(self, name: str | None = None) -> dict[str, Any]:
        """Parameters for ``make_allocator``: k, batch_size, seed plus the overrides."""
        name = name or self.allocator
        return {"k": self.k, "batch_size": self.batch_size, "seed": self.seed, **self.allocator_params.get(name, {})}


@dataclass(frozen=True)
class EvaluateConfig:
    """Held-out evaluation: greedy accuracy and pass@k from ``n_samples`` samples."""

    k: int = 8
    n_samples: int = 16
    temperature: float = 1.0
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        require(_is_int(self.k) and self.k >= 1, "k", f"got {self.k!r}; need an int >= 1")
        require(_is_int(self.n_samples) and (self.n_samples == 0 or self.n_samples >= self.k), "n_samples",
                f"got {self.n_samples!r}; need 0 or an int >= k")
        require(self.temperature > 0, "temperature", "need > 0")


@dataclass(frozen=True)
class Params:
    prepare: PrepareConfig
    warmstart: WarmStartConfig
    train: TrainConfig
    evaluate: EvaluateConfig


SECTIONS = {"prepare": PrepareConfig, "warmstart": WarmStartConfig, "train": TrainConfig, "evaluate": EvaluateConfig}


def load_params(path: str | Path = "params.yaml", overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Params:
    """Read and validate params.yaml; ``overrides`` {section: {key: value}} win over the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; run from the project root or pass the params file")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    for sec in raw:
        if sec not in SECTIONS and sec != "report":
            close = difflib.get_close_matches(str(sec), list(SECTIONS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{path}: unknown section {sec!r}{hint}; valid: {', '.join(SECTIONS)}, report")
    merged = {sec: dict(raw.get(sec) or {}) for sec in SECTIONS}
    for sec, vals in (overrides or {}).items():
        if sec not in SECTIONS:
            raise ConfigError(f"overrides: unknown section {sec!r}; valid: {', '.join(SECTIONS)}")
        merged[sec].update(vals)
    try:
        return Params(**{sec: from_mapping(cls, merged[sec], sec) for sec, cls in SECTIONS.items()})
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
