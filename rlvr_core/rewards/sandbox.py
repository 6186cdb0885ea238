"""Run one untrusted Python program on one stdin, contained, under limits.

Two isolation modes, chosen by ``SandboxLimits.isolation``:

``"bwrap"`` (the default): bubblewrap, the sandbox Flatpak uses (Debian/Ubuntu
package ``bubblewrap``). Each run gets

1. new user, PID, network, IPC, UTS and mount namespaces (and a cgroup namespace
   where the kernel has them), ``--die-with-parent`` and ``--new-session``;
2. a read-only root that holds only ``/usr``, the interpreter's prefix (read-only,
   at ``/opt/rlvr-python`` when it lies outside ``/usr``), a ``/proc`` of its own
   PID namespace, ``/dev/null``, ``/dev/zero``, ``/dev/urandom``, a private
   size-limited tmpfs ``/dev/shm`` (multiprocessing's semaphores) and, as working
   directory, a private size-limited tmpfs ``/tmp`` holding ``main.py``. Nothing of
   ``/root``, ``/home``, ``/etc``, the verifier's cwd, fds or environment is
   visible; the environment is ``PATH``, ``PYTHONHASHSEED``, ``PYTHONIOENCODING``,
   ``LANG``, ``HOME``, ``TMPDIR`` (and ``LD_LIBRARY_PATH`` for a relocated prefix);
3. uid/gid 65534 inside the namespace, with no capabilities, an empty bounding set
   and ``no_new_privs``. As root, the namespace maps uids 0 and 65534 to
   themselves and the program drops to 65534 with ``setpriv``, so the host sees
   it as ``nobody`` too (root-only files stay closed, ``RLIMIT_NPROC`` counts);
   as any other user, bwrap maps 65534 to that user;
4. a seccomp filter refusing new user namespaces (``unshare``/``clone`` with
   ``CLONE_NEWUSER``; ``clone3`` answers ENOSYS so libc falls back to ``clone``)
   and foreign syscall ABIs, so the program cannot become root of a namespace of
   its own and mount file systems there; unless ``allow_processes`` is set, it
   also refuses new processes (``fork``, ``vfork``, ``clone`` without
   ``CLONE_THREAD``: EAGAIN) while threads still start, so that ``RLIMIT_AS``
   bounds the run's memory in all, not each of up to ``max_processes`` processes
   (where there is no filter, ``RLIMIT_NPROC`` is 1 instead, threads included);
5. rlimits set by ``prlimit`` before the interpreter starts: ``RLIMIT_CPU``,
   ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_NPROC``,
   ``RLIMIT_CORE=0``;
6. the wall-clock timeout and output caps: on exit, timeout or overflow the
   namespace's init is killed through a pidfd, which ends every process in the
   PID namespace (daemons included) before bwrap is reaped.

No file is written on the host: the program and its stdin travel as sealed
memfds, and the tmpfs goes away with the mount namespace. When bubblewrap is
missing or cannot create namespaces here, ``run_python`` raises
``SandboxUnavailable`` with the fix (``apt-get install bubblewrap``).

``"inprocess"``: the earlier sandbox, only on explicit opt-in, with a
``SandboxWarning``. Its layers:

1. A fresh temporary directory as the working directory, removed afterwards.
2. A minimal environment (``PATH``, ``PYTHONHASHSEED=0``, ``PYTHONIOENCODING``),
   nothing inherited; the interpreter runs with ``-S -s -B -P`` (no site
   packages, no user site, no bytecode files, no script directory on the path).
3. Resource limits set by a prelude before the program's first line:
   ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
   ``RLIMIT_CORE=0`` and, where privileges were dropped, ``RLIMIT_NPROC``.
4. An audit hook (``sys.addaudithook``, installed by the same prelude) that ends
   the process on: ``os.fork``/``exec``/``spawn``/``system``, ``subprocess``,
   socket creation and connection, ``ctypes``/``cffi`` imports, raising its own
   resource limits, sending signals, writing, creating, renaming, removing,
   linking or changing permissions of paths outside its directory, and reading
   other processes' ``/proc`` entries.
5. A new session and process group; on exit, timeout or output overflow the whole
   group is killed with SIGKILL, then any straggler still in the session.
6. Wall-clock timeout, and stdout/stderr read in chunks with a byte cap.
7. Where available: ``unshare -n`` (empty network namespace) and, as root, an
   unprivileged uid (``nobody``) when that uid can execute ``SandboxLimits.python``
   and reach the temporary directory; ``RunResult.isolation`` says which were on.

The audit hook runs inside the program's own interpreter and is not a security
boundary: it can be bypassed from Python (a subinterpreter's ``run_string``,
``sqlite3``/``readline`` writing files, ``pidfd_send_signal``, ``ioctl``). Use it
only where bubblewrap cannot run and the completions are trusted. Programs get the
standard library only in both modes.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from rlvr_core.errors import require

# Statuses of one run / one test.
PASSED = "passed"
WRONG_ANSWER = "wrong_answer"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
OUTPUT_LIMIT = "output_limit"
RUNTIME_ERROR = "runtime_error"
SANDBOX_VIOLATION = "sandbox_violation"
OK = "ok"  # ran to completion with exit code 0 (output not judged yet)

VIOLATION_EXIT_CODE = 86
VIOLATION_MARKER = b"[sandbox] blocked:"
UNPRIVILEGED_UID = 65534  # nobody
UNPRIVILEGED_GID = 65534  # nogroup

BWRAP = "bwrap"
INPROCESS = "inprocess"
ISOLATIONS = (BWRAP, INPROCESS)
INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` "
    "(Fedora) or `pacman -S bubblewrap` (Arch)"
)
PYTHON_MOUNT = "/opt/rlvr-python"  # where an interpreter prefix outside /usr appears in the sandbox
SANDBOX_WORKDIR = "/tmp"  # the private tmpfs, the program's working directory


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot build the sandbox here; the message says how to fix it."""


