"""The nightly evaluation's bookkeeping (flows/evaluate.py ``nightly_pass``): its index is keyed by each run
folder's path under the project root, so runs/<name>/ and runs/deployments/<name>/ are both evaluated, and a
folder whose own files cannot be read is skipped, named and recorded, while every other folder is evaluated
and indexed. The evaluation itself and MLflow are replaced by fakes: what is tested is which checkpoints are
evaluated and what the index says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flows.evaluate
import pipeline.tracking
from rlvr_core.checkpoint import CheckpointError, manifest_step, save_checkpoint
from rlvr_core.config import load_params
from tests.pipeline.conftest import TINY


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    monkeypatch.delenv("RLVR_DVC_REMOTE", raising=False)
    return tmp_path


@pytest.fixture
def evaluated(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The checkpoints the pass evaluates, in order; a checkpoint under a folder named broken-* fails to load."""
    calls: list[Path] = []

    def fake_eval(params, ckpt: Path) -> dict:
        calls.append(ckpt)
        if ckpt.parts[-3].startswith("broken"):
            raise CheckpointError(f"{ckpt}: tensors.safetensors: not a safetensors file")
        return {"step": manifest_step(ckpt), "greedy_acc": 0.5}

    monkeypatch.setattr(flows.evaluate, "_eval", fake_eval)
    runs = iter(range(1000))
    monkeypatch.setattr(pipeline.tracking, "start_run", lambda name, params, tags: f"r{next(runs)}")
    monkeypatch.setattr(pipeline.tracking, "log_metrics", lambda run_id, metrics, step: None)
    monkeypatch.setattr(pipeline.tracking, "end_run", lambda run_id: None)
    return calls


def make_run(folder: Path, step: int, tracking: str | None = '{"run_id": "train1"}') -> Path:
    save_checkpoint(folder / "checkpoints", step, {"step": step}, meta={"config": {"allocator": "sara"}})
    if tracking is not None:
        (folder / "tracking.json").write_text(tracking)
    return folder / "checkpoints" / f"step_{step:06d}"


def index(project: Path) -> dict:
    return json.loads((project / "reports/nightly/index.json").read_text())


def test_a_deployment_run_does_not_shadow_the_pipeline_run_of_the_same_name(project: Path, evaluated) -> None:
    ours = make_run(project / "runs/sara-s0", 2)
    deployed = make_run(project / "runs/deployments/sara-s0", 2)
    out = flows.evaluate.nightly_pass(load_params(TINY))
    assert sorted(evaluated) == sorted([ours, deployed])
    assert index(project)["evaluated"] == {"runs/sara-s0": [2], "runs/deployments/sara-s0": [2]}
    assert set(out["evaluated"]) == {"runs/sara-s0", "runs/deployments/sara-s0"} and out["skipped"] == {}
    for key in ("runs/sara-s0", "runs/deployments/sara-s0"):  # one result file each, none overwritten
        assert json.loads((project / f"reports/nightly/{key}-step000002.json").read_text())["checkpoint"] == str(
            project / key / "checkpoints/step_000002")
    evaluated.clear()
    flows.evaluate.nightly_pass(load_params(TINY))
    assert evaluated == []


def test_a_bad_folder_is_skipped_named_and_recorded_and_the_others_are_indexed(project: Path, evaluated) -> None:
    first = make_run(project / "runs/grpo-s0", 2)
    make_run(project / "runs/sara-s0", 3, tracking="{not json")
    make_run(project / "runs/broken-s0", 4)
    last = make_run(project / "runs/deployments/vigor-s0", 5)
    with pytest.warns(RuntimeWarning) as warned:
        out = flows.evaluate.nightly_pass(load_params(TINY))
    said = [str(w.message) for w in warned]
    assert any(f"{project / 'runs/sara-s0'} skipped: " in m and "tracking.json: not a tracking record" in m
               for m in said), said
    assert any(f"{project / 'runs/broken-s0'} skipped: " in m and "not a safetensors file" in m for m in said), said
    # the bad tracking.json is read before the evaluation: no work is spent on that folder
    assert [c.parts[-3] for c in evaluated] == ["broken-s0", "grpo-s0", "vigor-s0"]
    idx = index(project)
    assert idx["evaluated"] == {"runs/grpo-s0": [2], "runs/deployments/vigor-s0": [5]}
    assert set(idx["skipped"]) == {"runs/sara-s0", "runs/broken-s0"} == set(out["skipped"])
    assert idx["skipped"]["runs/sara-s0"]["step"] == 3 and "not a tracking record" in idx["skipped"]["runs/sara-s0"][
        "reason"]
    assert set(out["evaluated"]) == {"runs/grpo-s0", "runs/deployments/vigor-s0"}

    evaluated.clear()  # a second pass: nothing that was evaluated is evaluated again; the bad folders are retried
    with pytest.warns(RuntimeWarning) as warned:
        flows.evaluate.nightly_pass(load_params(TINY))
    assert sorted(str(w.message).split(" skipped: ")[0] for w in warned) == [
        f"nightly: {project / 'runs/broken-s0'}", f"nightly: {project / 'runs/sara-s0'}"]
    assert [c.parts[-3] for c in evaluated] == ["broken-s0"] and first not in evaluated and last not in evaluated

    evaluated.clear()  # mended: evaluated, and no longer listed as skipped
    (project / "runs/sara-s0/tracking.json").write_text('{"run_id": "train2"}')
    (project / "runs/broken-s0").rename(project / "runs/fixed-s0")
    flows.evaluate.nightly_pass(load_params(TINY))
    assert sorted(c.parts[-3] for c in evaluated) == ["fixed-s0", "sara-s0"]
    idx = index(project)
    assert idx["skipped"] == {} and idx["evaluated"]["runs/sara-s0"] == [3] and idx["evaluated"]["runs/fixed-s0"] == [4]


def test_an_index_keyed_by_folder_name_is_stale_and_a_damaged_one_is_set_aside(project: Path, evaluated) -> None:
    make_run(project / "runs/sara-s0", 2)
    make_run(project / "runs/deployments/sara-s0", 2)
    (project / "reports/nightly").mkdir(parents=True)
    (project / "reports/nightly/index.json").write_text('{"sara-s0": [2]}')  # which of the two? it cannot say
    with pytest.warns(RuntimeWarning, match="keyed by run folder name.*evaluated once more"):
        flows.evaluate.nightly_pass(load_params(TINY))
    assert len(evaluated) == 2 and index(project)["format"] == 2
    assert set(index(project)["evaluated"]) == {"runs/sara-s0", "runs/deployments/sara-s0"}

    evaluated.clear()
    (project / "reports/nightly/index.json").write_text('{"format": 2, "evaluated": ')
    with pytest.warns(RuntimeWarning, match=r"index.json cannot be read .*set aside as index.json.damaged"):
        flows.evaluate.nightly_pass(load_params(TINY))
    assert (project / "reports/nightly/index.json.damaged").read_text() == '{"format": 2, "evaluated": '
    assert len(evaluated) == 2 and set(index(project)["evaluated"]) == {"runs/sara-s0", "runs/deployments/sara-s0"}
