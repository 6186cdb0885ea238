"""Beyond one machine: a worker (its own clone) pulls from a DVC remote, logs to an MLflow server, pushes back.

The fast tests: a bad worker setup stops before compute with a message naming what is missing.
The slow test plays two machines on localhost (Prefect server, process work pool + worker, MLflow server,
a DVC remote in a local directory, a bare git origin reached through a file:// URL).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from rlvr_core.errors import ConfigError
from tests.pipeline.conftest import PROJECT, PY, TINY, copy_project, free_port, stop

GIT_ID = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def sh(env: dict[str, str] | None, cwd: Path, *cmd: str, timeout: int = 600) -> str:
    p = subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def tiny_params_yaml() -> str:
    """The project's params.yaml with the tiny values laid over it (dvc needs every key a stage lists)."""
    full = yaml.safe_load((PROJECT / "params.yaml").read_text())
    for sec, vals in yaml.safe_load(TINY.read_text()).items():
        full[sec].update(vals)
    full["train"]["allocator_params"] = {}
    return yaml.safe_dump(full)


# ------------------------------------------------------------------ bad setups, before compute

@pytest.fixture
def worker_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed git + DVC repository as a worker's clone; env as on a worker with no credentials."""
    repo = tmp_path / "clone"
    repo.mkdir()
    (repo / "params.yaml").write_text(tiny_params_yaml())
    env = {**os.environ, **GIT_ID}
    sh(env, repo, "git", "init", "-q", "-b", "main")
    sh(env, repo, PY, "-m", "dvc", "init", "-q")
    (tmp_path / "remote").mkdir()
    sh(env, repo, PY, "-m", "dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh(env, repo, "git", "add", "-A")
    sh(env, repo, "git", "commit", "-qm", "clone")
    for k in list(os.environ):
        if k.startswith("AWS_") or k in ("SSH_AUTH_SOCK", "DVC_STAGE", "RLVR_PARAMS"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.aws, no ~/.ssh keys
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    monkeypatch.setenv("RLVR_ROOT", str(repo))
    monkeypatch.setenv("RLVR_DVC_REMOTE", "store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    return repo


def test_no_remote_is_local_mode(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import remote

    monkeypatch.delenv("RLVR_DVC_REMOTE")
    assert remote.setup() is None
    monkeypatch.setenv("RLVR_DVC_REMOTE", "store")
    monkeypatch.setenv("DVC_STAGE", "train@sara")  # inside `dvc repro`, DVC records the stage itself
    assert remote.setup() is None


def test_remote_without_credentials(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import remote

    sh(None, worker_clone, PY, "-m", "dvc", "remote", "add", "s3store", "s3://rlvr-bucket/cache")
    sh(None, worker_clone, PY, "-m", "dvc", "remote", "add", "sshstore", "ssh://gpu-host/srv/dvc")
    monkeypatch.setenv("RLVR_DVC_REMOTE", "s3store")
    with pytest.raises(ConfigError, match=r"'s3store' \(s3://rlvr-bucket/cache\): no S3 credentials.*AWS_ACCESS_KEY_ID"):
        remote.setup()
    monkeypatch.setenv("RLVR_DVC_REMOTE", "sshstore")
    with pytest.raises(ConfigError, match=r"'sshstore' \(ssh://gpu-host/srv/dvc\): no SSH credentials.*id_ed25519"):
        remote.setup()


def test_unreachable_or_unknown_remote(worker_clone: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train import train
    from tasks import remote

    shutil.rmtree(tmp_path / "remote")  # the shared directory is not mounted on this worker
    with pytest.raises(ConfigError, match=r"DVC remote 'store' .* unreachable from this worker: .*remote is not a dir"):
        train.fn(allocator="sara")
    assert not (worker_clone / "runs").exists() and not (worker_clone / "data").exists()  # nothing computed
    monkeypatch.setenv("RLVR_DVC_REMOTE", "nas")
    with pytest.raises(ConfigError, match=r"RLVR_DVC_REMOTE=nas: no DVC remote of that name .*configured: store"):
        remote.setup()
    shutil.rmtree(worker_clone / ".dvc")
    with pytest.raises(ConfigError, match=r"not a DVC repository \(no .dvc/\)"):
        remote.setup()


def test_unreachable_tracking_server(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.evaluate import evaluate
    from tasks import remote

    uri = os.environ["MLFLOW_TRACKING_URI"]
    with pytest.raises(ConfigError, match=rf"MLflow tracking server {uri} is unreachable .*spool.*still spooled"):
        evaluate.fn(nightly=True)
    assert not (worker_clone / "reports").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{worker_clone / 'mlflow.db'}")
    with pytest.raises(ConfigError, match=r"tracking URI is sqlite:.*set MLFLOW_TRACKING_URI=http://"):
        remote.setup()


def test_params_file_not_in_repository(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.deploy import check_params_in_repo, deploy
    from tasks import remote

    monkeypatch.setattr(remote, "check_tracking_server", lambda uri: None)  # the server is not what is tested here
    (worker_clone / "params_gpu.yaml").write_text(tiny_params_yaml())  # on disk, never committed
    with pytest.raises(ConfigError, match=r"params file params_gpu.yaml: not in the repository this worker cloned"):
        remote.setup("params_gpu.yaml")
    with pytest.raises(ConfigError, match=r"params file nowhere.yaml: not in the repository"):
        remote.setup("nowhere.yaml")
    assert remote.setup("params.yaml") is not None
    # flows.deploy refuses before registering anything (no Prefect server is running here)
    with pytest.raises(ConfigError, match=r"--params params_gpu.yaml: not in the repository at main"):
        deploy("file:///nowhere.git", "gpu", "main", "params_gpu.yaml", repo_dir=worker_clone)
    with pytest.raises(ConfigError, match=r"give a path inside the repository"):
        check_params_in_repo("/etc/params.yaml", "main", worker_clone)
    check_params_in_repo("params.yaml", "main", worker_clone)


def test_run_params_must_match_params_yaml(worker_clone: Path) -> None:
    """With a remote, dvc.lock records params.yaml: a run with other values is refused, not recorded wrongly."""
    from flows.common import load
    from tasks import remote

    sync = remote.Remote("store", worker_clone)
    (worker_clone / "dvc.yaml").write_text((PROJECT / "dvc.yaml").read_text())
    params = load(None, overrides={"train": {"steps": 50}})
    with pytest.raises(ConfigError, match=r"stage train@sara .* train differs \(\{'steps': 50\}\); commit the change"):
        remote.prepare_training(sync, worker_clone / "runs" / "sara", params)
    with pytest.raises(ConfigError, match=r"no dvc.yaml stage writes .*runs/vigor/checkpoints"):
        remote.prepare_training(sync, worker_clone / "runs" / "vigor", load(None))
