"""math-verify based verifier: equivalent forms, wrong answers, garbage, huge input, threads."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("math_verify")

from rlvr_core.rewards import get_verifier  # noqa: E402
from rlvr_core.rewards.math import gold_to_latex, shutdown_helpers, verify_math  # noqa: E402


@pytest.mark.parametrize("gold", [r"\frac{1}{2}", "0.5", "1/2", r"\boxed{\frac12}"])
@pytest.mark.parametrize(
    "completion",
    [
        r"So the probability is $\boxed{0.5}$.",
        r"Halving gives \boxed{\frac{1}{2}}",
        r"Therefore the final answer is $\frac{1}{2}$.",
        r"\boxed{1/2}",
        r"First I guessed \boxed{3}, but correcting: $\boxed{\dfrac{1}{2}}$",
    ],
)
def test_equivalent_forms(gold: str, completion: str) -> None:
    assert verify_math(completion, {"answer": gold}) == 1.0


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"\boxed{3}", r"\frac{1}{2}", 0.0),
        (r"$\boxed{0.51}$", "0.5", 0.0),
        (r"\boxed{-2}", "2", 0.0),
        (r"The answer is \boxed{1370}.", "1370", 1.0),
        (r"\boxed{9\pi}", r"9\pi", 1.0),
        (r"\boxed{\{1, 2\}}", r"\{1,2\}", 1.0),
    ],
)
def test_right_and_wrong(completion: str, gold: str, expected: float) -> None:
    assert verify_math(completion, {"answer": gold}) == expected


@pytest.mark.parametrize(
    "completion",
    ["", "   ", "I don't know", r"\boxed{", r"}}}{{{\frac{\frac{", "\x00\xff garbage \\\\", None, 42],
)
def test_garbage_scores_zero(completion: object) -> None:
    assert verify_math(completion, {"answer": "5"}) == 0.0  # type: ignore[arg-type]


def test_huge_and_pathological_inputs_return_quickly() -> None:
    t0 = time.monotonic()
    assert verify_math("7" * 5_000_000, {"answer": "5"}) == 0.0
    assert verify_math("blah " * 400_000 + r"\boxed{5}", {"answer": "5"}) == 1.0  # answer at the end survives
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    assert verify_math(r"\boxed{9^{9^{9^{9}}}}", {"answer": "5"}, timeout_seconds=1) == 0.0
    assert time.monotonic() - t0 < 4.0  # parse + compare each bounded by 1 s


def test_gold_wrapping_and_missing_answer() -> None:
    assert gold_to_latex("5") == "$5$"
    assert gold_to_latex(r"\boxed{5}") == r"\boxed{5}"
    assert gold_to_latex(204) == "$204$"
    assert verify_math(r"\boxed{204}", {"answer": 204}) == 1.0
    with pytest.raises(ValueError, match="non-empty 'answer'"):
        verify_math(r"\boxed{1}", {"solution": "x"})


def test_registered_under_math() -> None:
    assert get_verifier("math") is verify_math


def test_worker_threads_use_helper_with_timeout() -> None:
    """Off the main thread math-verify's signal timeouts cannot work; the helper process keeps them."""
    cases = [
        (r"\boxed{0.5}", 1.0),
        (r"\boxed{2}", 0.0),
        (r"\boxed{9^{9^{9^{9}}}}", 0.0),
        (r"so $\frac{2}{4}$", 1.0),
    ]
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda c: verify_math(c[0], {"answer": "1/2"}, timeout_seconds=1), cases))
        assert got == [want for _, want in cases]
        assert time.monotonic() - t0 < 30.0  # includes starting two helper interpreters
    finally:
        shutdown_helpers()
