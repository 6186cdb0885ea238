"""The in-process runner (explicit opt-in): an audit-hook prelude, rlimits, a private temporary directory,
and ``unshare -n`` and an unprivileged uid where they work (see the package docstring)."""

from __future__ import annotations

import math
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from functools import lru_cache
from importlib import resources

from rlvr_core.rewards.sandbox.collect import _classify, _collect
from rlvr_core.rewards.sandbox.limits import (
    INPROCESS,
    UNPRIVILEGED_GID,
    UNPRIVILEGED_UID,
    RunResult,
    SandboxLimits,
)


@lru_cache(maxsize=1)
def _prelude() -> str:
    """The child's prelude, the text of ``prelude.py`` in this package, run with ``python -c``.

    It sets the limits, installs the audit hook, then runs the program as ``__main__``;
    its argv: [-c, workdir, cpu_seconds, "RLIMIT_X=value,...", program_path].
    """
    return resources.files(__package__).joinpath("prelude.py").read_text(encoding="utf-8")


@lru_cache(maxsize=8)
def _probe(python: str, netns: bool, drop: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Which optional isolation layers work here: (command prefix, active layer names).

    Probed once per (interpreter, wish) by running ``python -c pass`` under them.
    """
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    unshare = shutil.which("unshare")
    candidates: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    if netns and unshare:
        if drop and is_root:
            candidates.append(
                (
                    (unshare, "-n", "-S", str(UNPRIVILEGED_UID), "-G", str(UNPRIVILEGED_GID), "--"),
                    ("netns", "unprivileged"),
                )
            )
        candidates.append(((unshare, "-n", "--"), ("netns",)))
    for prefix, layers in candidates:
        try:
            done = subprocess.run(
                [*prefix, python, "-S", "-c", "pass"],
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return prefix, layers
    if drop and is_root and _can_run_unprivileged(python):
        return (), ("unprivileged",)
    return (), ()


def _can_run_unprivileged(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-S", "-c", "pass"],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            user=UNPRIVILEGED_UID,
            group=UNPRIVILEGED_GID,
            extra_groups=[],
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _others_can_enter(path: str) -> bool:
    """True when every directory from / down to ``path`` is searchable by other users."""
    path = os.path.realpath(path)
    while True:
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def _kill_session(pid: int) -> None:
    """SIGKILL the process group ``pid`` and any process still in session ``pid``."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for _ in range(3):
        stragglers = _session_members(pid)
        if not stragglers:
            return
        for other in stragglers:
            try:
                os.kill(other, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _session_members(sid: int) -> list[int]:
    """Live pids whose session or process group is ``sid`` (Linux /proc; [] elsewhere)."""
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        # fields after the parenthesised command: state ppid pgrp session ...
        rest = raw[raw.rfind(b")") + 2 :].split()
        if len(rest) < 4 or rest[0] == b"Z":
            continue
        if int(rest[2]) == sid or int(rest[3]) == sid:
            found.append(int(entry))
    return found


def _write_program(workdir: str, code: str, unprivileged: bool) -> str:
    """Write ``code`` to ``workdir/main.py`` (both owned by the unprivileged uid when it runs); its path."""
    program = os.path.join(workdir, "main.py")
    with open(program, "w", encoding="utf-8") as f:
        f.write(code)
    if unprivileged:
        os.chown(workdir, UNPRIVILEGED_UID, UNPRIVILEGED_GID)
        os.chown(program, UNPRIVILEGED_UID, UNPRIVILEGED_GID)
    return program


def _inprocess_command(
    prefix: tuple[str, ...], limits: SandboxLimits, workdir: str, program: str, unprivileged: bool
) -> tuple[list[str], dict[str, str], dict]:
    """The interpreter's command line (prelude, limits, program), its environment and Popen's uid arguments."""
    cpu = max(1, math.ceil(limits.cpu_seconds))
    rlimits = [
        ("RLIMIT_AS", int(limits.memory_bytes)),
        ("RLIMIT_FSIZE", int(limits.max_file_bytes)),
        ("RLIMIT_NOFILE", int(limits.max_open_files)),
        ("RLIMIT_CORE", 0),
    ]
    if unprivileged:
        rlimits.append(("RLIMIT_NPROC", int(limits.max_processes)))
    rlimit_arg = ",".join(f"{name}={value}" for name, value in rlimits)
    argv = [*prefix, limits.python, "-S", "-s", "-B", "-P", "-c", _prelude(), workdir, str(cpu), rlimit_arg, program]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }
    extra: dict = {}
    if unprivileged and not prefix:
        extra = {"user": UNPRIVILEGED_UID, "group": UNPRIVILEGED_GID, "extra_groups": []}
    return argv, env, extra


def _end_inprocess(proc: subprocess.Popen[bytes] | None, workdir: str) -> None:
    """Kill what is left of the run's session, reap it, close its pipes and remove its working directory."""
    if proc is not None:
        _kill_session(proc.pid)
        if proc.returncode is None:
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    shutil.rmtree(workdir, ignore_errors=True)


def _run_inprocess(code: str, stdin: str, limits: SandboxLimits) -> RunResult:
    """The in-process sandbox (audit hook, rlimits, optional ``unshare -n`` and uid drop)."""
    prefix, layers = _probe(limits.python, limits.network_namespace, limits.drop_privileges)
    workdir = tempfile.mkdtemp(prefix="rlvr_sandbox_")
    if "unprivileged" in layers and not _others_can_enter(os.path.dirname(workdir)):
        # the unprivileged uid could not reach its own working directory: run without that layer
        prefix, layers = _probe(limits.python, limits.network_namespace, False)
    unprivileged = "unprivileged" in layers
    proc: subprocess.Popen[bytes] | None = None
    try:
        program = _write_program(workdir, code, unprivileged)
        argv, env, extra = _inprocess_command(prefix, limits, workdir, program, unprivileged)
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            start = time.monotonic()
            proc = subprocess.Popen(
                argv,
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=env,
                close_fds=True,
                start_new_session=True,
                **extra,
            )
            out, err, killed_for = _collect(proc, limits, start, lambda: _kill_session(proc.pid))
            wall = time.monotonic() - start
        status = _classify(proc.returncode, err, killed_for)
        return RunResult(
            status=status,
            returncode=proc.returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err[-8192:].decode("utf-8", errors="replace"),
            wall_seconds=wall,
            pid=proc.pid,
            isolation=(INPROCESS, *layers),
        )
    finally:
        _end_inprocess(proc, workdir)
