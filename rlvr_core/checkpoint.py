"""Atomic checkpoints with a content-hash manifest, loaded without running code.

A checkpoint is a folder ``<root>/step_<N>/`` (N zero-padded to at least six
digits) holding

- ``tensors.safetensors``: every torch tensor and NumPy array of the state
  (policy weights, optimizer moments, RNG state, allocator arrays), in the
  safetensors format, which is a JSON header plus raw bytes;
- ``state.json``: the rest of the state (counters, allocator bookkeeping, RNG
  generator states, config) as plain JSON, with references into the tensor
  file and tags for the few non-JSON containers (tuples, dicts with non-string
  keys, NumPy scalars, ``Rollouts``);
- ``manifest.json``: format, step, sha256 and size of both files, and ``meta``.

Loading parses JSON and safetensors only: no pickle, so a checkpoint cannot
run code however its files were written. Checkpoints of the earlier format
(one pickled ``state.pt``) are refused with ``CheckpointError`` (they could run
code when loaded); the message says what to do.

Every file is written to a temporary folder, fsynced and renamed; the manifest
is written last, so a folder without a valid manifest is incomplete. A failed
write (disk full) removes the temporary folder and names the path.
``load_latest`` verifies the hashes and falls back to the previous checkpoint
when the newest is truncated, corrupted or unparseable. Checkpoints are ordered
by their parsed step number (``step_999999`` comes before ``step_1000000``).

``fault_point`` is a test aid: the crash tests (tests/reliability) set
``$RLVR_FAULT_KILL_AT`` to make a training process SIGKILL itself at a chosen
point (``"checkpoint:4"`` dies half-way through writing checkpoint 4).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch

from rlvr_core.errors import ConfigError, short_repr
from rlvr_core.safefs import file_sha256

MANIFEST = "manifest.json"
STATE = "state.json"
TENSORS = "tensors.safetensors"
LEGACY_STATE = "state.pt"  # the earlier, pickled format: refused
FORMAT = 2
FAULT_ENV = "RLVR_FAULT_KILL_AT"
_STEP_DIR = re.compile(r"step_(\d+)")


class CheckpointError(ConfigError):
    """A checkpoint that is refused (a pickle, an unsupported format); the message says what to do."""


def fault_point(point: str, step: int) -> None:
    """Test aid: SIGKILL this process when ``$RLVR_FAULT_KILL_AT`` lists ``"<point>:<step>"``.

    The variable is a comma-separated list such as ``"update:3"`` or
    ``"generate:2,checkpoint:4"``. Points: ``generate`` (after a round's rollouts
    are generated, before they are scored), ``update`` (after the policy update,
    before the step's metrics are written), ``metrics`` (after the metrics line,
    before the checkpoint), ``checkpoint`` (state files written, manifest not yet).
    Unset (every normal run) this is one environment lookup.
    """
    spec = os.environ.get(FAULT_ENV)
    if spec and f"{point}:{step}" in (s.strip() for s in spec.split(",")):
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------ encoding

def _tensor_for_file(t: torch.Tensor, seen: set[int]) -> torch.Tensor:
    """A CPU, contiguous tensor owning its storage (safetensors refuses shared or partial storage)."""
    t = t.detach().to("cpu")
    ptr = t.untyped_storage().data_ptr()
    whole = t.is_contiguous() and t.storage_offset() == 0 and \
        t.untyped_storage().nbytes() == t.numel() * t.element_size()
    if not whole or (ptr in seen and t.numel()):
        t = t.clone(memory_format=torch.contiguous_format)
    seen.add(t.untyped_storage().data_ptr())
    return t


def encode_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-able tree, tensors by name) for ``state``; ``decode_state`` inverts it exactly.

    Supported: None, bool, int, float, str, list, tuple, dict (any keys of these
    types), torch tensors, NumPy arrays of numeric or bool dtype, NumPy scalars
    and ``rlvr_core.types.Rollouts``. Anything else raises TypeError naming
    where it sits in the state.
    """
    from rlvr_core.types import Rollouts

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def enc(v: Any, where: str) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, float)) and type(v) in (int, float):
            return v
        if isinstance(v, torch.Tensor):
            name = str(len(tensors))
            tensors[name] = _tensor_for_file(v, seen)
            return {"$tensor": name}
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in "biuf":
                raise TypeError(f"checkpoint state {where}: NumPy arrays of dtype {v.dtype} cannot be stored")
            name = str(len(tensors))
            a = np.ascontiguousarray(v.astype(v.dtype.newbyteorder("="), copy=False))
            tensors[name] = torch.from_numpy(a.copy())
            return {"$ndarray": name, "dtype": a.dtype.str}
        if isinstance(v, np.generic):
            if v.dtype.kind not in "biuf":
                raise TypeError(f"checkpoint state {where}: NumPy scalar of dtype {v.dtype} cannot be stored")
            return {"$npscalar": v.item(), "dtype": v.dtype.str}
        if isinstance(v, Rollouts):
            return {"$rollouts": {f.name: enc(getattr(v, f.name), f"{where}.{f.name}")
                                  for f in dataclasses.fields(v)}}
        if isinstance(v, list):
            return [enc(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, tuple):
            return {"$tuple": [enc(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, Mapping):
            if all(type(k) is str and not k.startswith("$") for k in v):
                return {k: enc(x, f"{where}.{k}") for k, x in v.items()}
            return {"$dict": [[enc(k, f"{where} key"), enc(x, f"{where}.{k}")] for k, x in v.items()]}
        raise TypeError(f"checkpoint state {where}: {type(v).__name__} values cannot be stored "
                        "(use plain data, tensors or NumPy arrays)")

    return enc(state, "state"), tensors


def decode_state(tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Invert ``encode_state``; raises CheckpointError on anything it would not have written."""
    from rlvr_core.types import Rollouts

    def dec(v: Any) -> Any:
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        if len(v) == 1 and "$tensor" in v:
            return tensors[v["$tensor"]]
        if set(v) == {"$ndarray", "dtype"}:
            dtype = np.dtype(v["dtype"])
            if dtype.kind not in "biuf":
                raise CheckpointError(f"array dtype {v['dtype']!r} is not allowed in a checkpoint")
            return tensors[v["$ndarray"]].numpy().astype(dtype, copy=True)
        if set(v) == {"$npscalar", "dtype"}:
            dtype = np.dtype(v["dtype"])
            if dtype.kind not in "biuf":
                raise CheckpointError(f"scalar dtype {v['dtype']!r} is not allowed in a checkpoint")
            return dtype.type(v["$npscalar"])
        if len(v) == 1 and "$tuple" in v:
            return tuple(dec(x) for x in v["$tuple"])
        if len(v) == 1 and "$dict" in v:
            return {_hashable(dec(k)): dec(x) for k, x in v["$dict"]}
        if len(v) == 1 and "$rollouts" in v:
            return Rollouts(**{k: dec(x) for k, x in v["$rollouts"].items()})
        if any(k.startswith("$") for k in v):
            raise CheckpointError(f"unknown tag in checkpoint state: {sorted(k for k in v if k.startswith('$'))}")
        return {k: dec(x) for k, x in v.items()}

    return dec(tree)


def _hashable(k: Any) -> Any:
    if isinstance(k, (list, dict)):
        raise CheckpointError(f"checkpoint state: a dict key of type {type(k).__name__}")
    return k


# ------------------------------------------------------------------ writing

def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_folder_name(step: int) -> str:
    """``step_000042``; steps past 999,999 get more digits (ordering uses the parsed number)."""
    return f"step_{step:06d}"


def _write_folder(folder: Path, state: Any, step: int, meta: Mapping[str, Any] | None, *,
                  fault: bool = False) -> None:
    """Write ``state`` as ``folder`` in the checkpoint format (state.json, tensors.safetensors, manifest.json):
    into a temporary sibling folder made afresh, each file fsynced, which then replaces ``folder``. An OSError
    removes the temporary folder and is raised again with its errno and the file being written (``filename``);
    ``fault`` calls ``fault_point("checkpoint", step)`` before the manifest is written."""
    from safetensors.torch import save as st_save

    tree, tensors = encode_state(state)
    blobs = {STATE: json.dumps(tree, separators=(",", ":")).encode(), TENSORS: st_save(tensors)}
    del tensors
    tmp_folder = folder.with_name(f".tmp_{folder.name}")
    target = tmp_folder
    try:
        shutil.rmtree(tmp_folder, ignore_errors=True)
        tmp_folder.mkdir()
        for name, data in blobs.items():
            target = tmp_folder / name
            _fsync_write(target, data)
        if fault:
            fault_point("checkpoint", step)
        manifest = {"format": FORMAT, "step": step,
                    "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)} for n, d in blobs.items()},
                    "meta": dict(meta or {})}
        target = tmp_folder / MANIFEST
        _fsync_write(target, json.dumps(manifest, indent=1, default=str).encode())
        target = folder
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp_folder, folder)
        _fsync_dir(folder.parent)
    except OSError as e:
        shutil.rmtree(tmp_folder, ignore_errors=True)
        e.filename = str(target)
        raise


def _reraise(e: OSError, where: str) -> OSError:
    """``e`` (from ``_write_folder``) again with the same errno and file, its message saying ``where``."""
    what = e.strerror or os.strerror(e.errno or 0) or e.__class__.__name__
    return OSError(e.errno, f"{what} while writing {where}", e.filename)


def save_checkpoint(root: str | os.PathLike, step: int, state: dict[str, Any], *, keep_last: int | None = None,
                    meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``state`` as checkpoint ``step`` under ``root``; prune to the newest ``keep_last``.

    ``meta`` (JSON-serialisable) is stored in the manifest, readable without loading the state
    (``latest_manifest``). An OSError while writing (ENOSPC, EIO) removes the temporary folder and
    is raised again with the same errno, naming the file being written.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / step_folder_name(step)
    try:
        _write_folder(folder, state, step, meta, fault=True)
    except OSError as e:
        raise _reraise(e, f"checkpoint {step} under {root} (its temporary folder was removed; the earlier "
                          "checkpoints are intact)") from e
    if keep_last is not None:
        prune(root, keep_last)
    return folder


# ------------------------------------------------------------------ reading

def checkpoint_step(folder: str | os.PathLike) -> int | None:
    """The step number in a checkpoint folder's name (``step_1000000`` -> 1000000), None if not one."""
    m = _STEP_DIR.fullmatch(Path(folder).name)
    return int(m.group(1)) if m else None


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Checkpoint folders under ``root``, oldest (lowest step number) first, complete or not."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := checkpoint_step(p)) is not None]
    return [p for _, p in sorted(found, key=lambda sp: (sp[0], sp[1].name))]


def _read_manifest(folder: Path) -> dict[str, Any]:
    manifest = json.loads((folder / MANIFEST).read_text())
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError("manifest has no files table")
    return manifest


def check_format(folder: str | os.PathLike, manifest: Mapping[str, Any]) -> None:
    """Raise CheckpointError for a pickle-format or unknown-format checkpoint (``latest_manifest``'s pair)."""
    folder = Path(folder)
    if not isinstance(manifest, Mapping) or not isinstance(manifest.get("files"), Mapping):
        return  # a damaged manifest: loading skips the checkpoint
    if LEGACY_STATE in manifest["files"] or manifest.get("format") is None:
        raise CheckpointError(
            f"checkpoint {folder} is in the old pickle format ({LEGACY_STATE}), which can run code when loaded, "
            "so it is not loaded. Start the run in a fresh folder (or delete its checkpoints/ folder to train "
            "again from the policy); a policy you trust can be exported with an older release first.")
    if manifest.get("format") != FORMAT or set(manifest["files"]) != {STATE, TENSORS}:
        raise CheckpointError(f"checkpoint {folder}: unsupported format {manifest.get('format')!r} "
                              f"with files {sorted(manifest['files'])} (this version reads format {FORMAT})")


def verify(folder: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it.

    Only sizes and hashes are checked here; the format is checked on load.
    """
    folder = Path(folder)
    try:
        manifest = _read_manifest(folder)
    except (OSError, ValueError) as e:
        return f"manifest unreadable ({e.__class__.__name__})"
    for name, meta in manifest["files"].items():
        if (problem := _file_problem(folder / str(name), str(name), meta)) is not None:
            return problem
    return None


def _file_problem(path: Path, name: str, meta: Any) -> str | None:
    """What is wrong with one file against its manifest entry: its size is compared first (a file padded
    to gigabytes is refused without reading it), then its content is hashed in 1 MiB chunks."""
    if not isinstance(meta, Mapping) or type(meta.get("bytes")) is not int or not isinstance(meta.get("sha256"), str):
        return f"{name}: manifest entry malformed"
    if not path.is_file():
        return f"{name} missing"
    try:
        size = path.stat().st_size
        if size != meta["bytes"]:
            return f"{name} has {size} bytes, manifest says {meta['bytes']}"
        digest = file_sha256(path)
    except OSError as e:
        return f"{name} unreadable ({e.strerror or e.__class__.__name__})"
    if digest != meta["sha256"]:
        return f"{name} content hash does not match the manifest"
    return None


def newest_intact(root: str | os.PathLike) -> Path | None:
    """The newest checkpoint folder under ``root`` that passes ``verify``, or None."""
    for ckpt in reversed(list_checkpoints(root)):
        if verify(ckpt) is None:
            return ckpt
    return None


def checkpoint_meta(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``meta`` a checkpoint was saved with (its run's config and data digest; {} if none)."""
    return dict(_read_manifest(Path(folder)).get("meta", {}))


def checkpoint_digest(folder: str | os.PathLike) -> str:
    """The hashes of a checkpoint's files, read from its manifest: changes whenever its content does."""
    return "".join(meta["sha256"] for meta in _read_manifest(Path(folder))["files"].values())


def manifest_step(folder: str | os.PathLike) -> int:
    """The step recorded in a checkpoint's manifest."""
    return int(_read_manifest(Path(folder))["step"])


def read_state(folder: str | os.PathLike, map_location: str = "cpu", *, part: Iterable[str] = (),
               without: Iterable[str] = ()) -> Any:
    """The state saved in checkpoint ``folder`` (verified first), or its sub-tree at key path ``part``.

    ``part=("trainer", "model")`` reads only the policy weights' tensors; ``without=("trainer",)`` reads
    all but the top-level keys named (their tensors are not loaded). Raises CheckpointError for
    a pickle-format checkpoint, ValueError for a damaged one (sizes, hashes or contents).
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    try:
        manifest = _read_manifest(folder)
    except (OSError, ValueError) as e:
        raise ValueError(f"checkpoint {folder}: manifest unreadable ({e.__class__.__name__})") from None
    check_format(folder, manifest)
    problem = verify(folder)
    if problem:
        raise ValueError(f"checkpoint {folder}: {problem}")
    try:
        tree = _without(json.loads((folder / STATE).read_text()), without)
        for key in part:
            tree = tree[key]
        names = sorted(_tensor_refs(tree), key=int)
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(folder / TENSORS), framework="pt", device="cpu") as f:
            available = set(f.keys())
            for n in names:
                if n not in available:
                    raise ValueError(f"tensor {n} named in {STATE} is not in {TENSORS}")
                t = f.get_tensor(n)
                tensors[n] = t if map_location == "cpu" else t.to(map_location)
        return decode_state(tree, tensors)
    except CheckpointError:
        raise
    except (SafetensorError, ValueError, KeyError, TypeError, OSError, IndexError, AttributeError,
            RecursionError, OverflowError) as e:  # a tampered state.json: nested 200k deep, an int64 of 10**30
        raise ValueError(f"checkpoint {folder}: contents unreadable ({e.__class__.__name__}: "
                         f"{str(e)[:200]})") from None


def _without(tree: Any, keys: Iterable[str]) -> Any:
    """``tree`` less the top-level ``keys`` (a tree that is not a JSON object is returned as it is)."""
    keys = set(keys)
    return {k: v for k, v in tree.items() if k not in keys} if keys and isinstance(tree, dict) else tree


def _tensor_refs(tree: Any) -> set[str]:
    out: set[str] = set()
    stack = [tree]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            if "$tensor" in v and isinstance(v["$tensor"], str):
                out.add(v["$tensor"])
            elif "$ndarray" in v and isinstance(v["$ndarray"], str):
                out.add(v["$ndarray"])
            else:
                stack.extend(v.values())
    return out


def load_latest(root: str | os.PathLike, map_location: str = "cpu", *,
                without: Iterable[str] = ()) -> tuple[int, dict[str, Any]] | None:
    """(step, state) of the newest intact checkpoint, or None; damaged ones are reported and skipped.

    ``without`` names top-level keys of the state not to read (``read_state``). Raises CheckpointError
    when the newest checkpoint with a readable manifest is in the pickle format.
    """
    for folder in reversed(list_checkpoints(root)):
        try:
            manifest = _read_manifest(folder)
        except (OSError, ValueError) as e:
            warnings.warn(f"skipping damaged checkpoint {folder}: manifest unreadable ({e.__class__.__name__})",
                          RuntimeWarning, stacklevel=2)
            continue
        check_format(folder, manifest)
        try:
            state = read_state(folder, map_location, without=without)
        except CheckpointError:
            raise
        except ValueError as e:
            problem = str(e).removeprefix(f"checkpoint {folder}: ")
            warnings.warn(f"skipping damaged checkpoint {folder}: {problem}", RuntimeWarning, stacklevel=2)
            continue
        if (problem := _step_problem(folder, manifest, state)) is not None:
            warnings.warn(f"skipping damaged checkpoint {folder}: {problem}", RuntimeWarning, stacklevel=2)
            continue
        return manifest["step"], state
    return None


def _step_problem(folder: Path, manifest: Mapping[str, Any], state: Any) -> str | None:
    """What disagrees between the step in a checkpoint's folder name, its manifest and its state's ``step``
    key (when the state has one), else None: a step edited in one place is not trusted in any."""
    step, named = manifest.get("step"), checkpoint_step(folder)
    if type(step) is not int or step != named:
        return f"the manifest's step {short_repr(step)} is not the folder's {named}"
    if isinstance(state, Mapping) and "step" in state and (type(state["step"]) is not int or state["step"] != step):
        return f"the state's step {short_repr(state['step'])} is not the manifest's {step}"
    return None


def latest_manifest(root: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """(folder, manifest) of the newest checkpoint whose manifest parses, or None (state not verified)."""
    for folder in reversed(list_checkpoints(root)):
        try:
            return folder, json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
    return None


def prune(root: str | os.PathLike, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` intact checkpoints (by step number) and leftover temporaries."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1")
    root = Path(root)
    for tmp in root.glob(".tmp_step_*"):
        shutil.rmtree(tmp, ignore_errors=True)
    intact = [f for f in list_checkpoints(root) if verify(f) is None]
    for folder in intact[:-keep_last]:
        shutil.rmtree(folder, ignore_errors=True)


def save_state_folder(folder: str | os.PathLike, state: Any, *, step: int,
                      meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``state`` into ``folder`` itself in the checkpoint format (state.json, tensors.safetensors,
    manifest.json), atomically, for a state that lives inside another program's checkpoint folder (TRL's
    ``checkpoint-N/``); ``read_state(folder)`` reads it back without pickle.

    The files go to a temporary sibling folder, fsynced, which then replaces ``folder``; an OSError
    removes the temporary folder and names the file being written.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write_folder(folder, state, int(step), meta)
    except OSError as e:
        raise _reraise(e, f"{folder} (its temporary folder was removed)") from e
    return folder
