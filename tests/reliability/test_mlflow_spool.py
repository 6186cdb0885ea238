"""MLflow outages never stop training: step metrics are spooled locally and replayed once; resumes never duplicate."""

from __future__ import annotations

import json
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipeline import tracking
from pipeline.tracking import SPOOL, StepLogger, adopt_spool


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One SQLite MLflow store for the module (creating one takes seconds); each test makes its own run."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("RLVR_ROOT", str(root))
        yield uri


class Outage:
    """Client factory whose clients fail with ConnectionError while ``down`` (counting every call)."""

    def __init__(self, down: bool = True) -> None:
        self.down = down
        self.calls = 0

    def __call__(self) -> Any:
        outage = self
        real = tracking._client()

        class Client:
            def __getattr__(self, name: str) -> Any:
                def call(*args: Any, **kwargs: Any) -> Any:
                    outage.calls += 1
                    if outage.down:
                        raise ConnectionError("Connection refused (simulated outage)")
                    return getattr(real, name)(*args, **kwargs)

                return call

        return Client()


def _rec(step: int) -> dict[str, Any]:
    return {"step": step, "rollouts": 10 * step, "loss": 0.5 / (step + 1), "nan": float("nan"), "note": "text"}


def _steps(run_id: str, key: str) -> list[int]:
    return [s for s, _ in tracking.metric_history(run_id, key)]


def test_outage_spools_then_replays_every_step_once(store: str, tmp_path: Path) -> None:
    run_id = tracking.start_run("t", {"a": 1}, {})
    outage = Outage(down=True)
    log = StepLogger(run_id, tmp_path / SPOOL, retry_interval_s=0.0, client_factory=outage)
    with pytest.warns(RuntimeWarning, match="MLflow unreachable .*ConnectionError"):
        for s in range(3):
            log(_rec(s))  # training goes on
    spooled = [json.loads(x) for x in (tmp_path / SPOOL).read_text().splitlines()]
    assert [e["step"] for e in spooled] == [0, 1, 2] and log.spooled == 3
    assert set(spooled[0]["metrics"]) == {"rollouts", "loss"}  # numeric, finite values only
    assert _steps(run_id, "rollouts") == []
    outage.down = False
    with pytest.warns(RuntimeWarning, match="replayed 3 spooled step record"):
        log(_rec(3))
    assert _steps(run_id, "rollouts") == [0, 1, 2, 3]
    assert [v for _, v in tracking.metric_history(run_id, "rollouts")] == [0, 10, 20, 30]
    stamps = [e["timestamp"] for e in spooled]
    got = tracking._client().get_metric_history(run_id, "loss")
    assert [m.timestamp for m in got][:3] == stamps  # logged at the time the step happened
    assert not (tmp_path / SPOOL).exists() and log.replayed == 3


def test_a_down_server_is_not_called_again_for_a_while(store: str, tmp_path: Path) -> None:
    run_id = tracking.start_run("t", {}, {})
    outage = Outage(down=True)
    log = StepLogger(run_id, tmp_path / SPOOL, retry_interval_s=3600.0, client_factory=outage)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(5):
            log(_rec(s))
    assert outage.calls == 1  # one failed attempt, then straight to the spool
    assert sum("unreachable" in str(w.message) for w in caught) == 1  # one warning per outage, not per step
    assert log.spooled == 5
    outage.down = False
    assert log.flush() == 0  # the end of the run replays regardless of the interval
    assert _steps(run_id, "loss") == [0, 1, 2, 3, 4]


def test_flush_while_still_down_keeps_the_spool(store: str, tmp_path: Path) -> None:
    run_id = tracking.start_run("t", {}, {})
    outage = Outage(down=True)
    log = StepLogger(run_id, tmp_path / SPOOL, retry_interval_s=0.0, client_factory=outage)
    with pytest.warns(RuntimeWarning):
        log(_rec(1))
        assert log.flush() == 1
    # a later process (the resumed flow) replays what the first one could not send
    outage.down = False
    with pytest.warns(RuntimeWarning, match="replayed 1"):
        assert StepLogger(run_id, tmp_path / SPOOL, client_factory=outage).flush() == 0
    assert _steps(run_id, "rollouts") == [1]


def test_a_resumed_run_never_logs_a_step_twice(store: str, tmp_path: Path) -> None:
    run_id = tracking.start_run("t", {}, {})
    first = StepLogger(run_id, tmp_path / SPOOL)
    for s in range(4):  # the first process got to step 3, its last checkpoint was step 2
        first(_rec(s))
    again = StepLogger(run_id, tmp_path / SPOOL)  # the restarted process repeats step 3
    for s in range(3, 6):
        again(_rec(s))
    for key in ("rollouts", "loss"):
        assert _steps(run_id, key) == [0, 1, 2, 3, 4, 5]


def test_records_spooled_without_a_run_go_to_the_run_created_later(store: str, tmp_path: Path) -> None:
    pending = StepLogger(None, tmp_path / SPOOL)
    for s in range(2):
        pending(_rec(s))  # MLflow was down when the flow started: no run id yet
    assert pending.flush() == 2
    run_id = tracking.start_run("t", {}, {})
    assert adopt_spool(tmp_path / SPOOL, run_id) == 2
    with pytest.warns(RuntimeWarning, match="replayed 2"):
        assert StepLogger(run_id, tmp_path / SPOOL).flush() == 0
    assert _steps(run_id, "rollouts") == [0, 1]


def test_closed_port_tracking_uri_then_reachable_store(store: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """MLFLOW_TRACKING_URI at a port nobody listens on: the step is spooled fast; the store back: replayed."""
    run_id = tracking.start_run("t", {}, {})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the socket is
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    log = StepLogger(run_id, tmp_path / SPOOL, retry_interval_s=0.0)
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="MLflow unreachable"):
        log(_rec(1))
    assert time.perf_counter() - t0 < 60
    assert log.spooled == 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    with pytest.warns(RuntimeWarning, match="replayed 1"):
        log(_rec(2))
    assert _steps(run_id, "rollouts") == [1, 2]


def test_open_run_without_mlflow_returns_none(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train import open_run
    from rlvr_core.config import TrainConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.warns(RuntimeWarning, match="MLflow start_run failed"):
        assert open_run(TrainConfig(), "arithmetic", tmp_path / "runs" / "sara", {"allocator": "sara"}) is None
