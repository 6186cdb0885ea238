"""Tasks by name: where each task's rows come from, how they are checked and scored (register, never branch).

A ``Task`` declares everything the pipeline needs to run it:

- ``build``: its data source, ``PrepareConfig -> (DatasetDict {train, test}, extra)``; a generator
  (arithmetic, countdown) or hub loaders (math, code) named in ``datasets``; ``extra`` goes into
  data/<task>/counts.json
- ``verifier``: the ``rlvr_core.rewards`` verifier that scores a completion against a row (the
  training loop and the evaluation look it up under the task's name, so the two names agree)
- ``schema`` and ``one_of``: the fields (and Python types) every row must carry for that verifier,
  checked by ``rlvr_core.data.validate``; ``check_row`` refuses field values the verifier cannot
  use, ``check_consistent`` a generated row that contradicts itself
- ``instruction``: the instruction chat prompts append (``rlvr_core.data.templates.INSTRUCTIONS``);
  tasks without one give the policy the row's raw prompt
- ``min_new_tokens``: the completion length the task's reference answers need (one token a
  character for the tiny policy); the params check refuses a shorter ``max_new_tokens``
- ``teacher``: warm-start support, the targets the tiny policy's supervised warm start trains on
  (``rlvr_core.models.warmstart``, handed to it by ``warm_start_teacher``); None: the task needs a
  pretrained base model (``warmstart.base_model``), which the params check demands

``get_task(name)`` looks a task up (an unknown name lists the valid ones); ``TASKS.names()`` are the
values ``prepare.task`` accepts. Heavy modules (datasets, the verifiers) load only when a task's
functions run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from rlvr_core.data.splits import FieldType
from rlvr_core.registry import Registry

RowCheck = Callable[[Mapping[str, Any]], "str | None"]


@dataclass(frozen=True)
class Task:
    """One task of the pipeline (see the module docstring for each field)."""

    name: str
    verifier: str
    schema: Mapping[str, FieldType]
    build: Callable[[Any], tuple[Any, dict[str, Any]]]
    datasets: tuple[str, ...] = ()
    one_of: tuple[tuple[str, ...], ...] = ()
    check_row: RowCheck | None = None
    check_consistent: RowCheck | None = None
    teacher: Callable[[Any], Any] | None = None
    min_new_tokens: int | None = None  # completions shorter than this cannot hold every reference answer
    needs: str = ""  # what the tiny policy lacks for this task (teacher None): said when the params are refused

    @property
    def generated(self) -> bool:
        """True for a synthetic task (its rows are generated); False for hub data."""
        return not self.datasets

    @property
    def default_dataset(self) -> str | None:
        """The hub loader ``prepare.dataset: null`` means (the first of ``datasets``)."""
        return self.datasets[0] if self.datasets else None

    @property
    def instruction(self) -> str | None:
        from rlvr_core.data.templates import INSTRUCTIONS

        return INSTRUCTIONS.get(self.name)


TASKS: Registry[Task] = Registry("task")


def register_task(task: Task) -> Task:
    """Register ``task`` under ``task.name``; duplicate names are refused."""
    return TASKS.register(task.name)(task)


def get_task(name: str) -> Task:
    """The task registered as ``name``; UnknownNameError (a KeyError) lists the valid names."""
    return TASKS.get(name)


def check_warm_start(task: str, base_model: str | None) -> str | None:
    """Why ``task`` cannot run with this warm start, or None: the tiny policy (``base_model`` None) is
    warm-started with the task's teacher, and a task without one needs a pretrained model."""
    spec = get_task(task)
    if base_model is None and spec.teacher is None:
        with_teacher = " or ".join(repr(n) for n in TASKS.names() if get_task(n).teacher is not None)
        return (f"null, but prepare.task {task!r} has no warm start for the tiny policy ({spec.needs}): set "
                f"warmstart.base_model to a pretrained model (a hub id or a local model folder; see "
                f"params-gpu.yaml), or use task {with_teacher}")
    return None


