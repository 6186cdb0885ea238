"""One writer per run folder: an exclusive ``flock`` on ``<run folder>/run.lock``.

``hold_run_folder(folder)`` takes the lock without waiting, or raises ``RunFolderBusy``
naming the folder and the holder's pid. The kernel releases a ``flock`` when the last
descriptor of its open file closes, so a process killed with SIGKILL leaves no stale
lock: the file stays, and the next run takes the lock on it. The lock file holds the
holder's pid, host and start time (JSON) for the error message only; it is never
deleted, because deleting it would let two processes lock two different files. It is opened through a
descriptor of the folder with ``O_NOFOLLOW`` (``rlvr_core.safefs``): a link planted as ``run.lock`` is
refused, never truncated through, and so is a folder that is a link, belongs to another user or that
every user may write.

Within one process the lock is re-entrant: the flow takes it, and ``training.train``
(called from the flow, or directly by library users) takes it again without blocking
itself. ``train`` takes it once its inputs passed their checks, so refused input leaves no
run folder behind.

A child made by ``fork`` without ``exec`` shares the locked descriptor and keeps the
lock while it lives; children started with ``exec`` (subprocess) do not inherit it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

from rlvr_core.errors import ConfigError
from rlvr_core.safefs import UnsafeRunFolder, folder_fd, open_in

LOCK_NAME = "run.lock"

_mutex = threading.RLock()  # re-entrant: __del__ may run inside a held section
_held: dict[str, list[int]] = {}  # resolved folder -> [fd, holds]


class RunFolderBusy(ConfigError):
    """Another process is writing this run folder (a ConfigError: retrying does not help)."""


class RunLock:
    """A hold on a run folder's lock; ``release`` (or leaving the ``with`` block) gives it back."""

    def __init__(self, key: str, folder: Path) -> None:
        self.key, self.folder, self._released = key, folder, False

    def release(self) -> None:
        with _mutex:
            if self._released:
                return
            self._released = True
            entry = _held.get(self.key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self.key]
                os.close(entry[0])  # closing the only descriptor releases the flock

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a hold dropped without release (an exception before the caller's finally)
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or not info.get("pid"):
        return "pid unknown"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info['pid']} on {info.get('host', '?')}, since {since}"


def hold_run_folder(folder: str | os.PathLike) -> RunLock:
    """Take the exclusive lock of run folder ``folder`` (created if missing); raise RunFolderBusy if held."""
    folder = Path(folder)
    with folder_fd(folder) as dfd:  # UnsafeRunFolder: a link, another user's folder, one anyone may write
        key = os.path.realpath(folder)
        path = Path(key) / LOCK_NAME
        with _mutex:
            if key in _held:
                _held[key][1] += 1
                return RunLock(key, folder)
            return _take(open_in(dfd, LOCK_NAME, os.O_RDWR | os.O_CREAT, folder), key, folder, path)


def _take(fd: int, key: str, folder: Path, path: Path) -> RunLock:
    """Lock the open lock file ``fd`` (closed on failure), write the holder's details, register the hold."""
    with _mutex:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                raise UnsafeRunFolder(f"{path}: not a plain file of this user ({stat.filemode(st.st_mode)}, uid "
                                      f"{st.st_uid}, {st.st_nlink} links); remove it")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunFolderBusy(
                f"run folder {folder} is being written by another process ({holder}); one writer per run "
                f"folder: wait for it to finish or stop it, or use another run folder (--out)") from None
        except BaseException:
            os.close(fd)
            raise
        try:  # a full disk (ENOSPC) here must not leave the locked descriptor open for the rest of the process
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "since": time.time()}).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        _held[key] = [fd, 1]
        return RunLock(key, folder)


__all__ = ["LOCK_NAME", "RunFolderBusy", "RunLock", "hold_run_folder"]
