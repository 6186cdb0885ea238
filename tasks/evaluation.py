"""Task: evaluate one checkpoint on the held-out split (greedy accuracy and pass@k)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS

from pipeline.retry import retry_if_transient
from rlvr_core.config import EvaluateConfig
from rlvr_core.evaluation import evaluate_policy
from rlvr_core.models.policy import load_checkpoint_policy, precision, resolve_device
from tasks.data import load_split


# cached on its inputs (paths, config and seed): a checkpoint folder is immutable once written; retried once,
# unless the failure is one a retry cannot fix (pipeline.retry: a bad checkpoint or config, out of memory, ...)
@task(retries=1, retry_delay_seconds=2, cache_policy=INPUTS,
      retry_condition_fn=retry_if_transient("evaluate.n_samples or evaluate.max_new_tokens"))
def evaluate_checkpoint(checkpoint: str, checkpoint_id: str, base_policy_dir: str, data_dir: str, task_name: str,
                        cfg: EvaluateConfig, seed: int = 0, device: str = "cpu",
                        dtype: str = "float32") -> dict[str, Any]:
    """Greedy accuracy and pass@k of ``checkpoint`` on the test split; adds the checkpoint's step.

    ``device`` and ``dtype`` are the train section's (``train.device``, ``train.dtype``): the
    checkpoint is evaluated where and in the precision it was trained. Prompts go through the
    tokenizer's chat template when it has one (``evaluate_policy``).

    ``checkpoint_id`` is the state hash from the checkpoint manifest (see ``checkpoint_id``), so the
    cache key changes whenever a checkpoint folder is rewritten with new content
    (``rlvr_core.checkpoint.checkpoint_digest``).
    """
    device = resolve_device(device)
    model, tok, step = load_checkpoint_policy(checkpoint, base_policy_dir, device=device)
    with precision(device, dtype):
        ev = evaluate_policy((model, tok), load_split(data_dir, "test"), task_name, k=cfg.k, n_samples=cfg.n_samples,
                             temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=seed, device=device)
    return {"step": step, **ev}
