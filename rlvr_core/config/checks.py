"""Checking a params section's values against its dataclass's type annotations (``check_fields``).

Ints, booleans, strings, lists and mappings of the right shape, and numbers that are finite (NaN and
infinities are refused everywhere); no params key takes a negative number, and a seed (``SEED_KEYS``:
prepare.seed, warmstart.seed, train.seed, train.seeds) is at most ``MAX_SEED``. Range checks follow in
each section's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Mapping, Union

from rlvr_core.config.reading import short_repr
from rlvr_core.errors import ConfigError

# the largest seed: the vllm engine samples with a seed's low 32 bits (rlvr_core.rollout.vllm.round_seed) and
# numpy's global generator is seeded with seed % 2**32 (rlvr_core.training), so larger seeds would repeat smaller
# ones; torch.manual_seed refuses 2**64 and more, and the hf engine seeds torch with seed * 1,000,003 + call
MAX_SEED = 2**32 - 1
SEED_KEYS = ("seed", "seeds")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ----------------------------------------------------------------------------- checking fields against their types


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past a float's range
        return False


def _non_finite(value: Any, key: str) -> tuple[str, Any, str] | None:
    """(key.path, value, "a finite number") for the first NaN, infinity or float-overflowing int anywhere
    in ``value`` (mappings and lists walked without recursion), else None."""
    todo = [(key, value)]
    while todo:
        path, v = todo.pop()
        if _is_real(v) and not _finite(v):
            return path, v, "a finite number"
        if isinstance(v, Mapping):
            todo.extend((f"{path}.{k}", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            todo.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def _need(value: Any, hint: Any, key: str) -> tuple[str, Any, str] | None:
    """None when ``value`` fits ``hint``, else (key or key.subkey, offending value, what is needed).
    A value typed ``Any`` (e.g. an allocator's parameters) may hold anything but a non-finite number."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return _non_finite(value, key)
    if origin in (Union, types.UnionType):
        nullable = type(None) in args
        if value is None and nullable:
            return None
        alts = [_need(value, a, key) for a in args if a is not type(None)]
        if any(a is None for a in alts):
            return None
        bad = alts[0] if len(alts) == 1 else (key, value, " or ".join(a[2] for a in alts))  # type: ignore[index]
        return (bad[0], bad[1], bad[2] + " or null") if nullable and bad[0] == key else bad  # type: ignore[index]
    if hint is bool:
        return None if isinstance(value, bool) else (key, value, "true or false")
    if hint is int:
        return None if _is_int(value) else (key, value, "an int")
    if hint is float:
        if not _is_real(value):
            return key, value, "a number"
        return None if _finite(value) else (key, value, "a finite number")
    if hint is str:
        return None if isinstance(value, str) else (key, value, "a string")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return key, value, "a list"
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return key, value, f"a list of {len(items)} items"
        for i, (x, a) in enumerate(zip(value, items)):
            if (bad := _need(x, a, key)) is not None:
                return key, value, f"a list whose items are each {bad[2]} (item {i} is {short_repr(x, 60)})"
        return None
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            return key, value, "a mapping"
        vhint = args[1] if len(args) == 2 else Any
        for k, v in value.items():
            if not isinstance(k, str):
                return key, value, f"a mapping with string keys (not {short_repr(k, 60)})"
            if (bad := _need(v, vhint, f"{key}.{k}")) is not None:
                return bad
        return None
    return None  # a type this checker does not know: the section's own checks apply


def check_fields(cls: type, values: Mapping[str, Any]) -> None:
    """ConfigError "key: got <value>; need <type>" for the first of ``values`` (known fields of dataclass
    ``cls``) that does not fit its annotation. NaN and infinities never fit a number, and no key of a
    params section takes a negative number (the sections' own checks then bound each range)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        v = values[f.name]
        if (bad := _need(v, hints[f.name], f.name)) is not None:
            raise ConfigError(f"{bad[0]}: got {short_repr(bad[1])}; need {bad[2]}")
        numbers = [v] if _is_real(v) else [x for x in v if _is_real(x)] if isinstance(v, (list, tuple)) else []
        if any(x < 0 for x in numbers):
            raise ConfigError(f"{f.name}: got {short_repr(v)}; no params key takes a negative number")
        if f.name in SEED_KEYS and any(x > MAX_SEED for x in numbers):
            raise ConfigError(f"{f.name}: got {short_repr(v)}; a seed is an int from 0 to {MAX_SEED:,} (2**32 - 1: "
                              "the vllm engine and numpy's global generator read only its low 32 bits)")


def _check_self(obj: Any) -> None:
    check_fields(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})

