"""Tasks: warm start the policy (or snapshot a pretrained base model); export a checkpoint's policy as a folder."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.retry import retry_if_transient
from rlvr_core.models.warmstart import WarmStartConfig, warm_start


@task(retries=0, cache_policy=NO_CACHE)
def run_warm_start(cfg: WarmStartConfig, data_dir: str, out_dir: str, task: str = "arithmetic") -> dict[str, Any]:
    """Policy folder at ``out_dir``; returns its metrics.

    ``cfg.base_model`` set: no training, the pretrained model and its tokenizer are
    snapshotted into ``out_dir`` (metrics say what was copied). Otherwise the tiny
    policy is warm-started on the train split of ``task`` at ``data_dir`` (with the task's teacher).
    """
    from prefect import get_run_logger

    log = get_run_logger()
    if cfg.base_model is not None:
        from rlvr_core.models.policy import snapshot_base_model

        info = snapshot_base_model(cfg.base_model, out_dir)
        log.info("warmstart: snapshot of %s (%s, %d parameters, %s) -> %s", cfg.base_model, info["model_type"],
                 info["params"], info["dtype"], out_dir)
        return info
    from rlvr_core.tasks import warm_start_teacher
    from tasks.data import load_split

    _, _, metrics = warm_start(load_split(data_dir, "train"), teacher=warm_start_teacher(task), **cfg.sft_kwargs(),
                               out_dir=out_dir,
                               progress=lambda s, m: log.info("warmstart step %d loss %.4f", s, m["loss"]))
    return metrics


# retried once, unless a retry cannot fix the failure (pipeline.retry: a bad checkpoint, a full disk, ...)
@task(retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE,
      retry_condition_fn=retry_if_transient("the model size (export on a machine with more memory)"))
def export_policy(checkpoint: str, base_policy_dir: str, out_dir: str) -> str:
    """Save the policy of ``checkpoint`` as a standalone policy folder at ``out_dir`` (``save_pretrained``);
    returns it."""
    from rlvr_core.models.policy import load_checkpoint_policy, save_any_policy

    model, tok, _ = load_checkpoint_policy(checkpoint, base_policy_dir)
    return str(save_any_policy(model, tok, out_dir))
