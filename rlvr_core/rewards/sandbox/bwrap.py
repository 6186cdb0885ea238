"""The bubblewrap runner: build the sandbox once per interpreter (``_bwrap_plan``), then run each program in it.

What each run gets is described in the package docstring (``rlvr_core.rewards.sandbox``).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from functools import lru_cache

from rlvr_core.rewards.sandbox.collect import _classify, _collect
from rlvr_core.rewards.sandbox.limits import (
    INSTALL_HINT,
    OK,
    PYTHON_MOUNT,
    SANDBOX_WORKDIR,
    UNPRIVILEGED_GID,
    UNPRIVILEGED_UID,
    RunResult,
    SandboxLimits,
    SandboxUnavailable,
)
from rlvr_core.rewards.sandbox.seccomp import _seccomp_filter


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass(frozen=True)
class _BwrapPlan:
    """What does not change between runs: tool paths, mounts, environment, filter."""

    bwrap: str
    drop: tuple[str, ...]  # setpriv command (as root) or () when bwrap maps the uid itself
    prlimit: str
    python: str  # the interpreter's path inside the sandbox
    mounts: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    as_root: bool
    seccomp: bytes | None
    layers: tuple[str, ...]


def _unavailable(why: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"code verifier: {why}. Candidate programs run under bubblewrap; {INSTALL_HINT}. "
        "The weaker in-process sandbox runs only on explicit opt-in: SandboxLimits(isolation='inprocess')."
    )


def _host_tool(name: str) -> str:
    """Absolute path of a host tool that must also exist inside the sandbox (under /usr)."""
    found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise _unavailable(f"`{name}` (util-linux) was not found")
    real = os.path.realpath(found)
    if not real.startswith("/usr/"):
        raise _unavailable(f"`{name}` resolves to {real}, outside /usr, so the sandbox cannot see it")
    return real


def _interpreter(python: str) -> tuple[str, str]:
    """(real executable, real base prefix) of ``python`` (a venv's interpreter gives its base)."""
    try:
        done = subprocess.run(
            [python, "-S", "-c", "import os, sys; print(os.path.realpath(sys.executable)); print(sys.base_prefix)"],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise _unavailable(f"cannot run the interpreter {python!r} ({e})") from e
    lines = done.stdout.decode("utf-8", "replace").splitlines()
    if done.returncode != 0 or len(lines) < 2:
        raise _unavailable(f"cannot run the interpreter {python!r}: {done.stderr[-300:]!r}")
    return lines[0], os.path.realpath(lines[1])


@lru_cache(maxsize=8)
def _bwrap_plan(python: str, as_root: bool) -> _BwrapPlan:
    """Build the sandbox for ``python`` and prove it with a self-test run (cached when it works)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise _unavailable("bubblewrap (`bwrap`) is not installed")
    prlimit = _host_tool("prlimit")
    drop: tuple[str, ...] = ()
    if as_root:
        drop = (
            _host_tool("setpriv"),
            f"--reuid={UNPRIVILEGED_UID}",
            f"--regid={UNPRIVILEGED_GID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        )
    exe, prefix = _interpreter(python)
    mounts: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            mounts += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            mounts += ["--ro-bind", top, top]
    env = [
        ("PATH", "/usr/bin:/bin"),
        ("PYTHONHASHSEED", "0"),
        ("PYTHONIOENCODING", "utf-8"),
        ("LANG", "C.UTF-8"),
        ("HOME", SANDBOX_WORKDIR),
        ("TMPDIR", SANDBOX_WORKDIR),
    ]
    if exe.startswith("/usr/"):
        inside = exe
    elif prefix != "/" and exe.startswith(prefix + "/"):
        inside = PYTHON_MOUNT + exe[len(prefix):]
        mounts += ["--perms", "0755", "--dir", os.path.dirname(PYTHON_MOUNT), "--ro-bind", prefix, PYTHON_MOUNT]
        if os.path.isdir(os.path.join(prefix, "lib")):
            env.append(("LD_LIBRARY_PATH", PYTHON_MOUNT + "/lib"))  # a shared libpython's RUNPATH names the host path
    else:
        raise _unavailable(f"the interpreter {exe} lies neither under /usr nor under its prefix {prefix}")
    mounts += ["--proc", "/proc", "--perms", "0755", "--dir", "/dev"]
    for dev in ("/dev/null", "/dev/zero", "/dev/urandom"):
        if os.path.exists(dev):
            mounts += ["--dev-bind", dev, dev]
    seccomp = _seccomp_filter()
    layers = ("bwrap", "userns", "pidns", "netns", "ipcns", "utsns", "mountns", "unprivileged") + (
        ("seccomp",) if seccomp is not None else ()
    )
    plan = _BwrapPlan(bwrap, drop, prlimit, inside, tuple(mounts), tuple(env), as_root, seccomp, layers)
    probe = "import os, sys\nprint(os.getuid(), os.getgid(), sys.version_info[0])\n"
    result = _bwrap_execute(plan, probe, "", SandboxLimits(python=python, wall_seconds=30, cpu_seconds=10))
    if result.status != OK or result.stdout.split() != [str(UNPRIVILEGED_UID), str(UNPRIVILEGED_GID), "3"]:
        raise _unavailable(
            f"bubblewrap is installed ({bwrap}) but its self-test failed (status {result.status}, "
            f"exit code {result.returncode}, stdout {result.stdout[-200:]!r}, stderr {result.stderr[-600:]!r}); "
            "it needs user namespaces (kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)"
        )
    return plan


def _run_bwrap(code: str, stdin: str, limits: SandboxLimits) -> RunResult:
    return _bwrap_execute(_bwrap_plan(limits.python, _is_root()), code, stdin, limits)


def _sealed_memfd(name: str, data: bytes) -> int:
    """A read-only-by-seal anonymous file holding ``data``, positioned at its start."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_info(fd: int, deadline: float) -> dict:
    """bwrap's --info-fd report (``child-pid``, namespace inodes); {} if bwrap ended without one."""
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, min(0.25, deadline - time.monotonic()))):
                continue
            chunk = os.read(fd, 4096)
            buf += chunk
            if not chunk or b"}" in buf:
                break
    try:
        info = json.loads(buf.decode())
        int(info["child-pid"])
        return info
    except (ValueError, KeyError, TypeError):
        return {}


