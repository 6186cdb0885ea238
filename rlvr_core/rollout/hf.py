"""Rollout engine on a transformers causal LM (CPU or GPU), docs/design.md §2.5 ``hf``.

Sampling is a small KV-cache loop of our own rather than ``model.generate``:
it draws from a private ``torch.Generator`` (determinism by seed without
touching the global RNG), returns the exact log-probs of the distribution it
sampled from, and on the tiny CPU policy it is faster (see ``generate``).

One ``generate(requests)`` call is one allocation round: every prompt id p is
repeated ``requests[p]`` times, the rows are cut into micro-batches of at most
``micro_batch`` sequences, and each micro-batch is one batched sampling loop
that stops when every row has written ``<eos>`` or ``max_new_tokens`` tokens.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from rlvr_core.errors import OutOfMemory, is_out_of_memory, require
from rlvr_core.rollout.base import RolloutEngine, check_sampling, encode_prompt_pool, prompt_sequences
from rlvr_core.types import Rollouts

_SEED_STRIDE = 1_000_003  # call c of an engine with seed s samples with seed s * stride + c


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists: returns input_ids (B, L) int64 and attention_mask (B, L) int64."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of tokens whose probability reaches ``top_p``.

    logits: (B, V) float, already temperature-scaled. Returns (B, V) with the
    dropped tokens at -inf (the most likely token is always kept).
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class HFEngine(RolloutEngine):
    """RolloutEngine sampling from a transformers causal LM.

    Args:
        model: a ``*ForCausalLM``; shared with the trainer unless a state dict is
            pushed with ``update_weights(state)``. Its train/eval mode is restored
            after every call.
        tokenizer: its tokenizer (pad, bos and eos ids set; ``<bos>`` added on encode).
        prompts: the prompt pool; ``generate`` requests index into it.
        temperature: sampling temperature (> 0); log-probs are of logits / temperature.
        top_p: nucleus sampling mass in (0, 1]; with top_p < 1 the log-probs are of
            the renormalised truncated distribution actually sampled from.
        max_new_tokens: generation cap per rollout (``<eos>`` included).
        seed: sampling seed; call c uses a seed derived from (seed, c), so the same
            seed and the same sequence of requests give the same rollouts.
        micro_batch: most sequences per forward pass (results depend on it only
            through the order in which random numbers are drawn).
        device: where the model runs ("cpu", "cuda").
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[str],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 8,
        seed: int = 0,
        micro_batch: int = 512,
        device: str | torch.device = "cpu",
    ) -> None:
        check_sampling(temperature, top_p, max_new_tokens)
        require(isinstance(micro_batch, int) and micro_batch >= 1, "micro_batch",
                f"must be an int >= 1, got {micro_batch!r}")
        for name in ("pad_token_id", "eos_token_id"):
            require(getattr(tokenizer, name, None) is not None, f"tokenizer.{name}", "must be set")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = max_new_tokens
        self.seed = int(seed)
        self.micro_batch = micro_batch
        self.device = torch.device(device)
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        self.calls = 0  # generate() calls so far; advances the sampling seed
        # transformers 5 renamed the KV-cache argument ``past_key_values`` -> ``cache``
        params = inspect.signature(type(model).forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.prompts: list[str] = []
        self.prompt_ids: list[list[int]] = []
        self.set_prompts(prompts)

    # ------------------------------------------------------------------ prompts
    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        return encode_prompt_pool(self.tokenizer, prompts)

    def set_prompts(self, prompts: Sequence[str]) -> None:
        """Replace the prompt pool (prompt ids index into it); tokenised once here."""
        self.prompts = list(prompts)
        self.prompt_ids = self._encode(self.prompts)

    # --------------------------------------------------------------- sampling
    def _forward_loop(
        self, seqs: Sequence[Sequence[int]], max_new: int, generator: torch.Generator | None
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Decode up to ``max_new`` tokens for each of B token lists (one batch).

        Sampling when ``generator`` is given (temperature / top_p of the engine),
        argmax otherwise. Returns completion ids (eos included when written) and
        their per-token log-probs, both lists of B lists.
        """
        model = self.model
        ids, mask = _left_pad(seqs, self.pad_id, self.device)
        b = ids.shape[0]
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        out_tok = torch.empty((b, max_new), dtype=torch.long, device=self.device)
        out_lp = torch.zeros((b, max_new), dtype=torch.float32, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        lengths = torch.full((b,), max_new, dtype=torch.long, device=self.device)
        past = None
        step_ids, step_pos = ids, pos
        n_steps = 0
        for t in range(max_new):
            kwargs = {self._cache_kw: past} if past is not None else {}
            out = model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos, use_cache=True, logits_to_keep=1,
                **kwargs,
            )
            past = getattr(out, "cache", None) if self._cache_kw == "cache" else out.past_key_values
            logits = out.logits[:, -1, :].float()
            if generator is None:
                nxt = logits.argmax(-1)
                lp = torch.log_softmax(logits, -1).gather(-1, nxt[:, None])[:, 0]
            else:
                scaled = top_p_filter(logits / self.temperature, self.top_p)
                logp = torch.log_softmax(scaled, -1)
                nxt = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
                lp = logp.gather(-1, nxt[:, None])[:, 0]
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            out_tok[:, t] = nxt
            out_lp[:, t] = lp
            newly = (~done) & (nxt == self.eos_id)
            lengths = torch.where(newly, torch.full_like(lengths, t + 1), lengths)
            done = done | newly
            n_steps = t + 1
            if bool(done.all()):
                break
            step_ids = nxt[:, None]
            step_pos = step_pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=mask.device)], dim=1)
        toks = out_tok[:, :n_steps].tolist()
        lps = out_lp[:, :n_steps].tolist()
        lens = lengths.clamp_max(n_steps).tolist()
        return [toks[i][: lens[i]] for i in range(b)], [lps[i][: lens[i]] for i in range(b)]

    def _run(
        self, seqs: list[list[int]], max_new: int, generator: torch.Generator | None
    ) -> tuple[list[list[int]], list[list[float]]]:
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        comp: list[list[int]] = []
        lps: list[list[float]] = []
        try:
            with torch.inference_mode():
                for start in range(0, len(seqs), self.micro_batch):
                    chunk = seqs[start : start + self.micro_batch]
                    try:
                        c, lp = self._forward_loop(chunk, max_new, generator)
                    except Exception as e:  # noqa: BLE001 - only out-of-memory is translated
                        if not is_out_of_memory(e):
                            raise
                        raise self._out_of_memory(e, chunk, max_new) from e
                    comp.extend(c)
                    lps.extend(lp)
        finally:
            if was_training:
                self.model.train()
        return comp, lps

    def _out_of_memory(self, e: BaseException, chunk: Sequence[Sequence[int]], max_new: int) -> OutOfMemory:
        """OutOfMemory naming the batch that did not fit and what to reduce (the same batch would fail again)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        longest = max((len(s) for s in chunk), default=0)
        return OutOfMemory(
            f"generation ran out of memory on {self.device} for {len(chunk)} sequences of up to {longest} prompt "
            f"tokens + {max_new} new tokens ({e.__class__.__name__}: {str(e)[:300]}); reduce the prompt length, "
            f"train.max_new_tokens (now {self.max_new_tokens}) or the sequences per forward pass "
            f"(train.engine_options.micro_batch, now {self.micro_batch}); retrying the same batch cannot help")

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def generate(self, requests: Mapping[int, int]) -> Rollouts:
        """Sample ``requests[p]`` completions of prompt ``p`` for every requested p.

        Returns R = sum(requests.values()) rollouts in request order (prompt ids
        grouped), reward 0.0 (the caller's verifier scores them), tokens = generated
        tokens including ``<eos>``, and payload dicts with prompt_id, text (no
        special tokens), prompt_ids (bos included), completion_ids (eos included
        when produced) and logprobs (one per completion id, float).
        """
        order: list[int] = []
        for p, n in requests.items():
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= int(p) < len(self.prompts):
                raise ValueError(f"requests: prompt id {p!r} is outside the prompt pool [0, {len(self.prompts)})")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise ValueError(f"requests[{p}]: need a non-negative int count, got {n!r}")
            order.extend([int(p)] * int(n))
        call = self.calls
        self.calls += 1
        if not order:
            return Rollouts(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), [])
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.seed * _SEED_STRIDE + call)
        seqs = [self.prompt_ids[p] for p in order]
        comp, lps = self._run(seqs, self.max_new_tokens, gen)
        payload = [
            {
                "prompt_id": p,
                "text": self._decode(c),
                "prompt_ids": list(self.prompt_ids[p]),
                "completion_ids": c,
                "logprobs": lp,
            }
            for p, c, lp in zip(order, comp, lps)
        ]
        return Rollouts(
            prompt_id=np.asarray(order, dtype=np.int64),
            reward=np.zeros(len(order)),
            tokens=np.asarray([len(c) for c in comp], dtype=np.int64),
            payload=payload,
        )

    def greedy(self, prompts: Sequence[str] | Sequence[int], max_new_tokens: int | None = None) -> list[str]:
        """Argmax completions (text without special tokens), batched by ``micro_batch``.

        ``prompts`` are either strings or ids into the engine's prompt pool.
        """
        items = list(prompts)
        if not items:
            return []
        seqs = prompt_sequences(self.tokenizer, self.prompt_ids, items)
        comp, _ = self._run(seqs, max_new_tokens or self.max_new_tokens, None)
        return [self._decode(c) for c in comp]

    def update_weights(self, state: Mapping[str, torch.Tensor] | None = None) -> None:
        """Load ``state`` (a state dict) into the engine's model in place.

        With ``state=None`` nothing happens: the engine shares the trainer's model
        object, so it already samples from the updated weights.
        """
        if state is not None:
            self.model.load_state_dict(state, strict=True)

    def state_dict(self) -> dict[str, int]:
        """Sampling state for checkpoints (the model weights are saved elsewhere)."""
        return {"seed": self.seed, "calls": self.calls}

    @classmethod
    def fresh_state(cls, seed: int) -> dict[str, int]:
        """``state_dict()`` of an engine built with ``seed`` that has not generated yet."""
        return {"seed": int(seed), "calls": 0}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.seed = int(state["seed"])
        self.calls = int(state["calls"])


__all__ = ["HFEngine", "top_p_filter"]
