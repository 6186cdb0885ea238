"""The task registry: every task declares a buildable source, a registered verifier and a schema its rows meet."""

from __future__ import annotations

import json

import pytest

from rlvr_core.config import PrepareConfig
from rlvr_core.data.hub import DATASETS
from rlvr_core.data.validate import DataError, validate_rows, validate_splits
from rlvr_core.errors import ConfigError
from rlvr_core.registry import UnknownNameError
from rlvr_core.rewards import VERIFIERS
from rlvr_core.tasks import TASKS, get_task

GENERATED = [n for n in TASKS.names() if get_task(n).generated]


def test_registry_names_the_five_tasks() -> None:
    assert set(TASKS.names()) == {"arithmetic", "arithmetic-steps", "code", "countdown", "math"}
    assert set(GENERATED) == {"arithmetic", "arithmetic-steps", "countdown"}
    with pytest.raises(UnknownNameError, match=r"unknown task 'countdwn' \(did you mean 'countdown'\?\); valid names"):
        get_task("countdwn")


@pytest.mark.parametrize("name", TASKS.names())
def test_every_task_is_complete(name: str) -> None:
    task = get_task(name)
    assert task.name == name and task.verifier in VERIFIERS
    assert {"id", "prompt"} <= set(task.schema)
    assert set(task.datasets) <= set(DATASETS.names())
    assert task.teacher is not None or task.needs, f"{name}: no warm-start teacher and no reason why"
    assert (task.instruction is None) == task.generated  # hub problems get the task's instruction in chat prompts


@pytest.mark.parametrize("name", GENERATED)
def test_generated_rows_meet_their_schema_and_checks(name: str) -> None:
    ds, extra = get_task(name).build(PrepareConfig(task=name, n_train=30, n_test=10, seed=3))
    train, test = list(ds["train"]), list(ds["test"])
    assert (len(train), len(test), extra) == (30, 10, {})
    validate_splits(train, test, get_task(name))
    # the task's own consistency check catches a row edited to contradict itself
    bad = dict(train[0], prompt=test[0]["prompt"])
    with pytest.raises(DataError, match="contradicts itself"):
        validate_rows([bad], get_task(name), "train")


def test_prepare_task_errors_come_from_the_registry() -> None:
    with pytest.raises(ConfigError, match=r"task: got 'sudoku'; use 'arithmetic' or 'arithmetic-steps' or 'countdown' "
                                          r"\(generated\), "
                                          r"'code' or 'math' \(hub datasets\)"):
        PrepareConfig(task="sudoku")
    with pytest.raises(ConfigError, match=r"dataset: unknown dataset 'gsm9k'; valid names: aime2024, gsm8k, "
                                          r"math, math500$"):
        PrepareConfig(task="math", dataset="gsm9k")
    assert PrepareConfig(task="math").hub_sources()["train"]["dataset"] == get_task("math").default_dataset == "math"


def test_countdown_teacher_writes_the_recorded_solution_and_a_sloppy_expression() -> None:
    from rlvr_core.data.countdown import make_countdown
    from rlvr_core.models.warmstart import countdown_targets
    from rlvr_core.rewards.countdown import _literals, verify_countdown

    rows = list(make_countdown(200, 10, seed=1)["train"])
    t = countdown_targets(rows)
    assert t.prompts == [r["prompt"] for r in rows] and t.difficulty == [len(r["numbers"]) for r in rows]
    assert all(verify_countdown(c, r) == 1.0 for c, r in zip(t.clean, rows))
    import ast

    for s, r in zip(t.sloppy, rows):  # well formed: every number once, only + - * / and parentheses
        assert sorted(_literals(ast.parse(s, mode="eval").body, 4)) == sorted(r["numbers"]), s
    wrong = sum(verify_countdown(s, r) == 0.0 for s, r in zip(t.sloppy, rows))
    assert wrong > 0.8 * len(rows)  # the sloppy teacher reaches the target only by chance
    assert countdown_targets(rows).sloppy == t.sloppy  # the same every run


def test_tasks_without_a_teacher_are_refused_up_front(tmp_path) -> None:
    import yaml

    from rlvr_core.config import load_params
    from rlvr_core.tasks import warm_start_teacher

    with pytest.raises(ConfigError, match=r"task 'math': the tiny policy has no warm start for it"):
        warm_start_teacher("math")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"prepare": {"task": "math"}, "train": {}}))
    with pytest.raises(ConfigError, match=r"warmstart\.base_model: null, but prepare\.task 'math' has no warm start "
                                          r"for the tiny policy \(its problems are English.*set warmstart\.base_model"):
        load_params(path)
    path.write_text(yaml.safe_dump({"prepare": {"task": "math"}, "train": {},
                                    "warmstart": {"base_model": "Qwen/Qwen2.5-1.5B-Instruct"}}))
    assert load_params(path).prepare.task == "math"


def test_countdown_needs_completions_long_enough_for_its_answers(tmp_path) -> None:
    import yaml

    from rlvr_core.config import load_params
    from rlvr_core.data.countdown import MAX_ANSWER_CHARS

    assert MAX_ANSWER_CHARS == len("100/(75-(50-25))")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"prepare": {"task": "countdown"}, "train": {}}))  # max_new_tokens 8
    with pytest.raises(ConfigError, match=r"train\.max_new_tokens: got 8, but prepare\.task 'countdown' has answers "
                                          r"of up to 16 tokens .*set it to 16 or more"):
        load_params(path)
    path.write_text(yaml.safe_dump({"prepare": {"task": "countdown"}, "train": {"max_new_tokens": 16},
                                    "evaluate": {"max_new_tokens": 12}}))
    with pytest.raises(ConfigError, match=r"evaluate\.max_new_tokens: got 12"):
        load_params(path)
    path.write_text(yaml.safe_dump({"prepare": {"task": "countdown"}, "train": {"max_new_tokens": 16},
                                    "evaluate": {"max_new_tokens": 16}}))
    assert load_params(path).train.max_new_tokens == 16


def test_code_rows_need_tests_the_sandbox_can_run() -> None:
    good = {"id": "p", "prompt": "Print A+B.", "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n",
                                                                                  "testtype": "stdin"}])}
    validate_rows([good], get_task("code"), "train")
    with pytest.raises(DataError, match=r"needs one of the fields \['tests', 'public_test_cases'\]"):
        validate_rows([{"id": "p", "prompt": "Print A+B."}], get_task("code"), "train")
    functional = dict(good, public_test_cases=json.dumps([{"input": "[1]", "output": "1", "testtype": "functional"}]))
    with pytest.raises(DataError, match=r"train row 0 \('p'\): the code verifier cannot run its tests .*'functional'"):
        validate_rows([functional], get_task("code"), "train")
    with pytest.raises(ConfigError, match=r"dataset: dataset 'math' belongs to another task; "
                                          r"valid names for task 'code': livecodebench"):
        PrepareConfig(task="code", dataset="math")
    assert PrepareConfig(task="code").hub_sources()["train"]["dataset"] == "livecodebench"
