"""The warmstart flow uses the policy recorded for its settings (artifacts/warmstart/), verified, instead of
training one; a recorded file that no longer hashes as recorded stops the flow before anything is written."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rlvr_core.config import load_params
from rlvr_core.models.recorded import file_hashes, policy_key, record_policy
from tests.pipeline.conftest import PROJECT, PY, TINY

pytestmark = pytest.mark.slow


def run(env: dict[str, str], mod: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", mod], env=env, cwd=PROJECT, capture_output=True, text=True, timeout=900)


def test_warmstart_uses_the_recorded_policy_and_refuses_a_mismatch(pipeline_env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    for mod in ("flows.prepare", "flows.warmstart"):
        assert run(pipeline_env, mod).returncode == 0
    built = tmp_path / "models/warmstart"
    report = json.loads((tmp_path / "reports/warmstart.json").read_text())
    params = load_params(TINY)
    key = policy_key(params.prepare, params.warmstart)
    store = tmp_path / "artifacts/warmstart"
    record_policy(store, key, built, {"name": "tiny", "metrics": report, "built_on": "this test"})
    shutil.rmtree(built)

    p = run(pipeline_env, "flows.warmstart")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"the recorded policy {key}" in p.stdout + p.stderr
    assert "final loss" not in p.stdout + p.stderr  # nothing trained
    assert file_hashes(built) == json.loads((store / "manifest.json").read_text())[key]["files"]
    assert json.loads((tmp_path / "reports/warmstart.json").read_text()) == report  # as the build wrote it
    assert json.loads((tmp_path / "reports/warmstart_timings.json").read_text()) == {"recorded": key}

    weights = store / key / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    p = run(pipeline_env, "flows.warmstart")
    assert p.returncode != 0 and "records sha256" in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