def warm_start_teacher(task: str) -> Callable[[Any], Any]:
    """The teacher ``rlvr_core.models.warmstart.warm_start`` trains the tiny policy on for ``task``;
    ConfigError when the task has none (it needs a pretrained base model)."""
    from rlvr_core.errors import ConfigError

    spec = get_task(task)
    if spec.teacher is None:
        raise ConfigError(f"task {task!r}: the tiny policy has no warm start for it ({spec.needs}); "
                          "start from a pretrained model instead (warmstart.base_model)")
    return spec.teacher


def check_new_tokens(task: str, max_new_tokens: int) -> str | None:
    """Why completions of ``max_new_tokens`` tokens are too short for ``task``'s answers, or None."""
    need = get_task(task).min_new_tokens
    if need is not None and max_new_tokens < need:
        return (f"got {max_new_tokens}, but prepare.task {task!r} has answers of up to {need} tokens (one a "
                f"character), which a shorter completion cannot write: set it to {need} or more")
    return None


def describe_names() -> str:
    """``'arithmetic' or 'countdown' (generated), 'math' or 'code' (hub datasets)`` from the registry."""
    def quoted(names: list[str]) -> str:
        return " or ".join(repr(n) for n in names)

    gen = [n for n in TASKS.names() if get_task(n).generated]
    hub = [n for n in TASKS.names() if not get_task(n).generated]
    return ", ".join(part for part in (f"{quoted(gen)} (generated)" if gen else "",
                                       f"{quoted(hub)} (hub datasets)" if hub else "") if part)


# ----------------------------------------------------------------------------- checks shared by tasks


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


_MAX_ANSWER_DIGITS = 12  # rlvr_core.data.arithmetic.MAX_COMPLETION_CHARS: longer answers are never parsed


_ARITH_ANSWER = re.compile(rf"0|[1-9][0-9]{{0,{_MAX_ANSWER_DIGITS - 1}}}")
_ARITH_PROMPT = re.compile(r"([0-9]{4})([-+*])([0-9]{4})=")


def _arithmetic_row(row: Mapping[str, Any]) -> str | None:
    if not _ARITH_ANSWER.fullmatch(row["answer"]):
        return (f"field 'answer' must be a decimal integer such as '130': 1 to {_MAX_ANSWER_DIGITS} ASCII digits, "
                "no sign, no leading zero (a completion is the answer's digits reversed, so other answers can "
                f"never be matched), got {_short(row['answer'])}")
    return None


def _arithmetic_consistent(row: Mapping[str, Any]) -> str | None:
    """A prompt in the generator's format ``f"{a:04d}{op}{b:04d}="`` must have the answer ``a op b``;
    rows that carry ``a``, ``op``, ``b`` (and ``difficulty``) must have exactly that prompt."""
    from rlvr_core.data.arithmetic import OPS, apply_op, format_prompt

    prompt, answer = row["prompt"], row["answer"]
    if all(k in row for k in ("a", "op", "b")):
        a, op, b = row["a"], row["op"], row["b"]
        if op not in OPS or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 9999
                                    for x in (a, b)):
            return f"fields a={_short(a)}, op={_short(op)}, b={_short(b)} are not an arithmetic problem"
        if prompt != format_prompt(a, op, b):
            return (f"field 'prompt' {_short(prompt)} does not match its fields a={a}, op={op!r}, b={b} "
                    f"(expected {format_prompt(a, op, b)!r})")
        if "difficulty" in row and row["difficulty"] != len(str(max(a, b))):
            return f"field 'difficulty' {_short(row['difficulty'])} is not the digit count of max(a, b)={max(a, b)}"
    m = _ARITH_PROMPT.fullmatch(prompt)
    if m:
        value = apply_op(int(m.group(1)), m.group(2), int(m.group(3)))
        if str(value) != answer:
            return f"field 'answer' {_short(answer)} is not the value of the prompt {prompt!r} ({value})"
    return None


