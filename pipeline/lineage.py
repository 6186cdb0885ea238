"""Lineage facts for tracking: git commit, DVC content hashes of data and base model."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pipeline.paths import root


def git_commit() -> str:
    """HEAD commit of the repository holding the root, or 'unknown' outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root(), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def dir_hash(path: Path) -> str:
    """md5 over the sorted relative paths and contents of every file under ``path`` (or of one file)."""
    path = Path(path)
    h = hashlib.md5()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        h.update(hashlib.md5(f.read_bytes()).digest())
    return h.hexdigest()


def dvc_md5(path: Path) -> str:
    """The md5 dvc.lock records for output ``path`` (relative to the root), else a computed directory hash."""
    path = Path(path).resolve()
    lock = root() / "dvc.lock"
    if lock.is_file():
        try:
            stages: dict[str, Any] = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
        except yaml.YAMLError:
            stages = {}
        rel = str(path.relative_to(root())) if path.is_relative_to(root()) else str(path)
        for stage in stages.values():
            for out in stage.get("outs", []) or []:
                if out.get("path") == rel and out.get("md5"):
                    return str(out["md5"])
    return dir_hash(path) if path.exists() else "missing"
