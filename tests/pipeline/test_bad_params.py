"""Bad flow parameters fail the run with a clear message before any rollout is generated."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, PY


@pytest.mark.parametrize("args, message", [
    (["--allocator", "nosuch"], "unknown 'nosuch'"),
    (["--allocator", "sara", "--steps", "-3"], "train.steps: got -3"),
    (["--allocator", "sara", "--set", "lrr=0.1"], "did you mean 'lr'"),
    (["--allocator", "sara", "--set", "lr=["], "tiny_params.yaml: train.lr (from --set 'lr=['): not valid YAML"),
    # lr=5e-5 (a string to YAML 1.1) is read as a number: the first bad key is clip_eps, reported against the file
    (["--set", "lr=5e-5", "--set", "clip_eps=.nan"],
     "tiny_params.yaml: train.clip_eps: got nan; need a finite number (the value of train.clip_eps came from --set"),
])
def test_bad_train_params_fail_before_rollouts(pipeline_env: dict[str, str], tmp_path: Path, args: list[str],
                                               message: str) -> None:
    p = subprocess.run([PY, "-m", "flows.train", *args], env=pipeline_env, cwd=PROJECT, capture_output=True,
                       text=True, timeout=900)  # a loaded 2-core machine takes 85 s to import the flow
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert message in out, out[-2000:]
    assert "ConfigError" in out
    assert not list(tmp_path.glob("runs/*/metrics.jsonl"))  # no step (not even the step-0 eval) ran
