"""The ``train`` section: one GRPO training run with an allocator."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from rlvr_core.config.checks import _check_self, _is_int
from rlvr_core.config.reading import short_repr
from rlvr_core.errors import ConfigError, require

# longest completion a run may ask for: Qwen2.5's context is 32,768 tokens, and the engines reserve
# batch_size * k * max_new_tokens token slots up front (1e9 tokens asked for 160 GB)
MAX_NEW_TOKENS = 32_768
# a verifier call's time limit: setitimer overflows on huge values, and an hour per completion is no limit
MAX_VERIFIER_TIMEOUT_S = 3600.0

DEVICES: tuple[str, ...] = ("cpu", "cuda", "auto")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")


@dataclass(frozen=True)
class TrainConfig:
    """One GRPO training run with an allocator (the ``train`` section).

    allocator: registered allocator name (grpo, dapo, sara, vigor, pods, greso, sara+dps)
    allocators: the allocators ``dvc repro`` and the report compare
    seeds: the seeds ``dvc repro`` trains each of them with (one run per allocator and seed)
    allocator_params: per-allocator parameter overrides, {name: {param: value}}
    k: rollouts per full group; batch_size: prompts (or effective groups) per step
    steps: training steps; seed: seeds allocator, sampler and prompt order
    max_rollouts: stop early once this many rollouts were generated (a fixed
        compute budget, for comparing allocators on rollouts rather than steps)
    lr, clip_eps, grad_clip, kl_coef, advantage, aggregation, group_weight: the GRPO update (group_weight
        ``prompt`` gives every trained group the same weight, whatever its size)
    clip_eps_high, betas, weight_decay, adam_eps, adv_eps, epochs, only_effective,
        compute_entropy: the rest of the update (``rlvr_core.grpo.trainer.TrainerConfig``,
        built from this section by ``TrainerConfig.from_train``); clip_eps_high is DAPO's
        clip-higher (null: symmetric), grad_clip null disables clipping
    temperature, top_p, max_new_tokens: sampling (max_new_tokens <= MAX_NEW_TOKENS)
    eval_every: steps between held-out evaluations (0: only at the end)
    eval_every_rollouts: also evaluate after each step whose cumulative rollouts cross a multiple of this (0:
        off); the same grid for every allocator, which ``eval_every`` (steps) is not when allocators spend
        different rollouts per step
    eval_size: held-out problems per evaluation; eval_samples: samples each for pass@k
    eval_pass_k: the k of pass@k and of the held-out group shares (null: the group size k)
    checkpoint_every: steps between checkpoints; keep_last: checkpoints kept
    max_nonfinite: consecutive non-finite updates that stop the run
    engine: rollout engine name ("hf" in-process; "vllm" the rollout server, see docs/vllm.md)
    engine_options: extra keyword arguments for the engine (e.g. dtype, server_args, enable_sleep_mode);
        names the engine does not take are refused here
    engine_retries, engine_retry_delay_s: retries of a failing generation round, and the pause between
    verifier_timeout_s: per-call verifier time limit (null: none; at most MAX_VERIFIER_TIMEOUT_S);
        a timeout scores 0.0 and is counted
    max_verifier_error_share: the run stops when more than this share of a step's rollouts are
        verifier errors or timeouts (1: never)
    verifier_workers: helper processes that score a step's completions in parallel, for verifiers
        that run out of process (math); the others score in process
    allow_no_update: a run in which no step updated the policy (no effective group, or every loss
        non-finite) ends FAILED without a summary; true lets it end with a summary saying ``updates: 0``
        (pipeline smoke tests on a policy too weak to give mixed groups)
    device: where the policy trains and the HF engine samples: "cpu", "cuda" (or "cuda:N"),
        "auto" (cuda when visible, else cpu)
    dtype: "float32", or "bfloat16" (mixed precision: float32 weights and AdamW state,
        forward and backward passes under bfloat16 autocast)
    micro_batch: sequences per forward/backward of the update (gradients accumulate over the
        batch); lower it for large models: the logits of one micro-batch take
        micro_batch * sequence length * vocabulary size floats
    threads: torch's CPU threads in the warm start, train and evaluate stages (torch.set_num_threads,
        set by each flow before any computation); float sums depend on it, so it is a param, not
        the environment's OMP_NUM_THREADS

    Defaults are params.yaml's values (the CPU default of ``make run``).
    """

    allocator: str = "sara"
    allocators: tuple[str, ...] = ("grpo", "dapo", "sara", "vigor")
    seeds: tuple[int, ...] = (0, 1, 2)
    allocator_params: dict[str, dict[str, Any]] = field(default_factory=lambda: {"dapo": {"max_gen_batches": 4}})
    k: int = 8
    batch_size: int = 32
    steps: int = 1000
    seed: int = 0
    max_rollouts: int | None = 12000
    lr: float = 1e-4
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    grad_clip: float | None = 1.0
    kl_coef: float = 0.0
    advantage: str = "grpo"
    adv_eps: float = 1e-6
    aggregation: str = "token_mean"
    group_weight: str = "none"
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    epochs: int = 1
    only_effective: bool = True
    compute_entropy: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    eval_every: int = 0
    eval_every_rollouts: int = 512
    eval_size: int = 500
    eval_samples: int = 0
    eval_pass_k: int | None = None
    checkpoint_every: int = 25
    keep_last: int = 2
    max_nonfinite: int = 5
    engine: str = "hf"
    engine_options: dict[str, Any] = field(default_factory=dict)
    engine_retries: int = 2
    engine_retry_delay_s: float = 1.0
    verifier_timeout_s: float | None = None
    max_verifier_error_share: float = 0.5
    verifier_workers: int = 2
    allow_no_update: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    micro_batch: int = 256
    threads: int = 1

    def __post_init__(self) -> None:
        from rlvr_core.allocation import ALLOCATORS
        from rlvr_core.grpo.trainer import TrainerConfig

        _check_self(self)
        require(self.device in DEVICES or re.fullmatch(r"cuda:\d+", self.device) is not None,
                "device", f"got {short_repr(self.device)}; use 'cpu', 'cuda', 'cuda:N' or 'auto'")
        require(self.dtype in DTYPES, "dtype", f"got {short_repr(self.dtype)}; use 'float32' or 'bfloat16'")
        object.__setattr__(self, "allocators", tuple(self.allocators))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        require(len(self.seeds) > 0 and all(_is_int(s) and s >= 0 for s in self.seeds)
                and len(set(self.seeds)) == len(self.seeds), "seeds",
                f"got {short_repr(list(self.seeds))}; give distinct ints >= 0, at least one")
        object.__setattr__(self, "betas", tuple(self.betas))
        for name in (self.allocator, *self.allocators):
            if name not in ALLOCATORS:
                raise ConfigError(f"allocator: unknown {short_repr(name)}; "
                                  f"valid names: {', '.join(ALLOCATORS.names())}")
        for name in self.allocator_params:
            require(name in ALLOCATORS, f"allocator_params.{name}",
                    f"unknown allocator; valid names: {', '.join(ALLOCATORS.names())}")
        for key, lo in (("k", 2), ("batch_size", 1), ("steps", 0), ("max_new_tokens", 1), ("eval_every", 0),
                        ("eval_every_rollouts", 0),
                        ("eval_size", 1), ("eval_samples", 0), ("checkpoint_every", 1), ("keep_last", 1),
                        ("max_nonfinite", 1), ("engine_retries", 0), ("micro_batch", 1), ("seed", 0),
                        ("threads", 1)):
            v = getattr(self, key)
            require(v >= lo, key, f"got {short_repr(v)}; need an int >= {lo}")
        require(self.max_new_tokens <= MAX_NEW_TOKENS, "max_new_tokens",
                f"got {self.max_new_tokens:,}; at most {MAX_NEW_TOKENS:,} tokens (a 32k context; the engine "
                "reserves batch_size * k * max_new_tokens token slots up front)")
        require(self.max_rollouts is None or self.max_rollouts >= 1, "max_rollouts",
                f"got {short_repr(self.max_rollouts)}; need an int >= 1 or null")
        require(0 < self.lr < 1, "lr", f"got {short_repr(self.lr)}; need 0 < lr < 1 (1e-4 is the tested default)")
        require(self.temperature > 0, "temperature", f"got {short_repr(self.temperature)}; need > 0")
        require(0 < self.top_p <= 1, "top_p", f"got {short_repr(self.top_p)}; need 0 < top_p <= 1")
        require(self.eval_pass_k is None or self.eval_pass_k >= 1, "eval_pass_k",
                f"got {short_repr(self.eval_pass_k)}; need an int >= 1 or null (the group size k)")
        require(self.eval_samples == 0 or self.eval_samples >= self.pass_k, "eval_samples",
                f"got {self.eval_samples}; need 0 or >= {self.pass_k} (train.eval_pass_k, null: train.k) for pass@k")
        require(self.engine_retry_delay_s >= 0, "engine_retry_delay_s",
                f"got {short_repr(self.engine_retry_delay_s)}; need >= 0")
        require(self.verifier_timeout_s is None or 0 < self.verifier_timeout_s <= MAX_VERIFIER_TIMEOUT_S,
                "verifier_timeout_s", f"got {short_repr(self.verifier_timeout_s)}; need seconds in (0, "
                f"{MAX_VERIFIER_TIMEOUT_S:g}] or null (the limit arms setitimer once per verifier call)")
        require(0 <= self.max_verifier_error_share <= 1, "max_verifier_error_share",
                f"got {short_repr(self.max_verifier_error_share)}; need a share in [0, 1] (1: never stop)")
        require(self.verifier_workers >= 1, "verifier_workers",
                f"got {short_repr(self.verifier_workers)}; need an int >= 1")
        self._check_engine()
        TrainerConfig.from_train(self)  # the update's knobs: clip_eps in (0, 1), grad_clip > 0, betas, ...

    def _check_engine(self) -> None:
        """engine is a policy engine; engine_options are keyword arguments it takes and the run does not set."""
        import inspect

        from rlvr_core.rollout import ENGINES

        require(self.engine in ENGINES and self.engine != "simulated", "engine",
                f"got {short_repr(self.engine)}; use 'hf' (in-process) or 'vllm' (rollout server)")
        params = inspect.signature(ENGINES.get(self.engine)).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        set_by_run = {"self", "model", "tokenizer", "prompts", "temperature", "top_p", "max_new_tokens", "seed"}
        valid = sorted(n for n, p in params.items()
                       if n not in set_by_run and p.kind is not inspect.Parameter.VAR_POSITIONAL)
        for key in self.engine_options:
            if key in set_by_run:
                raise ConfigError(f"engine_options.{key}: set by the run (use train.{key})"
                                  if key in ("temperature", "top_p", "max_new_tokens", "seed")
                                  else f"engine_options.{key}: set by the run, not an option")
            if key not in valid:
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f" (did you mean {short_repr(close[0])}?)" if close else ""
                raise ConfigError(f"engine_options.{key}: not an option of engine {short_repr(self.engine)}{hint}; "
                                  f"valid: {', '.join(valid)}")

    @property
    def pass_k(self) -> int:
        """The k of the held-out pass@k: ``eval_pass_k``, or the group size ``k`` when that is null."""
        return self.k if self.eval_pass_k is None else self.eval_pass_k

    def allocator_kwargs(self, name: str | None = None) -> dict[str, Any]:
        """Parameters for ``make_allocator``: k, batch_size, seed plus the overrides."""
        name = name or self.allocator
        return {"k": self.k, "batch_size": self.batch_size, "seed": self.seed, **self.allocator_params.get(name, {})}

