"""Two gloo ranks on CPU apply the same update as one process on the whole batch."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr_core.grpo.trainer import GRPOTrainer, TrainerConfig
from rlvr_core.types import Rollouts, TrainBatch

PAD, BOS, EOS, VOCAB = 0, 1, 2, 24
AGGREGATIONS = ("token_mean", "seq_mean_token_mean")


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
    )
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def make_batch(model: torch.nn.Module, seed: int) -> TrainBatch:
    """Ragged groups (sizes 3, 1, 5, 2, 4), random completions scored by ``model`` at temperature 1."""
    rng = np.random.default_rng(seed)
    payloads, gid, rew = [], [], []
    for g, k in enumerate([3, 1, 5, 2, 4]):
        prompt = [BOS] + rng.integers(3, VOCAB, size=int(rng.integers(2, 5))).tolist()
        for j in range(k):
            comp = rng.integers(3, VOCAB, size=int(rng.integers(1, 8))).tolist() + [EOS]
            ids = torch.tensor([prompt + comp])
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            payloads.append(dict(prompt_id=g, text="", prompt_ids=prompt, completion_ids=comp,
                                 logprobs=lp[len(prompt) - 1 :].tolist()))
            gid.append(g)
            rew.append(float(j % 2) if g != 2 else float(rng.integers(0, 2)))
    r, gid_arr = np.asarray(rew), np.asarray(gid, dtype=np.int64)
    eff = np.array([np.ptp(r[gid_arr == g]) > 0 for g in range(5)])
    return TrainBatch(Rollouts(gid_arr, r, np.array([len(p["completion_ids"]) for p in payloads]), payloads),
                      gid_arr, eff)


def run_training(aggregation: str, model_seed: int) -> tuple[list[torch.Tensor], list[dict[str, float]]]:
    """Two steps on two batches; returns the final parameters and each step's metrics."""
    scorer = tiny_model(0)
    batches = [make_batch(scorer, 1), make_batch(scorer, 2)]
    model = tiny_model(model_seed)
    cfg = TrainerConfig(lr=1e-3, aggregation=aggregation, micro_batch=2)
    trainer = GRPOTrainer(model, cfg, pad_id=PAD)
    metrics = [trainer.step(b) for b in batches]
    return [p.detach().clone() for p in model.parameters()], metrics


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for agg in AGGREGATIONS:
            # rank 1 starts from different weights: the trainer must broadcast rank 0's
            results[agg] = run_training(agg, model_seed=rank)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_match_single_process(tmp_path: Path):
    world = 2
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for agg in AGGREGATIONS:
        single_params, single_metrics = run_training(agg, model_seed=0)
        start = [p.detach() for p in tiny_model(0).parameters()]
        assert any(not torch.allclose(a, b) for a, b in zip(single_params, start))  # it did move
        for r in range(world):
            params, metrics = ranks[r][agg]
            for a, b in zip(params, single_params):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
            for ms, md in zip(single_metrics, metrics):
                assert md["updates"] == ms["updates"] == 1
                assert md["n_sequences"] == ms["n_sequences"] and md["n_tokens"] == ms["n_tokens"]
                for k in ("loss", "grad_norm", "clip_frac", "approx_kl", "entropy", "ratio_max"):
                    assert md[k] == pytest.approx(ms[k], rel=1e-5, abs=1e-7), (agg, k)
