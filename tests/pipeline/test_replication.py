"""Exact replication: two `dvc repro` runs give the same dvc.lock (scripts/verify_lock.py says so), and a served
deployment run leaves the pipeline up to date. (A stage's results and the thread environment: test_thread_env.py.)"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.pipeline.conftest import PROJECT, PY, sh, stop, threads_env, tiny_repo

pytestmark = pytest.mark.slow
VERIFY = PROJECT / "scripts" / "verify_lock.py"


def _serve_and_run_train_sara(env: dict[str, str], repo: Path, log_path: Path) -> str:
    """flows.serve against the test's server, then `prefect deployment run train/sara -p steps=3 --watch`."""
    prefect = str(Path(PY).with_name("prefect"))
    log = open(log_path, "w")
    server = subprocess.Popen([PY, "-m", "flows.serve"], env=env, cwd=repo, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.time() + 360
        while subprocess.run([prefect, "deployment", "inspect", "train/sara"], env=env, capture_output=True,
                             timeout=180).returncode != 0:
            assert server.poll() is None, log_path.read_text()[-3000:]
            assert time.time() < deadline, "train/sara was never registered"
            time.sleep(2)
        run = subprocess.run([prefect, "deployment", "run", "train/sara", "-p", "steps=3", "--watch",
                              "--watch-interval", "1", "--watch-timeout", "900"], env=env, capture_output=True,
                             text=True, timeout=1080)
        out = run.stdout + run.stderr
        assert run.returncode == 0 and "Completed" in out, out[-3000:] + log_path.read_text()[-3000:]
        return out
    finally:
        stop(server)
        log.close()


def _clean(env: dict[str, str], repo: Path, dvc: str) -> None:
    status = sh(env, repo, dvc, "status")
    assert "up to date" in status.lower() or status.strip() == "", status
    verify = sh(env, repo, PY, str(VERIFY), "--repo", str(repo))
    assert "every stage matches dvc.lock at HEAD" in verify, verify


def test_repro_replicates_and_a_served_run_leaves_the_pipeline_up_to_date(pipeline_env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    env = tiny_repo(repo, pipeline_env)
    dvc = str(Path(PY).with_name("dvc"))
    sh(threads_env(env, 1), repo, dvc, "repro")
    sh(env, repo, "git", "add", "-A")
    sh(env, repo, "git", "commit", "-qm", "a replicated pipeline: dvc.lock committed")
    locked = (repo / "dvc.lock").read_text()

    # every stage again, in another thread environment: the same dvc.lock, and verify_lock.py says so
    out = sh(threads_env(env, 2), repo, dvc, "repro", "--force")
    assert "Running stage 'train@sara-0'" in out and "Running stage 'warmstart'" in out, out[-3000:]
    assert (repo / "dvc.lock").read_text() == locked
    _clean(env, repo, dvc)

    # the README's served command right after the pipeline: its own folder, and the pipeline stays up to date
    out = _serve_and_run_train_sara(env, repo, tmp_path / "serve.log")
    folders = list((repo / "runs/deployments").iterdir())
    assert len(folders) == 1 and f"'{folders[0].name}'" in out, (folders, out[-2000:])
    assert json.loads((folders[0] / "summary.json").read_text())["steps"] == 3
    assert json.loads((repo / "runs/sara-s0/summary.json").read_text())["steps"] == 2
    _clean(env, repo, dvc)
    # the nightly evaluation finds the deployment's run, and still leaves every stage up to date
    sh(env, repo, PY, "-m", "flows.evaluate", "--nightly")
    index = json.loads((repo / "reports/nightly/index.json").read_text())["evaluated"]
    assert index[f"runs/deployments/{folders[0].name}"] == [3] and index["runs/sara-s0"] == [2], index
    _clean(env, repo, dvc)


def test_verify_lock_names_the_stage_whose_outputs_differ(tmp_path: Path) -> None:
    from scripts.verify_lock import differences

    lock = {"schema": "2.0", "stages": {
        "prepare": {"cmd": "python -m flows.prepare", "deps": [{"path": "flows/prepare.py", "md5": "a1"}],
                    "params": {"params.yaml": {"prepare": {"seed": 0}}}, "outs": [{"path": "data/x", "md5": "b1"}]},
        "train@sara-0": {"cmd": "python -m flows.train", "deps": [{"path": "data/x", "md5": "b1"}],
                         "outs": [{"path": "runs/sara-s0/metrics.jsonl", "md5": "c1"}]}}}
    assert differences(lock, lock) == {}
    now = yaml.safe_load(yaml.safe_dump(lock))
    now["stages"]["train@sara-0"]["outs"][0]["md5"] = "c2"
    assert differences(lock, now) == {"train@sara-0": ["output runs/sara-s0/metrics.jsonl: c1 committed, c2 now"]}
    now["stages"]["prepare"]["params"]["params.yaml"]["prepare"]["seed"] = 1
    del now["stages"]["train@sara-0"]
    assert differences(lock, now) == {"prepare": ["params differ"], "train@sara-0": ["not in the current dvc.lock"]}
