"""One writer per run folder: a second writer is refused (naming the folder and the holder's pid) before
it writes or tracks anything; a SIGKILLed holder leaves a lock file that the next run takes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr_core.config import TrainConfig
from rlvr_core.runlock import LOCK_NAME, RunFolderBusy, hold_run_folder
from tests.reliability.common import CFG, PROJECT, dataset

HOLD = ("import sys, time\nfrom rlvr_core.runlock import hold_run_folder\n"
        "lock = hold_run_folder(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(300)\n")


def _holder(folder: Path) -> subprocess.Popen:
    """A subprocess that holds ``folder`` until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=PROJECT, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(PROJECT)}, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_second_writer_is_refused_and_a_sigkilled_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(RunFolderBusy, match=rf"run folder {run} is being written by another process "
                                                rf"\(pid {holder.pid} on .*\).*another run folder"):
            hold_run_folder(run)
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid}"):  # through a symlink to the same folder
            (tmp_path / "alias").symlink_to(run)
            hold_run_folder(tmp_path / "alias")
    finally:
        _kill(holder)
    assert (run / LOCK_NAME).is_file()  # the lock file outlives its holder; its flock does not
    with hold_run_folder(run) as lock:
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
        with hold_run_folder(run):  # re-entrant within one process (the flow, then training.train)
            pass
        assert lock.key in __import__("rlvr_core.runlock", fromlist=["_held"])._held  # still held by the outer
        second = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(300)", ""), str(run)], cwd=PROJECT,
                                env={**os.environ, "PYTHONPATH": str(PROJECT)}, capture_output=True, text=True)
        assert second.returncode != 0 and f"pid {os.getpid()}" in second.stderr
    again = _holder(run)  # released: another process takes it
    _kill(again)



@pytest.mark.parametrize("fails", ["pwrite", "ftruncate"])
def test_a_full_disk_while_taking_the_lock_does_not_leak_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            fails: str) -> None:
    """ENOSPC writing the holder's pid left a locked descriptor open: every later attempt in the process got
    RunFolderBusy (pid unknown), even after space was freed."""
    import errno

    from rlvr_core import runlock

    real, calls = getattr(os, fails), []

    def full_once(*a: object) -> object:
        calls.append(a)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a)

    monkeypatch.setattr(runlock.os, fails, full_once)
    fds = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="No space left"):
        hold_run_folder(tmp_path / "run")
    assert set(os.listdir("/proc/self/fd")) <= fds and not runlock._held  # nothing open, nothing held
    with hold_run_folder(tmp_path / "run"):  # space freed: the same process takes the lock
        assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
    _kill(_holder(tmp_path / "run"))  # released: another process takes it too


def test_training_refuses_a_held_run_folder_before_writing(policy_dir: Path, tmp_path: Path) -> None:
    from rlvr_core.training import check_and_train

    ds = dataset()
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid}"):
            check_and_train(TrainConfig(**CFG), policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                            run_dir=run)
    finally:
        _kill(holder)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # no metrics.jsonl, no checkpoints
    res = check_and_train(TrainConfig(**{**CFG, "steps": 1}), policy_dir=policy_dir, train_rows=ds["train"],
                          test_rows=ds["test"], run_dir=run)  # the killed holder's lock is taken
    assert res.steps_done == 1 and (run / "metrics.jsonl").is_file()


PARAMS = """\
prepare: {task: arithmetic, n_train: 400, n_test: 60, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 1, eval_every: 1, eval_size: 8,
        eval_samples: 0, checkpoint_every: 1, keep_last: 1, seed: 1}
"""


@pytest.mark.slow
def test_second_train_flow_on_the_same_out_is_refused_before_mlflow(policy_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    dataset().save_to_disk(str(root / "data/arithmetic"))
    shutil.copytree(policy_dir, root / "models/warmstart")
    (root / "params.yaml").write_text(PARAMS)
    run = root / "shared_out"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RLVR_FAULT_KILL_AT")}
    env.update(PREFECT_HOME=str(root / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", RLVR_ROOT=str(root),
               RLVR_PARAMS=str(root / "params.yaml"), OMP_NUM_THREADS="1", PYTHONPATH=str(PROJECT))
    holder = _holder(run)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flows.train", "--out", "shared_out"], env=env, cwd=PROJECT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=900)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # its ephemeral Prefect server
            except ProcessLookupError:
                pass
    finally:
        _kill(holder)
    assert proc.returncode != 0, out[-3000:]
    assert "RunFolderBusy" in out and f"pid {holder.pid}" in out and str(run) in out, out[-3000:]
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # no tracking.json, nothing else written
    if (root / "mlflow.db").exists():  # no MLflow run was opened
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
        assert not [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.slow
def test_dvc_repro_leaves_a_live_writers_outputs_alone(policy_dir: Path, tmp_path: Path) -> None:
    # issue 26, break 3: DVC removed a stage's outputs before its flow reached the run lock; with `persist: true`
    # it leaves them, and the flow, refused by the lock, deletes nothing either
    import yaml

    from tests.pipeline.conftest import copy_project

    repo = tmp_path / "repo"
    repo.mkdir()
    copy_project(repo)
    full = yaml.safe_load((repo / "params.yaml").read_text())
    full["prepare"].update(task="arithmetic", n_train=400, n_test=60, seed=0)
    full["train"].update(yaml.safe_load(PARAMS)["train"], allocators=["grpo"], seeds=[0], allocator_params={})
    (repo / "params.yaml").write_text(yaml.safe_dump(full))
    dataset().save_to_disk(str(repo / "data/arithmetic"))
    shutil.copytree(policy_dir, repo / "models/warmstart")
    run = repo / "runs/grpo-s0"
    for name in ("checkpoints/step_000001", "final_model"):
        (run / name).mkdir(parents=True)
        (run / name / "written").write_text("by the live writer")
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RLVR_PARAMS", "DVC_STAGE")}
    env.update(PREFECT_HOME=str(tmp_path / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600", DVC_NO_ANALYTICS="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", RLVR_ROOT=str(repo),
               OMP_NUM_THREADS="1", PYTHONPATH=str(PROJECT), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    dvc = [sys.executable, "-m", "dvc"]
    for cmd in (["git", "init", "-q"], [*dvc, "init", "-q"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    holder = _holder(run)
    try:
        p = subprocess.run([*dvc, "repro", "--single-item", "train@grpo-0"], cwd=repo, env=env, capture_output=True,
                           text=True, timeout=1800)
    finally:
        _kill(holder)
    out = p.stdout + p.stderr
    assert (run / "checkpoints/step_000001/written").read_text() == "by the live writer", out[-3000:]
    assert (run / "final_model/written").exists() and (run / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert p.returncode != 0 and "RunFolderBusy" in out and f"pid {holder.pid}" in out, out[-3000:]
