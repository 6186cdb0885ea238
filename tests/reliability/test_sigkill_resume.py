"""A training process killed with SIGKILL at any point resumes and ends exactly like an uninterrupted run.

The driver (tests/reliability/driver.py) runs ``train`` in a subprocess and kills
itself at a chosen point through ``$RLVR_FAULT_KILL_AT``; one more case is
killed by the parent at an arbitrary moment. The same command is then started
again; its metrics.jsonl (minus timings), its rollouts.parquet and its final
checkpoint (policy, optimizer, allocator posteriors, prompt order, engine and RNG
states) must equal those of an uninterrupted run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rlvr_core.config import TrainConfig
from rlvr_core.rollout_log import read_log
from rlvr_core.training import check_and_train
from tests.reliability.common import (
    CFG,
    DRIVER,
    PROJECT,
    assert_same,
    dataset,
    driver_env,
    final_state,
    read_metrics,
    run_driver,
    strip_timing,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """The uninterrupted run (in this process: same code path, no start-up cost)."""
    run = tmp_path_factory.mktemp("reference") / "run"
    ds = dataset()
    res = check_and_train(TrainConfig(**CFG), policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                          run_dir=run)
    assert res.steps_done == CFG["steps"]
    return run, res.metrics


def _check_resumed(run: Path, reference: tuple[Path, list[dict[str, Any]]], policy_dir: Path,
                   expect_from: int) -> None:
    p = run_driver(policy_dir, run, CFG)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"DONE {CFG['steps']} {expect_from}" in p.stdout, p.stdout
    ref_run, ref_metrics = reference
    got = read_metrics(run)
    assert [r["step"] for r in got] == list(range(CFG["steps"] + 1))  # nothing missing or duplicated
    assert strip_timing(got) == strip_timing(ref_metrics)
    # the rollout log: every step once, as the uninterrupted run logged it
    pd.testing.assert_frame_equal(read_log(run / "rollouts.parquet"), read_log(ref_run / "rollouts.parquet"))
    assert_same(final_state(run, CFG["steps"]), final_state(ref_run, CFG["steps"]))
    assert not list((run / "checkpoints").glob(".tmp_*"))  # the half-written checkpoint was cleaned up


# (kill point, steps in metrics.jsonl when it dies); each restart resumes from checkpoint 2 and dies again
CHAIN = [
    ("generate:3", 2),    # during the allocation rounds of step 3
    ("update:3", 2),      # right after the policy update of step 3, before its metrics line
    ("metrics:4", 4),     # step 4's metrics line written, its checkpoint not yet
    ("checkpoint:4", 4),  # half-way through writing checkpoint 4 (state files written, no manifest)
]


def test_sigkill_at_each_point_then_resume_matches_uninterrupted(policy_dir: Path, reference: Any,
                                                                 tmp_path: Path) -> None:
    """One run killed at four points in turn (each restart is killed at the next), then run to the end."""
    run = tmp_path / "run"
    for kill_at, last_step in CHAIN:
        p = run_driver(policy_dir, run, CFG, kill_at=kill_at)
        assert p.returncode == -signal.SIGKILL, (kill_at, p.returncode, p.stderr[-2000:])
        assert [r["step"] for r in read_metrics(run)] == list(range(last_step + 1)), kill_at
        assert [c.name for c in (run / "checkpoints").glob("step_*")] == ["step_000002"], kill_at
    tmp = run / "checkpoints" / ".tmp_step_000004"
    assert ((tmp / "tensors.safetensors").is_file() and (tmp / "state.json").is_file()
            and not (tmp / "manifest.json").exists())
    _check_resumed(run, reference, policy_dir, 2)


def test_kill_from_outside_at_an_arbitrary_moment(policy_dir: Path, reference: Any, tmp_path: Path) -> None:
    """The parent sends SIGKILL 0.2 s after the driver reported step 3, wherever it is then."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(policy_dir), str(run), __import__("json").dumps(CFG)],
                            env=driver_env(), cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "STEP 3":
                time.sleep(0.2)
                proc.send_signal(signal.SIGKILL)
                break
        assert proc.wait(timeout=180) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = [r["step"] for r in read_metrics(run)]
    assert 3 <= done[-1] < CFG["steps"]
    _check_resumed(run, reference, policy_dir, 4 if (run / "checkpoints/step_000004/manifest.json").is_file() else 2)
