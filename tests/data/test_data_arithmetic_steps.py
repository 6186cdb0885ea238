"""Task arithmetic-steps: worked answers whose final answer alone is verified, and a sloppy teacher whose wrong
answers come with longer, wandering working."""

from __future__ import annotations

import random
import statistics

import pytest

from rlvr_core.config import PrepareConfig
from rlvr_core.data.arithmetic import apply_op
from rlvr_core.data.arithmetic_steps import (
    MAX_STEPS_CHARS,
    max_clean_chars,
    parse_final,
    sloppy_solution,
    worked_solution,
    worked_targets,
)
from rlvr_core.data.validate import validate_splits
from rlvr_core.models.tokenizer import check_text
from rlvr_core.models.warmstart import sloppy_value
from rlvr_core.rewards import get_verifier
from rlvr_core.tasks import check_new_tokens, get_task


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    ds, _ = get_task("arithmetic-steps").build(PrepareConfig(task="arithmetic-steps", n_train=3000, n_test=50, seed=5))
    return list(ds["train"])


@pytest.fixture(scope="module")
def targets(rows: list[dict]) -> dict[str, list]:
    return get_task("arithmetic-steps").teacher(rows).__dict__


def test_worked_answers_write_each_column_then_the_reversed_answer() -> None:
    assert worked_solution(47, "+", 83) == "7+3=10,4+8+1=13>031"
    assert worked_solution(83, "-", 47) == "13-7=6,8-4-1=3>63"
    assert worked_solution(47, "*", 3) == "7*3=21,4*3+2=14>141"
    assert worked_solution(1000, "-", 999) == "10-9=1,10-9-1=0,10-9-1=0,1-0-1=0>1"  # leading zeros dropped
    assert worked_solution(0, "+", 0) == "0+0=0>0"


def test_rows_validate_and_every_completion_is_writable_by_the_tiny_policy(rows: list[dict],
                                                                           targets: dict[str, list]) -> None:
    ds, extra = get_task("arithmetic-steps").build(PrepareConfig(task="arithmetic-steps", n_train=40, n_test=10))
    validate_splits(list(ds["train"]), list(ds["test"]), get_task("arithmetic-steps"))
    for text in targets["clean"] + targets["sloppy"]:
        check_text(text)  # digits, + - * = , > only: no new token
        assert len(text) <= MAX_STEPS_CHARS
    assert max(len(t) for t in targets["clean"]) <= max_clean_chars() <= MAX_STEPS_CHARS
    assert check_new_tokens("arithmetic-steps", MAX_STEPS_CHARS) is None
    assert f"set it to {MAX_STEPS_CHARS} or more" in check_new_tokens("arithmetic-steps", 8)


def test_the_verifier_reads_the_final_answer_only(rows: list[dict], targets: dict[str, list]) -> None:
    verify = get_verifier("arithmetic-steps")
    assert all(verify(c, r) == 1.0 for c, r in zip(targets["clean"], rows))
    row = {"answer": "130"}
    assert verify("7+3=10,4+8+1=13>031", row) == 1.0
    assert verify("9+9=99>031", row) == 1.0  # wrong working, right answer: RLVR checks the answer
    assert verify("7+3=10,4+8+1=13>02", row) == 0.0  # right working, wrong answer
    assert verify("7+3=10,4+8+1=13>02>031", row) == 1.0  # the last answer counts
    assert verify("7+3=10,4+8+1=13>031>02", row) == 0.0
    for bad in ("031", "7+3=10,4+8+1=13", "7+3=10>", ">0310", ">-31", "1" * 600 + ">031", ""):
        assert verify(bad, row) == 0.0, bad
    assert parse_final(">031") == 130 and parse_final(None) is None  # type: ignore[arg-type]


def test_sloppy_answers_drop_carries_and_wander_when_they_do(rows: list[dict], targets: dict[str, list]) -> None:
    verify = get_verifier("arithmetic-steps")
    for r, clean, sloppy in zip(rows, targets["clean"], targets["sloppy"]):
        a, op, b = r["a"], r["op"], r["b"]
        assert parse_final(sloppy) == sloppy_value(a, op, b)
        if sloppy_value(a, op, b) == apply_op(a, op, b):
            assert sloppy == clean  # no carry, no mistake, no wandering
        else:
            assert verify(sloppy, r) == 0.0 and sloppy.count(",") > clean.count(",")  # at least one line more
    # a dropped carry is followed by a repeated line or an ignored correction
    assert sloppy_solution(47, "+", 83, random.Random(0)).count(",") >= 2
    failing = [len(s) for s, r in zip(targets["sloppy"], rows) if verify(s, r) == 0.0]
    passing = [len(c) for c in targets["clean"]]
    assert statistics.median(failing) >= 1.4 * statistics.median(passing)


def test_working_varies_in_length(targets: dict[str, list]) -> None:
    lengths = [len(t) for t in targets["clean"] + targets["sloppy"]]
    assert min(lengths) <= 10 and max(lengths) >= 50
    assert len(set(lengths)) >= 20


def test_teacher_is_deterministic_by_seed(rows: list[dict], targets: dict[str, list]) -> None:
    again = worked_targets(rows)
    assert again["clean"] == targets["clean"] and again["sloppy"] == targets["sloppy"]
    other = worked_targets(rows, seed=1)
    assert other["clean"] == targets["clean"] and other["sloppy"] != targets["sloppy"]
    a, b = (get_task("arithmetic-steps").build(PrepareConfig(task="arithmetic-steps", n_train=30, n_test=5, seed=s))[0]
            for s in (2, 2))
    assert list(a["train"]) == list(b["train"])
