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
   its own and mount file systems there. System V IPC (``shm*``, ``sem*``,
   ``msg*``), ``memfd_create`` and ``memfd_secret``, io_uring and the kernel key
   calls (``keyctl``, ``add_key``, ``request_key``) answer ENOSYS, as on a kernel
   built without them: a detached System V segment is outside the address space,
   so ``RLIMIT_AS`` never counted it (32 x 32 MiB held 1 GiB under a 128 MiB
   limit), and a memfd lies on no mount of the sandbox, bounded only per file by
   ``RLIMIT_FSIZE`` (8 x 32 MiB held 256 MiB). Every file the program can still
   write, ``O_TMPFILE`` ones included, lies on its two tmpfs mounts. Where there
   is no filter, segments and memfds still escape ``memory_bytes`` while the run
   lasts (memfds up to 3 x ``max_open_files`` x ``max_file_bytes``, counting
   those in flight in a socket's queue), and go when it ends. Unless
   ``allow_processes`` is set, it
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

It has no seccomp filter and no IPC namespace: memory outside the address space
(System V segments, which stay in the host's IPC namespace after the run unless
``kernel.shm_rmid_forced`` is 1) is bounded only by the audit hook's refusal of
``ctypes``; memfds are held to ``max_open_files`` x ``max_file_bytes`` (the hook
refuses the socket pair that could keep more in flight), and the files of its
directory to ``max_file_bytes`` each, not in number, on the host's temporary
file system. The audit hook runs inside the program's own interpreter and is not a security
boundary: it can be bypassed from Python (a subinterpreter's ``run_string``,
``sqlite3``/``readline`` writing files, ``pidfd_send_signal``, ``ioctl``). Use it
only where bubblewrap cannot run and the completions are trusted. Programs get the
standard library only in both modes.
"""

from __future__ import annotations

import warnings

from rlvr_core.rewards.sandbox.bwrap import _bwrap_plan, _is_root, _run_bwrap
from rlvr_core.rewards.sandbox.inprocess import _run_inprocess
from rlvr_core.rewards.sandbox.limits import (
    BWRAP,
    INPROCESS,
    INSTALL_HINT,
    ISOLATIONS,
    MEMORY_LIMIT,
    OK,
    OUTPUT_LIMIT,
    PASSED,
    PYTHON_MOUNT,
    RUNTIME_ERROR,
    SANDBOX_VIOLATION,
    SANDBOX_WORKDIR,
    TIMEOUT,
    UNPRIVILEGED_GID,
    UNPRIVILEGED_UID,
    VIOLATION_EXIT_CODE,
    VIOLATION_MARKER,
    WRONG_ANSWER,
    RunResult,
    SandboxLimits,
    SandboxUnavailable,
    SandboxWarning,
)

__all__ = [
    "BWRAP", "INPROCESS", "INSTALL_HINT", "ISOLATIONS", "MEMORY_LIMIT", "OK", "OUTPUT_LIMIT", "PASSED",
    "PYTHON_MOUNT", "RUNTIME_ERROR", "SANDBOX_VIOLATION", "SANDBOX_WORKDIR", "TIMEOUT", "UNPRIVILEGED_GID",
    "UNPRIVILEGED_UID", "VIOLATION_EXIT_CODE", "VIOLATION_MARKER", "WRONG_ANSWER", "RunResult", "SandboxLimits",
    "SandboxUnavailable", "SandboxWarning", "check_sandbox", "run_python",
]  # fmt: skip


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
