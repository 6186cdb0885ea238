"""Name -> implementation registries (docs/design.md §2.3: register, never branch).

Entries are either objects registered with ``@registry.register(name)`` or
lazy ``"package.module:attr"`` paths resolved on first use, so heavy
backends are imported only when asked for by name.
"""

from __future__ import annotations

import difflib
import importlib
import re
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

# the one spelling rule of a name where "+", "[" and "]" are not allowed (slug)
_SLUG_SUBS = (("+", "plus"), ("[", "_"), ("]", ""))
_SLUG_OK = re.compile(r"[A-Za-z0-9._-]+")


def slug(label: str) -> str:
    """A registered name or a variant label as a file, folder, URL or deployment name.

    The rule: ``+`` becomes ``plus``, ``[`` becomes ``_`` and ``]`` is dropped; letters, digits, ``-``, ``_``
    and ``.`` stay as they are. So ``sara+dps`` -> ``saraplusdps``, ``sara[carry]`` -> ``sara_carry`` and
    ``sara+dps[context+floor]`` -> ``saraplusdps_contextplusfloor``. The canonical name is always the label
    itself (``sara+dps``, as registered); the slug is only where a name must live without those characters:
    the training study's run folders (benchmarks/results/study/<regime>/<protocol>/<slug>/, committed in this
    spelling, so the rule must not change) and the Prefect deployments (``train/saraplusdps``). The pipeline's
    run folders keep the registered name (``runs/sara+dps-s0``): ``+`` is legal in a path there and dvc.yaml
    spells the folder from the name itself.

    Raises ValueError for an empty label or one with any other character (``/``, a space), which no rule here
    would make safe.
    """
    out = label if isinstance(label, str) else ""
    for char, sub in _SLUG_SUBS:
        out = out.replace(char, sub)
    if not _SLUG_OK.fullmatch(out) or out in (".", ".."):
        raise ValueError(f"{label!r} cannot be made a file or deployment name: use letters, digits, '-', '_', "
                         "'.', and '+', '[', ']' (spelled 'plus', '_', '')")
    return out


class UnknownNameError(KeyError):
    """Raised for a name that is not registered; the message lists valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep it readable
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A named collection of implementations of one kind (allocators, engines, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; duplicate names are rejected."""

        def deco(obj: T) -> T:
            self._add(name, obj)
            return obj

        return deco

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``"module.path:attr"`` to be imported when ``name`` is first looked up."""
        if ":" not in target:
            raise ValueError(f"lazy {self.kind} target must look like 'pkg.module:attr', got {target!r}")
        self._add(name, target)

    def _add(self, name: str, obj: Any) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items:
            raise ValueError(f"duplicate {self.kind} name {name!r}: already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        """Return the implementation registered as ``name``, importing it if lazy."""
        if name not in self._items:
            valid = ", ".join(sorted(self._items))
            close = difflib.get_close_matches(str(name), list(self._items), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}{hint}; valid names: {valid}")
        obj = self._items[name]
        if isinstance(obj, str):
            module, attr = obj.split(":", 1)
            obj = getattr(importlib.import_module(module), attr)
            self._items[name] = obj
        return obj

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
