"""The ``train`` section: one GRPO training run with an allocator."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from rlvr_core.config import limits
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

    Each field's ``help`` (field metadata) documents it: docs/configuration.md and params.yaml's comments
    are generated from them (``make docs``). The update's keys are copied into
    ``rlvr_core.grpo.trainer.TrainerConfig`` by ``TrainerConfig.from_train``.
    """

    allocator: str = field(default="sara", metadata={"help": (
        "The flow's allocator, and the `experiment` stage's. A registered name "
        "(`rlvr_core.allocation.ALLOCATORS`); an unknown one is refused with the valid names.")})
    allocators: tuple[str, ...] = field(default=("grpo", "dapo", "sara", "vigor"), metadata={"help": (
        "The allocators `dvc repro` trains and the report compares. One train stage per allocator and seed.")})
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={"help": (
        "The seeds `dvc repro` trains each allocator with. Distinct ints >= 0, one run per allocator and seed; "
        "the report gives medians over seeds.")})
    allocator_params: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"dapo": {"max_gen_batches": 4}}, metadata={"help": (
            "Per-allocator parameter overrides, {name: {param: value}}. E.g. `{sara: {tau_low: 0.4}}`: the "
            "parameters of each allocator's `Params` dataclass (`rlvr_core/allocation/`), checked when the params "
            "load for every allocator the section names, each step's rollouts against the machine's memory "
            "(`rlvr_core/config/limits.py`). The default caps a dapo step at 4 generation batches.")})
    k: int = field(default=8, metadata={"help": "Rollouts per full group (the group size)."})
    batch_size: int = field(default=32, metadata={"help": (
        "B, a step's size in the allocator's unit. Prompts per step (grpo, pods, ar3po, reinforce-ada); mixed "
        "groups to fill (dapo, greso, sara in groups mode); committed prompts (pilot-commit); the step budget B * k "
        "rollouts (vigor, sara in rollouts mode).")})
    steps: int = field(default=1000, metadata={"help": (
        "Training steps. A cap: at the default `max_rollouts` the rollout budget ends every run first.")})
    seed: int = field(default=0, metadata={"help": "Seeds the allocator, the sampler and the prompt order."})
    max_rollouts: int | None = field(default=12000, metadata={"help": (
        "Stop once this many rollouts were generated (null: no budget). A fixed compute budget for the whole "
        "run, so that allocators compare at equal rollouts rather than steps; SARA's per-step cap is its own "
        "`max_step_rollouts`.")})
    lr: float = field(default=1e-4, metadata={"help": (
        "AdamW learning rate of the GRPO update, in (0, 1). benchmarks/results/ablation/ablation.md: 2e-4 "
        "overshoots (VIGOR collapses).")})
    clip_eps: float = field(default=0.2, metadata={"help": (
        "Lower half-width of the ratio clip band. Also the upper one when `clip_eps_high` is null.")})
    clip_eps_high: float | None = field(default=None, metadata={"help": (
        "Upper clip half-width, DAPO's clip-higher (e.g. 0.28; null: `clip_eps`).")})
    grad_clip: float | None = field(default=1.0, metadata={"help": (
        "Largest global gradient L2 norm of an update. Null disables clipping (the norm is still reported).")})
    kl_coef: float = field(default=0.0, metadata={"help": (
        "Weight of the k3 KL to the frozen reference policy (0: none).")})
    advantage: str = field(default="grpo", metadata={"help": (
        "Advantage estimator: `grpo`, `dr_grpo` or `rloo`. The names of "
        "`rlvr_core.grpo.advantages.ADVANTAGES`.")})
    adv_eps: float = field(default=1e-6, metadata={"help": "Added to the group reward std (advantage `grpo`)."})
    aggregation: str = field(default="token_mean", metadata={"help": (
        "Loss aggregation (`rlvr_core.grpo.loss.AGGREGATIONS`). `token_mean`, `seq_mean_token_mean` or "
        "`seq_mean_token_sum`.")})
    group_weight: str = field(default="none", metadata={"help": (
        "How much each trained group weighs: `none` or `prompt`. `none`: rows weigh as the aggregation says "
        "(a prompt grown to 32 rollouts weighs 8x one of 4); `prompt`: every trained group weighs the same, "
        "whatever its size.")})
    betas: tuple[float, float] = field(default=(0.9, 0.99), metadata={"help": "AdamW (beta1, beta2)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW decoupled weight decay."})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    epochs: int = field(default=1, metadata={"help": "Optimizer passes over each step's batch."})
    only_effective: bool = field(default=True, metadata={"help": (
        "Train only on groups with mixed rewards (the effective groups).")})
    compute_entropy: bool = field(default=True, metadata={"help": (
        "Log the policy entropy on completion tokens (one extra softmax).")})
    temperature: float = field(default=1.0, metadata={"help": (
        "Sampling temperature of the rollouts (> 0). The update divides the logits by it as well.")})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass of the rollouts, in (0, 1]."})
    max_new_tokens: int = field(default=8, metadata={"help": (
        f"Longest completion in tokens, at most {MAX_NEW_TOKENS:,}. The engines reserve batch_size * k * "
        "max_new_tokens token slots up front; a task may need more (countdown: 16).")})
    eval_every: int = field(default=0, metadata={"help": (
        "Evaluate on held-out problems every n steps (0: no step cadence). The last step is always "
        "evaluated.")})
    eval_every_rollouts: int = field(default=512, metadata={"help": (
        "Also evaluate each time cumulative rollouts cross a multiple of this (0: off). After the step that "
        "crosses it: the same grid for every allocator, which `eval_every` (steps) is not when allocators "
        "spend different rollouts per step.")})
    eval_size: int = field(default=500, metadata={"help": (
        "Held-out problems per evaluation, drawn once per run from the held-out split.")})
    eval_samples: int = field(default=0, metadata={"help": (
        "Samples per held-out problem for pass@k (0: greedy accuracy only). Else at least the pass@k k "
        "(`eval_pass_k`, null: `k`).")})
    eval_pass_k: int | None = field(default=None, metadata={"help": (
        "The k of the held-out pass@k and group shares (null: `k`, the group size).")})
    checkpoint_every: int = field(default=25, metadata={"help": "Steps between checkpoints."})
    keep_last: int = field(default=2, metadata={"help": "Checkpoints kept (the newest)."})
    max_nonfinite: int = field(default=5, metadata={"help": (
        "Consecutive non-finite updates (loss or gradient) that stop the run.")})
    engine: str = field(default="hf", metadata={"help": (
        "Rollout engine: `hf` (in-process) or `vllm` (the rollout server, docs/vllm.md).")})
    engine_options: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments for the engine's constructor. E.g. dtype, server_args, enable_sleep_mode; names "
        "the engine does not take, and those the run sets (train.temperature, ...), are refused.")})
    engine_retries: int = field(default=2, metadata={"help": (
        "Retries of a failing generation round. The round is retried exactly; an out-of-memory is not "
        "retried.")})
    engine_retry_delay_s: float = field(default=1.0, metadata={"help": (
        "Seconds between the retries of a failing generation round.")})
    verifier_timeout_s: float | None = field(default=None, metadata={"help": (
        "Per-call verifier time limit in seconds (null: none; math keeps its own). At most "
        f"{MAX_VERIFIER_TIMEOUT_S:g}; a timeout scores 0.0 and is counted.")})
    max_verifier_error_share: float = field(default=0.5, metadata={"help": (
        "Stop when more of a step's rollouts are verifier errors or timeouts. A share in [0, 1] (1: never).")})
    verifier_workers: int = field(default=2, metadata={"help": (
        "Helper processes scoring a step's completions (math). For verifiers that run out of process; the "
        "others score in process. At most what the machine's memory holds at 64 MiB each.")})
    allow_no_update: bool = field(default=False, metadata={"help": (
        "True: a run in which no step updated the policy ends, its summary saying updates: 0. False: such a "
        "run (no effective group, or every loss non-finite) ends FAILED without a summary; true is for "
        "pipeline smoke tests on a policy too weak to give mixed groups.")})
    device: str = field(default="cpu", metadata={"help": (
        "Where the policy trains and the HF engine samples. `cpu`, `cuda`, `cuda:N` or `auto` (cuda when "
        "visible, else cpu; docs/gpu.md).")})
    dtype: str = field(default="float32", metadata={"help": (
        "`float32`, or `bfloat16` (mixed precision). bfloat16 keeps float32 weights and AdamW state and runs "
        "the forward and backward passes under bfloat16 autocast.")})
    micro_batch: int = field(default=256, metadata={"help": (
        "Sequences per forward/backward of the update. Gradients accumulate over the batch; lower it for "
        "large models (one micro-batch's logits take micro_batch * sequence length * vocabulary size "
        "floats).")})
    threads: int = field(default=1, metadata={"help": (
        "Torch CPU threads of the warmstart, train and evaluate stages (not $OMP_NUM_THREADS). Set by each "
        "flow before any computation (`torch.set_num_threads`): float sums depend on it, so it is a param "
        "and equal params give byte-identical results. At most the CPUs the process may use on the machine "
        "that loads the params (`rlvr_core/config/limits.py`).")})

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
        self._check_sizes()

    def _check_sizes(self) -> None:
        """Every size within the machine's ceilings (``rlvr_core.config.limits``): threads, verifier helpers,
        an evaluation's rollouts, and each named allocator's parameters and step."""
        limits.check_cpus("threads", self.threads)
        limits.check_memory("verifier_workers", self.verifier_workers, self.verifier_workers * limits.WORKER_BYTES,
                            f"{self.verifier_workers:,} verifier helper processes")
        per = limits.rollout_bytes(self.max_new_tokens)
        n_eval = self.eval_size * max(1, self.eval_samples)
        key = "eval_samples" if self.eval_samples > self.eval_size else "eval_size"
        limits.check_memory(key, getattr(self, key), n_eval * per, f"an evaluation's {n_eval:,} rollouts "
                            f"(eval_size * max(1, eval_samples), {per:,} bytes each at max_new_tokens="
                            f"{self.max_new_tokens:,})")
        for name in dict.fromkeys((self.allocator, *self.allocators, *self.allocator_params)):
            self._check_step(name, per)

    def _step_rollouts(self, name: str, changes: dict[str, Any] | None = None) -> tuple[Any, int]:
        """(the checked ``Params`` of allocator ``name``, the most rollouts one of its steps generates), with
        ``changes`` over ``allocator_kwargs(name)`` (a None value drops the key: its default)."""
        from rlvr_core.allocation import ALLOCATORS
        from rlvr_core.allocation.base import build_params

        cls = ALLOCATORS.get(name)
        kwargs = {k: v for k, v in {**self.allocator_kwargs(name), **(changes or {})}.items() if v is not None}
        params = build_params(cls.Params, name, kwargs)
        return params, int(cls(params).max_rollouts_per_step)

    def _check_step(self, name: str, per: int) -> None:
        """Allocator ``name``'s parameters are valid, and its step's rollouts (``per`` bytes each) and other
        arrays (``host_items``) fit the machine's memory; a refusal names the key that set the size."""
        try:
            params, rollouts = self._step_rollouts(name)
        except ConfigError as e:
            raise ConfigError(f"allocator_params.{e}") from None
        memory = limits.host_memory()
        if memory is not None and rollouts * per > memory:
            key, value = self._largest_size(name, rollouts)
            limits.check_memory(key, value, rollouts * per, f"a {name} step's {rollouts:,} rollouts "
                                f"({per:,} bytes each at max_new_tokens={self.max_new_tokens:,})")
        for field_name, items in params.host_items().items():
            limits.check_memory(f"allocator_params.{name}.{field_name}", getattr(params, field_name),
                                items * limits.NUMBER_BYTES, f"{items:,} items of a {name} step's arrays")

    def _largest_size(self, name: str, rollouts: int) -> tuple[str, Any]:
        """(key, value) of the size that makes allocator ``name``'s step ``rollouts`` long: of the ints given in
        ``allocator_params.<name>`` (dropped to their defaults) and train.batch_size and k (lowered to 1 and
        2), the one whose lowering shortens the step most."""
        given = self.allocator_params.get(name, {})
        options = [(f"allocator_params.{name}.{k}", v, {k: None}) for k, v in given.items() if _is_int(v)]
        options += [(k, getattr(self, k), {k: lo}) for k, lo in (("batch_size", 1), ("k", 2)) if k not in given]
        best: tuple[str, Any, int] = (f"allocator_params.{name}", dict(given), rollouts)
        for key, value, change in options:
            try:
                shorter = self._step_rollouts(name, change)[1]
            except ConfigError:
                continue
            if shorter < best[2]:
                best = (key, value, shorter)
        return best[0], best[1]

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

