"""The ``prepare`` section: task data, generated or read from a hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr_core.config.checks import _check_self, _is_int
from rlvr_core.config.reading import short_repr
from rlvr_core.errors import require


@dataclass(frozen=True)
class PrepareConfig:
    """Task data: generated, or read from a hub (the ``prepare`` section).

    Each field's ``help`` (field metadata) documents it: docs/configuration.md and params.yaml's comments
    are generated from them (``make docs``).
    """

    task: str = field(default="arithmetic", metadata={"help": (
        "A registered task (`rlvr_core.tasks`). `arithmetic` and `countdown` are generated; `math` reads hub "
        "rows verified by math-verify (MATH, GSM8K, MATH-500, AIME 2024 through `rlvr_core.data.hub`); `code` "
        "reads LiveCodeBench stdin/stdout problems, run in the sandbox.")})
    n_train: int = field(default=20000, metadata={"help": (
        "Generated tasks only: problems in the training split. The splits never share a problem.")})
    n_test: int = field(default=500, metadata={"help": "Generated tasks only: problems in the held-out split."})
    seed: int = field(default=0, metadata={"help": "Generated tasks only: the generator's seed."})
    digits: tuple[int, ...] = field(default=(1, 2, 3, 4), metadata={"help": (
        "Arithmetic only: operand digit counts to draw (distinct, 1 to 4). Operands are zero-padded to width 4 "
        "and answers written reversed. The default, 1-4, is the study's regime `hard`: the tiny policy does not "
        "learn 4-digit problems in its warm-start budget, which leaves RL room to rise.")})
    digit_weights: tuple[float, ...] | None = field(default=None, metadata={"help": (
        "Arithmetic only: relative weight of each entry of `digits` (null: equal).")})
    ops: tuple[str, ...] = field(default=("+", "-", "*"), metadata={"help": (
        "Arithmetic only: operators to draw from (`+`, `-`, `*`).")})
    dataset: str | None = field(default=None, metadata={"help": (
        "Hub tasks only: hub loader of the training split (null: the task's first). One the task reads "
        "(math: math, gsm8k, math500, aime2024; code: livecodebench); generated tasks refuse it unless null.")})
    path: str | None = field(default=None, metadata={"help": (
        "Hub tasks only: hub name or local copy in the hub format (null: the loader's hub name). A local copy "
        "is a directory or a file.")})
    split: str = field(default="train", metadata={"help": (
        "Hub tasks only: split of `dataset` used for training. livecodebench's split names a release file "
        "(`test`: release v1, `test2`: the problems release v2 added, ...).")})
    limit: int | None = field(default=None, metadata={"help": "Hub tasks only: first N training rows (null: all)."})
    eval_dataset: str | None = field(default=None, metadata={"help": (
        "Hub tasks only: hub loader of the held-out split (null: `dataset`).")})
    eval_path: str | None = field(default=None, metadata={"help": (
        "Hub tasks only: `path` for the held-out split (null: the loader's hub name).")})
    eval_split: str | None = field(default=None, metadata={"help": (
        "Hub tasks only: split of the held-out rows (null: the loader's default split).")})
    eval_limit: int | None = field(default=None, metadata={"help": (
        "Hub tasks only: first N held-out rows (null: all).")})

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

