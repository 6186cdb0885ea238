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


# ----------------------------------------------------------------------------- a step's batch (bounded wall time)

HOSTILE = (r"\boxed{9^{9^{9^{9}}}}", r"\boxed{" + "(" * 300 + "1" + ")" * 300 + "}", r"\boxed{10^{10^{10}}!}")


def test_score_batch_agrees_with_verify_math() -> None:
    from rlvr_core.errors import VerifierTimeout  # noqa: F401 - the type a killed helper reports
    from rlvr_core.rewards.math import score_batch

    cases = [(r"\boxed{0.5}", "1/2"), (r"\boxed{2}", "1/2"), ("", "3"), (r"so $\frac{2}{4}$", r"\frac12"),
             (r"\boxed{204}", 204), ("I don't know", "7")]
    try:
        got = score_batch([c for c, _ in cases], [{"answer": a} for _, a in cases], timeout_s=1, workers=2)
        assert got == [verify_math(c, {"answer": a}) for c, a in cases] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
        bad = score_batch([r"\boxed{1}"], [{"solution": "x"}])
        assert isinstance(bad[0], ValueError) and "non-empty 'answer'" in str(bad[0])
        with pytest.raises(ValueError, match="workers"):
            score_batch([], [], workers=0)
    finally:
        shutdown_helpers()


def test_a_hostile_batch_is_bounded_and_parallel() -> None:
    from rlvr_core.rewards.math import score_batch

    try:
        score_batch([r"\boxed{1}"] * 2, [{"answer": "1"}] * 2, timeout_s=1, workers=2)  # start both helpers
        n = 12
        t0 = time.monotonic()
        got = score_batch([HOSTILE[i % 3] for i in range(n)], [{"answer": "5"}] * n, timeout_s=1, workers=2)
        wall = time.monotonic() - t0
        assert got == [0.0] * n
        # each item runs until its 1 s limit: one after the other that is >= 12 s; two helpers halve it
        assert wall < 0.9 * n, wall
    finally:
        shutdown_helpers()


def test_the_scorer_gives_math_its_timeout_and_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import numpy as np

    from rlvr_core.rewards import math as math_reward
    from rlvr_core.training import Scorer, TrainingStopped
    from rlvr_core.types import Rollouts

    seen: list[tuple[int, str]] = []

    def ask(gold: str, pred: str, seconds: int) -> bool | None:
        seen.append((seconds, threading.current_thread().name))
        return None if pred == "stuck" else pred == r"\boxed{5}"

    monkeypatch.setattr(math_reward, "_ask_helper", ask)
    rows = [{"id": "m0", "prompt": "2+3?", "answer": "5"}]
    texts = [r"\boxed{5}", r"\boxed{4}", "stuck", r"\boxed{5}"]
    ro = Rollouts(np.zeros(4, np.int64), np.zeros(4), np.ones(4, np.int64), [{"text": t} for t in texts])
    scorer = Scorer("math", rows, timeout_s=0.5, workers=3)
    assert scorer.batch is math_reward.score_batch
    scorer(ro)
    assert ro.reward.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert scorer.timeouts == 1 and scorer.errors == 0 and "helper killed" in scorer.first_failure
    assert {s for s, _ in seen} == {1} and all(name.startswith("math-verify") for _, name in seen)
    seen.clear()
    Scorer("math", rows)(ro)  # train.verifier_timeout_s null: math's own 2 s
    assert {s for s, _ in seen} == {2}
    stuck = Rollouts(np.zeros(2, np.int64), np.zeros(2), np.ones(2, np.int64), [{"text": "stuck"}] * 2)
    scorer.begin_step()
    scorer(stuck)
    with pytest.raises(TrainingStopped, match=r"2 of 2 rollouts .*'math' verifier.*first: timeout"):
        scorer.check_step(1)
