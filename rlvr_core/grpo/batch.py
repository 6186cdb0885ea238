"""Collate rollout payloads into padded tensors for the policy update.

A model engine attaches one payload per rollout::

    dict(prompt_id=int, text=str,
         prompt_ids=list[int],      # prompt tokens, bos included
         completion_ids=list[int],  # generated tokens, eos included when produced
         logprobs=list[float])      # sampling log-probs of completion_ids (same length)

Row i of the batch is ``prompt_ids + completion_ids`` right-padded to L. Logits
at position t predict token t + 1, so with P prompt tokens and C completion
tokens the completion is scored at positions P - 1 .. P + C - 2: that is where
``completion_mask`` is 1 and where ``old_logprobs`` holds the sampling scores.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np
import torch


@dataclass
class PolicyBatch:
    """N sequences ready for a forward pass (all tensors on one device).

    input_ids:       (N, L) int64, prompt + completion, right-padded with pad_id
    attention_mask:  (N, L) int64, 1 on real tokens
    completion_mask: (N, L) float32, 1 where the next-token prediction at t is a completion token
    old_logprobs:    (N, L) float32, sampling log-prob of token t + 1 where completion_mask is 1, else 0
    advantages:      (N,) float32
    group_id:        (N,) int64
    row:             (N,) int64, index of each sequence in the source TrainBatch
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    group_id: torch.Tensor
    row: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        """Completion tokens scored in this batch."""
        return int(self.completion_mask.sum().item())

    def select(self, idx: Sequence[int] | np.ndarray | torch.Tensor, trim: bool = True) -> "PolicyBatch":
        """Rows ``idx`` (in that order); with ``trim`` drop trailing all-pad columns."""
        idx_t = torch.as_tensor(np.asarray(idx, dtype=np.int64)).to(self.input_ids.device)
        parts = {f.name: getattr(self, f.name).index_select(0, idx_t) for f in fields(self)}
        out = PolicyBatch(**parts)
        if trim and len(out):
            width = int(out.attention_mask.sum(dim=1).max().item())
            width = max(width, 1)
            for name in ("input_ids", "attention_mask", "completion_mask", "old_logprobs"):
                setattr(out, name, getattr(out, name)[:, :width])
        return out

    def to(self, device: str | torch.device) -> "PolicyBatch":
        return PolicyBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def _field(payload: Any, key: str, row: int) -> Any:
    if not isinstance(payload, Mapping):
        raise TypeError(
            f"rollout row {row}: payload must be a mapping with prompt_ids, completion_ids and logprobs, "
            f"got {type(payload).__name__}; use a model engine (hf, vllm), not the simulated one"
        )
    if key not in payload:
        raise KeyError(f"rollout row {row}: payload has no {key!r} (keys: {sorted(payload)}); "
                       "the engine must record it")
    return payload[key]


def collate(
    payloads: Sequence[Mapping[str, Any]],
    advantages: Sequence[float] | np.ndarray | torch.Tensor,
    pad_id: int,
    *,
    group_id: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    rows: Sequence[int] | np.ndarray | None = None,
    device: str | torch.device = "cpu",
) -> PolicyBatch:
    """Pad the payloads of ``rows`` (default: all) into a ``PolicyBatch``.

    payloads:   length-R list of engine payloads (see module docstring)
    advantages: (R,) one advantage per payload row
    group_id:   (R,) group of each row (default: all zeros)
    rows:       indices into the R rows to keep (e.g. rows of effective groups), in order
    """
    n_all = len(payloads)
    adv_all = _per_row(advantages, n_all, torch.float64, "advantages")
    gid_all = torch.zeros(n_all, dtype=torch.int64) if group_id is None else \
        _per_row(group_id, n_all, torch.int64, "group_id")
    row_idx = np.arange(n_all, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
    if len(row_idx) and (row_idx.min() < 0 or row_idx.max() >= n_all):
        raise IndexError(f"rows must lie in [0, {n_all}), got min {row_idx.min()} max {row_idx.max()}")
    seqs, olds, prompt_lens = _read_rows(payloads, row_idx)
    input_ids, attention, cmask, old = _pad(seqs, olds, prompt_lens, pad_id)
    sel = torch.as_tensor(row_idx)
    batch = PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=cmask,
        old_logprobs=old,
        advantages=adv_all.index_select(0, sel).to(torch.float32),
        group_id=gid_all.index_select(0, sel),
        row=sel.clone(),
    )
    return batch.to(device)


