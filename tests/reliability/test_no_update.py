"""A run in which no step updated the policy ends FAILED, unless train.allow_no_update lets it end saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.train import check_trained, summarize
from rlvr_core.training import TrainingStopped

STEP = {"rollouts": 32, "effective_ratio": 0.0, "update_skipped": 1.0, "nonfinite": 0.0}
HISTORY = [{"step": 0, "eval/greedy_acc": 0.0}, {**STEP, "step": 1}, {**STEP, "step": 2, "nonfinite": 1.0}]


def test_no_update_fails_the_run(tmp_path: Path) -> None:
    with pytest.raises(TrainingStopped, match=r"2 step\(s\) ran and none updated the policy.*allow_no_update"):
        check_trained(HISTORY, tmp_path)


def test_allow_no_update_ends_with_a_summary_that_says_so(tmp_path: Path) -> None:
    check_trained(HISTORY, tmp_path, allow_no_update=True)
    assert summarize("sara", HISTORY, {"greedy_acc": 0.0})["updates"] == 0


def test_one_update_is_enough(tmp_path: Path) -> None:
    history = HISTORY + [{**STEP, "step": 3, "update_skipped": 0.0}]
    check_trained(history, tmp_path)
    assert summarize("sara", history, {})["updates"] == 1
