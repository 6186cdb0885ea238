"""Tiny character-level policy for the CPU default and its supervised warm start.

Import from the submodules (``rlvr_core.models.tiny``, ``.tokenizer``,
``.warmstart``); this package re-exports the main entry points lazily so that
``import rlvr_core.models`` stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "build_char_tokenizer": "rlvr_core.models.tokenizer",
    "build_tiny_policy": "rlvr_core.models.tiny",
    "load_policy": "rlvr_core.models.tiny",
    "save_policy": "rlvr_core.models.tiny",
    "PolicyLoadError": "rlvr_core.models.tiny",
    "WarmStartConfig": "rlvr_core.models.warmstart_config",
    "warm_start": "rlvr_core.models.warmstart",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlvr_core.models' has no attribute {name!r}")