def _open_sandbox_init(info: dict) -> int | None:
    """A pidfd for the sandbox's init, only if that pid is still the init of the run's PID namespace."""
    if not info:
        return None
    child = int(info["child-pid"])
    try:
        pidfd = os.pidfd_open(child)
    except OSError:
        return None
    try:
        same = "pid-namespace" not in info or os.stat(f"/proc/{child}/ns/pid").st_ino == int(info["pid-namespace"])
    except (OSError, ValueError):
        same = False
    if not same:  # it ended and its pid went to another process: never signal that one
        os.close(pidfd)
        return None
    return pidfd


# Runs as uid 65534 after setpriv and prlimit: closes any descriptor bwrap kept open
# (its --userns-block-fd), then runs the program as __main__ from the tmpfs.
_BWRAP_PRELUDE = (
    "import os, sys\n"
    "os.closerange(3, 1 << 16)\n"
    "sys.argv = ['main.py']\n"
    "with open('main.py', 'rb') as _f:\n"
    "    _code = compile(_f.read(), 'main.py', 'exec')\n"
    "del _f\n"
    "exec(_code, {'__name__': '__main__', '__file__': 'main.py', '__builtins__': __builtins__})\n"
)


@dataclass
class _BwrapFds:
    """The parent's descriptors of one bwrap run.

    prog, stdin, seccomp: sealed memfds (program, standard input, filter; seccomp -1 without one)
    info_r, info_w: the pipe bwrap writes its --info-fd report to
    block_r, block_w: the --userns-block-fd pipe (as root only; else -1)
    own: the descriptors to close in the parent once bwrap has them
    """

    prog: int
    stdin: int
    info_r: int
    info_w: int
    block_r: int = -1
    block_w: int = -1
    seccomp: int = -1
    own: list[int] = field(default_factory=list)

    @property
    def passed(self) -> tuple[int, ...]:
        """The descriptors bwrap inherits by number (stdin goes as its standard input)."""
        return tuple(fd for fd in (self.prog, self.info_w, self.block_r, self.seccomp) if fd >= 0)


def _open_bwrap_fds(plan: _BwrapPlan, code: str, stdin: str, seccomp: bytes | None) -> _BwrapFds:
    """Seal the program, its stdin and the filter into memfds and open the info (and block) pipes."""
    own: list[int] = []
    prog_fd = _sealed_memfd("main.py", code.encode("utf-8", "surrogatepass"))
    own.append(prog_fd)
    stdin_fd = _sealed_memfd("stdin", stdin.encode("utf-8", "surrogatepass"))
    own.append(stdin_fd)
    info_r, info_w = os.pipe()
    own.append(info_w)
    fds = _BwrapFds(prog_fd, stdin_fd, info_r, info_w, own=own)
    if plan.as_root:
        fds.block_r, fds.block_w = os.pipe()
        own.append(fds.block_r)
    if seccomp is not None:
        fds.seccomp = _sealed_memfd("seccomp", seccomp)
        own.append(fds.seccomp)
    return fds


