"""Faults during training: engine errors retried exactly, verifier errors and timeouts scored 0.0 and counted,
non-finite updates skipped then stopping the run, saturated steps skipped, bad-input failures not retried."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rlvr_core.training as training
from rlvr_core.allocation.loop import EngineError, generate_with_retry
from rlvr_core.checkpoint import list_checkpoints, verify
from rlvr_core.config import TrainConfig
from rlvr_core.errors import ConfigError
from rlvr_core.rewards import scoring
from rlvr_core.rewards.scoring import Scorer
from rlvr_core.rollout import RolloutEngine
from rlvr_core.rollout.hf import HFEngine
from rlvr_core.training import TrainingStopped, check_and_train
from rlvr_core.types import Rollouts
from tests.reliability.common import CFG, assert_same, dataset, final_state, read_metrics, strip_timing

SHORT = {**CFG, "steps": 4, "engine_retries": 2, "engine_retry_delay_s": 0.0}


def _train(policy_dir: Path, run: Path, **kw: Any) -> training.TrainResult:
    cfg = TrainConfig(**{**SHORT, **kw.pop("cfg", {})})
    ds = dataset()
    return check_and_train(cfg, policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"], run_dir=run, **kw)


@pytest.fixture(scope="module")
def reference(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    run = tmp_path_factory.mktemp("faults") / "reference"
    return run, _train(policy_dir, run).metrics


def _without(recs: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in keys} for r in strip_timing(recs)]


# ----------------------------------------------------------------------------- engine errors


def _failing_generate(monkeypatch: pytest.MonkeyPatch, fail_calls: set[int], times: int) -> dict[int, int]:
    """HFEngine.generate raises (after advancing its counter, as a mid-batch crash would) on the given calls."""
    real = HFEngine.generate
    failures: dict[int, int] = {}

    def generate(self: HFEngine, requests: Any) -> Rollouts:
        call = self.calls
        if call in fail_calls and failures.get(call, 0) < times:
            failures[call] = failures.get(call, 0) + 1
            self.calls += 1
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (call {call})")
        return real(self, requests)

    monkeypatch.setattr(HFEngine, "generate", generate)
    return failures


def test_engine_error_in_a_round_is_retried_exactly(policy_dir: Path, reference: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    failures = _failing_generate(monkeypatch, {5, 9}, times=2)  # two rounds fail twice each
    with caplog.at_level(logging.WARNING, logger="rlvr_core.allocation.loop"):
        res = _train(policy_dir, tmp_path / "run")
    assert failures == {5: 2, 9: 2}
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 4
    assert sum(r.get("engine_retries", 0) for r in res.metrics) == 4
    ref_run, ref_metrics = reference
    assert _without(res.metrics, "engine_retries") == _without(ref_metrics, "engine_retries")
    assert_same(final_state(tmp_path / "run", 4), final_state(ref_run, 4))


def test_engine_error_after_the_retries_fails_the_step_and_keeps_the_checkpoint(
        policy_dir: Path, reference: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    probe = _failing_generate(monkeypatch, set(), times=0)
    _train(policy_dir, run, cfg={"steps": 2})
    calls_after_2 = final_state(run, 2)["engine"]["calls"]
    monkeypatch.undo()
    assert probe == {}
    _failing_generate(monkeypatch, {calls_after_2 + 1}, times=99)  # the second round of step 3 never works
    with pytest.raises(EngineError, match=r"round 1 of this step after 3 attempt\(s\); last error: RuntimeError: CUDA"):
        _train(policy_dir, run)
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]  # nothing written for the failed step
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000002"]
    assert verify(run / "checkpoints/step_000002") is None
    monkeypatch.undo()
    again = _train(policy_dir, run)  # the retry (e.g. Prefect's) resumes from step 2
    assert again.resumed_from == 2
    assert _without(read_metrics(run), "engine_retries") == _without(reference[1], "engine_retries")


class CountingEngine(RolloutEngine):
    """Engine whose draws depend on a call counter, like HFEngine; fails on chosen attempts."""

    def __init__(self, fail: list[BaseException | None]) -> None:
        self.calls, self.fail = 0, list(fail)

    def generate(self, requests: dict[int, int]) -> Rollouts:
        call = self.calls
        self.calls += 1
        err = self.fail.pop(0) if self.fail else None
        if err is not None:
            raise err
        n = sum(requests.values())
        return Rollouts(np.zeros(n, np.int64), np.full(n, float(call)), np.ones(n, np.int64))

    def update_weights(self, state: Any = None) -> None: ...

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


def test_retry_restores_the_engine_state_and_request_errors_are_not_retried() -> None:
    eng = CountingEngine([OSError("connection reset"), TimeoutError("slow")])
    out, used = generate_with_retry(eng, {0: 2}, retries=2)
    assert used == 2 and out.reward.tolist() == [0.0, 0.0]  # drawn as call 0, as without the failures
    assert eng.calls == 1
    bad = CountingEngine([ValueError("prompt id 9 is outside the pool")])
    with pytest.raises(ValueError, match="outside the pool"):
        generate_with_retry(bad, {9: 1}, retries=5)
    dead = CountingEngine([OSError("down")] * 3)
    with pytest.raises(EngineError, match="after 3 attempt") as err:
        generate_with_retry(dead, {0: 1}, retries=2)
    assert isinstance(err.value.__cause__, OSError) and dead.calls == 0  # state as before the round


# ----------------------------------------------------------------------------- verifier errors and timeouts


def _rollouts(texts: list[str]) -> Rollouts:
    n = len(texts)
    return Rollouts(np.arange(n), np.zeros(n), np.ones(n, np.int64), [{"text": t} for t in texts])


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": str(i), "prompt": f"p{i}", "answer": "1"} for i in range(n)]


_RELEASE = threading.Event()  # ends the runaway loop an abandoned worker thread is still spinning in


def _verifier(text: str, row: Any) -> float:
    if text == "raise":
        raise KeyError("answer")
    if text == "nan":
        return float("nan")
    if text == "loop":
        while not _RELEASE.is_set():  # a runaway pure-Python verifier
            pass
    if text == "sleep":
        time.sleep(5)
    return 1.0 if text == "1" else 0.0


def test_verifier_errors_score_zero_and_are_counted() -> None:
    s = Scorer("arithmetic", _rows(4))
    s.verify = _verifier
    r = _rollouts(["1", "raise", "nan", "0"])
    s(r)
    assert r.reward.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert (s.errors, s.timeouts) == (2, 0)


@pytest.mark.parametrize("where", ["main thread (SIGALRM)", "worker thread"])
def test_verifier_timeouts_score_zero_and_are_counted_separately(where: str) -> None:
    s = Scorer("arithmetic", _rows(5), timeout_s=0.2)
    s.verify = _verifier
    r = _rollouts(["1", "loop", "raise", "sleep", "1"])
    _RELEASE.clear()
    t0 = time.perf_counter()
    try:
        if where == "worker thread":
            t = threading.Thread(target=s, args=(r,))
            t.start()
            t.join(60)
        else:
            s(r)
        elapsed = time.perf_counter() - t0
    finally:
        _RELEASE.set()  # a thread cannot be killed: stop the abandoned loop so it does not slow later tests
    assert elapsed < 30
    assert r.reward.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert (s.errors, s.timeouts) == (1, 2)
    with pytest.raises(ConfigError, match="verifier_timeout_s"):  # refused by the train section, once
        TrainConfig(verifier_timeout_s=0)


def test_verifier_failures_in_training_are_counted_logged_and_checkpointed(
        policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = scoring.get_verifier("arithmetic")
    calls = {"n": 0}

    def flaky(text: str, row: Any) -> float:
        calls["n"] += 1
        if calls["n"] % 7 == 0:
            raise RuntimeError("verifier crashed")
        return real(text, row)

    monkeypatch.setattr(scoring, "get_verifier", lambda name: flaky)
    with caplog.at_level(logging.WARNING, logger="rlvr_core.training"):
        res = _train(policy_dir, tmp_path / "run", cfg={"steps": 2})
    errs = [r["verifier_errors"] for r in res.metrics[1:]]
    assert 0 < errs[0] < errs[1]
    assert any("verifier error(s)" in r.getMessage() for r in caplog.records)
    assert final_state(tmp_path / "run", 2)["verifier_errors"] == errs[-1]


# ----------------------------------------------------------------------------- non-finite updates


def _poison(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> dict[str, Any]:
    """NaN logits in the update's forward passes (grad enabled) of the chosen steps; generation is untouched."""
    box: dict[str, Any] = {"step": 0, "weights": {}}
    real = training.load_policy

    def load(*args: Any, **kw: Any) -> Any:
        model, tok = real(*args, **kw)
        if "model" not in box:
            box["model"] = model

            def hook(module: Any, inputs: Any, output: Any) -> Any:
                if torch.is_grad_enabled() and box["step"] in steps:
                    output.logits = output.logits * float("nan")
                return output

            model.register_forward_hook(hook)
        return model, tok

    monkeypatch.setattr(training, "load_policy", load)
    return box


