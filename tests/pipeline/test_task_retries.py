"""Prefect retries only what a retry can fix (pipeline.retry, issue 41): the real tasks, run by Prefect's engine
inside a flow against the test server, raise each kind of failure from the library call they wrap; a
deterministic one (ConfigError, CheckpointError, ENOSPC, out of memory) runs once, a transient one is retried."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, Callable

import pytest
from prefect.cache_policies import NO_CACHE

import tasks.evaluation
import tasks.models
import tasks.training
from rlvr_core.checkpoint import CheckpointError
from rlvr_core.config import EvaluateConfig, TrainConfig
from rlvr_core.errors import ConfigError

pytestmark = pytest.mark.slow


@pytest.fixture
def prefect_here(in_env: dict[str, str]):
    """in_env, and Prefect's settings pointed at the test server and home (it read the environment on import)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: in_env["PREFECT_API_URL"], PREFECT_HOME: in_env["PREFECT_HOME"]}):
        yield in_env
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for worker in (APILogWorker, EventsWorker):  # send what is queued while the server still runs
            worker.drain_all(timeout=10)


FAILURES: dict[str, tuple[Callable[[], BaseException], bool]] = {  # name: (the failure, retried?)
    "ConfigError": (lambda: ConfigError("train.lr: got -1; need > 0"), False),
    "CheckpointError": (lambda: CheckpointError("runs/x/checkpoints/step_2: state digest mismatch"), False),
    "ENOSPC": (lambda: OSError(errno.ENOSPC, "No space left on device", "runs/x/checkpoints/.tmp"), False),
    "EDQUOT": (lambda: OSError(errno.EDQUOT, "Disk quota exceeded", "runs/x"), False),
    "ENOMEM": (lambda: OSError(errno.ENOMEM, "Cannot allocate memory"), False),
    "bad_alloc": (lambda: RuntimeError("std::bad_alloc"), False),
    "ExceptionGroup[MemoryError]": (lambda: ExceptionGroup("workers", [MemoryError()]), False),
    "ConnectionError": (lambda: ConnectionError("vLLM server went away"), True),
}


def _failing(calls: list[int], make: Callable[[], BaseException]) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise make()

    return fail


def _in_a_flow(call: Callable[[], Any]) -> None:
    from prefect import flow

    @flow(name="retry-check")
    def check() -> None:
        call()

    check()


@pytest.mark.parametrize("name", FAILURES)
def test_the_training_task_retries_only_transient_failures(prefect_here: dict, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture, name: str) -> None:
    make, retried = FAILURES[name]
    calls: list[int] = []
    monkeypatch.setattr(tasks.training, "load_split", lambda data_dir, split: [])
    monkeypatch.setattr(tasks.training, "check_and_train", _failing(calls, make))
    task = tasks.training.run_training.with_options(retry_delay_seconds=0)
    with pytest.raises(type(make())):
        _in_a_flow(lambda: task(TrainConfig(), "policy", "data", "arithmetic", str(tmp_path / "run"), None,
                                track=False))
    assert len(calls) == (1 + tasks.training.run_training.retries if retried else 1), name
    assert ("run_training: not retried: " in caplog.text) is not retried  # the task run's log says why


@pytest.mark.parametrize("name", ["ConfigError", "ENOSPC", "ENOMEM", "ConnectionError"])
def test_the_evaluation_and_export_tasks_retry_only_transient_failures(
        prefect_here: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    make, retried = FAILURES[name]
    evals: list[int] = []
    exports: list[int] = []
    monkeypatch.setattr(tasks.evaluation, "load_checkpoint_policy", _failing(evals, make))
    monkeypatch.setattr("rlvr_core.models.policy.load_checkpoint_policy", _failing(exports, make))
    evaluate = tasks.evaluation.evaluate_checkpoint.with_options(retry_delay_seconds=0, cache_policy=NO_CACHE)
    export = tasks.models.export_policy.with_options(retry_delay_seconds=0)
    with pytest.raises(type(make())):
        _in_a_flow(lambda: evaluate(str(tmp_path / "ckpt"), name, "base", "data", "arithmetic", EvaluateConfig()))
    with pytest.raises(type(make())):
        _in_a_flow(lambda: export(str(tmp_path / "ckpt"), "base", str(tmp_path / "out")))
    assert (len(evals), len(exports)) == ((2, 2) if retried else (1, 1)), name