class SandboxWarning(UserWarning):
    """The weaker in-process sandbox was chosen explicitly (``isolation="inprocess"``)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one program run (one test case).

    cpu_seconds:      CPU time (RLIMIT_CPU, rounded up to whole seconds)
    wall_seconds:     wall-clock limit; every process of the run is killed after it
    memory_bytes:     address space (RLIMIT_AS); the interpreter itself needs ~30 MB
    max_output_bytes: cap on stdout and on stderr each; the run is killed beyond it
    max_file_bytes:   largest file the program may write (RLIMIT_FSIZE)
    max_disk_bytes:   size of the private tmpfs working directory, and of the
                      private /dev/shm (bwrap only)
    max_open_files:   RLIMIT_NOFILE
    max_processes:    RLIMIT_NPROC (bwrap: counted inside the run's namespace;
                      inprocess: applied only when privileges were dropped)
    allow_processes:  bwrap: let the program start processes (up to max_processes).
                      False (the default): ``fork``, ``vfork`` and ``clone`` without
                      ``CLONE_THREAD`` fail with EAGAIN (seccomp; RLIMIT_NPROC=1 where
                      there is no filter), threads still start, so the run's memory in
                      all is one address space under memory_bytes. True: the run may
                      hold up to max_processes x memory_bytes (docs/design.md §8.3)
    isolation:        "bwrap" (default; see the module docstring) or "inprocess"
                      (the weaker audit-hook sandbox, explicit opt-in, warns)
    network_namespace: inprocess only: run under ``unshare -n`` when that works
                      (bwrap always gives the program an empty network namespace)
    drop_privileges:  inprocess only: when root, run as uid/gid 65534 when that uid
                      can execute ``python`` (bwrap always runs it as 65534)
    python:           interpreter for the program (default: this interpreter; a
                      virtual environment's interpreter runs as its base)
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * 2**20
    max_output_bytes: int = 2**20
    max_file_bytes: int = 2**20
    max_disk_bytes: int = 16 * 2**20
    max_open_files: int = 64
    max_processes: int = 64
    allow_processes: bool = False
    isolation: str = BWRAP
    network_namespace: bool = True
    drop_privileges: bool = True
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        require(
            self.isolation in ISOLATIONS,
            "SandboxLimits.isolation",
            f"must be one of {', '.join(map(repr, ISOLATIONS))}, got {self.isolation!r}",
        )
        require(self.cpu_seconds > 0, "SandboxLimits.cpu_seconds", f"must be > 0, got {self.cpu_seconds}")
        require(
            math.isfinite(self.cpu_seconds), "SandboxLimits.cpu_seconds", f"must be finite, got {self.cpu_seconds}"
        )
        require(self.wall_seconds > 0, "SandboxLimits.wall_seconds", f"must be > 0, got {self.wall_seconds}")
        require(
            math.isfinite(self.wall_seconds), "SandboxLimits.wall_seconds", f"must be finite, got {self.wall_seconds}"
        )
        require(
            self.memory_bytes >= 64 * 2**20,
            "SandboxLimits.memory_bytes",
            f"must be >= 64 MiB (the interpreter needs ~30 MB), got {self.memory_bytes}",
        )
        for name in ("max_output_bytes", "max_file_bytes", "max_open_files", "max_processes"):
            value = getattr(self, name)
            require(value >= 1, f"SandboxLimits.{name}", f"must be >= 1, got {value}")
        require(
            self.max_disk_bytes >= 2**20, "SandboxLimits.max_disk_bytes", f"must be >= 1 MiB, got {self.max_disk_bytes}"
        )
        require(self.max_open_files >= 16, "SandboxLimits.max_open_files", "must be >= 16 (stdio and imports)")
        require(bool(self.python), "SandboxLimits.python", "must name an interpreter")
        if self.isolation == BWRAP:
            for name in ("network_namespace", "drop_privileges"):
                require(
                    getattr(self, name),
                    f"SandboxLimits.{name}",
                    "applies to isolation='inprocess' only; bwrap always runs the program without network "
                    "and as an unprivileged uid",
                )


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run.

    status:    OK, TIMEOUT, MEMORY_LIMIT, OUTPUT_LIMIT, RUNTIME_ERROR or SANDBOX_VIOLATION
               (the last only in the in-process sandbox, whose hook ends the program)
    returncode: the program's exit code (negative: killed by that signal); None if never started
    stdout:    captured stdout (at most max_output_bytes, decoded as UTF-8 with replacement)
    stderr:    captured stderr, last 8 KiB
    wall_seconds: measured wall time of the run
    pid:       host pid of the process started (bwrap, or the interpreter in-process;
               also its process group and session id)
    isolation: the layers that were active: bwrap: "bwrap", "userns", "pidns", "netns",
               "ipcns", "utsns", "mountns", "unprivileged", "seccomp" where the
               filter exists for this machine and "single-process" unless
               allow_processes; inprocess: "inprocess" plus "netns",
               "unprivileged" where they worked
    sandbox_pid: host pid of the PID namespace's init (bwrap only)
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_seconds: float
    pid: int | None
    isolation: tuple[str, ...]
    sandbox_pid: int | None = None


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
    """Run ``code`` as ``__main__`` with ``stdin`` as its standard input, under ``limits``.

    Never raises for anything the program does. Raises ``SandboxUnavailable`` when
    bubblewrap is missing or cannot build the sandbox (the message says how to
    install it), and ``OSError`` when the sandbox itself cannot start.
    """
    limits = limits or SandboxLimits()
    if limits.isolation == INPROCESS:
        warnings.warn(
            "code sandbox: isolation='inprocess' is an audit hook inside the program's own interpreter "
            "and can be bypassed from Python; use the default isolation='bwrap' (" + INSTALL_HINT + ")",
            SandboxWarning,
            stacklevel=2,
        )
        return _run_inprocess(code, stdin, limits)
    return _run_bwrap(code, stdin, limits)


def check_sandbox(limits: SandboxLimits | None = None) -> tuple[str, ...]:
    """Raise ``SandboxUnavailable`` unless ``limits`` can run programs here; return the active layers.

    For bwrap this builds the sandbox once (cached per interpreter) and runs a
    self-test program in it; for the in-process mode it warns and returns.
    """
    limits = limits or SandboxLimits()
    if limits.isolation == INPROCESS:
        warnings.warn(
            "code sandbox: isolation='inprocess' was chosen; it is weaker than bwrap (" + INSTALL_HINT + ")",
            SandboxWarning,
            stacklevel=2,
        )
        return (INPROCESS,)
    return _bwrap_plan(limits.python, _is_root()).layers + (() if limits.allow_processes else ("single-process",))


# ---------------------------------------------------------------------------------- bwrap


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


def _assemble(prog: list) -> bytes:
    """Classic BPF from (code, k, jump-if-true label, jump-if-false label) tuples and label strings."""
    labels: dict[str, int] = {}
    for item in prog:
        if isinstance(item, str):
            labels[item] = sum(1 for x in prog[: prog.index(item)] if not isinstance(x, str))
    out = bytearray()
    i = 0
    for item in prog:
        if isinstance(item, str):
            continue
        code, k, jt, jf = item
        out += struct.pack("=HBBI", code, labels[jt] - i - 1 if jt else 0, labels[jf] - i - 1 if jf else 0, k)
        i += 1
    return bytes(out)


@lru_cache(maxsize=4)
def _seccomp_filter(single_process: bool = False) -> bytes | None:
    """A classic-BPF seccomp program: no new user namespaces, no foreign syscall ABI.

    ``single_process``: also refuse new processes (``fork``, ``vfork``, ``clone`` without
    ``CLONE_THREAD``) with EAGAIN, as RLIMIT_NPROC would; threads (which share the address
    space, so RLIMIT_AS bounds them together) still start. None on machines without a table
    here (the other layers still apply).
    """
    # audit arch, clone, unshare, clone3, x32 ABI bit to refuse (x86_64 only), fork, vfork (none on aarch64)
    tables = {
        "x86_64": (0xC000003E, 56, 272, 435, 0x40000000, (57, 58)),
        "aarch64": (0xC00000B7, 220, 97, 435, None, ()),
    }
    entry = tables.get(platform.machine())
    if entry is None or sys.byteorder != "little":
        return None
    arch, nr_clone, nr_unshare, nr_clone3, x32, forks = entry
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    eperm, enosys, eagain = 0x00050000 | 1, 0x00050000 | 38, 0x00050000 | 11  # SECCOMP_RET_ERRNO | errno
    clone_newuser, clone_thread = 0x10000000, 0x00010000
    prog: list = [(ld, 4, None, None), (jeq, arch, None, "kill"), (ld, 0, None, None)]  # arch, then nr
    if x32 is not None:
        prog.append((jge, x32, "kill", None))
    prog += [(jeq, nr_clone3, "enosys", None), (jeq, nr_unshare, "unshare", None), (jeq, nr_clone, "clone", None)]
    prog += [(jeq, nr, "eagain", None) for nr in (forks if single_process else ())]
    prog += [(ret, allow, None, None), "unshare", (ld, 16, None, None), (jset, clone_newuser, "eperm", None),
             (ret, allow, None, None), "clone", (ld, 16, None, None), (jset, clone_newuser, "eperm", None)]
    if single_process:
        prog.append((jset, clone_thread, None, "eagain"))
    prog += [(ret, allow, None, None), "eperm", (ret, eperm, None, None), "enosys", (ret, enosys, None, None),
             "eagain", (ret, eagain, None, None), "kill", (ret, kill, None, None)]
    return _assemble(prog)


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


# ---------------------------------------------------------------------------------- in-process

# The prelude runs in the child before the program: limits, then the audit hook,
# then the program's code as __main__.
# argv: [-c, workdir, cpu_seconds, "RLIMIT_X=value,...", program_path].
_PRELUDE = r"""
import os as _os, sys as _sys, resource as _resource
_root, _cpu, _limits, _prog = _sys.argv[1:5]
with open(_prog, "rb") as _f:
    _src = _f.read()
