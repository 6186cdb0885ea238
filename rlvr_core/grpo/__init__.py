"""GRPO policy update: ragged-group advantages, clipped loss, trainer (docs/design.md §5)."""

from rlvr_core.grpo.advantages import ADVANTAGES, get_advantage_fn
from rlvr_core.grpo.batch import PolicyBatch, collate, token_logprobs
from rlvr_core.grpo.loss import AGGREGATIONS, loss_normaliser, policy_loss
from rlvr_core.grpo.trainer import GRPOTrainer, TrainerConfig, shard_rows

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "GRPOTrainer",
    "PolicyBatch",
    "TrainerConfig",
    "collate",
    "get_advantage_fn",
    "loss_normaliser",
    "policy_loss",
    "shard_rows",
    "token_logprobs",
]
