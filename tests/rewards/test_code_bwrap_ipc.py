"""The bubblewrap sandbox bounds memory that lives outside the address space: System V IPC, io_uring, keys.

RLIMIT_AS counts a System V shared memory segment only while it is attached, so a program could
create, fill and detach segment after segment and hold memory the limit never sees (32 x 32 MiB
against memory_bytes = 128 MiB took 1 GiB from the host). The seccomp filter now answers System V
IPC, io_uring and the key syscalls with ENOSYS. Needs bubblewrap: skipped without it, except when CI
is set, where these tests fail instead.
"""

from __future__ import annotations

import errno
import json
import platform
import sys
import threading
import time
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox relies on Linux namespaces", allow_module_level=True)

from rlvr_core.rewards.sandbox import OK, SandboxLimits, run_python  # noqa: E402
from rlvr_core.rewards.sandbox.seccomp import _seccomp_filter  # noqa: E402

MiB = 2**20
ROUNDS, SEGMENT = 32, 32 * MiB  # 1 GiB in all, were every round to succeed
# System V segments are shmem pages: the host's Shmem rises by what they hold (1 GiB before the filter)
# and barely moves otherwise, so it bears a tight bound: memory_bytes plus the two tmpfs (160 MiB), with room.
SHMEM_BOUND = 256 * MiB
# MemAvailable fell 1.1-1.4 GiB before the filter, but on a shared machine it also moves with other
# processes (up to 700 MiB during one 4 s run where this was written): half the attack's 1 GiB, and a
# few attempts, of which one must stay under it.
AVAILABLE_BOUND = 512 * MiB
ATTEMPTS = 4
# io_uring_setup, keyctl, add_key, request_key: arch/x86/entry/syscalls/syscall_64.tbl and, for aarch64,
# include/uapi/asm-generic/unistd.h (test_code_seccomp.py checks the filter's own table against the headers)
SYSCALLS = {"x86_64": (425, 250, 248, 249), "aarch64": (425, 219, 217, 218)}


ATTACK = r"""
import ctypes, json, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
libc.syscall.restype = ctypes.c_long
IPC_PRIVATE, IPC_CREAT = 0, 0o1000
ROUNDS, SEGMENT, PAUSE = {rounds}, {segment}, {pause}
NR_IO_URING_SETUP, NR_KEYCTL, NR_ADD_KEY, NR_REQUEST_KEY = {numbers}

def outcome(ret):
    return 0 if ret != -1 else ctypes.get_errno()

held, shm_errnos = 0, []
for _ in range(ROUNDS):
    ctypes.set_errno(0)
    sid = libc.shmget(IPC_PRIVATE, SEGMENT, IPC_CREAT | 0o600)
    if sid == -1:
        shm_errnos.append(ctypes.get_errno())
        continue
    addr = libc.shmat(sid, None, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        shm_errnos.append(ctypes.get_errno())
        continue
    ctypes.memset(addr, 0x5A, SEGMENT)  # touch every page: the segment now holds SEGMENT bytes
    libc.shmdt(addr)  # out of the address space (RLIMIT_AS no longer counts it), still held
    held += SEGMENT
params = ctypes.create_string_buffer(120)  # struct io_uring_params
found = {{
    "held": held,
    "shmget": sorted(set(shm_errnos)),
    "semget": outcome(libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)),
    "msgget": outcome(libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)),
    "io_uring_setup": outcome(libc.syscall(NR_IO_URING_SETUP, 1, params)),
    # KEYCTL_JOIN_SESSION_KEYRING (1) with no name: a new session keyring
    "keyctl": outcome(libc.syscall(NR_KEYCTL, ctypes.c_long(1), ctypes.c_void_p(0))),
    # a "user" key in the process keyring (KEY_SPEC_PROCESS_KEYRING = -2)
    "add_key": outcome(libc.syscall(NR_ADD_KEY, b"user", b"k", b"v", ctypes.c_size_t(1), ctypes.c_long(-2))),
    "request_key": outcome(libc.syscall(NR_REQUEST_KEY, b"user", b"k", ctypes.c_void_p(0), ctypes.c_long(0))),
}}
print(json.dumps(found), flush=True)
time.sleep(PAUSE)  # hold whatever was taken while the host measures
"""


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        out[name] = int(value.split()[0]) * 1024
    return out


def _run_measured(code: str, limits: SandboxLimits) -> tuple:
    """Run ``code`` in a thread; (result, largest fall of MemAvailable, largest rise of Shmem) while it ran."""
    before = _meminfo()
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(result=run_python(code, "", limits)))
    low_available, high_shmem = before["MemAvailable"], before["Shmem"]
    worker.start()
    while worker.is_alive():
        now = _meminfo()
        low_available = min(low_available, now["MemAvailable"])
        high_shmem = max(high_shmem, now["Shmem"])
        time.sleep(0.02)
    worker.join()
    return box["result"], before["MemAvailable"] - low_available, high_shmem - before["Shmem"]


@pytest.mark.usefixtures("bwrap_sandbox", "private_tmp")
@pytest.mark.skipif(_seccomp_filter() is None, reason="no seccomp table for this machine")
@pytest.mark.parametrize("allow_processes", [False, True])
def test_system_v_shared_memory_cannot_hold_memory_outside_the_limit(allow_processes: bool) -> None:
    """32 rounds of shmget/shmat/memset/shmdt (32 MiB each) under memory_bytes = 128 MiB hold nothing."""
    numbers = SYSCALLS[platform.machine()]
    code = ATTACK.format(rounds=ROUNDS, segment=SEGMENT, pause=2.0, numbers=numbers)
    limits = SandboxLimits(cpu_seconds=10, wall_seconds=40, memory_bytes=128 * MiB, allow_processes=allow_processes)
    falls = []
    for _ in range(ATTEMPTS):
        result, fell, rose = _run_measured(code, limits)
        assert result.status == OK, result.stderr[-800:]
        found = json.loads(result.stdout)
        figures = f"MemAvailable fell {fell / MiB:.0f} MiB, Shmem rose {rose / MiB:.0f} MiB, program saw {found}"
        assert found["held"] == 0, figures
        assert rose < SHMEM_BOUND, figures  # the attack would take ROUNDS * SEGMENT = 1 GiB
        assert found["shmget"] == [errno.ENOSYS], figures
        for call in ("semget", "msgget", "io_uring_setup", "keyctl", "add_key", "request_key"):
            assert found[call] == errno.ENOSYS, (call, figures)
        falls.append(fell)
        if fell < AVAILABLE_BOUND:
            break
    # the attack takes its 1 GiB in every attempt; other processes' drift rarely lasts through all of them
    assert min(falls) < AVAILABLE_BOUND, [f"{fell / MiB:.0f} MiB" for fell in falls]
