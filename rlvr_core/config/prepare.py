"""The ``prepare`` section: task data, generated or read from a hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr_core.config.checks import _check_self, _is_int
from rlvr_core.config.reading import short_repr
from rlvr_core.errors import require

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

