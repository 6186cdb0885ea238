"""The allocator state an integration keeps in its trainer's checkpoints: one shape, checked and restored one way.

``AllocatedGRPOTrainer`` (TRL) and ``AllocatorReplayBuffer`` (verl) both write ``allocation_state``'s dict with
``rlvr_core.checkpoint.save_state_folder`` (no pickle) and read it back through ``restore_allocation_state``, which
refuses a state that does not fit, naming the file and the field, before anything is loaded. Imports no torch.

A resume goes on only under the allocator and the parameters the state was written with (``check_same_allocator``):
the state records both (``allocator``, and ``params``: every parameter the allocator was built with, the trainer's
defaults included), and another allocator or any changed parameter is refused naming both values, as the pipeline
refuses a changed setting for its own checkpoints (``rlvr_core.preflight.check_resumable``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from rlvr_core.errors import ConfigError, short_repr
from rlvr_core.types import plain

STATE_FIELDS = {"allocator": str, "params": dict, "state": dict, "source": dict, "history": list, "totals": dict}


def allocation_state(name: str, params: Any, allocator: Any, source: Any, history: Sequence[dict[str, Any]],
                     totals: dict[str, int]) -> dict[str, Any]:
    """The dict a checkpoint keeps: the allocator's name, the parameters it was built with (``params``: the
    trainer's defaults included, so that a resume can be compared with all of them), its state, the prompt
    stream's state, the per-step history and the running totals."""
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


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(plain(a) == plain(b))
    except (TypeError, ValueError, RuntimeError):  # an array-valued parameter: compare what it prints as
        return repr(a) == repr(b)


_ABSENT = object()


def params_differences(saved: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """The parameters a checkpoint's state (``saved``) and this run (``given``) disagree on, each as
    ``"key=<saved> there, <given> now"`` (``absent`` where one side lacks the key), in key order."""
    out = []
    for key in sorted(set(saved) | set(given), key=str):
        old, new = saved.get(key, _ABSENT), given.get(key, _ABSENT)
        if old is _ABSENT or new is _ABSENT or not _same(old, new):
            show = [("absent" if v is _ABSENT else short_repr(v, 80)) for v in (old, new)]
            out.append(f"{str(key)[:60]}={show[0]} there, {show[1]} now")
    return out


def check_same_allocator(st: Mapping[str, Any], where: str | os.PathLike, *, name: str,
                         params: Mapping[str, Any]) -> None:
    """Raise ConfigError naming ``where`` unless the state ``st`` (shaped as ``check_allocation_state`` wants) was
    written by allocator ``name`` built with exactly ``params``: a resume under another allocator, or with any
    parameter added, dropped or changed, would go on from a state that the run's allocator did not write. The
    message gives both values of each parameter that differs."""
    if st["allocator"] != name:
        raise ConfigError(f"{where}: field 'allocator': the checkpoint holds allocator {st['allocator']!r} state; "
                          f"this run uses {name!r}")
    diffs = params_differences(st["params"], params)
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise ConfigError(f"{where}: field 'params': cannot resume, the run's {name!r} allocator was built with other "
                          f"parameters ({shown}); resume with the allocator_params (and the trainer's group size, "
                          "batch size and seed) the run started with, or start a fresh run")


def restore_allocation_state(st: Any, where: str | os.PathLike, *, name: str, params: Mapping[str, Any],
                             allocator: Any, source: Any, totals: Sequence[str] | None = None
                             ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Check ``st`` (``check_allocation_state``), refuse another allocator's state or other parameters
    (``check_same_allocator``: ConfigError), load the allocator's and the prompt stream's parts, and return
    (history, totals) for the caller to keep. A part that does not restore raises ValueError naming ``where`` and
    the field."""
    check_allocation_state(st, where, totals=totals)
    check_same_allocator(st, where, name=name, params=params)
    for field, target in (("state", allocator), ("source", source)):
        try:
            target.load_state_dict(st[field])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError) as e:
            raise ValueError(f"{where}: field {field!r} does not restore the {name!r} "
                             f"{'allocator' if field == 'state' else 'prompt stream'} "
                             f"({e.__class__.__name__}: {short_repr(str(e))})") from None
    return [dict(h) for h in st["history"]], {k: int(v) for k, v in st["totals"].items()}
