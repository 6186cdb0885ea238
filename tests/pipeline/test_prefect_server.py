"""`prefect deployment run train/sara` against a local server and flows/serve.py runs the tiny pipeline."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, PY, stop

pytestmark = pytest.mark.slow


def test_deployment_run_train_sara(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    env = pipeline_env
    for mod in ("flows.prepare", "flows.warmstart"):
        subprocess.run([PY, "-m", mod], env=env, cwd=PROJECT, check=True, capture_output=True, timeout=900)
    prefect = str(Path(PY).with_name("prefect"))
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([PY, "-m", "flows.serve"], env=env, cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.time() + 360
        while subprocess.run([prefect, "deployment", "inspect", "train/sara"], env=env, capture_output=True,
                             timeout=180).returncode != 0:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.time() < deadline, "train/sara was never registered"
            time.sleep(2)
        ls = subprocess.run([prefect, "deployment", "ls"], env=env, capture_output=True, text=True, timeout=180).stdout
        for name in ("train/grpo", "train/dapo", "train/vigor", "train/pods", "train/greso", "train/saraplusdps",
                     "evaluate/nightly"):
            assert name.split("/")[1] in ls
        run = subprocess.run([prefect, "deployment", "run", "train/sara", "--watch", "--watch-interval", "1",
                              "--watch-timeout", "900"], env=env, capture_output=True, text=True, timeout=1080)
        out = run.stdout + run.stderr
        assert run.returncode == 0 and "Completed" in out, out[-3000:] + (tmp_path / "serve.log").read_text()[-3000:]
        # the same request without the auth string is refused by the server (401), and no run is made
        bare = {k: v for k, v in env.items() if k != "PREFECT_API_AUTH_STRING"}
        refused = subprocess.run([prefect, "deployment", "run", "train/sara"], env=bare, capture_output=True,
                                 text=True, timeout=300)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0 and ("401" in said or "Unauthorized" in said), said[-3000:]
    finally:
        stop(server)
        log.close()
    # a deployment's run has its own folder, runs/deployments/<flow run name>/, never the stage's runs/sara-s0/
    assert not (tmp_path / "runs/sara-s0").exists()
    folders = list((tmp_path / "runs/deployments").iterdir())
    assert len(folders) == 1 and f"'{folders[0].name}'" in out, (folders, out[-2000:])
    ckpt = folders[0] / "checkpoints/step_000002/manifest.json"
    assert ckpt.is_file()
    run_id = json.loads((folders[0] / "tracking.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    mrun = client.get_run(run_id)
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2]
    assert mrun.data.tags["allocator"] == "sara" and len(mrun.data.tags["prefect_flow_run_id"]) == 36
    assert mrun.data.tags["data_md5"] and mrun.data.tags["base_model_md5"]