for _item in _limits.split(","):
    _name, _value = _item.split("=")
    _resource.setrlimit(getattr(_resource, _name), (int(_value), int(_value)))
_resource.setrlimit(_resource.RLIMIT_CPU, (int(_cpu), int(_cpu) + 1))


def _make_hook(root, pid):
    # Everything the hook uses is bound here, so the program cannot change it by
    # patching builtins or stdlib modules; path resolution uses only C functions.
    _write, _exit, _lstat, _stat, _readlink, _getcwd = (_os.write, _os._exit, _os.lstat, _os.stat, _os.readlink,
                                                        _os.getcwd)
    _type, _issubclass, _len, _str, _bytes, _BaseException = type, issubclass, len, str, bytes, BaseException
    _copy = _str.__getitem__
    _decode = _bytes.decode
    _ALL = slice(None)
    _WFLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND
    _PREFIX = root + "/"
    _DENY = frozenset({
        "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
        "os.startfile", "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg",
        "signal.pthread_kill", "os.setuid", "os.setgid", "os.chroot", "os.mknod",
        "os.setns", "os.unshare", "socket.__new__", "socket.connect", "socket.bind",
        "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.socketpair",
        "resource.setrlimit", "resource.prlimit", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.cdata", "ctypes.call_function", "sys.settrace", "sys.setprofile",
        "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "sys.remote_exec",
    })
    _DENY_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"})
    # event -> (indices of path arguments that must stay inside root, indices of dir_fd arguments)
    _PATH_EVENTS = {
        "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
        "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)), "os.symlink": ((1,), (2,)),
        "os.truncate": ((0,), ()), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)),
        "os.utime": ((0,), (3,)), "os.chflags": ((0,), ()), "os.lchflags": ((0,), ()),
        "os.lchmod": ((0,), ()), "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()),
        "os.mkfifo": ((0,), (2,)), "shutil.rmtree": ((0,), ()),
    }
    _NO_DIR_FD = (None, -1, -100)

    def die(event, detail=""):
        try:
            _write(2, b"\n[sandbox] blocked: " + _str(event).encode() + b" " + _str(detail)[:200].encode() + b"\n")
        finally:
            _exit(86)

    def text(p):
        t = _type(p)
        if t is _str or _issubclass(t, _str):
            return _copy(p, _ALL)  # an exact str with the same characters
        if t is _bytes or _issubclass(t, _bytes):
            return _decode(_bytes(p), "utf-8", "surrogateescape")
        die("path that is not str or bytes", t.__name__)

    def real(p):
        # realpath from C primitives only: absolute, '.', '..' and symlinks resolved
        if not p.startswith("/"):
            p = _getcwd() + "/" + p
        pending = [c for c in p.split("/") if c][::-1]
        out = []
        hops = 0
        while pending:
            c = pending.pop()
            if c == ".":
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            cand = "/" + "/".join(out + [c])
            try:
                mode = _lstat(cand).st_mode
            except OSError:
                out.append(c)
                continue
            if mode & 0o170000 == 0o120000:
                hops += 1
                if hops > 40:
                    die("symlink loop", cand)
                target = _readlink(cand)
                if target.startswith("/"):
                    out = []
                pending.extend([x for x in target.split("/") if x][::-1])
            else:
                out.append(c)
        return "/" + "/".join(out)

    def inside(p):
        return p == root or p.startswith(_PREFIX)

    def other_proc(p):
        if not p.startswith("/proc/"):
            return False
        head = p[6:].split("/", 1)[0]
        return head.isdigit() and head != pid

    def is_dir(p):
        try:
            return _stat(p).st_mode & 0o170000 == 0o040000
        except OSError:
            return False

    def check(event, args):
        if event in _DENY:
            die(event)
        if event == "import":
            name = args[0]
            if _type(name) is _str and name.split(".")[0] in _DENY_IMPORTS:
                die(event, name)
            return
        if event == "open":
            path, mode, flags = args
            if _type(path) is int:
                return
            where = real(text(path))
            writing = bool(flags & _WFLAGS) or (
                mode is not None and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if writing and not inside(where):
                die("open for writing outside the sandbox directory", where)
            if other_proc(where):
                die("open of another process's /proc entry", where)
            if mode is None and not inside(where) and is_dir(where):
                die("os.open of a directory outside the sandbox directory", where)
            return
        spec = _PATH_EVENTS.get(event)
        if spec is not None:
            paths, dir_fds = spec
            for i in dir_fds:
                if i < _len(args) and args[i] not in _NO_DIR_FD:
                    die(event, "dir_fd")
            for i in paths:
                if i < _len(args):
                    if _type(args[i]) is int:
                        die(event, "file descriptor")
                    if not inside(real(text(args[i]))):
                        die(event, args[i])

    busy = [False]

    def hook(event, args):
        if busy[0]:
            return
        busy[0] = True
        try:
            check(event, args)
        except _BaseException as e:  # never let the program see a traceback through the hook
            die("sandbox check failed on " + event, _type(e).__name__)
        finally:
            busy[0] = False

    return hook


_sys.addaudithook(_make_hook(_os.path.realpath(_root), str(_os.getpid())))
del _make_hook, _root, _cpu, _limits, _prog, _item, _name, _value, _f
_sys.argv = ["main.py"]
_code = compile(_src, "main.py", "exec")
del _src
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__, "__file__": "main.py"})
"""


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
    argv = [*prefix, limits.python, "-S", "-s", "-B", "-P", "-c", _PRELUDE, workdir, str(cpu), rlimit_arg, program]
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
