"""The seccomp filter's assembler and tables (no sandbox run needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlvr_core.rewards.sandbox import seccomp


def test_a_jump_too_far_for_classic_bpf_is_refused_not_wrapped() -> None:
    """A conditional jump's offset is 8 bits: one past 255 instructions must fail, not wrap around."""
    ret_allow = (0x06, 0x7FFF0000, None, None)
    near = [(0x15, 1, "end", None), *[ret_allow] * 255, "end", ret_allow]
    assert len(seccomp._assemble(near)) == 8 * 257
    with pytest.raises(ValueError, match="does not fit in 8 bits"):
        seccomp._assemble([(0x15, 1, "end", None), *[ret_allow] * 256, "end", ret_allow])


HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_the_refused_numbers_match_the_kernel_headers(machine: str) -> None:
    """Every refused call has its number from the kernel's table for each machine the filter knows."""
    header = Path(HEADERS[machine])
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    defined = dict(re.findall(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\b", header.read_text(), re.M))
    table = seccomp._DENIED[machine]
    assert sorted(table) == sorted(seccomp._DENIED_NAMES)
    assert {name: int(defined[name]) for name in table} == table
    assert "ipc" not in defined  # no multiplexer to refuse as well (i386/x32/arm32 are refused as foreign ABIs)