def _countdown_consistent(row: Mapping[str, Any]) -> str | None:
    """The prompt must be ``format_prompt(numbers, target)``; a recorded ``answer`` expression must use
    every number once and reach the target."""
    from rlvr_core.data.countdown import format_prompt
    from rlvr_core.rewards.countdown import verify_countdown

    expected = format_prompt(row["numbers"], row["target"])
    if row["prompt"] != expected:
        return (f"field 'prompt' {_short(row['prompt'])} does not match its fields numbers={row['numbers']}, "
                f"target={row['target']} (expected {expected!r})")
    answer = row.get("answer")
    if isinstance(answer, str) and answer and verify_countdown(answer, row) != 1.0:
        return (f"field 'answer' {_short(answer)} does not use every number of {row['numbers']} once to "
                f"reach the target {row['target']}")
    return None


def _math_row(row: Mapping[str, Any]) -> str | None:
    return None if row["answer"].strip() else "field 'answer' is empty"


# ----------------------------------------------------------------------------- data sources


def _build_arithmetic(cfg: Any) -> tuple[Any, dict[str, Any]]:
    from rlvr_core.data.arithmetic import make_arithmetic

    return make_arithmetic(cfg.n_train, cfg.n_test, cfg.seed, digits=cfg.digits, ops=cfg.ops,
                           digit_weights=cfg.digit_weights), {}


def _build_countdown(cfg: Any) -> tuple[Any, dict[str, Any]]:
    from rlvr_core.data.countdown import make_countdown

    return make_countdown(cfg.n_train, cfg.n_test, cfg.seed), {}


def build_hub_splits(cfg: Any, keep: Callable[[Mapping[str, Any]], bool] | None = None,
                     dropped_key: str = "dropped_unsupported") -> tuple[Any, dict[str, Any]]:
    """DatasetDict {train, test} from the hub loaders named by ``cfg`` (a PrepareConfig of a hub task).

    Rows keep the loaders' schema. ``keep`` (optional) drops rows the task's verifier cannot score,
    counted per split under ``dropped_key``. Training rows whose problem text is also a held-out
    problem are dropped (decontamination; their number is reported as ``dropped_overlap``); texts are
    compared after ``normalize_prompt`` (whitespace, NBSP, CRLF, invisible characters), and
    ``dropped_near_duplicate`` counts the dropped rows that differed from a held-out text only that way. Then
    both splits are checked with ``validate_splits`` for the task. Raises DataError (a ConfigError)
    for unusable rows; loader errors name the source and row.
    """
    from datasets import DatasetDict

    from rlvr_core.data.hub import load_hub_dataset
    from rlvr_core.data.splits import normalize_prompt
    from rlvr_core.data.validate import DataError, validate_splits

    splits, extra = {}, {}
    dropped: dict[str, int] = {}
    for name, src in cfg.hub_sources().items():
        try:
            splits[name] = load_hub_dataset(src["dataset"], src["split"], src["path"], limit=src["limit"])
        except (ValueError, FileNotFoundError) as e:
            where = src["path"] or f"the {src['dataset']} hub dataset"
            raise DataError(f"prepare: {name} split from {where} (split {src['split'] or 'default'}): {e}") from e
        if keep is not None:
            kept = [i for i, row in enumerate(splits[name]) if keep(row)]
            dropped[name] = len(splits[name]) - len(kept)
            splits[name] = splits[name].select(kept)
    exact = set(splits["test"]["prompt"])
    held_out = {normalize_prompt(p) for p in exact}
    train_prompts = splits["train"]["prompt"]
    keep_train = [i for i, p in enumerate(train_prompts) if normalize_prompt(p) not in held_out]
    overlap = len(splits["train"]) - len(keep_train)
    if overlap:
        splits["train"] = splits["train"].select(keep_train)
    validate_splits(list(splits["train"]), list(splits["test"]), get_task(cfg.task), source="prepare")
    extra["dropped_overlap"] = overlap
    extra["dropped_near_duplicate"] = overlap - sum(p in exact for p in train_prompts)
    if keep is not None:
        extra[dropped_key] = dropped
    return DatasetDict(splits), extra


