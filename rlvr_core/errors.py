"""Exceptions shared across rlvr_core, and building validated configs from mappings."""

from __future__ import annotations

import dataclasses
import difflib
import reprlib
from typing import Any, Mapping, TypeVar

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


_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate memory")


#: How many links of an exception's cause/context chain ``is_out_of_memory`` follows.
OOM_CHAIN_DEPTH = 16


def _is_bare_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, OutOfMemory)):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, without importing torch here
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc)[:2000].lower() for t in _OOM_TEXT)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for an out-of-memory of any origin: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA, MPS),
    the CPU allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory") and ``OutOfMemory``,
    also when another exception wraps it: ``raise X from oom`` (``__cause__``) or an error raised while
    handling one (``__context__``, unless ``from None`` suppressed it), up to ``OOM_CHAIN_DEPTH`` links."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < OOM_CHAIN_DEPTH:
        if _is_bare_out_of_memory(link):
            return True
        seen.add(id(link))
        link = link.__cause__ if link.__cause__ is not None else (
            None if link.__suppress_context__ else link.__context__)
    return False
