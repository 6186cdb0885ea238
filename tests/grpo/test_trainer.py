"""Collate alignment and the GRPO trainer on a tiny random Llama."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr_core.errors import ConfigError
from rlvr_core.grpo.batch import collate, token_logprobs
from rlvr_core.grpo.trainer import GRPOTrainer, TrainerConfig, prompt_weights, shard_rows
from rlvr_core.types import Rollouts, TrainBatch

PAD, BOS, EOS, VOCAB = 0, 1, 2, 24


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
    )
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def score(model: torch.nn.Module, prompt: list[int], comp: list[int], temperature: float) -> list[float]:
    """Log-probs of ``comp`` given ``prompt`` from one unpadded forward (what a sampler records)."""
    ids = torch.tensor([prompt + comp])
    logits = model(input_ids=ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(prompt) - 1 :].tolist()


def make_batch(model, sizes, *, temperature=1.0, seed=0, rewards=None) -> TrainBatch:
    """Ragged groups of random completions scored by ``model``; rewards 0/1 at random unless given."""
    rng = np.random.default_rng(seed)
    payloads, pid, rew, gid = [], [], [], []
    for g, k in enumerate(sizes):
        prompt = [BOS] + rng.integers(3, VOCAB, size=int(rng.integers(2, 6))).tolist()
        for _ in range(k):
            comp = rng.integers(3, VOCAB, size=int(rng.integers(1, 7))).tolist()
            if rng.random() < 0.7:
                comp.append(EOS)
            payloads.append(dict(prompt_id=g, text="", prompt_ids=prompt, completion_ids=comp,
                                 logprobs=score(model, prompt, comp, temperature)))
            pid.append(g)
            gid.append(g)
            rew.append(float(rng.integers(0, 2)))
    rew_arr = np.asarray(rewards if rewards is not None else rew, dtype=np.float64)
    gid_arr = np.asarray(gid, dtype=np.int64)
    eff = np.array([rew_arr[gid_arr == g].std() > 0 for g in range(len(sizes))])
    ro = Rollouts(np.asarray(pid), rew_arr, np.array([len(p["completion_ids"]) for p in payloads]), payloads)
    return TrainBatch(ro, gid_arr, eff)


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- collate


def test_collate_aligns_completion_mask_and_old_logprobs():
    payloads = [
        dict(prompt_ids=[1, 5, 6], completion_ids=[7, 8, 2], logprobs=[-0.1, -0.2, -0.3]),
        dict(prompt_ids=[1, 9], completion_ids=[10], logprobs=[-0.5]),
        dict(prompt_ids=[1], completion_ids=[4, 4], logprobs=[-1.0, -2.0]),
    ]
    b = collate(payloads, [1.0, -1.0, 0.5], pad_id=PAD, group_id=[0, 0, 1])
    assert b.input_ids.tolist() == [[1, 5, 6, 7, 8, 2], [1, 9, 10, 0, 0, 0], [1, 4, 4, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    # logits at t predict token t+1: row 0 completion tokens sit at 3..5, predicted from 2..4
    assert b.completion_mask.tolist() == [[0, 0, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert b.old_logprobs[0, 2:5].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert b.old_logprobs[1, 1].item() == pytest.approx(-0.5)
    assert b.old_logprobs[2, :2].tolist() == pytest.approx([-1.0, -2.0])
    assert (b.old_logprobs[b.completion_mask == 0] == 0).all()
    for i in range(3):  # the masked positions predict exactly the completion tokens
        predicted = b.input_ids[i, 1:][b.completion_mask[i, :-1] > 0].tolist()
        assert predicted == payloads[i]["completion_ids"]
    assert b.advantages.tolist() == [1.0, -1.0, 0.5]
    assert b.group_id.tolist() == [0, 0, 1]
    assert b.n_tokens == 6

    sub = collate(payloads, [1.0, -1.0, 0.5], pad_id=PAD, rows=[2, 1])
    assert sub.row.tolist() == [2, 1]
    assert sub.input_ids.shape == (2, 3)
    assert sub.advantages.tolist() == [0.5, -1.0]
    trimmed = b.select([1, 2])
    assert trimmed.input_ids.shape == (2, 3) and trimmed.completion_mask.sum() == 3


def test_collate_rejects_bad_payloads():
    with pytest.raises(ValueError, match="row 0.*2 logprobs for 1 completion_ids"):
        collate([dict(prompt_ids=[1], completion_ids=[3], logprobs=[-1.0, -1.0])], [0.0], PAD)
    with pytest.raises(KeyError, match="row 1.*'logprobs'"):
        collate([dict(prompt_ids=[1], completion_ids=[3], logprobs=[-1.0]),
                 dict(prompt_ids=[1], completion_ids=[3])], [0.0, 0.0], PAD)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        collate([dict(prompt_ids=[], completion_ids=[3], logprobs=[-1.0])], [0.0], PAD)
    with pytest.raises(TypeError, match="mapping"):
        collate([None], [0.0], PAD)
    with pytest.raises(ValueError, match="advantages"):
        collate([dict(prompt_ids=[1], completion_ids=[3], logprobs=[-1.0])], [0.0, 1.0], PAD)


def test_recomputed_logprobs_match_hf_sampling_scores():
    """Left-padded HF sampling at temperature 0.7 vs the trainer's right-padded recompute: ratio 1."""
    model = tiny_model(1).eval()
    temperature = 0.7
    prompts = [[BOS, 5, 6, 7], [BOS, 9], [BOS, 3, 4]]
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    attn = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    torch.manual_seed(3)
    out = model.generate(
        input_ids=ids, attention_mask=attn, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
        max_new_tokens=6, pad_token_id=PAD, eos_token_id=EOS, output_logits=True, return_dict_in_generate=True,
    )
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / temperature  # (N, T, V) raw logits per step
    lps = torch.log_softmax(logits, -1).gather(-1, new[..., None])[..., 0]
    payloads, gid = [], []
    for i, p in enumerate(prompts):
        comp = new[i].tolist()
        n = comp.index(EOS) + 1 if EOS in comp else len(comp)
        payloads.append(dict(prompt_id=i, text="", prompt_ids=p, completion_ids=comp[:n], logprobs=lps[i, :n].tolist()))
        gid.append(i)
    rewards = [1.0, 0.0, 1.0]
    ro = Rollouts(np.arange(3), rewards, np.array([len(p["completion_ids"]) for p in payloads]), payloads)
    tb = TrainBatch(ro, np.zeros(3, np.int64), np.array([True]))
    trainer = GRPOTrainer(model, TrainerConfig(temperature=temperature), pad_id=PAD)
    m = trainer.evaluate(tb)
    assert m["n_tokens"] == sum(len(p["completion_ids"]) for p in payloads)
    assert m["old_logprob_abs_diff"] < 1e-5
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["approx_kl"] < 1e-9 and m["clip_frac"] == 0.0
    # the same scores at the wrong temperature do not match: the check can fail
    wrong = GRPOTrainer(model, TrainerConfig(temperature=1.0), pad_id=PAD).evaluate(tb)
    assert wrong["old_logprob_abs_diff"] > 1e-2