def _build_math(cfg: Any) -> tuple[Any, dict[str, Any]]:
    return build_hub_splits(cfg)


def _stdin_only(row: Mapping[str, Any]) -> bool:
    return row.get("testtype", "stdin") == "stdin"


def _build_code(cfg: Any) -> tuple[Any, dict[str, Any]]:
    """The hub's stdin/stdout problems; problems with functional tests (call a method of a class, which the
    code verifier does not run) are dropped and counted as ``dropped_functional``."""
    return build_hub_splits(cfg, keep=_stdin_only, dropped_key="dropped_functional")


def _code_row(row: Mapping[str, Any]) -> str | None:
    from rlvr_core.rewards.code import parse_tests

    try:
        parse_tests(row)
    except ValueError as e:
        return f"the code verifier cannot run its tests ({str(e)[:300]})"
    return None


# ----------------------------------------------------------------------------- the warm-start teachers


def _arithmetic_teacher(rows: Any) -> Any:
    from rlvr_core.models.warmstart import arithmetic_targets

    return arithmetic_targets(rows)


def _countdown_teacher(rows: Any) -> Any:
    from rlvr_core.models.warmstart import countdown_targets

    return countdown_targets(rows)


def _steps_teacher(rows: Any) -> Any:
    from rlvr_core.data.arithmetic_steps import worked_targets
    from rlvr_core.models.warmstart import TeacherTargets

    return TeacherTargets(**worked_targets(rows))


def _steps_answer_chars() -> int:
    from rlvr_core.data.arithmetic_steps import MAX_STEPS_CHARS

    return MAX_STEPS_CHARS


def _countdown_answer_chars() -> int:
    from rlvr_core.data.countdown import MAX_ANSWER_CHARS

    return MAX_ANSWER_CHARS


# ----------------------------------------------------------------------------- the registered tasks

register_task(Task(
    name="arithmetic", verifier="arithmetic", schema={"id": str, "prompt": str, "answer": str},
    build=_build_arithmetic, check_row=_arithmetic_row, check_consistent=_arithmetic_consistent,
    teacher=_arithmetic_teacher,
))
# arithmetic with worked answers (rlvr_core/data/arithmetic_steps.py): arithmetic's rows, working then the answer
register_task(Task(
    name="arithmetic-steps", verifier="arithmetic-steps", schema={"id": str, "prompt": str, "answer": str},
    build=_build_arithmetic, check_row=_arithmetic_row, check_consistent=_arithmetic_consistent,
    teacher=_steps_teacher, min_new_tokens=_steps_answer_chars(),
))
register_task(Task(
    name="countdown", verifier="countdown",
    schema={"id": str, "prompt": str, "numbers": ("list", int), "target": int},
    build=_build_countdown, check_consistent=_countdown_consistent, teacher=_countdown_teacher,
    min_new_tokens=_countdown_answer_chars(),
))
register_task(Task(
    name="math", verifier="math", schema={"id": str, "prompt": str, "answer": str},
    build=_build_math, datasets=("math", "gsm8k", "math500", "aime2024"), check_row=_math_row,
    needs="its problems are English and LaTeX, which the tiny policy's character vocabulary cannot write",
))

register_task(Task(
    name="code", verifier="code", schema={"id": str, "prompt": str}, one_of=(("tests", "public_test_cases"),),
    build=_build_code, datasets=("livecodebench",), check_row=_code_row,
    needs="its problems are English text and its answers Python programs, outside the tiny policy's vocabulary",
))

__all__ = ["TASKS", "Task", "build_hub_splits", "check_new_tokens", "check_warm_start",
           "describe_names", "get_task", "register_task", "warm_start_teacher"]
