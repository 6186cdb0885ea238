"""prepare -> warmstart -> train -> evaluate -> report on a tiny config, tracked in MLflow."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, PY

pytestmark = pytest.mark.slow


def flow(env: dict[str, str], cwd: Path, *args: str) -> float:
    """Run ``python -m flows.<...>``; returns its wall seconds; fails the test with the output on error."""
    t0 = time.perf_counter()
    p = subprocess.run([PY, "-m", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return time.perf_counter() - t0


def test_pipeline_end_to_end(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    flow(pipeline_env, PROJECT, "flows.prepare")
    counts = json.loads((tmp_path / "data/arithmetic/counts.json").read_text())["rows"]
    assert counts == {"train": 300, "test": 40}
    flow(pipeline_env, PROJECT, "flows.warmstart")
    assert (tmp_path / "models/warmstart/config.json").is_file()
    wall = {a: flow(pipeline_env, PROJECT, "flows.train", "--allocator", a) for a in ("sara", "grpo")}
    for a in ("sara", "grpo"):
        run = tmp_path / "runs" / f"{a}-s0"  # tiny_params.yaml: train.seeds [0]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["allocator"] == a and "greedy_acc" in summary["final_eval"]
        assert not any(k.endswith("_s") or "seconds" in k for k in summary)  # timings live elsewhere
        assert (run / "checkpoints/step_000002/manifest.json").is_file()
        assert json.loads((run / "checkpoints/step_000002/manifest.json").read_text())["meta"]["config"]["seed"] == 0
        assert (run / "final_model/config.json").is_file()
    flow(pipeline_env, PROJECT, "flows.evaluate")
    ev = json.loads((tmp_path / "reports/evaluation.json").read_text())
    assert set(ev) == {"grpo", "sara"} and set(ev["sara"]) == {"0"}  # {allocator: {seed: metrics}}
    assert ev["sara"]["0"]["step"] == 2 and 0 <= ev["sara"]["0"]["pass_at_4"] <= 1
    flow(pipeline_env, PROJECT, "flows.report")
    for name in ("accuracy_vs_rollouts.png", "accuracy_vs_tokens.png", "comparison.md", "metrics.json", "curves.csv"):
        assert (tmp_path / "reports" / name).stat().st_size > 0
    table = (tmp_path / "reports/comparison.md").read_text()
    assert "| sara | 1 |" in table and "| grpo | 1 |" in table and "rollouts to target" in table
    report = json.loads((tmp_path / "reports/metrics.json").read_text())
    assert report["target"]["reference"] == "grpo" and set(report["allocators"]) == {"grpo", "sara"}
    assert report["allocators"]["sara"]["seeds"] == [0]

    client = MlflowClient(tracking_uri=pipeline_env["MLFLOW_TRACKING_URI"])
    run_id = json.loads((tmp_path / "runs/sara-s0/tracking.json").read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "rollouts")] == [1, 2]
    assert len(client.get_metric_history(run_id, "eval/greedy_acc")) == 3
    for tag in ("git_commit", "data_md5", "base_model_md5", "prefect_flow_run_id", "allocator"):
        assert run.data.tags.get(tag), tag
    assert run.data.params["train.allocator"] == "sara"
    assert run.inputs.dataset_inputs[0].dataset.digest == run.data.tags["data_md5"][:36]
    assert any(f.path == "final_model" for f in client.list_artifacts(run_id))

    # orchestration overhead: everything in the flow process besides the training task itself
    timings = json.loads((tmp_path / "runs/sara-s0/train_timings.json").read_text())
    overhead = {"flow_wall_s": wall["sara"], "train_task_s": timings["seconds"], "step_s": timings["step_s"],
                "mlflow_step_logging_s": timings["mlflow_step_seconds"],
                "mlflow_share_of_step_time": timings["mlflow_step_seconds"] / max(timings["step_s"], 1e-9)}
    (tmp_path / "overhead.json").write_text(json.dumps(overhead, indent=1))
    print("orchestration overhead (tiny config):", overhead)
    assert timings["step_s"] > 0


def test_resume_and_nightly(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    """A second train flow run resumes (no steps redone); nightly evaluates each newest checkpoint once."""
    from mlflow.tracking import MlflowClient

    for mod in ("flows.prepare", "flows.warmstart"):
        flow(pipeline_env, PROJECT, mod)
    flow(pipeline_env, PROJECT, "flows.train", "--allocator", "sara")
    flow(pipeline_env, PROJECT, "flows.train", "--allocator", "sara", "--steps", "3")
    lines = [json.loads(x) for x in (tmp_path / "runs/sara-s0/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 3]
    assert json.loads((tmp_path / "runs/sara-s0/train_timings.json").read_text())["resumed_from"] == 2
    flow(pipeline_env, PROJECT, "flows.evaluate", "--nightly")
    flow(pipeline_env, PROJECT, "flows.evaluate", "--nightly")  # nothing new: no second evaluation
    index = json.loads((tmp_path / "reports/nightly/index.json").read_text())
    assert index == {"format": 2, "evaluated": {"runs/sara-s0": [3]}, "skipped": {}}
    assert not list((tmp_path / "runs").glob("*.json")), "nightly state must stay out of runs/ (a DVC dependency)"
    result = json.loads((tmp_path / "reports/nightly/runs/sara-s0-step000003.json").read_text())
    assert result["step"] == 3 and result["allocator"] == "sara" and 0.0 <= result["greedy_acc"] <= 1.0
    curve = (tmp_path / "runs/sara-s0/curve.csv").read_text().splitlines()
    assert curve[0] == "step,cum_rollouts,cum_tokens,greedy_acc" and [r.split(",")[0] for r in curve[1:]] == [
        "0", "1", "2", "3"]
    client = MlflowClient(tracking_uri=pipeline_env["MLFLOW_TRACKING_URI"])
    parent = json.loads((tmp_path / "runs/sara-s0/tracking.json").read_text())["run_id"]
    evals = client.search_runs([r.experiment_id for r in client.search_experiments()],
                               filter_string="tags.kind = 'nightly-eval'")
    assert len(evals) == 1 and evals[0].data.tags["mlflow.parentRunId"] == parent
    assert "heldout/greedy_acc" in evals[0].data.metrics