def test_token_logprobs_shapes_and_entropy():
    logits = torch.randn(2, 4, VOCAB)
    ids = torch.randint(0, VOCAB, (2, 4))
    lp, ent = token_logprobs(logits, ids, temperature=2.0, with_entropy=True)
    ref = torch.log_softmax(logits / 2.0, -1)
    assert lp.shape == ent.shape == (2, 4)
    assert torch.allclose(lp[:, :3], ref[:, :3].gather(-1, ids[:, 1:, None])[..., 0], atol=1e-6)
    assert (lp[:, 3] == 0).all()
    assert torch.allclose(ent[:, :3], -(ref.exp() * ref).sum(-1)[:, :3], atol=1e-6)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(lr=0.0), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(betas=(0.9,)), "betas"),
        (dict(betas=(0.9, 1.0)), "betas"),
        (dict(clip_eps=0.0), "clip_eps"),
        (dict(clip_eps_high=-0.1), "clip_eps_high"),
        (dict(grad_clip=0.0), "grad_clip"),
        (dict(advantage="grpoo"), "advantage"),
        (dict(aggregation="mean"), "aggregation"),
        (dict(group_weight="group"), "group_weight"),
        (dict(kl_coef=-1.0), "kl_coef"),
        (dict(temperature=0.0), "temperature"),
        (dict(micro_batch=0), "micro_batch"),
        (dict(epochs=1.5), "epochs"),
        (dict(weight_decay=-0.1), "weight_decay"),
    ],
)
def test_config_rejects_impossible_settings(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        TrainerConfig(**kwargs)


def test_config_defaults_and_kl_needs_reference():
    c = TrainerConfig(betas=[0.8, 0.9])
    assert c.betas == (0.8, 0.9) and c.lr == 1e-4 and c.advantage == "grpo" and c.only_effective
    with pytest.raises(ConfigError, match="^kl_coef:.*ref_model"):
        GRPOTrainer(tiny_model(), TrainerConfig(kl_coef=0.1), pad_id=PAD)


def test_shard_rows_partitions_contiguously():
    for n in (0, 1, 5, 8, 11):
        for world in (1, 2, 3):
            shards = [shard_rows(n, r, world) for r in range(world)]
            assert np.concatenate(shards).tolist() == list(range(n))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(ValueError):
        shard_rows(4, 2, 2)


# ---------------------------------------------------------------- trainer


SIZES = [4, 1, 3, 6, 2, 5]


def test_step_changes_parameters_and_lowers_loss():
    model = tiny_model()
    tb = make_batch(model, SIZES, temperature=0.8, seed=1)
    assert tb.effective.any() and not tb.effective.all()
    trainer = GRPOTrainer(model, TrainerConfig(lr=1e-3, temperature=0.8), pad_id=PAD)
    before = params(model)
    m0 = trainer.evaluate(tb)
    m = trainer.step(tb)
    m1 = trainer.evaluate(tb)
    assert not same(before, params(model))
    assert m["skipped"] == 0 and m["nonfinite"] == 0 and m["updates"] == 1
    assert m["loss"] == pytest.approx(m0["loss"], abs=1e-6)  # step reports the pre-update loss
    assert m1["loss"] < m0["loss"] - 1e-4
    assert m["grad_norm"] > 0 and m["seconds"] > 0
    eff_rows = tb.effective[tb.group_id]
    assert m["n_sequences"] == eff_rows.sum()
    assert m["n_tokens"] == sum(len(p["completion_ids"]) for p, e in zip(tb.rollouts.payload, eff_rows) if e)
    assert m["old_logprob_abs_diff"] < 1e-5 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m1["approx_kl"] > 0 and m1["ratio_mean"] != pytest.approx(1.0, abs=1e-6)
    assert 0 < m["entropy"] < math.log(VOCAB) + 1e-6
    for k, v in m.items():
        assert isinstance(v, float), k


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_micro_batching_gives_the_same_update(aggregation):
    tb = make_batch(tiny_model(), SIZES, seed=2)
    results = []
    for micro in (256, 3):
        model = tiny_model()
        tr = GRPOTrainer(model, TrainerConfig(aggregation=aggregation, micro_batch=micro, only_effective=False),
                         pad_id=PAD)
        m = tr.step(tb)
        results.append((params(model), m))
    (pa, ma), (pb, mb) = results
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(pa, pb))
    assert ma["loss"] == pytest.approx(mb["loss"], abs=1e-6)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-5)
    assert ma["n_sequences"] == sum(SIZES)


