"""Fixtures for the code sandbox tests: a private temp root, bubblewrap, process markers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Sandbox temp files go under a test-owned folder so leftovers can be counted."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def bwrap_sandbox() -> tuple[str, ...]:
    """The bubblewrap sandbox's layers; skips without bubblewrap, except under CI, where it fails."""
    from rlvr_core.rewards.sandbox import SandboxLimits, SandboxUnavailable, check_sandbox

    try:
        return check_sandbox(SandboxLimits())
    except SandboxUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the bubblewrap sandbox tests (CI is set): {e}")
        pytest.skip(f"bubblewrap sandbox unavailable here: {e}")


@pytest.fixture
def processes_with():
    """``processes_with(marker)``: live host pids whose command line contains ``marker``."""
    return _processes_with


def _processes_with(marker: str) -> list[int]:
    """Live, non-zombie host pids whose command line contains ``marker``."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != "Z":
            found.append(int(entry))
    return found
