"""Exceptions shared across rlvr_core, and building validated configs from mappings."""

from __future__ import annotations

import dataclasses
import difflib
import errno
import reprlib
from typing import Any, Iterator, Mapping, TypeVar

C = TypeVar("C")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 8, 8, 8, 8
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 120, 120, 60


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` bounded in depth, width and length (safe on values that expand to gigabytes)."""
    r = _REPR.repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


class ConfigError(ValueError):
    """An impossible or unknown setting; the message names the field and the fix."""


def require(cond: bool, field: str, message: str) -> None:
    """Raise ConfigError(f"{field}: {message}") unless cond holds."""
    if not cond:
        raise ConfigError(f"{field}: {message}")


def from_mapping(cls: type[C], data: Mapping[str, Any] | None, section: str) -> C:
    """Build dataclass ``cls`` from ``data``, prefixing every error with ``section``.

    Unknown keys name the closest valid one; a key the class lists in its ``RENAMED_KEYS``
    ({old name: what to write instead}) is refused with that text; the dataclass's own
    validation errors ("field: why") become "section.field: why".
    """
    data = dict(data or {})
    names = [f.name for f in dataclasses.fields(cls)]
    renamed: Mapping[str, str] = getattr(cls, "RENAMED_KEYS", {})
    for key in data:
        if key in renamed and key not in names:
            raise ConfigError(f"{section}.{key}: {renamed[key]}")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{section}.{key}: unknown key{hint}; valid keys: {', '.join(names)}")
    try:
        return cls(**data)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(section + ".") else f"{section}.{msg}") from None
    except TypeError as e:
        raise ConfigError(f"{section}: {e}") from None


class RewardError(ValueError):
    """A reward outside an allocator's reward contract (NaN, infinite, or not pass/fail where the allocator reads
    passes; docs/design.md §3.2). The message names the round, the prompt and the value; ``prompt``, ``value`` and
    ``row`` (the row of the round's rollouts) let a caller that knows more (the step, the reward functions) say so
    with ``where``."""

    def __init__(self, message: str, *, prompt: int, value: float, row: int) -> None:
        super().__init__(message)
        self.message, self.prompt, self.value, self.row = message, prompt, value, row

    def where(self, context: str) -> RewardError:
        """The same error, its message led by ``context`` (e.g. "step 3")."""
        return RewardError(f"{context}: {self.message}", prompt=self.prompt, value=self.value, row=self.row)


class TrainingStopped(RuntimeError):
    """Training cannot continue (e.g. repeated non-finite updates); the message says why."""


class VerifierTimeout(Exception):
    """A verifier call ran past its time limit (``train.verifier_timeout_s``, or the verifier's own bound)."""


class OutOfMemory(RuntimeError):
    """The work did not fit in memory. Deterministic for the same inputs, so it is never retried;
    the message names what to reduce."""


# Lower-cased texts of out-of-memory RuntimeErrors: PyTorch's allocators, C++ ``std::bad_alloc`` and the CUDA
# libraries' allocation failures (CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED, ...).
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate memory",
             "bad_alloc", "_status_alloc_failed", "cudaerrormemoryallocation")
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded")


#: How many links of an exception's cause/context chain (and levels of ExceptionGroup members)
#: ``is_out_of_memory`` and ``is_disk_full`` follow.
OOM_CHAIN_DEPTH = 16
_MAX_VISITED = 256  # exceptions looked at in all, however wide the groups


def related_exceptions(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it came from: its ``__cause__``, its ``__context__`` (unless ``from None`` suppressed
    it) and the members of an ``ExceptionGroup``, recursively, each once, at most ``OOM_CHAIN_DEPTH`` links
    deep and ``_MAX_VISITED`` exceptions in all (a cycle or a huge group ends the walk)."""
    seen: set[int] = set()
    todo: list[tuple[BaseException, int]] = [(exc, 0)]
    while todo and len(seen) < _MAX_VISITED:
        link, depth = todo.pop(0)
        if id(link) in seen or depth >= OOM_CHAIN_DEPTH:
            continue
        seen.add(id(link))
        yield link
        nxt = [link.__cause__] if link.__cause__ is not None else (
            [] if link.__suppress_context__ else [link.__context__])
        if isinstance(link, BaseExceptionGroup):
            nxt += list(link.exceptions)
        todo += [(e, depth + 1) for e in nxt if isinstance(e, BaseException)]


def _errno_is(exc: BaseException, codes: tuple[int, ...]) -> bool:
    return isinstance(exc, OSError) and exc.errno in codes


def _says(exc: BaseException, texts: tuple[str, ...]) -> bool:
    return isinstance(exc, RuntimeError) and any(t in str(exc)[:2000].lower() for t in texts)


def _is_bare_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, OutOfMemory)):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, without importing torch here
        return True
    return _errno_is(exc, (errno.ENOMEM,)) or _says(exc, _OOM_TEXT)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an out-of-memory of any origin: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA, MPS),
    ``OSError(ENOMEM)`` (mmap, fork), RuntimeErrors saying so (the CPU allocator's "can't allocate memory",
    "std::bad_alloc", "CUBLAS_STATUS_ALLOC_FAILED") and ``OutOfMemory``; also when another exception wraps
    it, by ``raise X from oom``, by raising while handling one, or in an ``ExceptionGroup``
    (``related_exceptions``). Deterministic for the same work: the callers do not retry it."""
    return any(_is_bare_out_of_memory(e) for e in related_exceptions(exc))


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` or what it came from (``related_exceptions``) is a full disk or a spent quota:
    ``OSError`` ENOSPC / EDQUOT, or a RuntimeError saying "No space left on device" (torch.save's writer)."""
    codes = tuple(c for c in (getattr(errno, "ENOSPC", None), getattr(errno, "EDQUOT", None)) if c is not None)
    return any(_errno_is(e, codes) or _says(e, _DISK_FULL_TEXT) for e in related_exceptions(exc))
