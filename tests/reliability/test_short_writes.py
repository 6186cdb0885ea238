"""A write cut short is noticed (round 4, break 8; rlvr_core/safefs.py): ``os.write`` may write a prefix of
what it is given. On a full disk 2,096 of a 6,023-byte metrics line reached metrics.jsonl and the next line
was glued on, so the resume refused the file ("line 8: not a JSON object"). Now every write loops on the
rest (``write_all``), and an append that fails part-way is cut back off the file and raised."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from rlvr_core import safefs
from rlvr_core.training import _append_metrics

LONG = {"step": 2, "note": "x" * 6000}


def _short_writes(monkeypatch: pytest.MonkeyPatch, prefix: int, then_fail: bool) -> list[int]:
    """``os.write`` writes at most ``prefix`` bytes per call; with ``then_fail`` its second call is ENOSPC."""
    real, calls = os.write, []

    def write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if then_fail and len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bytes(data[:prefix]))

    monkeypatch.setattr(os, "write", write)
    return calls


def test_a_failed_append_is_cut_back_and_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    _append_metrics(path, {"step": 1})
    before = path.read_bytes()
    calls = _short_writes(monkeypatch, 2096, then_fail=True)
    with pytest.raises(OSError) as err:
        _append_metrics(path, LONG)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert len(calls) == 2  # the prefix was written, the rest was tried
    assert path.read_bytes() == before  # only whole lines: the 2,096 bytes that reached the file are gone
    monkeypatch.undo()
    _append_metrics(path, {"step": 2})  # the disk has room again: the next line starts a line of its own
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]


def test_a_short_write_goes_on_with_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "metrics.jsonl"
    calls = _short_writes(monkeypatch, 2096, then_fail=False)
    _append_metrics(path, LONG)
    _append_metrics(path, {"step": 3})
    monkeypatch.undo()
    assert len(calls) > 3  # the long line took several writes
    assert [json.loads(x) for x in path.read_text().splitlines()] == [LONG, {"step": 3}]


def test_a_failed_fsync_cuts_the_append_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "spool.jsonl"
    safefs.append_line(path, "one\n", fsync=True)

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        safefs.append_line(path, "two\n", fsync=True)
    assert path.read_text() == "one\n"


def test_write_all_refuses_a_write_that_makes_no_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        assert len(calls) < 100, "write_atomic keeps calling a write that writes nothing"
        return 0

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(OSError) as err:
        safefs.write_atomic(tmp_path / "x.json", b"{}")
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []  # the temporary file is removed, no target written


def test_the_auth_string_is_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.local_server import auth_string

    _short_writes(monkeypatch, 7, then_fail=False)
    made = auth_string(tmp_path)
    monkeypatch.undo()
    assert made.startswith("rlvr:") and len(made) == len("rlvr:") + 43 and auth_string(tmp_path) == made
