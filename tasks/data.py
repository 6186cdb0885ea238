"""Task: generate the synthetic dataset and save it to disk."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlvr_core.config import PrepareConfig


@task(retries=0, cache_policy=NO_CACHE)
def generate_dataset(cfg: PrepareConfig, out_dir: str) -> dict[str, int]:
    """Build the task's DatasetDict, save_to_disk at ``out_dir``, write <out_dir>/counts.json; returns the counts."""
    if cfg.task == "arithmetic":
        from rlvr_core.data.arithmetic import make_arithmetic

        ds = make_arithmetic(cfg.n_train, cfg.n_test, cfg.seed, digits=cfg.digits, ops=cfg.ops,
                             digit_weights=cfg.digit_weights)
    else:
        from rlvr_core.data.countdown import make_countdown

        ds = make_countdown(cfg.n_train, cfg.n_test, cfg.seed)
    out = Path(out_dir)
    ds.save_to_disk(str(out))
    counts = {split: len(ds[split]) for split in ds}
    (out / "counts.json").write_text(json.dumps({"config": asdict(cfg), "rows": counts}, indent=1, sort_keys=True))
    return counts


def load_split(data_dir: str, split: str) -> list[dict]:
    """Rows of one split of a dataset saved by ``generate_dataset``."""
    from datasets import load_from_disk

    path = Path(data_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no dataset; run `python -m flows.prepare` first")
    return list(load_from_disk(str(path))[split])
