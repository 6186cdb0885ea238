"""Where the pipeline's files live: one root (RLVR_ROOT, default the working directory) and one params file.

Layout under the root: data/<task>/ (DatasetDict), models/warmstart/ (policy folder),
runs/<allocator>-s<seed>/ (checkpoints, metrics.jsonl, summary.json, tracking.json), experiment/ (the same
for the DVC experiment stage), reports/.
"""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    """Project root for pipeline files: $RLVR_ROOT or the current directory."""
    return Path(os.environ.get("RLVR_ROOT", ".")).resolve()


def params_path(explicit: str | None = None) -> Path:
    """The params file: ``explicit``, else $RLVR_PARAMS, else params.yaml under the root."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("RLVR_PARAMS")
    return Path(env) if env else root() / "params.yaml"


def data_dir(task: str) -> Path:
    return root() / "data" / task


def warmstart_dir() -> Path:
    return root() / "models" / "warmstart"


def recorded_dir() -> Path:
    """The recorded warm starts (rlvr_core.models.recorded): artifacts/warmstart/ under the root."""
    return root() / "artifacts" / "warmstart"


def run_name(allocator: str, seed: int) -> str:
    """Name of the run folder of one (allocator, seed): ``<allocator>-s<seed>``, the allocator as registered
    (``sara+dps-s0``). The one place run-folder names are made."""
    if not allocator or "/" in allocator or allocator in (".", ".."):
        raise ValueError(f"allocator name {allocator!r} cannot name a run folder")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed {seed!r} cannot name a run folder; need an int >= 0")
    return f"{allocator}-s{seed}"


def run_dir(allocator: str, seed: int) -> Path:
    """Run folder of one allocator and seed: runs/<allocator>-s<seed> (runs/sara+dps-s0/).

    dvc.yaml's train stage declares the same folder, ``runs/${item.allocator}-s${item.seed}``, for each
    (train.allocators, train.seeds) entry; tests/pipeline/test_dvc_deps.py checks that the two agree for
    every registered allocator.
    """
    return root() / "runs" / run_name(allocator, seed)


def experiment_dir() -> Path:
    """Run folder of the DVC ``experiment`` stage (train.allocator; dvc.yaml trains it with --out experiment)."""
    return root() / "experiment"


def reports_dir() -> Path:
    return root() / "reports"
