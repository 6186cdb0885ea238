"""The sandbox's vocabulary: statuses of a run, its limits (``SandboxLimits``), its outcome (``RunResult``)
and the errors and warnings it raises. Shared by the bubblewrap and the in-process runner."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

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