def test_batch_without_effective_group_is_skipped():
    model = tiny_model()
    tb = make_batch(model, [3, 1, 4], rewards=[1, 1, 1, 0, 0, 0, 0, 0])
    assert not tb.effective.any()
    trainer = GRPOTrainer(model, TrainerConfig(), pad_id=PAD)
    before = params(model)
    m = trainer.step(tb)
    assert m["skipped"] == 1 and m["updates"] == 0 and m["n_sequences"] == 0
    assert same(before, params(model))
    assert trainer.steps == 0 and not trainer.optimizer.state


def test_nonfinite_loss_skips_update_and_keeps_parameters():
    model = tiny_model()
    tb = make_batch(model, SIZES, seed=3)
    trainer = GRPOTrainer(model, TrainerConfig(lr=1e-3), pad_id=PAD)
    before = params(model)
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out * float("nan"))
    m = trainer.step(tb)
    handle.remove()
    assert m["nonfinite"] == 1 and m["updates"] == 0
    assert same(before, params(model)) and not trainer.optimizer.state
    assert all(p.grad is None for p in model.parameters())
    # the trainer recovers: a clean batch updates again
    assert trainer.step(tb)["updates"] == 1 and not same(before, params(model))


def test_nan_reward_is_nonfinite_not_a_crash():
    model = tiny_model()
    tb = make_batch(model, [3, 2], rewards=[1.0, float("nan"), 0.0, 1.0, 0.0])
    tb.effective[:] = True
    trainer = GRPOTrainer(model, TrainerConfig(), pad_id=PAD)
    before = params(model)
    m = trainer.step(tb)
    assert m["nonfinite"] == 1 and same(before, params(model))


