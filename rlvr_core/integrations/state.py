"""The allocator state an integration keeps in its trainer's checkpoints: one shape, checked and restored one way.

``AllocatedGRPOTrainer`` (TRL) and ``AllocatorReplayBuffer`` (verl) both write ``allocation_state``'s dict with
``rlvr_core.checkpoint.save_state_folder`` (no pickle) and read it back through ``restore_allocation_state``, which
refuses a state that does not fit, naming the file and the field, before anything is loaded. Imports no torch.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from rlvr_core.errors import short_repr

STATE_FIELDS = {"allocator": str, "params": dict, "state": dict, "source": dict, "history": list, "totals": dict}


def allocation_state(name: str, params: Any, allocator: Any, source: Any, history: Sequence[dict[str, Any]],
                     totals: dict[str, int]) -> dict[str, Any]:
    """The dict a checkpoint keeps: the allocator's name, parameters and state, the prompt stream's state, the
    per-step history and the running totals."""
    return {"allocator": name, "params": params, "state": allocator.state_dict(), "source": source.state_dict(),
            "history": list(history), "totals": dict(totals)}


def check_allocation_state(st: Any, where: str | os.PathLike, *, totals: Sequence[str] | None = None) -> None:
    """Raise ValueError naming ``where`` and the field unless ``st`` has the shape ``allocation_state`` writes:
    every field of its kind, history entries of numbers, totals non-negative integers (exactly the keys
    ``totals`` when given). The allocator's and the prompt stream's own dicts are checked when they are loaded."""
    if not isinstance(st, dict):
        raise ValueError(f"{where}: the allocator state is a {type(st).__name__}, not a dict")
    for field, kind in STATE_FIELDS.items():
        if field not in st:
            raise ValueError(f"{where}: field {field!r} is missing")
        if not isinstance(st[field], kind):
            raise ValueError(f"{where}: field {field!r} is a {type(st[field]).__name__} "
                             f"({short_repr(st[field])}), not a {kind.__name__}")
    for i, rec in enumerate(st["history"]):
        if not isinstance(rec, dict) or not all(type(k) is str and type(v) in (int, float) for k, v in rec.items()):
            raise ValueError(f"{where}: field 'history': entry {i} is not a dict of numbers ({short_repr(rec)})")
    got = st["totals"]
    keys_ok = totals is None or sorted(got) == sorted(totals)
    if not keys_ok or not all(type(k) is str and type(v) is int and v >= 0 for k, v in got.items()):
        names = f" {', '.join(totals)}" if totals is not None else ""
        raise ValueError(f"{where}: field 'totals' must hold non-negative integer{names} (got {short_repr(got)})")


def restore_allocation_state(st: Any, where: str | os.PathLike, *, name: str, allocator: Any, source: Any,
                             totals: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Check ``st`` (``check_allocation_state``), refuse another allocator's state, load the allocator's and the
    prompt stream's parts, and return (history, totals) for the caller to keep. A part that does not restore
    raises ValueError naming ``where`` and the field."""
    check_allocation_state(st, where, totals=totals)
    if st["allocator"] != name:
        raise ValueError(f"{where}: field 'allocator': the checkpoint holds allocator {st['allocator']!r} state; "
                         f"this run uses {name!r}")
    for field, target in (("state", allocator), ("source", source)):
        try:
            target.load_state_dict(st[field])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError) as e:
            raise ValueError(f"{where}: field {field!r} does not restore the {name!r} "
                             f"{'allocator' if field == 'state' else 'prompt stream'} "
                             f"({e.__class__.__name__}: {short_repr(str(e))})") from None
    return [dict(h) for h in st["history"]], {k: int(v) for k, v in st["totals"].items()}