def _per_row(values: Any, n: int, dtype: torch.dtype, name: str) -> torch.Tensor:
    """``values`` as a (n,) tensor of ``dtype`` on the CPU; one value per payload row."""
    if isinstance(values, torch.Tensor):
        t = values.detach().cpu().to(dtype)
    else:
        t = torch.as_tensor(np.asarray(values, dtype=np.float64 if dtype == torch.float64 else np.int64))
    if t.shape != (n,):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({n},): one per payload")
    return t


def _read_rows(payloads: Sequence[Mapping[str, Any]], row_idx: np.ndarray
               ) -> tuple[list[list[int]], list[list[float]], list[int]]:
    """Token ids (prompt + completion), sampling log-probs and prompt lengths of the kept rows, checked."""
    seqs: list[list[int]] = []
    olds: list[list[float]] = []
    prompt_lens: list[int] = []
    for r in row_idx.tolist():
        p = payloads[r]
        prompt = list(_field(p, "prompt_ids", r))
        comp = list(_field(p, "completion_ids", r))
        lp = list(_field(p, "logprobs", r))
        if not prompt:
            raise ValueError(f"rollout row {r}: prompt_ids is empty; it must hold at least the bos token")
        if len(lp) != len(comp):
            raise ValueError(
                f"rollout row {r}: {len(lp)} logprobs for {len(comp)} completion_ids; "
                "the engine must record one sampling log-prob per generated token"
            )
        seqs.append(prompt + comp)
        olds.append([float(x) for x in lp])
        prompt_lens.append(len(prompt))
    return seqs, olds, prompt_lens


def _pad(seqs: list[list[int]], olds: list[list[float]], prompt_lens: list[int], pad_id: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask, completion mask and old log-probs (aligned to next-token logits)."""
    n = len(seqs)
    width = max((len(s) for s in seqs), default=1)
    input_ids = torch.full((n, width), int(pad_id), dtype=torch.int64)
    attention = torch.zeros((n, width), dtype=torch.int64)
    cmask = torch.zeros((n, width), dtype=torch.float32)
    old = torch.zeros((n, width), dtype=torch.float32)
    for i, (s, lp, plen) in enumerate(zip(seqs, olds, prompt_lens)):
        input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        attention[i, : len(s)] = 1
        if lp:
            start = plen - 1  # logits at plen - 1 predict the first completion token
            cmask[i, start : start + len(lp)] = 1.0
            old[i, start : start + len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return input_ids, attention, cmask, old


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token under ``softmax(logits / temperature)``.

    logits: (N, L, V), input_ids: (N, L) -> logprobs (N, L) where column t scores
    token t + 1 (the last column is 0), and optionally the entropy (N, L) of the
    same distribution (detached; for metrics).
    """
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    nxt = input_ids[:, 1:]
    head = scaled[:, :-1]
    lse = torch.logsumexp(head, dim=-1)
    lp = head.gather(-1, nxt.unsqueeze(-1)).squeeze(-1) - lse
    lp = torch.nn.functional.pad(lp, (0, 1))
    ent = None
    if with_entropy:
        with torch.no_grad():
            logp = torch.log_softmax(head, dim=-1)
            ent = torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (0, 1))
    return lp, ent


__all__ = ["PolicyBatch", "collate", "token_logprobs"]
