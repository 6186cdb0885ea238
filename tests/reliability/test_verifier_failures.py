"""Issue 13 section 2: a run whose rewards are verifier failures stops, and a run that never updated
the policy never ends looking complete (library and flow)."""

from __future__ import annotations

import ast
import inspect
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlvr_core.config import TrainConfig
from rlvr_core.errors import ConfigError, from_mapping
from rlvr_core.rewards import scoring
from rlvr_core.rewards.scoring import Scorer
from rlvr_core.training import TrainingStopped, check_and_train
from rlvr_core.types import Rollouts
from tests.reliability.common import dataset, make_flow_root, read_metrics

SHORT = dict(allocator="grpo", steps=2, batch_size=4, k=4, eval_every=0, eval_size=10, eval_samples=0,
             checkpoint_every=1, keep_last=2, seed=1)


def _rows() -> tuple[list[dict], list[dict]]:
    ds = dataset()
    return list(ds["train"]), list(ds["test"])


def _alternating(fail_first: bool = True) -> Any:
    """A verifier whose every other call raises: exactly half of any even number of rollouts fail."""
    calls = {"n": 0}

    def verify(text: str, row: Any) -> float:
        calls["n"] += 1
        if (calls["n"] % 2 == 1) == fail_first:
            raise RuntimeError(f"verifier broke on call {calls['n']}")
        return 1.0 if calls["n"] % 4 == 0 else 0.0

    return verify


def _broken(text: str, row: Any) -> float:
    raise OverflowError("timer value too large")


# ----------------------------------------------------------------------------- the Scorer


def _rollouts(n: int) -> Rollouts:
    return Rollouts(np.zeros(n, np.int64), np.zeros(n), np.ones(n, np.int64), [{"text": "1"} for _ in range(n)])


def test_the_scorer_knobs_are_refused_once_by_the_train_section() -> None:
    """The Scorer's three knobs are train keys, checked once when the train section is built (the Scorer does
    not check them again): an infinite or non-positive timeout, a share outside [0, 1], no worker."""
    for bad in (math.inf, math.nan, 0, -1.0):
        with pytest.raises(ConfigError, match="train.verifier_timeout_s: got"):
            from_mapping(TrainConfig, {"verifier_timeout_s": bad}, "train")
    with pytest.raises(ConfigError, match=r"train.max_verifier_error_share: got 1.5; need a share in \[0, 1\]"):
        from_mapping(TrainConfig, {"max_verifier_error_share": 1.5}, "train")
    with pytest.raises(ConfigError, match="train.verifier_workers: got 0; need an int >= 1"):
        from_mapping(TrainConfig, {"verifier_workers": 0}, "train")
    assert not any(isinstance(n, ast.Raise) for n in ast.walk(ast.parse(inspect.getsource(Scorer.__init__).strip())))


def test_scorer_counts_a_step_and_names_the_first_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scoring, "get_verifier", lambda name: _alternating())
    scorer = Scorer("arithmetic", [{"id": "a", "prompt": "0001+0000=", "answer": "1"}], max_error_share=0.5)
    scorer(_rollouts(8))
    assert (scorer.step_scored, scorer.step_failed, scorer.errors) == (8, 4, 4)
    scorer.check_step(1)  # exactly half: not more than the share
    scorer(_rollouts(1))  # a ninth rollout that fails: 5 of 9
    with pytest.raises(TrainingStopped, match=r"step 3: 5 of 9 rollouts \(56%\) were errors or timeouts of the "
                                              r"'arithmetic' verifier.*first: RuntimeError: verifier broke on call 1"):
        scorer.check_step(3)
    scorer.begin_step()
    scorer.check_step(4)  # a new step starts from zero
    assert scorer.errors == 5  # the run's totals keep counting


def test_scorer_counts_timeouts() -> None:
    import time

    scorer = Scorer("arithmetic", [{"id": "a", "prompt": "0001+0000=", "answer": "1"}], timeout_s=0.05)
    scorer.verify = lambda text, row: time.sleep(1.0) or 1.0  # type: ignore[assignment]
    scorer(_rollouts(2))
    assert scorer.timeouts == 2 and scorer.first_failure.startswith("timeout")
    with pytest.raises(TrainingStopped, match="2 of 2 rollouts"):
        scorer.check_step(1)


