"""The prepare flow's log carries the flow's own lines, not a library's bytecode disassembly."""

from __future__ import annotations

import dis
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, PY, TINY

pytestmark = pytest.mark.slow

# a dis.dis line: optional source line number, the offset, then an opcode name (LOAD_GLOBAL, PRECALL, ...)
OPCODES = sorted((op for op in dis.opname if not op.startswith("<")), key=len, reverse=True)
DISASSEMBLY = re.compile(r"(?:^|\s-\s|\|\s)\s*(?:\d+\s+)?\d+\s+(?:" + "|".join(OPCODES) + r")\b", re.M)


def test_disassembly_pattern_matches_a_real_disassembly(capsys: pytest.CaptureFixture[str]) -> None:
    dis.dis(lambda columns: len(columns))
    assert DISASSEMBLY.search(capsys.readouterr().out)
    assert not DISASSEMBLY.search("08:19:10.516 | INFO | Flow run 'x' - prepare: arithmetic {'train': 300} -> data")


def test_prepare_log_has_no_bytecode_and_keeps_its_prints(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    p = subprocess.run([PY, "-m", "flows.prepare"], env=pipeline_env, cwd=PROJECT, capture_output=True,
                       text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert not DISASSEMBLY.search(out), out[-3000:]
    assert "prepare: arithmetic {'train': 300, 'test': 40}" in out  # log_prints still logs the flow's print

    # the dataset fingerprint is the one a direct library call gives: dill's scan read its own output
    from rlvr_core.config import load_params
    from rlvr_core.data.arithmetic import make_arithmetic

    c = load_params(TINY).prepare
    direct = make_arithmetic(c.n_train, c.n_test, c.seed, digits=c.digits, ops=c.ops, digit_weights=c.digit_weights)
    for split in ("train", "test"):
        state = json.loads((tmp_path / "data/arithmetic" / split / "state.json").read_text())
        assert state["_fingerprint"] == direct[split]._fingerprint, split
