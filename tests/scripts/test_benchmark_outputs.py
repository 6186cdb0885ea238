"""Smoke and reduced benchmark runs never write over the committed benchmarks/results/."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.allocation import full_protocol
from benchmarks.common import RESULTS, results_dir

PROJECT = Path(__file__).resolve().parents[2]


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime_ns of every file under ``folder``."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_results_dir_keeps_the_committed_folder_for_full_runs_only(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert results_dir(None, True, "x") == RESULTS
    smoke = results_dir(None, False, "x")
    assert smoke.is_dir() and smoke.parent == tmp_path and str(smoke) in capsys.readouterr().out
    assert results_dir(None, False, "x") != smoke  # a fresh folder per run
    named = tmp_path / "named" / "deep"
    assert results_dir(named, False, "x") == named and named.is_dir()


def test_only_the_full_allocation_protocol_counts_as_full() -> None:
    assert full_protocol(False, 5, 60, 32)
    assert not full_protocol(True, 5, 60, 32)  # --quick, even with the full numbers
    assert not full_protocol(True, 5, 15, 32)
    assert not full_protocol(False, 1, 60, 32)
    assert not full_protocol(False, 5, 20, 32)
    assert not full_protocol(False, 5, 60, 8)


@pytest.mark.slow
def test_quick_allocation_run_leaves_results_untouched(tmp_path: Path) -> None:
    before = snapshot(RESULTS)
    assert before, "benchmarks/results/ holds the committed results"
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(PROJECT), OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    p = subprocess.run([sys.executable, "-m", "benchmarks.allocation", "--quick", "--seeds", "1"], cwd=PROJECT,
                       env=env, capture_output=True, text=True, timeout=2700)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert snapshot(RESULTS) == before
    out = Path(re.search(r"writing to (\S+)", p.stdout).group(1))
    assert out.parent == tmp_path
    for name in ("allocation.csv", "allocation.md", "allocation.png", "allocation_runs.csv", "allocation_timing.csv"):
        assert (out / "allocation" / name).stat().st_size > 0, name
    assert json.loads((out / "allocation" / "allocation_targets.json").read_text())["run"]["quick"] is True
