"""Typed, frozen configuration per params.yaml section, validated on load.

Each stage reads only its own section: ``prepare``, ``warmstart``, ``train``,
``evaluate``. Unknown keys are rejected with the closest valid key; impossible
values raise ConfigError naming ``section.key`` and how to fix it.

Every field is checked against its type annotation (``check_fields``): ints,
booleans, strings, lists and mappings of the right shape, and numbers that are
finite (NaN and infinities are refused everywhere). Range checks follow in each
section's ``__post_init__``. params.yaml is read with ``read_yaml``: aliases that
would expand past ``MAX_YAML_NODES`` nodes are refused while composing, before
anything is built, and exponent floats as people type them (``5e-5``, ``1E-4``)
are numbers, as in YAML 1.2. Ints past a float's range (``MAX_INT_DIGITS``) are refused
with the line they are on, and so are the YAML 1.1 readings people do not mean: ``010`` as
octal 8, ``1:30`` as 90, and a key given twice. Messages show values through ``short_repr``.

One source of defaults: every dataclass default equals the project's params.yaml
value (tests/pipeline/test_params_defaults.py), so a key a file leaves out means
the same as in ``make run``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Union

import yaml

from rlvr_core.errors import ConfigError, from_mapping, require
from rlvr_core.models.warmstart import WarmStartConfig

# the most nodes a params file or a --set value may expand to (aliases counted each time they are used);
# params.yaml has a few hundred
MAX_YAML_NODES = 20_000
# the most digits of an int in a params file: past 309 digits an int no longer fits a float
MAX_INT_DIGITS = 309
# longest completion a run may ask for: Qwen2.5's context is 32,768 tokens, and the engines reserve
# batch_size * k * max_new_tokens token slots up front (1e9 tokens asked for 160 GB)
MAX_NEW_TOKENS = 32_768
# a verifier call's time limit: setitimer overflows on huge values, and an hour per completion is no limit
MAX_VERIFIER_TIMEOUT_S = 3600.0
REQUIRED_SECTIONS: tuple[str, ...] = ("prepare", "train")

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 120, 120, 60


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` bounded in depth, width and length (safe on values that expand to gigabytes)."""
    r = _REPR.repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ----------------------------------------------------------------------------- reading YAML


class _Refused(yaml.YAMLError):
    """A params file that parses but is refused; the message says where and why."""


class _ExpandsTooFar(_Refused):
    pass


