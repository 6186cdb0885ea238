import time

import pytest

from rlvr_core.rewards import get_verifier
from rlvr_core.rewards.countdown import verify_countdown

EX = {"prompt": "3,7,25,50>125=", "numbers": [3, 7, 25, 50], "target": 125, "difficulty": 4, "answer": "(7*50+25)/3"}
EX3 = {"numbers": [2, 5, 5], "target": 20}


def test_registry_lookup():
    assert get_verifier("countdown") is verify_countdown


@pytest.mark.parametrize(
    "completion, example, expected",
    [
        ("(7*50+25)/3", EX, 1.0),
        ("25/(3+7)*50", EX, 1.0),  # fractional intermediate 5/2
        ("  ((50*7) + 25) / 3 \n", EX, 1.0),
        ("(7*50+25)/3+0", EX, 0.0),  # 0 not given
        ("7*50+25/3", EX, 0.0),  # wrong value
        ("50*7/3+25/3", EX, 0.0),  # equals 125 but uses 3 twice
        ("3*50-25", EX, 0.0),  # 7 missing
        ("(7*50+25)/3*1", EX, 0.0),
        ("(5+5)*2", EX3, 1.0),
        ("5*2*2", EX3, 0.0),  # 2 reused, a 5 missing
        ("5*(5-5)+20", EX3, 0.0),
        ("2/(5-5)*5", EX3, 0.0),  # division by zero
        ("(2/(5-5))*0+20", {"numbers": [2, 5, 5, 0, 20], "target": 20}, 0.0),
        ("-2+5*5-3", {"numbers": [2, 5, 5, 3], "target": 20}, 0.0),  # unary minus
        ("5*(+2)*2", EX3, 0.0),
        ("2**5", {"numbers": [2, 5], "target": 32}, 0.0),
        ("10//5", {"numbers": [10, 5], "target": 2}, 0.0),
        ("05+1", {"numbers": [5, 1], "target": 6}, 0.0),  # leading zero literal
        ("(5+1", {"numbers": [5, 1], "target": 6}, 0.0),
        ("5 5", {"numbers": [5, 5], "target": 55}, 0.0),
        ("100*100*100*100", {"numbers": [100, 100, 100, 100], "target": 10**8}, 1.0),
        ("999999*999999*999999", {"numbers": [999999] * 3, "target": 999999**3}, 0.0),  # over 1e12
        ("(5+5)*2", {"numbers": [2, 5, 5], "target": 21}, 0.0),
        ("__import__('os')", EX, 0.0),
        ("__import__('os').system('true')", EX, 0.0),
        ("9**9**9", EX, 0.0),
        ("9**9**9**9", {"numbers": [9, 9, 9, 9], "target": 1}, 0.0),
        ("(" * 10000 + "1" + ")" * 10000, {"numbers": [1], "target": 1}, 0.0),
        ("(" * 33 + "1" + ")" * 33, {"numbers": [1], "target": 1}, 0.0),  # deeper than 32
        ("(" * 30 + "1" + ")" * 30, {"numbers": [1], "target": 1}, 1.0),
        ("1" + "+1" * 99, {"numbers": [1] * 100, "target": 100}, 1.0),
        ("1" + "+1" * 150, {"numbers": [1] * 151, "target": 151}, 0.0),  # over 200 chars
        ("１２+3", {"numbers": [12, 3], "target": 15}, 0.0),  # fullwidth digits
        ("١٢+3", {"numbers": [12, 3], "target": 15}, 0.0),  # Arabic-Indic digits
        ("12+3", {"numbers": [12, 3], "target": 15}, 1.0),
        ("7*50+25/3\u00a0", EX, 0.0),  # non-ASCII space
        ("lambda: 1", EX, 0.0),
        ("1 if 1 else 2", EX, 0.0),
        ("[3,7,25,50]", EX, 0.0),
        ("3.5*2", EX, 0.0),
        ("1e3", EX, 0.0),
        ("1_000", EX, 0.0),
        ("", EX, 0.0),
        ("   \n\t", EX, 0.0),
        ("1" * 1_000_000, EX, 0.0),
        ("(" * 1_000_000, EX, 0.0),
        (None, EX, 0.0),
        (125, EX, 0.0),
        (b"(7*50+25)/3", EX, 0.0),
        ("(7*50+25)/3", {}, 0.0),  # example missing fields
        ("(7*50+25)/3", {"numbers": "3,7,25,50", "target": 125}, 0.0),
        ("(7*50+25)/3", {"numbers": [3, 7, 25, 50], "target": 125.0}, 0.0),
        ("(7*50+25)/3", None, 0.0),
    ],
)
def test_table(completion, example, expected):
    t = time.perf_counter()
    got = verify_countdown(completion, example)
    elapsed = time.perf_counter() - t
    assert got == expected and type(got) is float
    assert elapsed < 1.0  # a table row, not a benchmark: only a pathological parse takes this long


def test_numpy_ints_in_example_are_accepted():
    np = pytest.importorskip("numpy")
    ex = {"numbers": np.array([3, 7, 25, 50]), "target": np.int64(125)}
    assert verify_countdown("(7*50+25)/3", ex) == 1.0


def test_typical_call_is_fast():
    t = time.perf_counter()
    for _ in range(2_000):
        verify_countdown("(7*50+25)/3", EX)
    assert (time.perf_counter() - t) / 2_000 < 5e-4
