"""The bubblewrap sandbox's seccomp filter, assembled as classic BPF (no new user namespaces, no foreign
syscall ABI, no System V IPC, memfds, io_uring or kernel keys, optionally no new processes)."""

from __future__ import annotations

import platform
import struct
import sys
from functools import lru_cache

# Calls refused with ENOSYS, as a kernel built without CONFIG_SYSVIPC, CONFIG_MEMFD_CREATE,
# CONFIG_IO_URING or CONFIG_KEYS answers them, so programs and libraries take their usual "not there"
# path (liburing's users fall back to epoll; CPython's standard library uses none of them). EPERM would
# read as a permission problem to report or retry instead.
# System V IPC: a shared memory segment counts against RLIMIT_AS only while attached, so shmget,
# shmat, a write and shmdt, repeated, held memory that memory_bytes never saw (32 x 32 MiB under a
# 128 MiB limit). Semaphore sets and message queues hold kernel memory the same way.
# memfd_create: a memfd is a shmem file on no mount of the sandbox, so no tmpfs size bounds it, only
# RLIMIT_FSIZE per file: 8 memfds of 32 MiB held 256 MiB under a 128 MiB limit, and one sent over a
# socket pair and closed stays held in flight with no descriptor counted. memfd_secret is the same,
# its pages hidden. Every other file the program can write lies on the two tmpfs mounts (O_TMPFILE
# ones too; the root is read-only), which max_disk_bytes bounds.
# io_uring and the key calls are kernel surface no program here needs. x86-64 and aarch64 have no
# ipc(2) multiplexer; the i386, x32 and arm32 ABIs that do are refused as foreign ABIs below.
_DENIED_NAMES = (
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "memfd_create", "memfd_secret",
)  # fmt: skip
# Numbers from the kernel's tables: arch/x86/entry/syscalls/syscall_64.tbl (the headers'
# asm/unistd_64.h) and include/uapi/asm-generic/unistd.h, which aarch64 uses.
_DENIED = {
    "x86_64": {
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semtimedop": 220,
        "semctl": 66, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249,
        "memfd_create": 319, "memfd_secret": 447,
    },
    "aarch64": {
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semtimedop": 192,
        "semctl": 191, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218,
        "memfd_create": 279, "memfd_secret": 447,
    },
}  # fmt: skip


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
        for label in (jt, jf):
            if label and not 0 <= labels[label] - i - 1 <= 255:
                raise ValueError(f"BPF jump to {label!r} from instruction {i} does not fit in 8 bits")
        out += struct.pack("=HBBI", code, labels[jt] - i - 1 if jt else 0, labels[jf] - i - 1 if jf else 0, k)
        i += 1
    return bytes(out)


@lru_cache(maxsize=4)
def _seccomp_filter(single_process: bool = False) -> bytes | None:
    """A classic-BPF seccomp program: no new user namespaces, no foreign syscall ABI, and ENOSYS
    for System V IPC, memfds, io_uring and the kernel key calls (``_DENIED``).

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
    machine = platform.machine()
    entry = tables.get(machine)
    if entry is None or machine not in _DENIED or sys.byteorder != "little":
        return None
    arch, nr_clone, nr_unshare, nr_clone3, x32, forks = entry
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    eperm, enosys, eagain = 0x00050000 | 1, 0x00050000 | 38, 0x00050000 | 11  # SECCOMP_RET_ERRNO | errno
    clone_newuser, clone_thread = 0x10000000, 0x00010000
    prog: list = [(ld, 4, None, None), (jeq, arch, None, "kill"), (ld, 0, None, None)]  # arch, then nr
    if x32 is not None:
        prog.append((jge, x32, "kill", None))
    prog += [(jeq, nr, "enosys", None) for nr in sorted(_DENIED[machine].values())]
    prog += [(jeq, nr_clone3, "enosys", None), (jeq, nr_unshare, "unshare", None), (jeq, nr_clone, "clone", None)]
    prog += [(jeq, nr, "eagain", None) for nr in (forks if single_process else ())]
    prog += [(ret, allow, None, None), "unshare", (ld, 16, None, None), (jset, clone_newuser, "eperm", None),
             (ret, allow, None, None), "clone", (ld, 16, None, None), (jset, clone_newuser, "eperm", None)]
    if single_process:
        prog.append((jset, clone_thread, None, "eagain"))
    prog += [(ret, allow, None, None), "eperm", (ret, eperm, None, None), "enosys", (ret, enosys, None, None),
             "eagain", (ret, eagain, None, None), "kill", (ret, kill, None, None)]
    return _assemble(prog)

