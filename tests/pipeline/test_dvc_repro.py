"""`dvc repro` runs the whole tiny pipeline in a fresh git+dvc repo; a second repro does nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline.conftest import PY, sh, tiny_repo

pytestmark = pytest.mark.slow


def test_dvc_repro_tiny(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # a name with '+' names its run folder as dvc.yaml does; one stage and one run folder per (allocator, seed)
    env = tiny_repo(repo, pipeline_env, allocators=["grpo", "sara+dps"], seeds=[0, 1])
    dvc = str(Path(PY).with_name("dvc"))
    sh(env, repo, dvc, "repro")
    status = sh(env, repo, dvc, "status")
    assert "up to date" in status.lower() or status.strip() == "", status
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert set(metrics["allocators"]) == {"grpo", "sara+dps"} and metrics["target"]["reference"] == "grpo"
    assert all(m["seeds"] == [0, 1] for m in metrics["allocators"].values())
    for run in ("sara+dps-s0", "sara+dps-s1"):
        assert json.loads((repo / f"runs/{run}/summary.json").read_text())["steps"] == 2
    assert sorted(p.name for p in (repo / "runs").iterdir()) == ["grpo-s0", "grpo-s1", "sara+dps-s0", "sara+dps-s1"]
    seeds = {json.loads((repo / f"runs/grpo-s{s}/checkpoints/step_000002/manifest.json").read_text())["meta"]
             ["config"]["seed"] for s in (0, 1)}
    assert seeds == {0, 1}  # each stage trained its own seed
    table = (repo / "reports/comparison.md").read_text()
    assert "| sara+dps | 2 |" in table and "| grpo | 2 |" in table and "rollouts to target" in table, table
    reports = {p.name: p.read_bytes() for p in sorted((repo / "reports").glob("*.json"))}
    second = sh(env, repo, dvc, "repro")
    assert "didn't change" in second and "Running stage" not in second, second
    # the report is a function of the runs: made again from the same runs, its files are byte-identical
    sh(env, repo, dvc, "repro", "--force", "--single-item", "report")
    assert {p.name: p.read_bytes() for p in sorted((repo / "reports").glob("*.json"))} == reports

    # the stages depend on the code they run: an allocator's edit makes the training stages stale, and only them
    sara = repo / "rlvr_core/allocation/sara.py"
    original = sara.read_text()
    sara.write_text(original + "# an edit\n")
    stale = sh(env, repo, dvc, "status")
    for s in ("train@grpo-0", "train@grpo-1", "train@sara+dps-0", "train@sara+dps-1", "experiment"):
        assert s in stale, (s, stale)
    for s in ("prepare", "warmstart"):
        assert f"{s}:" not in stale, (s, stale)
    sara.write_text(original)
    (repo / "README.md").write_text((repo / "README.md").read_text() + "\nan edit\n")
    status = sh(env, repo, dvc, "status")
    assert "up to date" in status.lower() or status.strip() == "", status
    # the experiment stage trained train.allocator (sara) into experiment/
    assert json.loads((repo / "experiment/summary.json").read_text())["allocator"] == "sara"
    assert (repo / "experiment/curve.csv").read_text().startswith("step,cum_rollouts,cum_tokens,greedy_acc")
    # the README's `dvc metrics show` and `dvc plots show` read the declared files
    metrics_out = sh(env, repo, dvc, "metrics", "show", "--json")
    for f in ("experiment/summary.json", "runs/sara+dps-s1/summary.json", "reports/metrics.json"):
        assert f in metrics_out, (f, metrics_out[:2000])
    plots_out = sh(env, repo, dvc, "plots", "show", "--json")
    for f in ("experiment/curve.csv", "reports/curves.csv"):
        assert f in plots_out, (f, plots_out[:2000])

    # a nightly evaluation pass leaves every stage up to date
    sh(env, repo, PY, "-m", "flows.evaluate", "--nightly")
    assert json.loads((repo / "reports/nightly/index.json").read_text())["evaluated"] == {
        "experiment": [2], "runs/grpo-s0": [2], "runs/grpo-s1": [2], "runs/sara+dps-s0": [2], "runs/sara+dps-s1": [2]}
    status = sh(env, repo, dvc, "status")
    assert "up to date" in status.lower() or status.strip() == "", status
    assert json.loads((repo / "reports/nightly/experiment-step000002.json").read_text())["allocator"] == "sara"

    # `dvc exp run -S train.allocator=grpo` reruns only the experiment stage, with grpo
    sh(env, repo, "git", "add", "-A")
    sh(env, repo, "git", "commit", "-qm", "baseline")
    out = sh(env, repo, dvc, "exp", "run", "-S", "train.allocator=grpo")
    assert "Running stage 'experiment'" in out, out
    assert not any(f"Running stage '{s}" in out for s in ("prepare", "warmstart", "train@", "evaluate", "report")), out
    assert json.loads((repo / "experiment/summary.json").read_text())["allocator"] == "grpo"
    shown = json.loads(sh(env, repo, dvc, "exp", "show", "--json"))
    assert "grpo" in json.dumps(shown) and "experiment/summary.json" in json.dumps(shown)
