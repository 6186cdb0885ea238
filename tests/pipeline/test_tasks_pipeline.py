"""Every task through the pipeline on the CPU: prepare -> warmstart -> train -> evaluate, flows called in-process.

countdown: the tiny policy, warm-started on the countdown teacher's solutions, trained two steps with
the countdown verifier. code: LiveCodeBench-format files (tests/fixtures/hub/livecodebench: release
files test.jsonl and test2.jsonl, a functional LeetCode problem among them, private tests plain and
compressed) and a random tiny chat model (tests/models/chat_model.py) standing in for a pretrained
base; it writes no working program, so every reward is a 0 from the bubblewrap sandbox, and a known
program scores 1 through the same Scorer. The budgets are tiny (a smoke test of the wiring;
``train.allow_no_update`` because such policies may give no mixed group).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from rlvr_core.rewards import scoring
from tasks.data import load_split
from tests.pipeline.conftest import PROJECT

LCB = PROJECT / "tests" / "fixtures" / "hub" / "livecodebench"
SUM_PROGRAM = "Read both numbers:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"

pytestmark = pytest.mark.slow

TINY_WARMSTART = {"steps": 20, "batch_size": 16, "warmup": 5, "log_every": 10, "hidden": 32, "layers": 1,
                  "heads": 2, "intermediate": 64}
TINY_TRAIN = {"allocator": "grpo", "allocators": ["grpo"], "k": 4, "batch_size": 8, "steps": 2, "eval_every": 1,
              "eval_size": 20, "eval_samples": 0, "checkpoint_every": 1, "keep_last": 2, "allow_no_update": True,
              "seeds": [0]}  # the flows train train.seed (0); evaluate covers train.seeds


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
    lookup = scoring.get_verifier

    def recording(name: str):
        verify = lookup(name)

        def scored(completion, row):
            reward = verify(completion, row)
            calls.append((name, reward))
            return reward

        return scored

    monkeypatch.setattr(scoring, "get_verifier", recording)
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

    evaluate(params_file=params)
    assert json.loads((tmp_path / "reports/evaluation.json").read_text())["grpo"]["0"]["step"] == 2


def _sandbox() -> None:
    """Skip without bubblewrap, except under CI, where the code path must run."""
    import os

    from rlvr_core.rewards.sandbox import SandboxLimits, SandboxUnavailable, check_sandbox

    try:
        check_sandbox(SandboxLimits())
    except SandboxUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the code task through the bubblewrap sandbox: {e}")
        pytest.skip(f"bubblewrap sandbox unavailable here: {e}")


def test_code_runs_the_pipeline_with_rewards_from_the_sandbox(flows_here, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    import rlvr_core.rewards.code as code
    from flows.evaluate import evaluate
    from flows.prepare import prepare
    from flows.train import train
    from flows.warmstart import warmstart
    from rlvr_core.types import Rollouts
    from tests.models.chat_model import build_chat_model

    _sandbox()
    base = build_chat_model(tmp_path / "base" / "tiny-qwen2-instruct")
    source = {"dataset": "livecodebench", "path": str(LCB), "split": "test"}
    params = _params(tmp_path, prepare={"task": "code", **source, "eval_dataset": "livecodebench",
                                        "eval_path": str(LCB), "eval_split": "test2"},
                     warmstart={"base_model": str(base)},
                     train={**TINY_TRAIN, "k": 2, "batch_size": 3, "eval_size": 3, "max_new_tokens": 16},
                     evaluate={"k": 2, "n_samples": 2, "max_new_tokens": 16})
    assert prepare(params_file=params) == {"train": 3, "test": 3}
    counts = json.loads((tmp_path / "data/code/counts.json").read_text())
    assert counts["dropped_functional"] == {"train": 1, "test": 0}  # the LeetCode problem needs a call harness
    rows = load_split(str(tmp_path / "data/code"), "train")
    assert [r["platform"] for r in rows] == ["atcoder", "codeforces", "atcoder"]

    assert warmstart(params_file=params)["mode"] == "pretrained"

    calls = _record_verifier(monkeypatch)
    runs: list[str] = []
    run_python = code.run_python

    def sandboxed(program, stdin, limits):
        result = run_python(program, stdin, limits)
        runs.append(result.status)
        return result

    monkeypatch.setattr(code, "run_python", sandboxed)
    summary = train(params_file=params)["summary"]
    assert summary["steps"] == 2 and summary["cum_rollouts"] == 2 * 3 * 2
    assert [name for name, _ in calls] == ["code"] * summary["cum_rollouts"]
    assert {r for _, r in calls} == {0.0}  # a random 2-layer model writes no working program
    assert len(runs) >= len(calls)  # every score came from programs run in the sandbox

    # the same Scorer the run used: a known program passes every test, public and private
    scorer = scoring.Scorer("code", rows)
    i = next(i for i, r in enumerate(rows) if r["id"] == "livecodebench-abc901_a")
    texts = [SUM_PROGRAM, "```python\nprint(3)\n```", "print(int(input()) + 1"]  # right; public test only; broken
    ro = Rollouts(np.full(3, i), np.full(3, np.nan), np.ones(3, dtype=np.int64), [{"text": t} for t in texts])
    scorer(ro)
    assert ro.reward.tolist() == [1.0, 0.0, 0.0] and scorer.errors == 0

    evaluate(params_file=params)
    assert json.loads((tmp_path / "reports/evaluation.json").read_text())["grpo"]["0"]["step"] == 2
