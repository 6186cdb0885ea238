"""Which failures are out-of-memory, a full disk, or a deterministic refusal (rlvr_core.errors, pipeline.retry),
in every shape a run meets them: real ones made here (MemoryError, mmap's ENOMEM, /dev/full's ENOSPC) and the
texts PyTorch and the CUDA libraries raise, bare, chained and inside ExceptionGroups (issue 41)."""

from __future__ import annotations

import errno
import logging
import mmap
import os
from typing import Any

import pytest
import torch

from pipeline.retry import not_retried, retry_if_transient
from rlvr_core.allocation.loop import EngineError, generate_with_retry
from rlvr_core.checkpoint import CheckpointError
from rlvr_core.errors import ConfigError, OutOfMemory, RewardError, TrainingStopped, is_disk_full, is_out_of_memory
from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.rollout.base import RolloutEngine


def real_memory_error() -> MemoryError:
    try:
        bytearray(1 << 62)  # 4 EiB: malloc refuses it at once, whatever the machine's overcommit setting
    except MemoryError as e:
        return e
    raise AssertionError("a 4 EiB allocation succeeded")


def real_enomem() -> OSError:
    try:
        mmap.mmap(-1, 1 << 60)  # 1 EiB anonymous map: ENOMEM from the kernel
    except OSError as e:
        return e
    raise AssertionError("a 1 EiB mmap succeeded")


def real_enospc() -> OSError:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    try:
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"x")
    except OSError as e:
        return e
    raise AssertionError("/dev/full took a write")


def chained(inner: BaseException, how: str = "cause") -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            if how == "cause":
                raise RuntimeError("worker failed") from e
            raise RuntimeError("worker failed")  # noqa: B904 - the implicit __context__ is the point
    except RuntimeError as outer:
        return outer


OOMS = {
    "MemoryError (real)": real_memory_error,
    "OSError ENOMEM (real mmap)": real_enomem,
    "OSError(ENOMEM)": lambda: OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)),
    "std::bad_alloc": lambda: RuntimeError("std::bad_alloc"),
    "CUBLAS_STATUS_ALLOC_FAILED": lambda: RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "CUDNN_STATUS_ALLOC_FAILED": lambda: RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "torch CUDA OOM": lambda: torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
        "1.2 GiB is free."),
    "CUDA error: out of memory": lambda: RuntimeError("CUDA error: out of memory"),
    "ExceptionGroup[MemoryError]": lambda: ExceptionGroup("verifiers", [ValueError("bad row"), MemoryError()]),
    "nested group": lambda: ExceptionGroup("outer", [ExceptionGroup("inner", [RuntimeError("std::bad_alloc")])]),
    "group member's cause": lambda: ExceptionGroup("workers", [chained(OSError(errno.ENOMEM, "no memory"))]),
    "ENOMEM as a cause": lambda: chained(OSError(errno.ENOMEM, "Cannot allocate memory")),
    "bad_alloc as a context": lambda: chained(RuntimeError("std::bad_alloc"), "context"),
}
NOT_OOMS = {
    "connection reset": lambda: RuntimeError("connection reset by peer"),
    "OSError EIO": lambda: OSError(errno.EIO, "I/O error"),
    "ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "a ValueError naming memory": lambda: ValueError("train.max_memory: out of memory is not a number"),
    "group without one": lambda: ExceptionGroup("g", [ValueError("a"), ConnectionError("b")]),
}


@pytest.mark.parametrize("make", OOMS.values(), ids=OOMS.keys())
def test_every_shape_of_out_of_memory_is_recognised(make: Any) -> None:
    exc = make()
    assert is_out_of_memory(exc)
    reason = not_retried(exc, "train.micro_batch")
    assert reason is not None and reason.startswith("out of memory (") and "lower train.micro_batch" in reason


@pytest.mark.parametrize("make", NOT_OOMS.values(), ids=NOT_OOMS.keys())
def test_other_failures_are_not_out_of_memory(make: Any) -> None:
    assert not is_out_of_memory(make())


