"""Task: build the task's dataset (its generator or hub loaders, ``rlvr_core.tasks``) and save it to disk."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlvr_core.config import PrepareConfig
from rlvr_core.data.disk import save_splits
from rlvr_core.safefs import write_text_atomic
from rlvr_core.tasks import get_task

# PrepareConfig fields of the hub datasets; left out of a synthetic task's counts.json (its bytes stay as before)
HUB_FIELDS = ("dataset", "path", "split", "limit", "eval_dataset", "eval_path", "eval_split", "eval_limit")


# log_prints=False: building a Dataset hashes its table with dill, whose globals scan reads
# dis.dis output from a swapped sys.stdout; Prefect's print patch would log that disassembly instead.
@task(retries=0, cache_policy=NO_CACHE, log_prints=False)
def generate_dataset(cfg: PrepareConfig, out_dir: str) -> dict[str, int]:
    """Build the task's DatasetDict, save it at ``out_dir`` (``save_splits``: with digests.json), write
    <out_dir>/counts.json; returns the counts."""
    spec = get_task(cfg.task)
    ds, extra = spec.build(cfg)
    out = Path(out_dir)
    save_splits(ds, out)  # save_to_disk, plus digests.json: each arrow file's sha256, checked before reading
    counts = {split: len(ds[split]) for split in ds}
    config = asdict(cfg)
    if spec.generated:
        config = {k: v for k, v in config.items() if k not in HUB_FIELDS}
    write_text_atomic(out / "counts.json", json.dumps({"config": config, "rows": counts, **extra}, indent=1,
                                                      sort_keys=True))  # never through a planted link
    return counts


def hub_dataset(cfg: PrepareConfig) -> tuple[Any, dict[str, Any]]:
    """A hub task's DatasetDict {train, test} and its counts.json extras (``rlvr_core.tasks.build_hub_splits``
    through the task's ``build``): loaded, decontaminated, validated."""
    spec = get_task(cfg.task)
    if spec.generated:
        raise ValueError(f"task {cfg.task!r} is generated, not loaded from the hub")
    return spec.build(cfg)


def load_split(data_dir: str, split: str) -> list[dict]:
    """Rows of one split of a dataset saved by ``generate_dataset``.

    Raises DataError (a ConfigError: not retried) naming the file and row for a missing folder or
    split, an empty split, and truncated, non-UTF-8 or invalid JSON/arrow files
    (``rlvr_core.data.disk.load_saved_split``).
    """
    from rlvr_core.data.disk import load_saved_split

    return load_saved_split(data_dir, split)
