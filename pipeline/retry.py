"""Which failures a Prefect task retry can fix: the one place the tasks' ``retry_condition_fn`` is decided.

A retry runs the same task on the same inputs, so it helps only a failure that may not happen again (a lost
server, a dropped connection, a killed process; the training task resumes from its newest checkpoint).
``not_retried(exc)`` is the pure part: the reason a retry cannot help, or None. Not retried:

- an out-of-memory of any shape (``rlvr_core.errors.is_out_of_memory``: MemoryError, CUDA OOM, OSError ENOMEM,
  "std::bad_alloc", CUBLAS_STATUS_ALLOC_FAILED, wrapped or in an ExceptionGroup): the same work needs the
  same memory; the reason names what to lower;
- a full disk or a spent quota (ENOSPC, EDQUOT, ``is_disk_full``): a retry would fill it again;
- a deterministic refusal: ConfigError (CheckpointError, DataError, RunFolderBusy, ... are ConfigErrors),
  PolicyLoadError, TrainingStopped, SandboxUnavailable, UnknownNameError, also as a member of an ExceptionGroup.

``retry_if_transient(oom_hint)`` makes the Prefect condition: it logs the reason once and says no retry.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from rlvr_core.errors import (
    ConfigError,
    RewardError,
    TrainingStopped,
    is_disk_full,
    is_out_of_memory,
    related_exceptions,
)
from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.registry import UnknownNameError
from rlvr_core.rewards.sandbox.limits import SandboxUnavailable

log = logging.getLogger(__name__)

# Refusals that come back the same on every try: bad settings, data, checkpoints or policy folders, a run
# stopped on purpose, a machine without the sandbox, an unknown registry name, a reward outside the allocators'
# contract (the verifier returns the same reward for the same completion).
DETERMINISTIC: tuple[type[BaseException], ...] = (ConfigError, PolicyLoadError, TrainingStopped, SandboxUnavailable,
                                                  UnknownNameError, RewardError)
OOM_HINT = "the batch or sequence sizes the error names"


def _group_members(exc: BaseException) -> list[BaseException]:
    """``exc`` and, for an ExceptionGroup, its members at any depth (not the cause/context chain: a wrapper
    that chose to raise something else decides what the failure is)."""
    out, todo = [], [exc]
    while todo and len(out) < 256:
        e = todo.pop(0)
        out.append(e)
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return out


def _brief(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {str(exc)[:300]}"


def not_retried(exc: BaseException, oom_hint: str = OOM_HINT) -> str | None:
    """Why a retry of the same work cannot help ``exc`` (naming what to change), or None when it may."""
    if is_out_of_memory(exc):
        return (f"out of memory ({_brief(exc)}): the same work needs the same memory, so a retry would fail "
                f"again; lower {oom_hint}, or run on a machine with more memory")
    if is_disk_full(exc):
        full = next((e for e in related_exceptions(exc) if isinstance(e, OSError) and e.filename), None)
        where = f" on the disk holding {full.filename}" if full is not None else ""
        return (f"disk full or quota spent ({_brief(exc)}): a retry would fill it again; free space{where} "
                "(or point the run elsewhere), then run again")
    for e in _group_members(exc):
        if isinstance(e, DETERMINISTIC):
            return f"{_brief(e)}: the same inputs give the same refusal; fix what it names, then run again"
    return None


def failure_of(state: Any) -> BaseException | None:
    """The exception of a failed Prefect state (``Failed(data=exc)``, or what its result raises), or None."""
    data = getattr(state, "data", None)
    if isinstance(data, BaseException):
        return data
    try:
        res = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - a result that cannot be read: unknown, the retry policy decides
        return None
    return res if isinstance(res, BaseException) else None


def retry_if_transient(oom_hint: str = OOM_HINT) -> Callable[[Any, Any, Any], bool]:
    """A Prefect ``retry_condition_fn``: True (go on to the task's ``retries``) unless ``not_retried`` gives a
    reason, which is logged; ``oom_hint`` names the task's settings that lower its memory."""

    def should_retry(task: Any, task_run: Any, state: Any) -> bool:
        exc = failure_of(state)
        reason = None if exc is None else not_retried(exc, oom_hint)
        if reason is None:
            return True
        name = getattr(task, "name", "task")
        try:
            from prefect import get_run_logger

            get_run_logger().error("%s: not retried: %s", name, reason)
        except Exception:  # noqa: BLE001 - outside a run context (a test calling the condition)
            log.error("%s: not retried: %s", name, reason)
        return False

    return should_retry