def test_state_dict_round_trip_gives_identical_next_step():
    tb1 = make_batch(tiny_model(), SIZES, seed=4)
    tb2 = make_batch(tiny_model(), SIZES, seed=5)
    cfg = TrainerConfig(lr=1e-3)
    a = GRPOTrainer(tiny_model(), cfg, pad_id=PAD)
    a.step(tb1)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = GRPOTrainer(tiny_model(seed=9), cfg, pad_id=PAD)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert b.steps == 1 and same(params(a.model), params(b.model))
    ma, mb = a.step(tb2), b.step(tb2)
    assert same(params(a.model), params(b.model))
    assert ma["loss"] == mb["loss"] and ma["grad_norm"] == mb["grad_norm"]
    with pytest.raises(KeyError, match="optimizer"):
        b.load_state_dict({"model": b.model.state_dict()})


def test_kl_to_reference_and_epochs():
    model = tiny_model()
    ref = copy.deepcopy(model)
    tb = make_batch(model, SIZES, seed=6)
    trainer = GRPOTrainer(model, TrainerConfig(lr=1e-3, kl_coef=0.1, epochs=3), ref_model=ref, pad_id=PAD)
    m0 = trainer.evaluate(tb)
    assert m0["kl"] == pytest.approx(0.0, abs=1e-9)
    m = trainer.step(tb)
    assert m["updates"] == 3 and trainer.steps == 3
    assert m["kl"] > 0 and m["approx_kl"] > 0  # later epochs see a moved policy
    assert trainer.evaluate(tb)["kl"] > 0
    assert all(not p.requires_grad for p in ref.parameters())


def test_payloadless_batch_is_rejected_with_a_hint():
    ro = Rollouts(np.array([0, 0]), np.array([0.0, 1.0]), np.array([1, 1]))
    tb = TrainBatch(ro, np.array([0, 0]), np.array([True]))
    with pytest.raises(ValueError, match="no payload"):
        GRPOTrainer(tiny_model(), pad_id=PAD).step(tb)


