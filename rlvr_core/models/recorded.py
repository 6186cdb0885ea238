"""Recorded warm starts: policy folders committed under ``artifacts/warmstart/<key>/`` with their sha256.

A warm start of 2,400 steps amplifies the float differences between processors: the same settings give a
byte-identical policy run after run on one machine, and another policy on another (docs/design.md §6.2).
The results that start from a warm start (``make run``, the study's regimes) are therefore tied to a
recorded policy, keyed by the settings that built it (``policy_key``: the prepare and warmstart sections).
``artifacts/warmstart/manifest.json`` maps each key to the sha256 and size of every file of its folder and
to the warm start's metrics; ``recorded_policy`` returns a folder only after its files hash as recorded,
and raises ``RecordedPolicyMismatch`` otherwise, before anything trains on it. Its copy in models/warmstart
carries the same hashes in its ``sha256.json`` (``rlvr_core.models.integrity``), checked before each run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Mapping

from rlvr_core.errors import ConfigError
from rlvr_core.models.integrity import file_hashes, write_policy_record

MANIFEST = "manifest.json"


class RecordedPolicyMismatch(ConfigError):
    """A recorded policy's files do not hash as its manifest says (edited, truncated, or another build)."""


def policy_key(prepare: Any, warmstart: Any) -> str:
    """12 hex digits naming a warm start by the settings that build it (the prepare and warmstart sections)."""
    plain = {k: asdict(v) if is_dataclass(v) else dict(v) for k, v in (("prepare", prepare), ("warmstart", warmstart))}
    blob = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def read_manifest(store: Path) -> dict[str, Any]:
    path = Path(store) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded_policy(store: Path, key: str) -> tuple[Path, dict[str, Any]] | None:
    """(folder, manifest entry) of the policy recorded under ``key`` in ``store``, its hashes verified;
    None when none is recorded. RecordedPolicyMismatch names the first file that differs."""
    entry = read_manifest(store).get(key)
    if entry is None:
        return None
    folder = Path(store) / key
    found = file_hashes(folder) if folder.is_dir() else {}
    for name, want in sorted(entry["files"].items()):
        got = found.get(name)
        if got != want:
            what = "missing" if got is None else f"sha256 {got['sha256'][:16]}... ({got['bytes']} bytes)"
            raise RecordedPolicyMismatch(
                f"{folder / name}: {what}, but {Path(store) / MANIFEST} records sha256 {want['sha256'][:16]}... "
                f"({want['bytes']} bytes); restore it (git checkout {folder}) or remove its entry to build anew")
    if extra := sorted(set(found) - set(entry["files"])):
        raise RecordedPolicyMismatch(f"{folder}: files {extra} are not in {Path(store) / MANIFEST}; remove them")
    return folder, entry


def copy_recorded(store: Path, key: str, out_dir: Path) -> dict[str, Any] | None:
    """Copy the verified policy recorded under ``key`` to ``out_dir``; its manifest entry, or None if none."""
    found = recorded_policy(store, key)
    if found is None:
        return None
    folder, entry = found
    tmp = Path(out_dir).with_name(Path(out_dir).name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    write_policy_record(tmp, entry["files"])  # the copy is checked against the recorded hashes before training
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return entry


def record_policy(store: Path, key: str, folder: Path, info: Mapping[str, Any]) -> dict[str, Any]:
    """Record the policy ``folder`` under ``key`` in ``store`` (its files copied, the manifest updated with
    their hashes and ``info``); returns the entry. An entry already there is replaced."""
    dest = Path(store) / key
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(folder, dest)
    entry = {**dict(info), "files": file_hashes(dest)}
    manifest = {**read_manifest(store), key: entry}
    Path(store).mkdir(parents=True, exist_ok=True)
    (Path(store) / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return entry