def _at(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


class ParamsLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs and reads ``5e-5`` / ``1E-4`` / ``1e5`` as floats."""

    def compose_document(self) -> Any:
        node = super().compose_document()
        _count_nodes(node, {})
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An int, refused when it is past a float's range (Python refuses 4,301+ digit ints with a
        ValueError, and no params number can be that large)."""
        digits = str(node.value).replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise _Refused(f"the number at {_at(node)} is {len(digits):,} digits long; a params number must fit "
                           f"a float (at most {MAX_INT_DIGITS} digits)")
        value = super().construct_yaml_int(node)
        if ":" in digits:
            raise _Refused(f"{node.value} at {_at(node)} reads as {value} (YAML 1.1 reads a colon as base 60); "
                           f"write {value} or quote the value")
        if digits[:2] not in ("0x", "0b") and len(digits) > 1 and digits[0] == "0":
            meant = int(str(node.value).replace("_", ""), 10)
            raise _Refused(f"{node.value} at {_at(node)} reads as {value} (YAML 1.1 reads a leading 0 as octal); "
                           f"write {meant}, or {value} if octal was meant")
        if abs(value) >= 2 ** 1024:
            raise _Refused(f"the number at {_at(node)} is past a float's range (about 1.8e308)")
        return value


    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping, refused when it gives a key twice (YAML would keep the last one silently)."""
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise _Refused(f"the key {short_repr(key, 80)} is given twice, at {_at(seen[key])} and "
                               f"{_at(key_node)} (YAML would keep the last one silently); give it once")
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


ParamsLoader.add_constructor("tag:yaml.org,2002:int", ParamsLoader.construct_yaml_int)


# YAML 1.1 (PyYAML) wants a dot and a signed exponent (5.0e-5); people type 5e-5, 1E-4, 1e5
ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _count_nodes(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes ``node`` expands to (an alias counts its target again); raises once past MAX_YAML_NODES."""
    if id(node) in memo:
        n = memo[id(node)]
    else:
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(_count_nodes(c, memo) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(_count_nodes(k, memo) + _count_nodes(v, memo) for k, v in node.value)
        memo[id(node)] = n
    if n > MAX_YAML_NODES:
        m = node.start_mark
        raise _ExpandsTooFar(f"the value at line {m.line + 1}, column {m.column + 1} expands to more than "
                             f"{MAX_YAML_NODES:,} nodes through aliases (an alias bomb?); write the values out")
    return n


def read_yaml(text: str, where: str) -> Any:
    """Parse ``text`` with ``ParamsLoader``; ConfigError naming ``where`` on bad or oversized YAML."""
    try:
        return yaml.load(text, Loader=ParamsLoader)  # a SafeLoader subclass
    except _Refused as e:
        raise ConfigError(f"{where}: {e}") from None
    except (yaml.YAMLError, ValueError, OverflowError) as e:  # ValueError: e.g. a date 2001-13-01, !!int 12x
        why = " ".join(str(e).split())
        raise ConfigError(f"{where}: not valid YAML ({why if len(why) <= 300 else why[:297] + '...'})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a params value") from None


def parse_set(items: typing.Sequence[str], params_file: str | Path, section: str = "train") -> dict[str, Any]:
    """``--set key=value`` items -> {key: value}, values read as params.yaml reads them.

    Errors name ``params_file`` and ``section.key`` and say the value came from --set.
    """
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {short_repr(item)}: use key=value, e.g. --set lr=5e-5")
        key, value = (s.strip() for s in item.split("=", 1))
        if not key:
            raise ConfigError(f"--set {short_repr(item)}: the key is empty; use key=value, e.g. --set lr=5e-5")
        out[key] = read_yaml(value, f"{params_file}: {section}.{key} (from --set {short_repr(item)})")
    return out


# ----------------------------------------------------------------------------- checking fields against their types


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past a float's range
        return False


def _non_finite(value: Any, key: str) -> tuple[str, Any, str] | None:
    """(key.path, value, "a finite number") for the first NaN, infinity or float-overflowing int anywhere
    in ``value`` (mappings and lists walked without recursion), else None."""
    todo = [(key, value)]
    while todo:
        path, v = todo.pop()
        if _is_real(v) and not _finite(v):
            return path, v, "a finite number"
        if isinstance(v, Mapping):
            todo.extend((f"{path}.{k}", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            todo.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def _need(value: Any, hint: Any, key: str) -> tuple[str, Any, str] | None:
    """None when ``value`` fits ``hint``, else (key or key.subkey, offending value, what is needed).
    A value typed ``Any`` (e.g. an allocator's parameters) may hold anything but a non-finite number."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return _non_finite(value, key)
    if origin in (Union, types.UnionType):
        nullable = type(None) in args
        if value is None and nullable:
            return None
        alts = [_need(value, a, key) for a in args if a is not type(None)]
        if any(a is None for a in alts):
            return None
        bad = alts[0] if len(alts) == 1 else (key, value, " or ".join(a[2] for a in alts))  # type: ignore[index]
        return (bad[0], bad[1], bad[2] + " or null") if nullable and bad[0] == key else bad  # type: ignore[index]
    if hint is bool:
        return None if isinstance(value, bool) else (key, value, "true or false")
    if hint is int:
        return None if _is_int(value) else (key, value, "an int")
    if hint is float:
        if not _is_real(value):
            return key, value, "a number"
        return None if _finite(value) else (key, value, "a finite number")
    if hint is str:
        return None if isinstance(value, str) else (key, value, "a string")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return key, value, "a list"
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return key, value, f"a list of {len(items)} items"
        for i, (x, a) in enumerate(zip(value, items)):
            if (bad := _need(x, a, key)) is not None:
                return key, value, f"a list whose items are each {bad[2]} (item {i} is {short_repr(x, 60)})"
        return None
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            return key, value, "a mapping"
        vhint = args[1] if len(args) == 2 else Any
        for k, v in value.items():
            if not isinstance(k, str):
                return key, value, f"a mapping with string keys (not {short_repr(k, 60)})"
            if (bad := _need(v, vhint, f"{key}.{k}")) is not None:
                return bad
        return None
    return None  # a type this checker does not know: the section's own checks apply


def check_fields(cls: type, values: Mapping[str, Any]) -> None:
    """ConfigError "key: got <value>; need <type>" for the first of ``values`` (known fields of dataclass
    ``cls``) that does not fit its annotation. NaN and infinities never fit a number, and no key of a
    params section takes a negative number (the sections' own checks then bound each range)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        v = values[f.name]
        if (bad := _need(v, hints[f.name], f.name)) is not None:
            raise ConfigError(f"{bad[0]}: got {short_repr(bad[1])}; need {bad[2]}")
        numbers = [v] if _is_real(v) else [x for x in v if _is_real(x)] if isinstance(v, (list, tuple)) else []
        if any(x < 0 for x in numbers):
            raise ConfigError(f"{f.name}: got {short_repr(v)}; no params key takes a negative number")


def _check_self(obj: Any) -> None:
    check_fields(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})


@dataclass(frozen=True)
class PrepareConfig:
    """Task data: synthetic generation, or hub datasets.

    task: a registered task (``rlvr_core.tasks``): "arithmetic" or "countdown" (synthetic),
        "math" (hub rows verified by math-verify: MATH, GSM8K, MATH-500, AIME 2024 through
        ``rlvr_core.data.hub``) or "code" (LiveCodeBench stdin/stdout problems, run in the sandbox)
    n_train, n_test: synthetic only, problems per split (disjoint)
    seed: synthetic only, generator seed
    digits: arithmetic only, operand digit counts to draw (the CPU default uses 1-4, the study's
        regime ``hard``: the tiny policy does not learn 4-digit problems in its warm-start budget,
        which leaves RL room to rise)
    digit_weights: arithmetic only, relative weight of each entry of ``digits``
    ops: arithmetic only, operators to draw from
    dataset: hub tasks only, hub loader of the training split, one the task reads (math: math,
        gsm8k, math500, aime2024; code: livecodebench; null: the task's first, math or livecodebench)
    path: hub name or local directory/file in the hub format (null: the loader's hub name)
    split: split of ``dataset`` used for training (livecodebench: the release file, test for
        release v1, test2 for the problems release v2 added, ...)
    limit: first N training rows (null: all)
    eval_dataset, eval_path, eval_split, eval_limit: the same for the held-out split
        (eval_dataset null: ``dataset``; eval_split null: the loader's default split)
    """

    task: str = "arithmetic"
    n_train: int = 20000
    n_test: int = 500
    seed: int = 0
    digits: tuple[int, ...] = (1, 2, 3, 4)
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
        from rlvr_core.tasks import TASKS, describe_names

        _check_self(self)
        require(self.task in TASKS, "task", f"got {short_repr(self.task)}; use {describe_names()}")
        self._check_hub_fields()
        require(_is_int(self.n_train) and self.n_train >= 1, "n_train",
                f"got {short_repr(self.n_train)}; need an int >= 1")
        require(_is_int(self.n_test) and self.n_test >= 1, "n_test", f"got {short_repr(self.n_test)}; need an int >= 1")
        require(self.seed >= 0, "seed", f"got {short_repr(self.seed)}; need an int >= 0")
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
        from rlvr_core.tasks import TASKS, get_task

        hub_keys = ("dataset", "path", "limit", "eval_dataset", "eval_path", "eval_split", "eval_limit")
        task = get_task(self.task)
        if task.generated:
            given = [k for k in hub_keys if getattr(self, k) is not None]
            hub = " or ".join(repr(n) for n in TASKS.names() if not get_task(n).generated)
            require(not given, given[0] if given else "dataset",
                    f"applies to task {hub} only; task {short_repr(self.task)} is generated, remove {given}")
            return
        names = sorted(task.datasets)
        for key in ("dataset", "eval_dataset"):
            v = getattr(self, key)
            what = (f"dataset {short_repr(v)} belongs to another task" if v in DATASETS
                    else f"unknown dataset {short_repr(v)}")
            require(v is None or v in names, key, f"{what}; valid names for task {short_repr(self.task)}: "
                    f"{', '.join(names)}" if v in DATASETS else f"{what}; valid names: {', '.join(names)}")
        for key in ("path", "eval_path", "eval_split"):
            v = getattr(self, key)
            require(v is None or (isinstance(v, str) and v.strip() != ""), key,
                    f"got {short_repr(v)}; need a non-empty string or null")
        require(isinstance(self.split, str) and self.split.strip() != "", "split",
                f"got {short_repr(self.split)}; need a split name")
        for key in ("limit", "eval_limit"):
            v = getattr(self, key)
            require(v is None or (_is_int(v) and v >= 1), key, f"got {short_repr(v)}; need an int >= 1 or null")

    def hub_sources(self) -> dict[str, dict[str, Any]]:
        """A hub task: {"train"|"test": {dataset, path, split, limit}} for ``rlvr_core.data.hub.load_hub_dataset``."""
        from rlvr_core.tasks import get_task

        train = self.dataset or get_task(self.task).default_dataset
        return {
            "train": {"dataset": train, "path": self.path, "split": self.split, "limit": self.limit},
            "test": {"dataset": self.eval_dataset or train, "path": self.eval_path, "split": self.eval_split,
                     "limit": self.eval_limit},
        }


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


@dataclass(frozen=True)
class EvaluateConfig:
    """Held-out evaluation: greedy accuracy and pass@k from ``n_samples`` samples (defaults: params.yaml)."""

    k: int = 8
    n_samples: int = 8
    temperature: float = 1.0
    max_new_tokens: int = 8

    def __post_init__(self) -> None:
        _check_self(self)
        require(self.k >= 1, "k", f"got {short_repr(self.k)}; need an int >= 1")
        require(self.n_samples == 0 or self.n_samples >= self.k, "n_samples",
                f"got {short_repr(self.n_samples)}; need 0 or an int >= k")
        require(self.temperature > 0, "temperature", f"got {short_repr(self.temperature)}; need > 0")
        require(1 <= self.max_new_tokens <= MAX_NEW_TOKENS, "max_new_tokens",
                f"got {self.max_new_tokens:,}; need 1 to {MAX_NEW_TOKENS:,} tokens (a 32k context)")


@dataclass(frozen=True)
class Params:
    prepare: PrepareConfig
    warmstart: WarmStartConfig
    train: TrainConfig
    evaluate: EvaluateConfig


SECTIONS = {"prepare": PrepareConfig, "warmstart": WarmStartConfig, "train": TrainConfig, "evaluate": EvaluateConfig}


def load_params(path: str | Path = "params.yaml", overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Params:
    """Read and validate params.yaml; ``overrides`` {section: {key: value}} win over the file.

    The file must hold the sections ``REQUIRED_SECTIONS`` (prepare and train), and its sections must
    agree (``check_sections_agree``: a task without a tiny-policy warm start needs
    ``warmstart.base_model``); a section it leaves out
    (warmstart, evaluate) and keys a section leaves out take the dataclass defaults, which are the
    project's params.yaml values. An error about an overridden key says the value came from the
    overrides (the flows' --set and --steps/--seed/--allocator), not from the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; run from the project root or pass the params file")
    raw = read_yaml(path.read_text(), str(path))
    need = f"a params file needs the sections {', '.join(REQUIRED_SECTIONS)} (see the project's params.yaml)"
    if raw is None:
        raise ConfigError(f"{path}: empty (or only comments); {need}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    for sec in raw:
        if sec not in SECTIONS and sec != "report":
            close = difflib.get_close_matches(str(sec), list(SECTIONS), n=1)
            hint = f" (did you mean {short_repr(close[0])}?)" if close else ""
            raise ConfigError(f"{path}: unknown section {short_repr(sec)}{hint}; valid: {', '.join(SECTIONS)}, report")
    for sec in SECTIONS:
        if raw.get(sec) is not None and not isinstance(raw[sec], Mapping):
            raise ConfigError(f"{path}: {sec}: got {short_repr(raw[sec])}; need a mapping of {sec} keys")
    merged = {sec: dict(raw.get(sec) or {}) for sec in SECTIONS}
    for sec, vals in (overrides or {}).items():
        if sec not in SECTIONS:
            raise ConfigError(f"overrides: unknown section {short_repr(sec)}; valid: {', '.join(SECTIONS)}")
        merged[sec].update(vals)
    try:
        for sec, cls in SECTIONS.items():
            try:
                check_fields(cls, merged[sec])
            except ConfigError as e:
                raise ConfigError(f"{sec}.{e}") from None
        params = Params(**{sec: from_mapping(cls, merged[sec], sec) for sec, cls in SECTIONS.items()})
    except ConfigError as e:
        msg = str(e) if len(str(e)) <= 600 else str(e)[:597] + "..."  # e.g. an unknown key 100k characters long
        raise ConfigError(f"{path}: {msg}{_from_overrides(msg, overrides or {}, path)}") from None
    missing = [sec for sec in REQUIRED_SECTIONS if raw.get(sec) is None]
    if missing:
        raise ConfigError(f"{path}: no {short_repr(missing[0])} section; {need}")
    check_sections_agree(params, path)
    return params


def check_sections_agree(params: Params, where: str | Path = "params") -> None:
    """ConfigError for sections that are each valid but cannot run together: a task without a warm
    start for the tiny policy (``rlvr_core.tasks``: math, code) needs ``warmstart.base_model``, and
    ``train.max_new_tokens`` / ``evaluate.max_new_tokens`` must fit the task's answers (countdown: 16)."""
    from rlvr_core.tasks import check_new_tokens, check_warm_start

    task = params.prepare.task
    problem = check_warm_start(task, params.warmstart.base_model)
    if problem:
        raise ConfigError(f"{where}: warmstart.base_model: {problem}")
    for key, value in (("train.max_new_tokens", params.train.max_new_tokens),
                       ("evaluate.max_new_tokens", params.evaluate.max_new_tokens)):
        if (problem := check_new_tokens(task, value)) is not None:
            raise ConfigError(f"{where}: {key}: {problem}")


def _from_overrides(message: str, overrides: Mapping[str, Mapping[str, Any]], path: Path) -> str:
    """" (train.lr came from --set ...)" when the key a message names was overridden, else ""."""
    for sec, vals in overrides.items():
        for key in vals:
            if re.match(rf"{re.escape(sec)}\.{re.escape(str(key))}\b", message):
                return f" (the value of {sec}.{key} came from --set or a command-line option, not from {path})"
    return ""
