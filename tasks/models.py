"""Tasks: warm start the tiny policy; export a checkpoint's policy as a policy folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rlvr_core.models.warmstart import WarmStartConfig, warm_start


@task(retries=0, cache_policy=NO_CACHE)
def run_warm_start(cfg: WarmStartConfig, data_dir: str, out_dir: str) -> dict[str, Any]:
    """Warm start on the train split at ``data_dir``; saves the policy to ``out_dir``; returns its metrics."""
    from tasks.data import load_split

    from prefect import get_run_logger

    log = get_run_logger()
    _, _, metrics = warm_start(load_split(data_dir, "train"), **cfg.to_dict(), out_dir=out_dir,
                               progress=lambda s, m: log.info("warmstart step %d loss %.4f", s, m["loss"]))
    return metrics


def checkpoint_policy(checkpoint: str, base_policy_dir: str) -> tuple[Any, Any, int]:
    """(model, tokenizer, step) of a training checkpoint folder ``runs/<alloc>/checkpoints/step_N``."""
    import torch

    from rlvr_core.checkpoint import STATE, verify
    from rlvr_core.models.tiny import load_policy

    folder = Path(checkpoint)
    problem = verify(folder)
    if problem:
        raise ValueError(f"checkpoint {folder}: {problem}")
    state = torch.load(folder / STATE, map_location="cpu", weights_only=False)
    model, tok = load_policy(base_policy_dir)
    model.load_state_dict(state["trainer"]["model"])
    model.eval()
    return model, tok, int(json.loads((folder / "manifest.json").read_text())["step"])


@task(retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def export_policy(checkpoint: str, base_policy_dir: str, out_dir: str) -> str:
    """Save the policy of ``checkpoint`` as a standalone policy folder at ``out_dir``; returns it."""
    from rlvr_core.models.tiny import save_policy

    model, tok, _ = checkpoint_policy(checkpoint, base_policy_dir)
    return str(save_policy(model, tok, out_dir))
