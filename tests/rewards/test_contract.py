"""Contract tests run over every registered verifier, as tests/allocation/test_contract.py does for allocators.

Each verifier scores a correct completion 1.0 and an incorrect one 0.0 for an example in its task's row
format, scores malformed output 0.0 without raising, and gives the same rewards through the training
loop's ``Scorer`` (which scores a round in a batch where the verifier has ``score_batch``, as math does)
with no error counted.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from rlvr_core.rewards import VERIFIERS, get_verifier

# verifier -> (example row, correct completion, incorrect completion)
EXAMPLES: dict[str, tuple[dict[str, Any], str, str]] = {
    "arithmetic": ({"id": "a0", "prompt": "0047+0083=", "answer": "130", "op": "+", "a": 47, "b": 83,
                    "difficulty": 2}, "031", "130"),
    "arithmetic-steps": ({"id": "s0", "prompt": "0047+0083=", "answer": "130", "op": "+", "a": 47, "b": 83,
                          "difficulty": 2}, "7+3=10,4+8+1=13>031", "7+3=10,4+8=12>02"),
    "countdown": ({"id": "c0", "prompt": "3,7,25,50>125=", "numbers": [3, 7, 25, 50], "target": 125,
                   "difficulty": 4, "answer": "(7*50+25)/3"}, "(7*50+25)/3", "7*50+25/3"),
    "math": ({"id": "m0", "prompt": "What is 1/4 + 1/4?", "answer": "\\frac{1}{2}"},
             "Adding the quarters gives $\\boxed{\\frac{1}{2}}$.", "So the answer is $\\boxed{\\frac{1}{3}}$."),
    "code": ({"id": "k0", "prompt": "Read two integers and print their sum.",
              "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "-5 7\n", "output": "2\n"}]},
             "```python\na, b = map(int, input().split())\nprint(a + b)\n```", "```python\nprint(3)\n```"),
}
MALFORMED = ["", "   \n", "\x00\xff\ufffd\u202e", "(" * 5000, "```python\n", "\\boxed{", "}{" * 200, "9" * 100_000]


def test_every_registered_verifier_has_examples() -> None:
    assert set(VERIFIERS.names()) >= {"arithmetic", "countdown", "math", "code"}
    assert set(VERIFIERS.names()) <= set(EXAMPLES), "add an example row for the new verifier to EXAMPLES"


def _verifier(name: str):
    if name == "code":
        from rlvr_core.rewards.sandbox import SandboxUnavailable

        try:
            return get_verifier(name)  # its preflight refuses a machine without the bubblewrap sandbox
        except SandboxUnavailable as e:
            if os.environ.get("CI"):
                pytest.fail(f"CI must run the code verifier's contract (CI is set): {e}")
            pytest.skip(f"bubblewrap sandbox unavailable here: {e}")
    return get_verifier(name)


@pytest.mark.parametrize("name", VERIFIERS.names())
def test_verifier_contract(name: str) -> None:
    from rlvr_core.training import Scorer
    from rlvr_core.types import Rollouts

    row, right, wrong = EXAMPLES[name]
    verify = _verifier(name)
    assert float(verify(right, row)) == 1.0
    assert float(verify(wrong, row)) == 0.0
    for text in MALFORMED:  # nothing a completion says makes a verifier raise
        assert float(verify(text, row)) == 0.0, text[:40]

    texts = [right, wrong, *MALFORMED]
    ro = Rollouts(np.zeros(len(texts), np.int64), np.full(len(texts), -1.0), np.ones(len(texts), np.int64),
                  [{"text": t} for t in texts])
    scorer = Scorer(name, [row], workers=1)
    try:
        scorer(ro)
    finally:
        scorer.close()
    assert ro.reward.tolist() == [1.0] + [0.0] * (len(texts) - 1)
    assert scorer.errors == 0 and scorer.timeouts == 0
