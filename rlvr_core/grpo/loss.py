"""Clipped policy-gradient loss for GRPO-style updates (pure function).

Per completion token (PPO, Schulman et al., 2017; GRPO, Shao et al., 2024)::

    ratio = exp(logp - old_logp)
    pg    = max(-A * ratio, -A * clip(ratio, 1 - clip_eps, 1 + clip_eps_high))
    kl    = exp(ref - logp) - (ref - logp) - 1          # k3 estimator, if ref_logprobs given
    token_loss = pg + kl_coef * kl

Token losses are reduced by an *aggregation* looked up by name in
``AGGREGATIONS`` (register, never branch). An aggregation turns the (N, L)
token losses into one contribution per sequence, and says how many units
(tokens or sequences) the batch holds; the loss is

    loss = sum(contributions) / normaliser

``normaliser`` defaults to the local unit count. Data-parallel training passes
the *global* count (``loss_normaliser`` summed over ranks and micro-batches),
so that the per-shard losses, and their gradients, add up exactly to the
single-process loss over the whole batch.

Aggregations:

- ``token_mean``: every completion token weighs the same (DAPO); units = tokens.
- ``seq_mean_token_mean``: mean over tokens within a sequence, then mean over
  sequences (the original GRPO); units = sequences with at least one token.
- ``seq_mean_token_sum``: sum over tokens within a sequence, mean over sequences;
  units = sequences with at least one token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlvr_core.registry import Registry

# Log-ratios are clamped to this magnitude before exp so a wild token cannot
# overflow to inf; real updates stay far inside (|log ratio| < 1).
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class Aggregation:
    """How token losses become a scalar.

    per_row(token_loss (N, L), mask (N, L)) -> (N,) contribution of each sequence
    units(mask (N, L)) -> number of units (tokens or sequences) the batch holds
    """

    per_row: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    units: Callable[[torch.Tensor], torch.Tensor]
    unit: str


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


def _rows_with_tokens(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(dim=-1) > 0).sum().to(torch.float64)


AGGREGATIONS.register("token_mean")(
    Aggregation(
        per_row=lambda tl, m: (tl * m).sum(dim=-1),
        units=lambda m: m.sum().to(torch.float64),
        unit="tokens",
    )
)
AGGREGATIONS.register("seq_mean_token_mean")(
    Aggregation(
        per_row=lambda tl, m: (tl * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1),
        units=_rows_with_tokens,
        unit="sequences",
    )
)
AGGREGATIONS.register("seq_mean_token_sum")(
    Aggregation(
        per_row=lambda tl, m: (tl * m).sum(dim=-1),
        units=_rows_with_tokens,
        unit="sequences",
    )
)


def loss_normaliser(mask: torch.Tensor, aggregation: str = "token_mean") -> float:
    """Units (tokens or sequences) in ``mask`` (N, L) for ``aggregation``; sum these over shards."""
    return float(AGGREGATIONS.get(aggregation).units(mask))


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: str = "token_mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    normaliser: float | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss (to minimise) and detached metrics.

    logprobs:     (N, L) current policy log-probs of the next token (requires grad)
    old_logprobs: (N, L) log-probs under the sampling policy
    advantages:   (N,) one advantage per sequence, broadcast over its tokens
    mask:         (N, L) 1 on completion positions, 0 elsewhere (other values are ignored there)
    clip_eps / clip_eps_high: ratio band [1 - clip_eps, 1 + clip_eps_high]
        (``clip_eps_high=None`` means symmetric; DAPO's clip-higher sets it larger)
    ref_logprobs: (N, L) frozen reference log-probs; with ``kl_coef > 0`` adds kl_coef * k3
    normaliser:   units to divide by (default: this batch's ``loss_normaliser``)
    entropy:      (N, L) optional per-position entropy, only reported

    Metrics (means over this batch's masked tokens unless noted): ``pg_loss``,
    ``clip_frac`` (tokens whose clipped branch is the active one), ``approx_kl``
    (k3 estimate of KL(old || current)), ``kl_ref`` (k3 to the reference, 0
    without one), ``ratio_mean``, ``ratio_max``, ``entropy``, and the counts
    ``n_tokens`` and ``n_sequences``.
    """
    _check_shapes(logprobs, old_logprobs, advantages, mask, clip_eps, clip_eps_high)
    agg = AGGREGATIONS.get(aggregation)
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    m = mask.to(logprobs.dtype)
    t = _token_terms(logprobs, old_logprobs, advantages, m, clip_eps, eps_high, ref_logprobs)
    token_loss = t["pg"]
    if t["kl_ref"] is not None and kl_coef != 0.0:
        token_loss = token_loss + kl_coef * t["kl_ref"]
    elif t["kl_ref"] is None and kl_coef != 0.0:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs; pass them or set kl_coef=0")

    if normaliser is None:
        denom = max(float(agg.units(m)), 1.0)  # an all-masked batch gives loss 0, not nan
    elif normaliser > 0:
        denom = float(normaliser)
    else:
        raise ValueError(f"normaliser must be > 0, got {normaliser}; pass the global unit count of the batch")
    loss = agg.per_row(token_loss, m).sum() / denom
    return loss, _metrics(t, m, agg, denom, entropy)


