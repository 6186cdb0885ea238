"""One rule for "did this step update the policy" (rlvr_core.types.step_updated), used by every reader of a
run's step records: the train flow's summary and its no-update check, the report and the study's ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr_core.errors import TrainingStopped
from rlvr_core.types import StepRecord, step_updated

TIMES = {"generate_s": 0.1, "verify_s": 0.1, "allocate_s": 0.1, "update_s": 0.1}


def _step(step: int, **kw: float) -> StepRecord:
    return {"step": step, "rollouts": 8, "tokens": 40, "effective_groups": 1, "groups": 2, "effective_ratio": 0.5,
            "rounds": 1, "update_skipped": 0.0, "nonfinite": 0.0, "cum_rollouts": 8 * step, "cum_tokens": 40 * step,
            "verifier_errors": 0, "verifier_timeouts": 0, **TIMES, **kw}


HISTORY: list[StepRecord] = [
    {"step": 0, "cum_rollouts": 0, "cum_tokens": 0, "eval/greedy_acc": 0.1, "eval_s": 0.2},  # no update: no step
    _step(1), _step(2, update_skipped=1.0), _step(3, nonfinite=1.0), _step(4, **{"eval/greedy_acc": 0.2})]


def test_step_updated_is_true_only_for_a_training_step_that_changed_the_policy():
    assert [step_updated(r) for r in HISTORY] == [False, True, False, False, True]


def test_the_flow_the_report_and_the_study_count_updates_by_the_same_rule():
    from benchmarks.study.execute import summarize_run
    from flows.train import check_trained, summarize
    from tasks.report import _updates

    expected = sum(step_updated(r) for r in HISTORY)
    assert summarize("grpo", HISTORY, {})["updates"] == expected == 2
    assert _updates(HISTORY) == expected
    study = summarize_run(HISTORY, params=1)
    assert study["ledger"]["updates"] == expected
    assert [p["updates"] for p in study["curve"]] == [0, 2]
    # a run whose steps all failed to update, and only its step-0 evaluation "looks" updated, is refused
    with pytest.raises(TrainingStopped, match="none updated the policy"):
        check_trained(HISTORY[:1] + HISTORY[2:4], Path("runs/x"))
