"""A process killed with SIGKILL leaves no server behind: flows.common.tie_children (issue 26, break 15)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, TINY

MARK = "RLVR_TEST_LIFELINE_MARK"

# a parent that ties its children, then starts two "servers" the way the project does: one in a session of its
# own with an environment built before (tied() adds the tokens), one that starts a grandchild in a new session
PARENT = r"""
import os, subprocess, sys, time
from flows.common import tie_children, tied
env = dict(os.environ)
tie_children()
sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
a = subprocess.Popen(sleep, env=tied(env), start_new_session=True)
b = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:], "
                      "start_new_session=True); time.sleep(300)", *sleep], start_new_session=True)
print("started", flush=True)
time.sleep(300)
"""


def _marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment has MARK=mark."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{MARK}={mark}".encode() in env and state != "Z":
            pids.append(int(d))
    return pids


def _survivors(mark: str, within_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.3)
    for pid in left:  # do not leave them running after a failure
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def _spawn(cmd: list[str], mark: str, **env: str) -> subprocess.Popen:
    penv = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RLVR_LIFELINE")}
    penv.update({MARK: mark, "PYTHONPATH": str(PROJECT), "DO_NOT_TRACK": "1",
                 "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}, **env)
    return subprocess.Popen(cmd, env=penv, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _printed(proc: subprocess.Popen, line: str) -> bool:
    """Read ``proc``'s output until ``line`` (True) or its end (False)."""
    assert proc.stdout is not None
    return any(out.strip() == line for out in proc.stdout)


def _runs(mark: str, module: str) -> bool:
    """A marked process runs ``module`` (its command line names it)."""
    for pid in _marked(mark):
        try:
            if module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def _sigkill(proc: subprocess.Popen, mark: str) -> None:
    assert proc.poll() is None and len(_marked(mark)) >= 2  # the parent and what it started
    proc.kill()
    proc.wait()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the watchdog reads /proc (Linux)")
def test_children_in_own_sessions_end_with_a_sigkilled_parent() -> None:
    mark = secrets.token_hex(6)
    proc = _spawn([sys.executable, "-c", PARENT], mark)
    assert _printed(proc, "started")
    _sigkill(proc, mark)
    assert _survivors(mark) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the watchdog reads /proc (Linux)")
def test_sigkilled_flow_leaves_no_temporary_prefect_server(tmp_path: Path) -> None:
    # no PREFECT_API_URL: the flow starts prefect's temporary server (uvicorn), then fails on the missing data
    mark = secrets.token_hex(6)
    proc = _spawn([sys.executable, "-m", "flows.report"], mark, PREFECT_HOME=str(tmp_path / ".prefect"),
                  RLVR_ROOT=str(tmp_path), RLVR_PARAMS=str(TINY))
    deadline = time.monotonic() + 720
    while not _runs(mark, "prefect.server.api.server:create_app"):  # prefect's temporary server (uvicorn)
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.3)
    _sigkill(proc, mark)
    assert _survivors(mark) == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the watchdog reads /proc (Linux)")
def test_sigkilled_local_server_leaves_neither_server_nor_command(tmp_path: Path) -> None:
    mark = secrets.token_hex(6)
    cmd = [sys.executable, "-m", "flows.local_server", "--home", str(tmp_path / ".prefect"), "--",
           sys.executable, "-c", "import time; print('started', flush=True); time.sleep(300)"]
    proc = _spawn(cmd, mark)
    assert _printed(proc, "started")  # the command starts once the server answers
    _sigkill(proc, mark)
    assert _survivors(mark) == []
