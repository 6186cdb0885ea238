"""The allocator registry and ``make_allocator``."""

from __future__ import annotations

from typing import Any

from rlvr_core.registry import Registry

ALLOCATORS: Registry[type] = Registry("allocator")


def make_allocator(name: str, **params: Any):
    """Build the allocator registered as ``name`` with validated parameters.

    Unknown names raise an error listing the valid ones; unknown or impossible
    parameters raise ``ConfigError`` naming the field and the fix.
    """
    from rlvr_core.allocation.base import build_params

    cls = ALLOCATORS.get(name)
    return cls(build_params(cls.Params, name, params))
