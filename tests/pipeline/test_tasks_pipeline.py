"""Every task through the pipeline on the CPU: prepare -> warmstart -> train -> evaluate, flows called in-process.

countdown: the tiny policy, warm-started on the countdown teacher's solutions, trained two steps with
the countdown verifier. The budgets are tiny (a smoke test of the wiring; ``train.allow_no_update``
because a 20-step warm start may give no mixed group).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

import rlvr_core.training as training
from tasks.data import load_split

pytestmark = pytest.mark.slow

TINY_WARMSTART = {"steps": 20, "batch_size": 16, "warmup": 5, "log_every": 10, "hidden": 32, "layers": 1,
                  "heads": 2, "intermediate": 64}
TINY_TRAIN = {"allocator": "grpo", "allocators": ["grpo"], "k": 4, "batch_size": 8, "steps": 2, "eval_every": 1,
              "eval_size": 20, "eval_samples": 0, "checkpoint_every": 1, "keep_last": 2, "allow_no_update": True}


@pytest.fixture
def flows_here(in_env: dict[str, str]):
    """in_env, and Prefect's settings pointed at the test server and home (it read the environment on import)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: in_env["PREFECT_API_URL"], PREFECT_HOME: in_env["PREFECT_HOME"]}):
        yield in_env
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for worker in (APILogWorker, EventsWorker):  # send what is queued while the server still runs
            worker.drain_all(timeout=10)


def _params(tmp: Path, **sections) -> str:
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(sections))
    return str(path)


def _record_verifier(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """Wrap the verifier the training loop's Scorer looks up; returns the (verifier, reward) of every call."""
    calls: list[tuple[str, float]] = []
    lookup = training.get_verifier

    def recording(name: str):
        verify = lookup(name)

        def scored(completion, row):
            reward = verify(completion, row)
            calls.append((name, reward))
            return reward

        return scored

    monkeypatch.setattr(training, "get_verifier", recording)
    return calls


def test_countdown_runs_the_pipeline(flows_here, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.evaluate import evaluate
    from flows.prepare import prepare
    from flows.train import train
    from flows.warmstart import warmstart
    from rlvr_core.rewards.countdown import verify_countdown

    params = _params(tmp_path, prepare={"task": "countdown", "n_train": 300, "n_test": 40, "seed": 0},
                     warmstart=TINY_WARMSTART, train={**TINY_TRAIN, "max_new_tokens": 16},
                     evaluate={"k": 4, "n_samples": 4, "max_new_tokens": 16})
    assert prepare(params_file=params) == {"train": 300, "test": 40}
    rows = load_split(str(tmp_path / "data/countdown"), "train")
    assert all(verify_countdown(r["answer"], r) == 1.0 for r in rows)  # the teacher's solutions are right

    metrics = warmstart(params_file=params)
    assert metrics["steps"] == 20 and math.isfinite(metrics["final_loss"])
    assert 0 < metrics["sloppy_fraction"] < 1  # 3-number rows are noisy by default (noisy_difficulties 2, 3)
    assert (tmp_path / "models/warmstart/config.json").is_file()

    calls = _record_verifier(monkeypatch)
    result = train(params_file=params)
    summary = result["summary"]
    assert summary["steps"] == 2 and "greedy_acc" in summary["final_eval"]
    assert summary["cum_rollouts"] > 0 and {name for name, _ in calls} == {"countdown"}
    assert len(calls) == summary["cum_rollouts"] and {r for _, r in calls} <= {0.0, 1.0}

    ev = evaluate(params_file=params)
    assert json.loads((tmp_path / "reports/evaluation.json").read_text())["grpo"]["step"] == 2
    assert ev
