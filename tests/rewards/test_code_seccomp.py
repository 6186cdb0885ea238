"""The seccomp filter's assembler (no sandbox run needed)."""

from __future__ import annotations

import pytest

from rlvr_core.rewards.sandbox import seccomp


def test_a_jump_too_far_for_classic_bpf_is_refused_not_wrapped() -> None:
    """A conditional jump's offset is 8 bits: one past 255 instructions must fail, not wrap around."""
    ret_allow = (0x06, 0x7FFF0000, None, None)
    near = [(0x15, 1, "end", None), *[ret_allow] * 255, "end", ret_allow]
    assert len(seccomp._assemble(near)) == 8 * 257
    with pytest.raises(ValueError, match="does not fit in 8 bits"):
        seccomp._assemble([(0x15, 1, "end", None), *[ret_allow] * 256, "end", ret_allow])
