"""Run one untrusted Python program on one stdin, in a subprocess with limits.

Layers (each one is cheap; together they stop the usual ways generated code goes
wrong, from an infinite loop to a fork bomb):

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
   other processes' ``/proc`` entries (``/proc/<ppid>/environ`` would leak the
   trainer's environment).
5. A new session and process group; on exit, timeout or output overflow the whole
   group is killed with SIGKILL, then any straggler still in the session.
6. Wall-clock timeout, and stdout/stderr read in chunks with a byte cap, so a
   program printing gigabytes is killed after the first ``max_output_bytes``.
7. Where available (probed once, cached): ``unshare -n`` puts the program in an
   empty network namespace, and when running as root the program runs as an
   unprivileged uid (``nobody``), which makes ``RLIMIT_NPROC`` effective and the
   parent's ``/proc`` entries unreadable. Both need the interpreter to be
   executable by that uid (``SandboxLimits.python``); otherwise the run falls back
   to layers 1-6 and ``RunResult.isolation`` says which layers were active. The
   unprivileged uid also needs to reach the temporary directory (``TMPDIR``
   searchable by others, as ``/tmp`` is); where it cannot, that layer is skipped.

The audit hook is defence in depth, not a security boundary against a determined
adversary (CPython documents as much); for untrusted code at scale run the whole
verifier inside a container as well. Programs get the standard library only.
"""

from __future__ import annotations

import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
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


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one program run (one test case).

    cpu_seconds:      CPU time (RLIMIT_CPU, rounded up to whole seconds)
    wall_seconds:     wall-clock limit; the process group is killed after it
    memory_bytes:     address space (RLIMIT_AS); the interpreter itself needs ~30 MB
    max_output_bytes: cap on stdout and on stderr each; the run is killed beyond it
    max_file_bytes:   largest file the program may write (RLIMIT_FSIZE)
    max_open_files:   RLIMIT_NOFILE
    max_processes:    RLIMIT_NPROC, applied only when privileges were dropped
                      (root ignores it, and for an ordinary user it counts all of
                      that user's processes)
    network_namespace: run under ``unshare -n`` when that works
    drop_privileges:  when root, run as uid/gid 65534 when that uid can execute
                      ``python``
    python:           interpreter for the program (default: this interpreter)
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * 2**20
    max_output_bytes: int = 2**20
    max_file_bytes: int = 2**20
    max_open_files: int = 64
    max_processes: int = 64
    network_namespace: bool = True
    drop_privileges: bool = True
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        require(self.cpu_seconds > 0, "SandboxLimits.cpu_seconds", f"must be > 0, got {self.cpu_seconds}")
        require(self.wall_seconds > 0, "SandboxLimits.wall_seconds", f"must be > 0, got {self.wall_seconds}")
        require(
            self.memory_bytes >= 64 * 2**20,
            "SandboxLimits.memory_bytes",
            f"must be >= 64 MiB (the interpreter needs ~30 MB), got {self.memory_bytes}",
        )
        for name in ("max_output_bytes", "max_file_bytes", "max_open_files", "max_processes"):
            value = getattr(self, name)
            require(value >= 1, f"SandboxLimits.{name}", f"must be >= 1, got {value}")
        require(self.max_open_files >= 16, "SandboxLimits.max_open_files", "must be >= 16 (stdio and imports)")
        require(bool(self.python), "SandboxLimits.python", "must name an interpreter")


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run.

    status:    OK, TIMEOUT, MEMORY_LIMIT, OUTPUT_LIMIT, RUNTIME_ERROR or SANDBOX_VIOLATION
    returncode: process exit code (negative: killed by that signal); None if never started
    stdout:    captured stdout (at most max_output_bytes, decoded as UTF-8 with replacement)
    stderr:    captured stderr, last 8 KiB
    wall_seconds: measured wall time of the run
    pid:       process id (also its process group and session id)
    isolation: the optional layers that were active: "netns", "unprivileged"
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_seconds: float
    pid: int | None
    isolation: tuple[str, ...]


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
    _write, _exit, _lstat, _stat, _readlink, _getcwd = _os.write, _os._exit, _os.lstat, _os.stat, _os.readlink, _os.getcwd
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
            writing = bool(flags & _WFLAGS) or (mode is not None and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
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


def _classify(returncode: int | None, stderr: bytes, killed_for: str | None) -> str:
    if killed_for is not None:
        return killed_for
    if returncode == 0:
        return OK
    if returncode == VIOLATION_EXIT_CODE and VIOLATION_MARKER in stderr:
        return SANDBOX_VIOLATION
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return TIMEOUT  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one
    if b"MemoryError" in stderr[-4096:]:
        return MEMORY_LIMIT
    return RUNTIME_ERROR


def run_python(code: str, stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
    """Run ``code`` as ``__main__`` with ``stdin`` as its standard input, under ``limits``.

    Never raises for anything the program does; raises ``OSError`` only when the
    sandbox itself cannot start (no temporary directory, interpreter missing).
    """
    limits = limits or SandboxLimits()
    prefix, layers = _probe(limits.python, limits.network_namespace, limits.drop_privileges)
    workdir = tempfile.mkdtemp(prefix="rlvr_sandbox_")
    if "unprivileged" in layers and not _others_can_enter(os.path.dirname(workdir)):
        # the unprivileged uid could not reach its own working directory: run without that layer
        prefix, layers = _probe(limits.python, limits.network_namespace, False)
    unprivileged = "unprivileged" in layers
    proc: subprocess.Popen[bytes] | None = None
    try:
        program = os.path.join(workdir, "main.py")
        with open(program, "w", encoding="utf-8") as f:
            f.write(code)
        if unprivileged:
            os.chown(workdir, UNPRIVILEGED_UID, UNPRIVILEGED_GID)
            os.chown(program, UNPRIVILEGED_UID, UNPRIVILEGED_GID)
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
            out, err, killed_for = _collect(proc, limits, start)
            wall = time.monotonic() - start
        status = _classify(proc.returncode, err, killed_for)
        return RunResult(
            status=status,
            returncode=proc.returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err[-8192:].decode("utf-8", errors="replace"),
            wall_seconds=wall,
            pid=proc.pid,
            isolation=layers,
        )
    finally:
        if proc is not None:
            _kill_session(proc.pid)
            if proc.returncode is None:
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(proc: subprocess.Popen[bytes], limits: SandboxLimits, start: float) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr in chunks until both close, the deadline passes or a cap is hit.

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
        _kill_session(proc.pid)
        proc.wait()
    else:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:  # closed its pipes but kept running
            killed_for = TIMEOUT
            _kill_session(proc.pid)
            proc.wait()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), killed_for