def test_prompt_group_weight_gives_every_trained_group_the_same_weight():
    """1 x 32 + 24 x 4 rollouts: under group_weight none the big group holds 25% of the rows; under prompt, 1/25."""
    gid = np.repeat(np.arange(25), [32] + [4] * 24)
    w = prompt_weights(gid, np.arange(len(gid)))
    per_group = np.bincount(gid, weights=w)
    assert np.allclose(per_group, per_group[0]) and w.sum() == pytest.approx(len(gid))
    assert 32 / len(gid) == pytest.approx(0.25)
    only = np.flatnonzero(gid >= 20)  # trained rows of groups 20..24: the others weigh 0
    w2 = prompt_weights(gid, only)
    assert (w2[gid < 20] == 0).all() and np.allclose(w2[only], 1.0)
    model = tiny_model()
    tb = make_batch(model, [8, 2, 2, 2], seed=3, rewards=[1, 0] * 4 + [1, 0] * 3)
    plain, _ = GRPOTrainer(model, TrainerConfig(), pad_id=PAD).prepare(tb)
    weighted, _ = GRPOTrainer(model, TrainerConfig(group_weight="prompt"), pad_id=PAD).prepare(tb)
    ratio = (weighted.advantages / plain.advantages).numpy()
    big = (weighted.group_id == 0).numpy()
    assert np.allclose(ratio[big], 3.5 / 8) and np.allclose(ratio[~big], 3.5 / 2)


def mark_reused(batch: TrainBatch, rows) -> TrainBatch:
    payload = [dict(p, reused=True) if i in set(rows) else p for i, p in enumerate(batch.rollouts.payload)]
    ro = batch.rollouts
    return TrainBatch(Rollouts(ro.prompt_id, ro.reward, ro.tokens, payload), batch.group_id, batch.effective)


def test_reused_rows_take_their_ratio_against_the_current_policy():
    """AR3PO's reused completions carry log-probs of an earlier policy; the trainer replaces them by the current
    policy's, so the loss equals that of the same completions scored now (docs/allocators/ar3po.md)."""
    sizes = [4, 3]
    stale = make_batch(tiny_model(seed=7), sizes, seed=2, rewards=[1, 0, 0, 1, 0, 1, 1])
    fresh = make_batch(tiny_model(seed=0), sizes, seed=2, rewards=[1, 0, 0, 1, 0, 1, 1])
    cfg = TrainerConfig(lr=1e-2, micro_batch=2)
    plain = GRPOTrainer(tiny_model(seed=0), cfg, pad_id=PAD).evaluate(stale)
    assert plain["old_logprob_abs_diff"] > 1e-2 and plain["reused_sequences"] == 0
    reused = mark_reused(stale, range(7))
    m = GRPOTrainer(tiny_model(seed=0), cfg, pad_id=PAD).evaluate(reused)
    assert m["reused_sequences"] == 7
    assert m["old_logprob_abs_diff"] < 1e-5 and m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    now = GRPOTrainer(tiny_model(seed=0), cfg, pad_id=PAD).evaluate(fresh)
    assert m["loss"] == pytest.approx(now["loss"], abs=1e-6)
    assert m["approx_kl"] == pytest.approx(now["approx_kl"], abs=1e-7)
    assert plain["loss"] != pytest.approx(now["loss"], abs=1e-6)  # the stale ratio would change the loss


def test_only_the_reused_rows_are_rescored():
    sizes = [4, 3]
    stale = make_batch(tiny_model(seed=7), sizes, seed=2, rewards=[1, 0, 0, 1, 0, 1, 1])
    one = mark_reused(stale, [3])
    m = GRPOTrainer(tiny_model(seed=0), TrainerConfig(), pad_id=PAD).evaluate(one)
    full = GRPOTrainer(tiny_model(seed=0), TrainerConfig(), pad_id=PAD).evaluate(stale)
    assert m["reused_sequences"] == 1
    assert 0 < m["old_logprob_abs_diff"] < full["old_logprob_abs_diff"]
