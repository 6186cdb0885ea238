"""The top-level folders hold what their names say: tasks/ only Prefect tasks, pipeline/ none."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def defines_task(source: str) -> bool:
    """Whether a module defines a function decorated with Prefect's ``@task`` (bare, called or ``prefect.task``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                if name == "task":
                    return True
    return False


def modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")


def test_every_module_of_tasks_defines_a_prefect_task() -> None:
    found = modules("tasks")
    assert len(found) >= 4  # data, models, training, evaluation, report
    helpers = [p.name for p in found if not defines_task(p.read_text())]
    assert not helpers, f"tasks/ holds Prefect tasks only; move {helpers} to pipeline/ (docs/design.md §2.1)"


def test_pipeline_defines_no_task() -> None:
    found = modules("pipeline")
    assert {"paths.py", "tracking.py", "remote.py"} <= {p.name for p in found}
    tasks = [p.name for p in found if defines_task(p.read_text())]
    assert not tasks, f"pipeline/ holds no Prefect task; move {tasks} to tasks/"


def test_the_task_finder_sees_every_spelling() -> None:
    assert defines_task("from prefect import task\n@task\ndef f(): pass\n")
    assert defines_task("from prefect import task\n@task(retries=2)\ndef f(): pass\n")
    assert defines_task("import prefect\n@prefect.task(cache_policy=None)\nasync def f(): pass\n")
    assert not defines_task("import functools\n@functools.cache\ndef f(): pass\n")
    assert not defines_task("def task(): pass\n")
