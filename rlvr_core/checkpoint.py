"""Atomic checkpoints with a content-hash manifest.

A checkpoint is a folder ``<root>/step_<NNNNNN>/`` holding ``state.pt`` (one
torch-pickled dict: policy, optimizer, allocator, prompt source, engine and
RNG states) and ``manifest.json`` (step, sha256 and size of state.pt). Both are
written to temporary names, fsynced and renamed; the manifest is written last,
so a folder without a valid manifest is incomplete. ``load_latest`` verifies
the hash and falls back to the previous checkpoint when the newest is
truncated or corrupted.

``fault_point`` is a test aid: the crash tests (tests/reliability) set
``$RLVR_FAULT_KILL_AT`` to make a training process SIGKILL itself at a chosen
point (``"checkpoint:4"`` dies half-way through writing checkpoint 4).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

MANIFEST = "manifest.json"
STATE = "state.pt"
FAULT_ENV = "RLVR_FAULT_KILL_AT"


def fault_point(point: str, step: int) -> None:
    """Test aid: SIGKILL this process when ``$RLVR_FAULT_KILL_AT`` lists ``"<point>:<step>"``.

    The variable is a comma-separated list such as ``"update:3"`` or
    ``"generate:2,checkpoint:4"``. Points: ``generate`` (after a round's rollouts
    are generated, before they are scored), ``update`` (after the policy update,
    before the step's metrics are written), ``metrics`` (after the metrics line,
    before the checkpoint), ``checkpoint`` (state.pt written, manifest not yet).
    Unset (every normal run) this is one environment lookup.
    """
    spec = os.environ.get(FAULT_ENV)
    if spec and f"{point}:{step}" in (s.strip() for s in spec.split(",")):
        os.kill(os.getpid(), signal.SIGKILL)


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


def save_checkpoint(root: str | os.PathLike, step: int, state: dict[str, Any], *, keep_last: int | None = None,
                    meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``state`` as checkpoint ``step`` under ``root``; prune to the newest ``keep_last``.

    ``meta`` (JSON-serialisable) is stored in the manifest, readable without loading the state
    (``latest_manifest``).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"step_{step:06d}"
    tmp_folder = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp_folder, ignore_errors=True)
    tmp_folder.mkdir()
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    _fsync_write(tmp_folder / STATE, data)
    fault_point("checkpoint", step)
    manifest = {"step": step, "files": {STATE: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}},
                "meta": dict(meta or {})}
    _fsync_write(tmp_folder / MANIFEST, json.dumps(manifest, indent=1, default=str).encode())
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp_folder, folder)
    _fsync_dir(root)
    if keep_last is not None:
        prune(root, keep_last)
    return folder


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Checkpoint folders under ``root``, oldest first (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir())


def verify(folder: Path) -> str | None:
    """None if the checkpoint is complete and intact, else what is wrong with it."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"manifest unreadable ({e.__class__.__name__})"
    for name, meta in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            return f"{name} missing"
        data = path.read_bytes()
        if len(data) != meta["bytes"]:
            return f"{name} has {len(data)} bytes, manifest says {meta['bytes']}"
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            return f"{name} content hash does not match the manifest"
    return None


def load_latest(root: str | os.PathLike, map_location: str = "cpu") -> tuple[int, dict[str, Any]] | None:
    """(step, state) of the newest intact checkpoint, or None; damaged ones are reported and skipped."""
    for folder in reversed(list_checkpoints(root)):
        problem = verify(folder)
        if problem:
            warnings.warn(f"skipping damaged checkpoint {folder}: {problem}", RuntimeWarning, stacklevel=2)
            continue
        state = torch.load(folder / STATE, map_location=map_location, weights_only=False)
        return int(json.loads((folder / MANIFEST).read_text())["step"]), state
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
    """Delete all but the newest ``keep_last`` intact checkpoints (and leftover temporaries)."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1")
    root = Path(root)
    for tmp in root.glob(".tmp_step_*"):
        shutil.rmtree(tmp, ignore_errors=True)
    intact = [f for f in list_checkpoints(root) if verify(f) is None]
    for folder in intact[:-keep_last]:
        shutil.rmtree(folder, ignore_errors=True)
