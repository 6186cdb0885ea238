"""Fixtures for the pipeline tests: isolated env (tmp Prefect home, MLflow sqlite, run root) and a Prefect server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from flows import local_server
from flows.common import tie_children
from flows.local_server import free_port, stop  # noqa: F401  (the tests import them from here)

PROJECT = Path(__file__).resolve().parents[2]
TINY = Path(__file__).with_name("tiny_params.yaml")
PY = sys.executable


def base_env(tmp: Path) -> dict[str, str]:
    """Environment for flows in ``tmp``: own PREFECT_HOME, MLflow sqlite file, run root, tiny params."""
    env = dict(os.environ)
    env.update(PREFECT_HOME=str(tmp / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600", DO_NOT_TRACK="1", DVC_NO_ANALYTICS="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}", RLVR_ROOT=str(tmp), RLVR_PARAMS=str(TINY),
               OMP_NUM_THREADS="1", PYTHONPATH=str(PROJECT), PREFECT_LOGGING_LEVEL="INFO")
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_API_AUTH_STRING", None)
    return env


@pytest.fixture(scope="session", autouse=True)
def _servers_end_with_pytest() -> None:
    """Every process these tests start (servers, workers, flows; their env copies os.environ) ends with pytest,
    also when pytest is killed: flows.common.tie_children."""
    tie_children()


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PREFECT_HOME of the shared test server (its database and its auth string)."""
    return tmp_path_factory.mktemp("prefect_server") / ".prefect"


@pytest.fixture(scope="session")
def prefect_server(prefect_home: Path) -> Iterator[str]:
    """A local Prefect server on a free port with a temporary home, authentication on (as `make serve` starts
    it); yields its API URL. Clients send ``prefect_auth``."""
    # a loaded 2-core CI machine needs more than 150 s
    with local_server.prefect_server(prefect_home, timeout_s=300, env=base_env(prefect_home.parent)) as url:
        yield url


@pytest.fixture(scope="session")
def prefect_auth(prefect_server: str, prefect_home: Path) -> str:
    """The basic-auth string the shared test server asks of every client ($PREFECT_API_AUTH_STRING)."""
    return local_server.auth_string(prefect_home)


@pytest.fixture
def pipeline_env(tmp_path: Path, prefect_server: str, prefect_auth: str) -> dict[str, str]:
    """Env for one test: isolated files, flows talking to the shared test server (no ephemeral server per flow)."""
    env = base_env(tmp_path)
    env.update(PREFECT_API_URL=prefect_server, PREFECT_API_AUTH_STRING=prefect_auth)
    return env


@pytest.fixture
def in_env(pipeline_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Apply pipeline_env to this process (for in-process flow calls)."""
    for k, v in pipeline_env.items():
        monkeypatch.setenv(k, v)
    return pipeline_env


def copy_project(dest: Path) -> None:
    """Copy what the pipeline needs to run from ``dest`` (its code, the recorded warm starts, dvc.yaml, params.yaml,
    the README)."""
    for name in ("flows", "tasks", "pipeline", "rlvr_core", "artifacts"):
        shutil.copytree(PROJECT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", "README.md"):
        shutil.copy(PROJECT / name, dest / name)


def sh(env: dict[str, str] | None, cwd: Path, *cmd: str, timeout: int = 1800) -> str:
    """Run ``cmd`` and return its stdout; a non-zero exit fails the test with the output's tail."""
    p = subprocess.run(list(cmd), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p.stdout


def threads_env(env: dict[str, str], n: int) -> dict[str, str]:
    """``env`` with ``n`` OpenMP/MKL threads."""
    return dict(env, OMP_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n))


def tiny_repo(repo: Path, pipeline_env: dict[str, str], **train: object) -> dict[str, str]:
    """A git + DVC repository in ``repo`` holding the project with the tiny values laid over its params.yaml (dvc
    needs every key a stage lists), ``train`` overriding train keys; returns the environment its commands run in."""
    repo.mkdir()
    copy_project(repo)
    full = yaml.safe_load((repo / "params.yaml").read_text())
    for sec, vals in yaml.safe_load(TINY.read_text()).items():
        full[sec].update(vals)
    full["train"].update(allocator_params={}, **train)
    (repo / "params.yaml").write_text(yaml.safe_dump(full))
    env = dict(pipeline_env, RLVR_ROOT=str(repo), PATH=f"{Path(PY).parent}:{pipeline_env['PATH']}",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    env.pop("RLVR_PARAMS")
    sh(env, repo, "git", "init", "-q")
    sh(env, repo, str(Path(PY).with_name("dvc")), "init", "-q")
    return env
