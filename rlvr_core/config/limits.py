"""The ceilings the machine sets on the sizes a params file asks for, stated once (issue #40).

A size that the machine loading the params cannot run is refused when the params load, with the other checks,
before a flow opens an MLflow run; the message names the key, the ceiling and where it comes from. Two
ceilings, both read from the machine each time they are checked:

- CPUs (``usable_cpus``): the CPUs this process may run on (its affinity mask, or the CPU count) and the
  cgroup's CPU quota when that is smaller. ``train.threads`` is at most that: torch starts that many
  threads per parallel region, and more threads than CPUs only contend.
- memory (``host_memory``): the physical memory, or the cgroup's memory limit when that is smaller. A
  size may not ask for more host memory than that in all, counted at a floor so that a refusal is
  certain: every rollout one step generates is ``rollout_bytes(max_new_tokens)`` (its row in the step's
  arrays and each completion token's id and logprob, 8 bytes a number; the engines hand them back as
  Python lists, which take several times that), an evaluation holds ``eval_size * max(1, eval_samples)``
  rollouts, a verifier helper process ``WORKER_BYTES``, and an allocator's other per-step arrays
  (``AllocatorParams.host_items``) 8 bytes an item.

The memory counted is the host's whatever ``train.device`` says: rollouts come back to the host from the
HF engine on a GPU and from the vLLM server alike, so the GPU presets are checked against the machine that
loads them (their sizes need a few hundred MB of it). A machine whose memory cannot be read sets no memory
ceiling.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from rlvr_core.errors import ConfigError

NUMBER_BYTES = 8  # an int64 / float64: the least a number of a rollout takes on the host
ROW_NUMBERS = 4  # a rollout's row: prompt id, reward, token count and its slot in the step's ledger
WORKER_BYTES = 64 * 2**20  # a verifier helper process: a Python interpreter with its verifier (~100 MB measured)
_CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_cpus() -> int | None:
    """CPUs the cgroup's quota allows (rounded up), or None without a quota (cgroup v2, then v1)."""
    v2 = _read(_CGROUP / "cpu.max")
    if v2 and v2.split()[0] != "max" and len(v2.split()) == 2:
        quota, period = (int(x) for x in v2.split())
        return max(1, math.ceil(quota / period))
    quota, period = _read(_CGROUP / "cpu" / "cpu.cfs_quota_us"), _read(_CGROUP / "cpu" / "cpu.cfs_period_us")
    if quota and period and quota.lstrip("-").isdigit() and int(quota) > 0 and period.isdigit() and int(period) > 0:
        return max(1, math.ceil(int(quota) / int(period)))
    return None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (else the CPU count), within the cgroup's quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    return max(1, min(n, quota) if quota else n)


def host_memory() -> int | None:
    """Bytes of memory this process may use: the physical memory, or the cgroup's limit when smaller; None
    where neither can be read."""
    found = []
    try:
        found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in (_CGROUP / "memory.max", _CGROUP / "memory" / "memory.limit_in_bytes"):
        text = _read(path)
        if text and text.isdigit() and 0 < int(text) < 2**60:  # v1 writes "no limit" as ~2**63
            found.append(int(text))
    return min(found) if found else None


def rollout_bytes(max_new_tokens: int) -> int:
    """The least host memory one rollout of up to ``max_new_tokens`` completion tokens takes."""
    return NUMBER_BYTES * (ROW_NUMBERS + 2 * max_new_tokens)


def size(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB: "149.0 GiB", "320.0 MiB"."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_cpus(key: str, value: int) -> None:
    """ConfigError unless ``value`` (a thread count) is at most ``usable_cpus()``."""
    cpus = usable_cpus()
    if value > cpus:
        raise ConfigError(f"{key} = {value}: at most {cpus} on this machine (the CPUs this process may use); "
                          "more threads than CPUs only contend")


def check_memory(key: str, value: int, needs: int, what: str) -> None:
    """ConfigError unless ``needs`` bytes (what ``key = value`` asks for: ``what``) fit ``host_memory()``."""
    memory = host_memory()
    if memory is not None and needs > memory:
        raise ConfigError(f"{key} = {value}: {what} need at least ~{size(needs)}, and this machine has "
                          f"{size(memory)} of memory; lower it")