def _bwrap_argv(plan: _BwrapPlan, limits: SandboxLimits, fds: _BwrapFds) -> list[str]:
    """bwrap's command line: namespaces, environment, mounts, uid setup and filter, then prlimit and the prelude."""
    cpu = max(1, math.ceil(limits.cpu_seconds))
    nproc = 1 if not limits.allow_processes and plan.seccomp is None else int(limits.max_processes)
    argv = [
        plan.bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "sandbox",
        "--clearenv",
    ]  # fmt: skip
    for key, value in plan.env:
        argv += ["--setenv", key, value]
    argv += list(plan.mounts)
    argv += [
        "--size", str(int(limits.max_disk_bytes)), "--perms", "01777", "--tmpfs", SANDBOX_WORKDIR,
        "--size", str(int(limits.max_disk_bytes)), "--perms", "01777", "--tmpfs", "/dev/shm",  # POSIX semaphores
        "--perms", "0444", "--file", str(fds.prog), SANDBOX_WORKDIR + "/main.py",
        "--chdir", SANDBOX_WORKDIR, "--remount-ro", "/", "--info-fd", str(fds.info_w),
    ]  # fmt: skip
    if plan.as_root:
        argv += ["--userns-block-fd", str(fds.block_r)]
    else:
        argv += ["--uid", str(UNPRIVILEGED_UID), "--gid", str(UNPRIVILEGED_GID),
                 "--disable-userns", "--cap-drop", "ALL"]
    if fds.seccomp >= 0:
        argv += ["--seccomp", str(fds.seccomp)]
    argv += ["--", *plan.drop, plan.prlimit]
    argv += [
        f"--cpu={cpu}:{cpu + 1}", f"--as={int(limits.memory_bytes)}", f"--fsize={int(limits.max_file_bytes)}",
        f"--nofile={int(limits.max_open_files)}", f"--nproc={nproc}", "--core=0",
        "--", plan.python, "-S", "-s", "-B", "-P", "-c", _BWRAP_PRELUDE,
    ]  # fmt: skip
    return argv


def _release_bwrap(plan: _BwrapPlan, fds: _BwrapFds, child: int | None, pidfd: int | None) -> None:
    """As root, map the namespace's ids and give bwrap the go-ahead; then close the block pipe."""
    if plan.as_root and pidfd is not None and child is not None:
        # bwrap waits on the block fd while its namespace has no mapping yet: map uid/gid 0
        # (bwrap's setup) and 65534 (the program, after setpriv) to themselves
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(f"0 0 1\n{UNPRIVILEGED_UID} {UNPRIVILEGED_UID} 1\n")
        os.write(fds.block_w, b"1")
    if fds.block_w >= 0:
        os.close(fds.block_w)  # without the mapping (EOF, no go-ahead) bwrap fails its setup: the program never runs
        fds.block_w = -1


def _close_bwrap_run(proc: subprocess.Popen[bytes] | None, pidfd: int | None, fds: _BwrapFds) -> None:
    """End what is left of the run, close its pipes and every descriptor the parent still holds."""
    if proc is not None:
        _kill_sandbox(proc, pidfd)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    for fd in [*fds.own, fds.info_r, fds.block_w, *([pidfd] if pidfd is not None else [])]:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _bwrap_execute(plan: _BwrapPlan, code: str, stdin: str, limits: SandboxLimits) -> RunResult:
    """Run ``code`` once under ``plan``: start bwrap, find the sandbox's init, collect the output, end the run."""
    single = not limits.allow_processes
    fds = _open_bwrap_fds(plan, code, stdin, _seccomp_filter(single) if plan.seccomp is not None else None)
    argv = _bwrap_argv(plan, limits, fds)
    proc: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    try:
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=fds.stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},  # bwrap's own environment, visible as /proc/1/environ inside
            close_fds=True,
            pass_fds=fds.passed,
            start_new_session=True,
        )
        for fd in fds.own:
            os.close(fd)
        fds.own.clear()
        info = _read_info(fds.info_r, start + max(10.0, limits.wall_seconds))
        child = int(info["child-pid"]) if info else None
        pidfd = _open_sandbox_init(info)  # signals through it cannot reach a recycled pid
        _release_bwrap(plan, fds, child, pidfd)

        def kill() -> None:
            _kill_sandbox(proc, pidfd)

        out, err, killed_for = _collect(proc, limits, start, kill)
        wall = time.monotonic() - start
        returncode = _bwrap_returncode(proc.returncode)
        status = _classify(returncode, err, killed_for, hook=False)
        return RunResult(
            status=status,
            returncode=returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err[-8192:].decode("utf-8", errors="replace"),
            wall_seconds=wall,
            pid=proc.pid,
            isolation=plan.layers + (("single-process",) if single else ()),
            sandbox_pid=child,
        )
    finally:
        _close_bwrap_run(proc, pidfd, fds)


def _kill_sandbox(proc: subprocess.Popen[bytes], pidfd: int | None) -> None:
    """End every process of the run and reap bwrap.

    SIGKILL to the PID namespace's init makes the kernel kill the namespace's other
    processes and wait for them before init's exit reaches bwrap; bwrap then exits.
    """
    if proc.returncode is not None:
        return
    if pidfd is not None:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap's --die-with-parent takes the namespace down
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _bwrap_returncode(code: int | None) -> int | None:
    """bwrap reports a program killed by signal N as exit code 128 + N; give it as -N."""
    if code is not None and 128 < code < 128 + 65:
        return -(code - 128)
    return code
