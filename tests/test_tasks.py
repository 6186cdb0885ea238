"""The task registry: every task declares a buildable source, a registered verifier and a schema its rows meet."""

from __future__ import annotations

import pytest

from rlvr_core.config import PrepareConfig
from rlvr_core.data.hub import DATASETS
from rlvr_core.data.validate import DataError, validate_rows, validate_splits
from rlvr_core.errors import ConfigError
from rlvr_core.registry import UnknownNameError
from rlvr_core.rewards import VERIFIERS
from rlvr_core.tasks import TASKS, get_task

GENERATED = [n for n in TASKS.names() if get_task(n).generated]


def test_registry_names_the_four_tasks() -> None:
    assert {"arithmetic", "countdown", "math"} <= set(TASKS.names())
    assert set(GENERATED) == {"arithmetic", "countdown"}
    with pytest.raises(UnknownNameError, match=r"unknown task 'countdwn' \(did you mean 'countdown'\?\); valid names"):
        get_task("countdwn")


@pytest.mark.parametrize("name", TASKS.names())
def test_every_task_is_complete(name: str) -> None:
    task = get_task(name)
    assert task.name == name and task.verifier in VERIFIERS
    assert {"id", "prompt"} <= set(task.schema)
    assert set(task.datasets) <= set(DATASETS.names())


@pytest.mark.parametrize("name", GENERATED)
def test_generated_rows_meet_their_schema_and_checks(name: str) -> None:
    ds, extra = get_task(name).build(PrepareConfig(task=name, n_train=30, n_test=10, seed=3))
    train, test = list(ds["train"]), list(ds["test"])
    assert (len(train), len(test), extra) == (30, 10, {})
    validate_splits(train, test, name)
    # the task's own consistency check catches a row edited to contradict itself
    bad = dict(train[0], prompt=test[0]["prompt"])
    with pytest.raises(DataError, match="contradicts itself"):
        validate_rows([bad], name, "train")


def test_prepare_task_errors_come_from_the_registry() -> None:
    with pytest.raises(ConfigError, match=r"task: got 'sudoku'; use 'arithmetic' or 'countdown' \(generated\), .*'math'"):
        PrepareConfig(task="sudoku")
    with pytest.raises(ConfigError, match=r"dataset: unknown dataset 'gsm9k'; valid names: aime2024, gsm8k, math, math500"):
        PrepareConfig(task="math", dataset="gsm9k")
    assert PrepareConfig(task="math").hub_sources()["train"]["dataset"] == get_task("math").default_dataset == "math"
