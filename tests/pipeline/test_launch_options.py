"""engine_options that pick the program a run starts are refused where params come from elsewhere (issue 26)."""

from __future__ import annotations

from pathlib import Path

import pytest

import flows.common
import flows.train
import pipeline.untrusted
from rlvr_core.errors import ConfigError
from tests.pipeline.conftest import TINY

EVIL = {"engine": "vllm", "engine_options": {"server_python": "/bin/sh", "server_env": {"LD_PRELOAD": "/tmp/x.so"}}}


@pytest.fixture
def tiny_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    monkeypatch.setenv("RLVR_PARAMS", str(TINY))
    monkeypatch.delenv("RLVR_DVC_REMOTE", raising=False)
    return tmp_path


def test_a_deployment_run_refuses_launch_options(tiny_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline.untrusted, "deployment_id", lambda: "0b7f")
    with pytest.raises(ConfigError, match=r"server_python, train.engine_options.server_env: refused in a run of "
                                          r"deployment 0b7f"):
        flows.train.train.fn(overrides=dict(EVIL))
    assert not list(tiny_root.iterdir())  # refused before anything was written


def test_a_local_run_keeps_them(tiny_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline.untrusted, "deployment_id", lambda: "")
    flows.common.refuse_launch_options(EVIL["engine_options"])  # no deployment, no worker: allowed
    with pytest.raises(ConfigError, match=r"refused in a run of a worker \(\$RLVR_DVC_REMOTE\)"):
        flows.common.refuse_launch_options({"log_path": "/root/.bashrc"}, worker=True)
