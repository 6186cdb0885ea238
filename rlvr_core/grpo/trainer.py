"""The GRPO policy update: advantages -> collate -> clipped loss -> AdamW step.

One ``GRPOTrainer.step(train_batch)`` call consumes the ragged groups an
allocator hands over (``rlvr_core.types.TrainBatch`` with engine payloads, see
``rlvr_core.grpo.batch``) and applies ``config.epochs`` optimizer updates to
the policy (a transformers causal LM or anything whose forward returns an
object with ``.logits`` of shape (N, L, V)).

Data parallel: when ``torch.distributed`` is initialised (any backend; the
tests use gloo on CPU), every rank receives the *same* TrainBatch, computes
the advantages over the whole batch (groups may straddle shards), takes its
contiguous block of rows (``shard_rows``), and divides its loss by the *global*
unit count. Gradients are summed with one ``all_reduce``, so W ranks apply the
same update as one process on the whole batch (up to float summation order).
Skips (no effective group, non-finite loss or gradient) are decided on reduced
values, so all ranks skip together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

from rlvr_core.errors import ConfigError, require
from rlvr_core.grpo.advantages import ADVANTAGES, get_advantage_fn
from rlvr_core.grpo.batch import PolicyBatch, collate, token_logprobs
from rlvr_core.grpo.loss import AGGREGATIONS, loss_normaliser, policy_loss
from rlvr_core.types import TrainBatch

# Token-weighted metrics from policy_loss that are averaged over tokens.
_TOKEN_METRICS = ("clip_frac", "approx_kl", "kl_ref", "ratio_mean", "entropy", "old_logprob_abs_diff")


@dataclass(frozen=True)
class TrainerConfig:
    """Settings of the policy update: the update keys of params.yaml's ``train`` section.

    Each field is a field of ``rlvr_core.config.TrainConfig`` with the same default; a run builds
    this from its section with ``from_train`` (tests/pipeline/test_params_defaults.py keeps the two
    in step).

    lr:            AdamW learning rate (3e-4 and above degraded the CPU default policy)
    betas:         AdamW (beta1, beta2)
    weight_decay:  AdamW decoupled weight decay
    adam_eps:      AdamW epsilon
    clip_eps:      lower (and default upper) half-width of the ratio clip band
    clip_eps_high: upper half-width (DAPO clip-higher); None = clip_eps
    grad_clip:     max global gradient L2 norm; None disables clipping (the norm is still reported)
    advantage:     advantage estimator name in ``ADVANTAGES`` (grpo, dr_grpo, rloo)
    adv_eps:       epsilon added to the group std by ``grpo``
    aggregation:   loss aggregation name in ``AGGREGATIONS``
    group_weight:  ``none``: every row weighs as its aggregation says, so a prompt grown to 32 rollouts weighs
                   8x one of 4 (ragged groups from VIGOR, SARA); ``prompt``: every trained group weighs the same,
                   each row's advantage scaled by (trained rows / trained groups) / its group's size
    kl_coef:       weight of the k3 KL to the frozen reference; > 0 needs ``ref_model``
    temperature:   the sampler's temperature; logits are divided by it before log-softmax
    micro_batch:   sequences per forward/backward (gradient accumulation beyond it)
    epochs:        optimizer updates per TrainBatch (each a full pass over its rows)
    only_effective: train only on rows of effective (mixed) groups
    compute_entropy: report the policy entropy on completion tokens (one extra softmax)
    """

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    grad_clip: float | None = 1.0
    advantage: str = "grpo"
    adv_eps: float = 1e-6
    aggregation: str = "token_mean"
    group_weight: str = "none"
    kl_coef: float = 0.0
    temperature: float = 1.0
    micro_batch: int = 256
    epochs: int = 1
    only_effective: bool = True
    compute_entropy: bool = True

    @classmethod
    def from_train(cls, train: Any) -> TrainerConfig:
        """This config from a ``train`` section (``rlvr_core.config.TrainConfig``): each field copied by name."""
        return cls(**{f.name: getattr(train, f.name) for f in fields(cls)})

    def __post_init__(self) -> None:
        def finite(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        require(finite(self.lr) and self.lr > 0, "lr", f"must be a finite number > 0, got {self.lr!r}")
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else None
        require(
            betas is not None and len(betas) == 2 and all(finite(b) and 0 <= b < 1 for b in betas),
            "betas",
            f"must be two numbers in [0, 1), e.g. (0.9, 0.99); got {self.betas!r}",
        )
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))  # type: ignore[index]
        require(finite(self.weight_decay) and self.weight_decay >= 0, "weight_decay",
                f"must be >= 0, got {self.weight_decay!r}")
        require(finite(self.adam_eps) and self.adam_eps > 0, "adam_eps", f"must be > 0, got {self.adam_eps!r}")
        require(finite(self.clip_eps) and 0 < self.clip_eps < 1, "clip_eps",
                f"must lie in (0, 1), e.g. 0.2; got {self.clip_eps!r}")
        require(
            self.clip_eps_high is None or (finite(self.clip_eps_high) and self.clip_eps_high > 0),
            "clip_eps_high",
            f"must be None (symmetric) or > 0, e.g. 0.28; got {self.clip_eps_high!r}",
        )
        require(
            self.grad_clip is None or (finite(self.grad_clip) and self.grad_clip > 0),
            "grad_clip",
            f"must be None (no clipping) or > 0, e.g. 1.0; got {self.grad_clip!r}",
        )
        require(
            self.advantage in ADVANTAGES,
            "advantage",
            f"unknown estimator {self.advantage!r}; choose one of {ADVANTAGES.names()}",
        )
        require(finite(self.adv_eps) and self.adv_eps >= 0, "adv_eps", f"must be >= 0, got {self.adv_eps!r}")
        require(
            self.aggregation in AGGREGATIONS,
            "aggregation",
            f"unknown aggregation {self.aggregation!r}; choose one of {AGGREGATIONS.names()}",
        )
        require(self.group_weight in GROUP_WEIGHTS, "group_weight",
                f"got {self.group_weight!r}; choose one of {list(GROUP_WEIGHTS)}")
        require(finite(self.kl_coef) and self.kl_coef >= 0, "kl_coef", f"must be >= 0, got {self.kl_coef!r}")
        require(
            finite(self.temperature) and self.temperature > 0,
            "temperature",
            f"must be > 0 and equal to the sampler's temperature; got {self.temperature!r}",
        )
        require(
            isinstance(self.micro_batch, int) and not isinstance(self.micro_batch, bool) and self.micro_batch >= 1,
            "micro_batch",
            f"must be an integer >= 1, got {self.micro_batch!r}",
        )
        require(
            isinstance(self.epochs, int) and not isinstance(self.epochs, bool) and self.epochs >= 1,
            "epochs",
            f"must be an integer >= 1, got {self.epochs!r}",
        )


GROUP_WEIGHTS = ("none", "prompt")


def prompt_weights(group_id: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row, (trained rows / trained groups) / the size of its group among the trained ``rows``: every trained
    group then carries the same total weight, and the weights of the trained rows sum to their number.
    Rows outside ``rows`` get weight 0."""
    w = np.zeros(len(group_id), np.float64)
    if len(rows) == 0:
        return w
    sizes = np.bincount(group_id[rows])
    w[rows] = (len(rows) / np.count_nonzero(sizes)) / sizes[group_id[rows]]
    return w


