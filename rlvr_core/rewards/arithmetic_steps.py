"""Verifier for arithmetic with worked answers (``rlvr_core.data.arithmetic_steps``).

The completion is column-by-column working, then ``>`` and the answer's digits reversed, e.g. prompt
``"0047+0083="`` (130) -> ``"7+3=10,4+8+1=13>031"``. Only the final answer is checked: the text after
the last ``>`` must be the reversed-digit form of ``example["answer"]`` (``parse_answer``'s format);
the working before it is not read, right or wrong. No ``>``, a malformed answer or a completion over
``MAX_READ_CHARS`` characters scores 0.0.

``verify_arithmetic_steps(completion, example) -> 1.0 | 0.0`` never raises and never evaluates model text.
"""

from __future__ import annotations

from typing import Mapping

from rlvr_core.data.arithmetic_steps import parse_final
from rlvr_core.rewards.arithmetic import score_parsed


def verify_arithmetic_steps(completion: str, example: Mapping) -> float:
    """1.0 iff the final answer of ``completion`` (after its last ``>``) is ``example["answer"]``, else 0.0."""
    return score_parsed(parse_final, completion, example)
