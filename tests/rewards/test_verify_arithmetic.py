import time

import pytest

from rlvr_core.rewards import get_verifier
from rlvr_core.rewards.arithmetic import verify_arithmetic

EX = {"prompt": "0047+0083=", "answer": "130", "op": "+", "a": 47, "b": 83, "difficulty": 2}


def test_registry_lookup():
    assert get_verifier("arithmetic") is verify_arithmetic


@pytest.mark.parametrize(
    "completion, example, expected",
    [
        ("031", EX, 1.0),
        ("  031\n", EX, 1.0),
        ("130", EX, 0.0),  # not reversed
        ("0310", EX, 0.0),  # extra digit (leading zero of the answer)
        ("03 1", EX, 0.0),
        ("-031", EX, 0.0),
        ("+031", EX, 0.0),
        ("031=", EX, 0.0),
        ("031<eos>", EX, 0.0),
        ("0", {"answer": "0"}, 1.0),
        ("00", {"answer": "0"}, 0.0),
        ("1008999", {"answer": "9998001"}, 1.0),
        ("０３１", EX, 0.0),  # fullwidth digits
        ("٠٣١", EX, 0.0),  # Arabic-Indic digits
        ("03\u00b9", EX, 0.0),  # superscript one
        ("", EX, 0.0),
        ("   ", EX, 0.0),
        ("__import__('os')", EX, 0.0),
        ("9**9**9", EX, 0.0),
        ("(" * 10000 + "1" + ")" * 10000, EX, 0.0),
        ("1" * 13, {"answer": "1" * 13}, 0.0),  # over the length bound
        ("1" * 1_000_000, EX, 0.0),
        (" " * 1_000_000 + "031", EX, 0.0),
        (None, EX, 0.0),
        (31, EX, 0.0),
        (b"031", EX, 0.0),
        (["031"], EX, 0.0),
        ("031", {}, 0.0),  # example without answer
        ("031", {"answer": None}, 0.0),
        ("031", {"answer": "abc"}, 0.0),
        ("031", None, 0.0),
    ],
)
def test_table(completion, example, expected):
    t = time.perf_counter()
    got = verify_arithmetic(completion, example)
    elapsed = time.perf_counter() - t
    assert got == expected and type(got) is float
    assert elapsed < 1.0  # a table row, not a benchmark: only a pathological parse takes this long


def test_typical_call_is_fast():
    t = time.perf_counter()
    for _ in range(10_000):
        verify_arithmetic("031", EX)
    assert (time.perf_counter() - t) / 10_000 < 1e-4