def dist_rank_world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_rows(n: int, rank: int, world: int) -> np.ndarray:
    """Row indices of ``rank``'s shard of n rows: contiguous blocks, sizes differing by at most 1.

    Deterministic and independent of the data; the union over ranks is ``arange(n)``.
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank must lie in [0, world) with world >= 1, got rank={rank}, world={world}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return np.arange(start, start + base + (1 if rank < extra else 0), dtype=np.int64)


def _chunks(n: int, size: int) -> Iterator[np.ndarray]:
    for s in range(0, n, size):
        yield np.arange(s, min(s + size, n), dtype=np.int64)


@dataclass
class _PassTotals:
    loss: float = 0.0
    pg_loss: float = 0.0
    token_sums: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in _TOKEN_METRICS})
    ratio_max: float = 0.0


class GRPOTrainer:
    """Applies GRPO updates to ``model`` from allocator TrainBatches.

    model:     causal LM; ``model(input_ids=..., attention_mask=...).logits`` is (N, L, V)
    config:    TrainerConfig
    ref_model: frozen reference for the KL term (required when ``config.kl_coef > 0``)
    pad_id:    token id used for right padding
    device:    where the forward passes run

    Dropout is switched off during the update (the model is put in eval mode for
    the forward passes, gradients still flow) so recomputed log-probs match the
    sampler's scores; the model's previous mode is restored afterwards.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig | None = None,
        *,
        ref_model: torch.nn.Module | None = None,
        pad_id: int,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config if config is not None else TrainerConfig()
        if self.config.kl_coef > 0 and ref_model is None:
            raise ConfigError(f"kl_coef: is {self.config.kl_coef} but no ref_model was given; "
                              "pass ref_model or set kl_coef=0")
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.ref_model = ref_model.to(self.device).eval() if ref_model is not None else None
        if self.ref_model is not None:
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.pad_id = int(pad_id)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no trainable parameters (all requires_grad=False)")
        c = self.config
        self.optimizer = torch.optim.AdamW(
            self.params, lr=c.lr, betas=c.betas, eps=c.adam_eps, weight_decay=c.weight_decay
        )
        self.advantage_fn = get_advantage_fn(c.advantage)
        self.steps = 0  # optimizer updates applied
        self.rank, self.world = dist_rank_world()
        if self.world > 1:  # start every rank from rank 0's weights, as DDP does
            with torch.no_grad():
                for p in self.model.parameters():
                    dist.broadcast(p.data, src=0)

    # ------------------------------------------------------------------ public

    def step(self, train_batch: TrainBatch) -> dict[str, float]:
        """One update from ``train_batch``; returns metrics (all floats).

        Metrics: loss, pg_loss, kl (to the reference), approx_kl (to the sampler),
        clip_frac, ratio_mean, ratio_max, entropy, old_logprob_abs_diff (mean
        |recomputed - sampling| log-prob; with epochs=1 this is measured before
        the update and checks that trainer and engine score tokens alike),
        grad_norm (before clipping), n_sequences, n_tokens,
        updates, skipped (1: nothing to train on), nonfinite (1: update dropped),
        reused_sequences (rows an allocator reused from an earlier step, their ratio taken against the current
        policy: ``_rescore_reused``),
        seconds, and the advantage estimator's metrics prefixed ``adv/``.
        Token metrics are token-weighted means over the whole (global) batch,
        averaged over the epochs that were applied.
        """
        return self._run(train_batch, update=True)

    @torch.no_grad()
    def evaluate(self, train_batch: TrainBatch) -> dict[str, float]:
        """The loss and metrics ``step`` would see on ``train_batch``, without updating."""
        return self._run(train_batch, update=False)

    def state_dict(self) -> dict[str, Any]:
        """Model and optimizer state (live tensors, like ``nn.Module.state_dict``) and the update count."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "config": asdict(self.config),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (the config is informational and not applied)."""
        for key in ("model", "optimizer"):
            if key not in state:
                raise KeyError(f"trainer state has no {key!r} entry; pass what GRPOTrainer.state_dict() returned")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state.get("steps", 0))

    # ----------------------------------------------------------------- helpers

    def prepare(self, train_batch: TrainBatch) -> tuple[PolicyBatch, dict[str, float]]:
        """Advantages over the whole batch, then the collated rows to train on (all ranks' rows)."""
        ro = train_batch.rollouts
        if ro.payload is None:
            raise ValueError(
                "TrainBatch rollouts carry no payload (token ids, log-probs); the trainer needs a model "
                "engine (hf, vllm), not the simulated one"
            )
        gid = np.asarray(train_batch.group_id, dtype=np.int64)
        if gid.shape != (len(ro),):
            raise ValueError(f"TrainBatch.group_id has shape {gid.shape}, expected ({len(ro)},)")
        eff = np.asarray(train_batch.effective, dtype=bool)
        if len(gid) and (gid.min() < 0 or gid.max() >= len(eff)):
            raise ValueError(f"TrainBatch.group_id must lie in [0, {len(eff)}) (one effective flag per group)")
        adv, adv_metrics = self.advantage_fn(ro.reward, gid, eps=self.config.adv_eps, num_groups=len(eff))
        rows = np.flatnonzero(eff[gid]) if self.config.only_effective else np.arange(len(ro))
        if self.config.group_weight == "prompt":
            adv = adv * prompt_weights(gid, rows)
        batch = collate(ro.payload, adv, self.pad_id, group_id=gid, rows=rows)
        return batch, {f"adv/{k}": float(v) for k, v in adv_metrics.items()}

    def _forward(
        self, model: torch.nn.Module, mb: PolicyBatch, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
        return token_logprobs(logits, mb.input_ids, self.config.temperature, with_entropy=entropy)

    def _pass(self, local: PolicyBatch, normaliser: float, grad: bool) -> _PassTotals:
        """Forward (and backward when ``grad``) over ``local`` in micro-batches; sums for the metrics."""
        c = self.config
        tot = _PassTotals()
        for idx in _chunks(len(local), c.micro_batch):
            mb = local.select(idx).to(self.device)
            with torch.set_grad_enabled(grad):
                lp, ent = self._forward(self.model, mb, c.compute_entropy)
                ref = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref, _ = self._forward(self.ref_model, mb, False)
                loss, m = policy_loss(
                    lp,
                    mb.old_logprobs,
                    mb.advantages,
                    mb.completion_mask,
                    clip_eps=c.clip_eps,
                    clip_eps_high=c.clip_eps_high,
                    aggregation=c.aggregation,
                    ref_logprobs=ref,
                    kl_coef=c.kl_coef,
                    normaliser=normaliser,
                    entropy=ent,
                )
                if grad:
                    loss.backward()
            with torch.no_grad():
                mask = mb.completion_mask
                diff = float(((lp.detach() - mb.old_logprobs).abs() * mask).sum())
            n = m["n_tokens"]
            tot.loss += float(loss.detach())
            tot.pg_loss += m["pg_loss"]
            for k in _TOKEN_METRICS:
                tot.token_sums[k] += diff if k == "old_logprob_abs_diff" else m[k] * n
            tot.ratio_max = max(tot.ratio_max, m["ratio_max"])
        return tot

    @torch.no_grad()
    def _rescore_reused(self, local: PolicyBatch, train_batch: TrainBatch) -> int:
        """Give rows whose payload says ``reused`` (a completion an allocator kept from an earlier step, AR3PO's
        response reuse) the current policy's log-probs as their old log-probs, so their importance ratio starts
        at 1: the sampling policy that scored them is gone. This is what a trainer that recomputes every old
        log-prob before the update (verl, the sources' trainer) does for them. Returns how many rows of the whole
        batch are reused."""
        payload = train_batch.rollouts.payload
        reused = np.fromiter((isinstance(p, Mapping) and bool(p.get("reused")) for p in payload), bool, len(payload))
        if not reused.any():
            return 0
        sel = np.flatnonzero(reused[local.row.cpu().numpy()])
        for idx in _chunks(len(sel), self.config.micro_batch):
            rows = sel[idx]
            mb = local.select(rows, trim=False).to(self.device)
            lp, _ = self._forward(self.model, mb, False)
            fresh = (lp * mb.completion_mask).to(local.old_logprobs.device, local.old_logprobs.dtype)
            local.old_logprobs[torch.as_tensor(rows)] = fresh
        return int(reused.sum())

    def _reduce(self, values: list[float], grads: bool) -> tuple[list[float], list[torch.Tensor] | None]:
        """Sum ``values`` (float64) and, with ``grads``, every parameter's gradient over ranks.

        Gradients travel as one flat float32 buffer (4 bytes per parameter of
        extra memory); ranks whose shard is empty contribute zeros.
        """
        flat_grads = None
        if grads:
            for p in self.params:
                if p.grad is None:  # same treatment on every rank and in single-process runs
                    p.grad = torch.zeros_like(p)
            flat_grads = [p.grad for p in self.params]
        if self.world == 1:
            return values, flat_grads
        vals = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(vals, op=dist.ReduceOp.SUM)
        if flat_grads is not None:
            buf = torch.cat([g.reshape(-1).float() for g in flat_grads])
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            off = 0
            for g in flat_grads:
                g.copy_(buf[off : off + g.numel()].view_as(g))
                off += g.numel()
        return vals.tolist(), flat_grads

    def _epoch(self, local: PolicyBatch, normaliser: float, n_tokens: float, update: bool) -> dict[str, Any]:
        """One pass over this rank's rows: losses and gradients reduced over ranks, then (``update``) the clipped
        optimizer step. A non-finite loss or gradient norm skips the step and clears the gradients."""
        if update:
            self.optimizer.zero_grad(set_to_none=False)
        tot = self._pass(local, normaliser, grad=update)
        vals = [tot.loss, tot.pg_loss, *(tot.token_sums[k] for k in _TOKEN_METRICS)]
        vals, grads = self._reduce(vals, grads=update)
        if self.world > 1:
            rmax = torch.tensor([tot.ratio_max], dtype=torch.float64, device=self.device)
            dist.all_reduce(rmax, op=dist.ReduceOp.MAX)
            tot.ratio_max = float(rmax)
        gnorm = float(torch.nn.utils.get_total_norm(grads, 2.0)) if grads is not None else 0.0
        e = {"loss": vals[0], "pg_loss": vals[1], "grad_norm": gnorm, "ratio_max": tot.ratio_max,
             **dict(zip(_TOKEN_METRICS, (v / max(n_tokens, 1.0) for v in vals[2:])))}
        e["finite"] = math.isfinite(e["loss"]) and math.isfinite(gnorm)
        if not e["finite"]:
            if update:
                self.optimizer.zero_grad(set_to_none=True)
            return e
        if grads is not None:
            if self.config.grad_clip is not None:
                torch.nn.utils.clip_grads_with_norm_(self.params, self.config.grad_clip, torch.tensor(gnorm))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps += 1
        return e

    def _run(self, train_batch: TrainBatch, update: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        c = self.config
        batch, adv_metrics = self.prepare(train_batch)
        normaliser = loss_normaliser(batch.completion_mask, c.aggregation)
        n_tokens = float(batch.n_tokens)
        out: dict[str, float] = {
            "loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "grad_norm": 0.0,
            **{k: 0.0 for k in _TOKEN_METRICS if k != "kl_ref"},
            "ratio_max": 0.0, "n_sequences": float(len(batch)), "n_tokens": n_tokens,
            "updates": 0.0, "skipped": 0.0, "nonfinite": 0.0, "reused_sequences": 0.0,
        }
        out.update(adv_metrics)
        if len(batch) == 0 or normaliser <= 0:
            out["skipped"] = 1.0
            out["seconds"] = time.perf_counter() - t0
            return out

        local = batch.select(shard_rows(len(batch), self.rank, self.world))
        was_training = self.model.training
        self.model.eval()
        out["reused_sequences"] = float(self._rescore_reused(local, train_batch))
        epochs = c.epochs if update else 1
        sums = {k: 0.0 for k in ("loss", "pg_loss", "grad_norm", *_TOKEN_METRICS)}
        done = 0
        try:
            for _ in range(epochs):
                e = self._epoch(local, normaliser, n_tokens, update)
                if not e["finite"]:
                    out["nonfinite"] = 1.0
                    out["loss"], out["grad_norm"] = e["loss"], e["grad_norm"]
                    break
                done += 1
                for k in sums:
                    sums[k] += e[k]
                out["ratio_max"] = max(out["ratio_max"], e["ratio_max"])
        finally:
            self.model.train(was_training)
        if done:
            for k, v in sums.items():
                out["kl" if k == "kl_ref" else k] = v / done
        out.pop("kl_ref", None)
        out["updates"] = float(done if update else 0)
        out["seconds"] = time.perf_counter() - t0
        return out


__all__ = ["GRPOTrainer", "TrainerConfig", "dist_rank_world", "shard_rows"]