# ----------------------------------------------------------------------------- the training function


def test_a_step_of_verifier_errors_stops_the_run_before_its_update(policy_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scoring, "get_verifier", lambda name: _broken)
    tr, te = _rows()
    with pytest.raises(TrainingStopped, match=r"step 1: 16 of 16 rollouts \(100%\) were errors or timeouts of the "
                                              r"'arithmetic' verifier.*first: OverflowError: timer value too large"):
        check_and_train(TrainConfig(**SHORT), policy_dir=policy_dir, train_rows=tr, test_rows=te,
                        run_dir=tmp_path / "run")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0]  # step 1 left nothing behind
    assert not (tmp_path / "run/checkpoints").exists() or not any((tmp_path / "run/checkpoints").iterdir())


def test_the_share_is_a_setting(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tr, te = _rows()
    monkeypatch.setattr(scoring, "get_verifier", lambda name: _alternating())
    res = check_and_train(TrainConfig(**SHORT), policy_dir=policy_dir, train_rows=tr, test_rows=te,
                          run_dir=tmp_path / "half")
    assert res.steps_done == 2 and res.metrics[-1]["verifier_errors"] == 2 * 16 // 2  # 50% is not more than 0.5
    monkeypatch.setattr(scoring, "get_verifier", lambda name: _alternating())
    with pytest.raises(TrainingStopped, match=r"8 of 16 rollouts \(50%\).*max_verifier_error_share=0\.4"):
        check_and_train(TrainConfig(**{**SHORT, "max_verifier_error_share": 0.4}), policy_dir=policy_dir, train_rows=tr,
                        test_rows=te, run_dir=tmp_path / "strict")


# ----------------------------------------------------------------------------- the train flow

PARAMS = """\
prepare: {task: arithmetic, n_train: 400, n_test: 60, seed: 0}
train: {allocator: grpo, allocators: [grpo], k: 4, batch_size: 4, steps: 2, eval_every: 0, eval_size: 10,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2, seed: 1}
"""


@pytest.fixture
def flow_root(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline root; the flow function runs in process, its training task as a plain function."""
    import logging

    import flows.train
    import tasks.training

    root = make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch, generate=True)
    monkeypatch.setattr(tasks.training, "get_run_logger", lambda: logging.getLogger("test-flow"))
    monkeypatch.setattr(flows.train, "run_training", tasks.training.run_training.fn)
    return root


def _mlflow_status(root: Path) -> str:
    from mlflow.tracking import MlflowClient

    run_id = json.loads((root / "runs/grpo-s1/tracking.json").read_text())["run_id"]
    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}").get_run(run_id).info.status


def test_flow_marks_a_run_of_verifier_errors_failed(flow_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train import train as train_flow

    monkeypatch.setattr(scoring, "get_verifier", lambda name: _broken)
    with pytest.raises(TrainingStopped, match=r"'arithmetic' verifier.*OverflowError"):
        train_flow.fn()
    run = flow_root / "runs/grpo-s1"
    assert not (run / "summary.json").exists() and not (run / "final_model").exists()
    assert _mlflow_status(flow_root) == "FAILED"


def test_flow_marks_a_run_without_any_update_failed(flow_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train import train as train_flow

    monkeypatch.setattr(scoring, "get_verifier", lambda name: lambda text, row: 0.0)  # no errors, no signal
    with pytest.raises(TrainingStopped, match=r"2 step\(s\) ran and none updated the policy"):
        train_flow.fn()
    run = flow_root / "runs/grpo-s1"
    assert [r["update_skipped"] for r in read_metrics(run)[1:]] == [1.0, 1.0]
    assert not (run / "summary.json").exists() and not (run / "curve.csv").exists()
    assert _mlflow_status(flow_root) == "FAILED"
