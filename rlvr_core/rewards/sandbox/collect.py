"""One run's output, read under the limits, and the status it ends in (both runners)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable

from rlvr_core.rewards.sandbox.limits import (
    MEMORY_LIMIT,
    OK,
    OUTPUT_LIMIT,
    RUNTIME_ERROR,
    SANDBOX_VIOLATION,
    TIMEOUT,
    VIOLATION_EXIT_CODE,
    VIOLATION_MARKER,
    SandboxLimits,
)


def _classify(returncode: int | None, stderr: bytes, killed_for: str | None, *, hook: bool = True) -> str:
    if killed_for is not None:
        return killed_for
    if returncode == 0:
        return OK
    if hook and returncode == VIOLATION_EXIT_CODE and VIOLATION_MARKER in stderr:
        return SANDBOX_VIOLATION
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return TIMEOUT  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one
    if b"MemoryError" in stderr[-4096:]:
        return MEMORY_LIMIT
    return RUNTIME_ERROR



def _collect(
    proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float, kill: Callable[[], None]
) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr in chunks until both close, the deadline passes or a cap is hit.

    ``kill`` ends every process of the run (and reaps the one started).

    Returns (stdout, stderr, reason the group was killed or None).
    """
    assert proc.stdout is not None and proc.stderr is not None
    cap = limits.max_output_bytes
    bufs: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        sel.register(stream, selectors.EVENT_READ)
    deadline = start + limits.wall_seconds
    killed_for: str | None = None
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = TIMEOUT
                break
            for key, _ in sel.select(timeout=min(remaining, 0.25)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fd]
                buf += chunk
                if len(buf) > cap:
                    del buf[cap:]
                    killed_for = OUTPUT_LIMIT
            if killed_for is not None:
                break
    finally:
        sel.close()
    if killed_for is not None:
        kill()
        proc.wait()
    else:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:  # closed its pipes but kept running
            killed_for = TIMEOUT
            kill()
            proc.wait()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), killed_for
