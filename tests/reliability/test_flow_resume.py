"""The train flow killed with SIGKILL and started again continues the same MLflow run, one entry per step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.common import PROJECT, dataset

pytestmark = pytest.mark.slow

PARAMS = """\
prepare: {task: arithmetic, n_train: 400, n_test: 60, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 4, eval_every: 2, eval_every_rollouts: 0,
        eval_size: 20, eval_samples: 0, checkpoint_every: 2, keep_last: 2, seed: 1,
        allow_no_update: true}  # resume mechanics on a 40-step warm start, which may give no mixed group
"""


def _flow(root: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RLVR_FAULT_KILL_AT")}
    env.update(PREFECT_HOME=str(root / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}",
               RLVR_ROOT=str(root), RLVR_PARAMS=str(root / "params.yaml"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(PROJECT), **extra)
    # own session: a SIGKILLed flow leaves its ephemeral Prefect server behind, stopped here by process group
    log = root / f"flow{len(list(root.glob('flow*.log')))}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.train"], env=env, cwd=PROJECT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=900)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            proc.wait()
    return subprocess.CompletedProcess(proc.args, rc, log.read_text(), "")


def test_killed_flow_resumes_into_the_same_mlflow_run(policy_dir: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    root = tmp_path / "root"
    dataset().save_to_disk(str(root / "data/arithmetic"))
    shutil.copytree(policy_dir, root / "models/warmstart")
    (root / "params.yaml").write_text(PARAMS)
    run = root / "runs/sara-s1"  # PARAMS: seed 1

    # killed in step 4's first round: steps 0-3 are in MLflow, the newest checkpoint is step 2
    first = _flow(root, RLVR_FAULT_KILL_AT="generate:4")
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:]
    run_id = json.loads((run / "tracking.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    assert [m.step for m in client.get_metric_history(run_id, "rollouts")] == [1, 2, 3]
    assert client.get_run(run_id).info.status == "RUNNING"
    assert not (run / "summary.json").exists() and not (run / "final_model").exists()  # nothing looks complete

    second = _flow(root)
    assert second.returncode == 0, second.stdout[-3000:]
    assert json.loads((run / "tracking.json").read_text())["run_id"] == run_id  # the same run continues
    mlrun = client.get_run(run_id)
    assert mlrun.info.status == "FINISHED"
    assert len(client.search_runs([mlrun.info.experiment_id])) == 1
    for key in mlrun.data.metrics:  # exactly one entry per step for every metric
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    assert [m.step for m in client.get_metric_history(run_id, "rollouts")] == [1, 2, 3, 4]
    assert [m.step for m in client.get_metric_history(run_id, "eval/greedy_acc")] == [0, 2, 4]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 3, 4]
    # step 3 was logged by the killed process and redone by the resumed one: same values
    assert [m.value for m in client.get_metric_history(run_id, "cum_tokens")] == [r["cum_tokens"] for r in lines]
    assert json.loads((run / "train_timings.json").read_text())["resumed_from"] == 2
    assert (run / "summary.json").is_file() and not (run / "mlflow_spool.jsonl").exists()