def test_a_group_cycle_ends() -> None:
    a = RuntimeError("a")
    g = ExceptionGroup("g", [a])
    a.__cause__ = g
    assert not is_out_of_memory(g) and not_retried(g) is None


@pytest.mark.parametrize("make", [real_enospc, lambda: OSError(errno.EDQUOT, "Disk quota exceeded", "/runs/x"),
                                  lambda: RuntimeError("PytorchStreamWriter: No space left on device"),
                                  lambda: OSError(errno.ENOSPC, "No space left on device while writing "
                                                  "runs/x/checkpoints/step_2", "runs/x/checkpoints/.tmp/state.json"),
                                  lambda: chained(OSError(errno.ENOSPC, "No space left on device", "/runs/a"))],
                         ids=["ENOSPC (real /dev/full)", "EDQUOT", "torch.save text", "checkpoint", "ENOSPC as cause"])
def test_a_full_disk_is_not_retried(make: Any) -> None:
    exc = make()
    reason = not_retried(exc)
    assert is_disk_full(exc) and reason is not None and reason.startswith("disk full or quota spent")
    if getattr(exc, "filename", None) or getattr(exc.__cause__, "filename", None):
        assert "free space on the disk holding " in reason


@pytest.mark.parametrize("exc", [ConfigError("train.lr: bad"), CheckpointError("step_3: digest mismatch"),
                                 PolicyLoadError("no config.json"), TrainingStopped("non-finite loss"),
                                 OutOfMemory("x"), ExceptionGroup("g", [ConnectionError("a"), ConfigError("b")]),
                                 RewardError("step 3: sara: reward nan", prompt=7, value=float("nan"), row=0)],
                         ids=lambda e: type(e).__name__)
def test_deterministic_refusals_are_not_retried(exc: BaseException) -> None:
    assert not_retried(exc) is not None


@pytest.mark.parametrize("exc", [EngineError("round 0 failed"), ConnectionError("refused"), TimeoutError("slow"),
                                 OSError("disk"), OSError(errno.EIO, "I/O error"), RuntimeError("server went away"),
                                 chained(ConfigError("x"))],  # a wrapper decides what the failure is
                         ids=lambda e: f"{type(e).__name__}:{e}")
def test_transient_failures_are_retried(exc: BaseException) -> None:
    assert not_retried(exc) is None


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_prefect_condition_reads_the_failed_state_and_logs_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.states import Failed

    kept = _Kept()  # on the module's logger itself: Prefect's logging set-up may replace the root's handlers
    logger = logging.getLogger("pipeline.retry")
    logger.addHandler(kept)
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    try:
        cond = retry_if_transient("evaluate.n_samples")
        assert cond(None, None, Failed(data=ConnectionError("refused"))) is True
        assert cond(None, None, Failed(data=OSError(errno.ENOMEM, "Cannot allocate memory"))) is False
    finally:
        logger.removeHandler(kept)
    assert len(kept.lines) == 1, kept.lines
    assert kept.lines[0].startswith("task: not retried: out of memory (OSError: [Errno 12]")
    assert "lower evaluate.n_samples" in kept.lines[0]


class _Engine(RolloutEngine):
    def __init__(self, exc: BaseException) -> None:
        self.exc, self.calls = exc, 0

    def generate(self, requests: Any) -> Any:
        self.calls += 1
        raise self.exc


@pytest.mark.parametrize("make", [real_enomem, lambda: RuntimeError("std::bad_alloc"),
                                  lambda: ExceptionGroup("g", [MemoryError()])], ids=["ENOMEM", "bad_alloc", "group"])
def test_generation_does_not_retry_these_out_of_memory_shapes(make: Any) -> None:
    engine = _Engine(make())
    with pytest.raises(BaseException) as err:
        generate_with_retry(engine, {0: 4}, retries=2, retry_delay_s=0.0)
    assert engine.calls == 1 and not isinstance(err.value, EngineError)
