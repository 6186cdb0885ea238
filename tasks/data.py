"""Task: build the task's dataset (synthetic, or hub math data) and save it to disk."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlvr_core.config import SYNTHETIC_TASKS, PrepareConfig

# PrepareConfig fields of the hub datasets; left out of a synthetic task's counts.json (its bytes stay as before)
HUB_FIELDS = ("dataset", "path", "split", "limit", "eval_dataset", "eval_path", "eval_split", "eval_limit")


# log_prints=False: building a Dataset hashes its table with dill, whose globals scan reads
# dis.dis output from a swapped sys.stdout; Prefect's print patch would log that disassembly instead.
@task(retries=0, cache_policy=NO_CACHE, log_prints=False)
def generate_dataset(cfg: PrepareConfig, out_dir: str) -> dict[str, int]:
    """Build the task's DatasetDict, save_to_disk at ``out_dir``, write <out_dir>/counts.json; returns the counts."""
    extra: dict[str, Any] = {}
    if cfg.task == "arithmetic":
        from rlvr_core.data.arithmetic import make_arithmetic

        ds = make_arithmetic(cfg.n_train, cfg.n_test, cfg.seed, digits=cfg.digits, ops=cfg.ops,
                             digit_weights=cfg.digit_weights)
    elif cfg.task == "countdown":
        from rlvr_core.data.countdown import make_countdown

        ds = make_countdown(cfg.n_train, cfg.n_test, cfg.seed)
    else:
        ds, extra = hub_dataset(cfg)
    out = Path(out_dir)
    ds.save_to_disk(str(out))
    counts = {split: len(ds[split]) for split in ds}
    config = asdict(cfg)
    if cfg.task in SYNTHETIC_TASKS:
        config = {k: v for k, v in config.items() if k not in HUB_FIELDS}
    (out / "counts.json").write_text(json.dumps({"config": config, "rows": counts, **extra}, indent=1, sort_keys=True))
    return counts


def hub_dataset(cfg: PrepareConfig) -> tuple[Any, dict[str, Any]]:
    """Task math: DatasetDict {train, test} from the hub loaders named by ``cfg`` (hub names or local paths).

    Rows keep the loaders' schema (id, prompt = the raw problem text, difficulty, answer,
    source). Training rows whose problem text is also a held-out problem are dropped
    (decontamination; their number is reported as ``dropped_overlap``), then both splits
    are checked with ``validate_splits`` for the math verifier. Raises DataError (a
    ConfigError) for unusable rows; loader errors name the source and row.
    """
    from datasets import DatasetDict

    from rlvr_core.data.hub import load_hub_dataset
    from rlvr_core.data.validate import DataError, validate_splits

    splits = {}
    for name, src in cfg.hub_sources().items():
        try:
            splits[name] = load_hub_dataset(src["dataset"], src["split"], src["path"], limit=src["limit"])
        except (ValueError, FileNotFoundError) as e:
            where = src["path"] or f"the {src['dataset']} hub dataset"
            raise DataError(f"prepare: {name} split from {where} (split {src['split'] or 'default'}): {e}") from e
    held_out = set(splits["test"]["prompt"])
    keep = [i for i, p in enumerate(splits["train"]["prompt"]) if p not in held_out]
    dropped = len(splits["train"]) - len(keep)
    if dropped:
        splits["train"] = splits["train"].select(keep)
    validate_splits(list(splits["train"]), list(splits["test"]), cfg.task, source="prepare")
    return DatasetDict(splits), {"dropped_overlap": dropped}


def load_split(data_dir: str, split: str) -> list[dict]:
    """Rows of one split of a dataset saved by ``generate_dataset``.

    Raises DataError (a ConfigError: not retried) naming the file and row for a missing folder or
    split, an empty split, and truncated, non-UTF-8 or invalid JSON/arrow files
    (``rlvr_core.data.disk.load_saved_split``).
    """
    from rlvr_core.data.disk import load_saved_split

    return load_saved_split(data_dir, split)