def _check_shapes(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_eps: float, clip_eps_high: float | None) -> None:
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same (N, L) shape"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected ({logprobs.shape[0]},)")
    if clip_eps < 0 or (clip_eps_high is not None and clip_eps_high < 0):
        raise ValueError(f"clip_eps={clip_eps} and clip_eps_high={clip_eps_high} must be >= 0")


def _token_terms(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, m: torch.Tensor,
                 clip_eps: float, eps_high: float, ref_logprobs: torch.Tensor | None) -> dict[str, Any]:
    """Per-token ratio, clipped surrogate (pg) and k3 distance to the reference (None without one)."""
    on = m > 0
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    # Masked positions may hold anything (padding, -inf); keep them out of the graph's values.
    log_ratio = torch.where(on, logprobs - old_logprobs.to(logprobs.dtype), zero)
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    kl_ref = None
    if ref_logprobs is not None:
        d = torch.where(on, ref_logprobs.to(logprobs.dtype) - logprobs, zero)
        kl_ref = torch.exp(d) - d - 1.0
    return {"on": on, "zero": zero, "log_ratio": log_ratio, "ratio": ratio, "pg_unclipped": pg_unclipped,
            "pg_clipped": pg_clipped, "pg": torch.maximum(pg_unclipped, pg_clipped), "kl_ref": kl_ref}


@torch.no_grad()
def _metrics(t: dict[str, Any], m: torch.Tensor, agg: Aggregation, denom: float,
             entropy: torch.Tensor | None) -> dict[str, float]:
    n_tok = m.sum()
    count = n_tok.clamp(min=1)
    on, zero, ratio = t["on"], t["zero"], t["ratio"]

    def tmean(x: torch.Tensor) -> float:
        return float((x * m).sum() / count)

    return {
        "pg_loss": float(agg.per_row(t["pg"], m).sum() / denom),
        "clip_frac": tmean((t["pg_clipped"] > t["pg_unclipped"]).to(m.dtype)),
        "approx_kl": tmean(ratio - t["log_ratio"] - 1.0),
        "kl_ref": tmean(t["kl_ref"]) if t["kl_ref"] is not None else 0.0,
        "ratio_mean": tmean(ratio),
        "ratio_max": float(torch.where(on, ratio, zero).max()) if on.any() else 0.0,
        "entropy": tmean(torch.where(on, entropy.to(m.dtype), zero)) if entropy is not None else 0.0,
        "n_tokens": float(n_tok),
        "n_sequences": float(_rows_with_tokens(m)),
    }


__all__ = ["AGGREGATIONS", "Aggregation", "MAX_LOG_RATIO", "loss_normaliser", "policy_loss"]