def _track(box: dict[str, Any]) -> Any:
    def on_step(rec: dict[str, Any]) -> None:
        box["weights"][rec["step"]] = {k: v.clone() for k, v in box["model"].state_dict().items()}
        box["step"] = rec["step"] + 1  # the step about to run

    return on_step


def test_a_non_finite_update_is_skipped_and_logged(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    box = _poison(monkeypatch, {2})
    with caplog.at_level(logging.WARNING, logger="rlvr_core.training"):
        res = _train(policy_dir, tmp_path / "run", cfg={"steps": 3, "batch_size": 16}, on_step=_track(box))
    nonfinite = [r["nonfinite"] for r in res.metrics[1:]]
    assert nonfinite == [0.0, 1.0, 0.0]
    assert any("step 2: non-finite loss or gradient" in r.getMessage() for r in caplog.records)
    w = box["weights"]
    assert all(torch.equal(w[2][k], w[1][k]) for k in w[1])  # step 2 changed nothing
    assert any(not torch.equal(w[3][k], w[2][k]) for k in w[2])  # step 3 trained again
    assert final_state(tmp_path / "run", 3)["nonfinite_run"] == 0


def test_consecutive_non_finite_updates_stop_the_run(policy_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    box = _poison(monkeypatch, {2, 3, 4})
    with pytest.raises(TrainingStopped, match=r"step 3: 2 consecutive non-finite losses or gradients; lower train\.lr"):
        _train(policy_dir, tmp_path / "run", cfg={"max_nonfinite": 2, "batch_size": 16}, on_step=_track(box))
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2, 3]
    assert [p.name for p in list_checkpoints(tmp_path / "run/checkpoints")] == ["step_000002"]


# ----------------------------------------------------------------------------- saturated steps


@pytest.mark.parametrize("allocator, params", [("grpo", {}), ("dapo", {"max_gen_batches": 2})])
def test_a_step_without_effective_groups_makes_no_update(policy_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture, allocator: str,
                                                         params: dict) -> None:
    monkeypatch.setattr(scoring, "get_verifier", lambda name: lambda text, row: 0.0)  # every group all-fail
    box = _poison(monkeypatch, set())
    with caplog.at_level(logging.WARNING, logger="rlvr_core.training"):
        res = _train(policy_dir, tmp_path / "run", on_step=_track(box),
                     cfg={"allocator": allocator, "allocator_params": {allocator: params} if params else {},
                          "steps": 2})
    steps = res.metrics[1:]
    assert [r["effective_groups"] for r in steps] == [0, 0]
    assert [r["update_skipped"] for r in steps] == [1.0, 1.0]
    if allocator == "dapo":
        assert all(r["hit_cap"] for r in steps) and all(r["rollouts"] == 2 * 8 * 4 for r in steps)
    assert sum("no effective group" in r.getMessage() for r in caplog.records) == 2
    w = box["weights"]
    assert all(torch.equal(w[2][k], w[0][k]) for k in w[0])


# ----------------------------------------------------------------------------- Prefect task retries


def test_prefect_retries_engine_faults_but_not_bad_input() -> None:
    from prefect.states import Failed

    from rlvr_core.data.validate import DataError
    from rlvr_core.models.tiny import PolicyLoadError
    from tasks.training import run_training, should_retry

    assert run_training.retries >= 1 and run_training.retry_condition_fn is should_retry
    for exc, retried in ((EngineError("round 0 failed"), True), (OSError("disk"), True),
                         (ConfigError("train.lr: bad"), False), (DataError("train row 3"), False),
                         (PolicyLoadError("no config.json"), False), (TrainingStopped("nan"), False)):
        assert should_retry(run_training, None, Failed(data=exc)) is retried, exc
