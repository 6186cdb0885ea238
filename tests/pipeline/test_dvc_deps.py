"""dvc.yaml's stages depend on the code they run, and name run folders as the code does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from rlvr_core.allocation.registry import ALLOCATORS
from tests.pipeline.conftest import PROJECT

STAGES = yaml.safe_load((PROJECT / "dvc.yaml").read_text())["stages"]

PACKAGES = ("flows", "tasks", "pipeline", "rlvr_core")
# Imports that decide whether a stage may run, never what it writes: params validation looks the allocator
# and engine names up in their registries and checks the update's knobs (TrainerConfig). A stage does not
# depend on them through this edge.
VALIDATION_ONLY = {("rlvr_core/config/train.py", "rlvr_core.allocation"),
                   ("rlvr_core/config/train.py", "rlvr_core.rollout"), ("rlvr_core/config/train.py", "rlvr_core.grpo")}


def module_file(name: str) -> Path | None:
    base = PROJECT.joinpath(*name.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def imported_project_files(module: str) -> list[str]:
    """Project files ``module`` imports, directly or through others, at top level or inside functions.

    Read from the source (ast), so lazy imports (an engine imported only when named) count too; importing
    a submodule runs its packages' ``__init__`` files, so those count as well.
    """
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            f = module_file(".".join(parts[:i]))
            if f is None or f in seen:
                continue
            seen.add(f)
            rel = f.relative_to(PROJECT).as_posix()
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                             if module_file(f"{node.module}.{a.name}")]
                else:
                    continue
                todo += [n for n in names if n.split(".")[0] in PACKAGES
                         and not any((rel, skip) == (r, n[:len(skip)]) for r, skip in VALIDATION_ONLY)]
    return sorted(f.relative_to(PROJECT).as_posix() for f in seen)


def stage_body(name: str) -> dict:
    body = STAGES[name]
    return body["do"] if "foreach" in body else body  # a matrix stage holds its body itself


def flow_module(body: dict) -> str:
    cmd = body["cmd"].split()
    assert cmd[:2] == ["python", "-m"] and cmd[2].startswith("flows."), body["cmd"]
    return cmd[2]


def code_deps(body: dict) -> list[str]:
    return [d for d in body["deps"] if d.split("/")[0] in PACKAGES]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_lists_every_project_file_its_flow_imports(stage: str) -> None:
    body = stage_body(stage)
    deps = code_deps(body)
    missing = [d for d in deps if not (PROJECT / d).exists()]
    assert not missing, f"stage {stage}: deps that do not exist: {missing}"
    uncovered = [f for f in imported_project_files(flow_module(body))
                 if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)]
    assert not uncovered, f"stage {stage} runs code its deps do not list (add to dvc.yaml): {uncovered}"


def test_allocator_edit_touches_train_stages_only() -> None:
    """An allocator's file is a dep of the training stages and of nothing upstream of them."""
    def covers(stage: str, f: str) -> bool:
        return any(f == d or f.startswith(d.rstrip("/") + "/") for d in code_deps(stage_body(stage)))
    f = "rlvr_core/allocation/sara.py"
    assert covers("train", f) and covers("experiment", f)
    assert not covers("prepare", f) and not covers("warmstart", f)
    assert not any(covers(s, "README.md") for s in STAGES)


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_dvc_outs_are_the_run_folder_the_flow_writes(allocator: str, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from pipeline.paths import run_dir

    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    body = stage_body("train")
    assert set(body["matrix"]) == {"allocator", "seed"}  # one stage per (train.allocators, train.seeds) entry
    for seed in (0, 3, 12):
        folder = run_dir(allocator, seed).relative_to(tmp_path).as_posix()
        outs = [o if isinstance(o, str) else next(iter(o)) for o in body["outs"] + body["metrics"]]
        declared = {o.replace("${item.allocator}", allocator).replace("${item.seed}", str(seed)).rsplit("/", 1)[0]
                    for o in outs}
        assert declared == {folder}, (declared, folder)
    assert "--allocator ${item.allocator} --seed ${item.seed}" in body["cmd"]  # the flow writes run_dir(both)


def test_run_folder_names() -> None:
    from pipeline.paths import run_name

    assert run_name("sara+dps", 0) == "sara+dps-s0" and run_name("grpo", 12) == "grpo-s12"
    for bad in (("", 0), ("a/b", 0), ("..", 0), ("grpo", -1), ("grpo", True), ("grpo", "0")):
        with pytest.raises(ValueError):
            run_name(*bad)
