"""Verifier for the synthetic arithmetic task (``rlvr_core.data.arithmetic``).

Answer format: the completion is the answer's decimal digits written reversed
(least significant first) and nothing else, e.g. prompt ``"0047+0083="`` (130)
-> completion ``"031"``; zero is ``"0"``. Surrounding ASCII whitespace is
ignored; anything else (signs, inner spaces, unicode digits, a trailing "0" that
would be a leading zero of the answer, more than 12 digits) scores 0.0.

``verify_arithmetic(completion, example) -> 1.0 | 0.0`` compares the parsed value
with ``int(example["answer"])``. It never raises and never evaluates model text;
it does O(1) work for any input (oversized text is rejected by length first).
"""

from __future__ import annotations

from typing import Callable, Mapping

from rlvr_core.data.arithmetic import parse_answer


def verify_arithmetic(completion: str, example: Mapping) -> float:
    """1.0 iff ``completion`` is the reversed-digit form of ``example["answer"]``, else 0.0."""
    return score_parsed(parse_answer, completion, example)


def score_parsed(parse: Callable[[str], int | None], completion: str, example: Mapping) -> float:
    """1.0 iff ``parse(completion)`` equals ``example["answer"]`` (an int or a digit string of at most 20
    characters), else 0.0; never raises (shared by the arithmetic tasks' verifiers)."""
    try:
        value = parse(completion)
        if value is None:
            return 0.0
        answer = example["answer"]
        if not isinstance(answer, (str, int)) or isinstance(answer, bool) or len(str(answer)) > 20:
            return 0.0
        return 1.0 if value == int(answer) else 0.0
    except Exception:  # noqa: BLE001 - a verifier must score, never crash the training step
        return 0.0
