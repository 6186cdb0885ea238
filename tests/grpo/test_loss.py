"""The clipped policy-gradient loss against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr_core.grpo.loss import AGGREGATIONS, loss_normaliser, policy_loss

E = math.exp


def tiny():
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.7, -9.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -0.6, -5.0], [-0.5, -0.1, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    # by hand: row 0 tokens have ratios 1 and e^0.1 (inside the band) -> -1, -e^0.1;
    # row 1 has ratio e^0.2 = 1.2214 > 1.2 with A = -2 -> max(2 e^0.2, 2 * 1.2) = 2 e^0.2 (unclipped side)
    row0 = [-1.0, -E(0.1)]
    row1 = [2 * E(0.2)]
    return logp, old, mask, adv, row0, row1


def test_token_and_sequence_aggregation_by_hand():
    logp, old, mask, adv, row0, row1 = tiny()
    expected = {
        "token_mean": (sum(row0) + sum(row1)) / 3,
        "seq_mean_token_mean": (sum(row0) / 2 + sum(row1) / 1) / 2,
        "seq_mean_token_sum": (sum(row0) + sum(row1)) / 2,
    }
    for agg, want in expected.items():
        loss, m = policy_loss(logp, old, adv, mask, clip_eps=0.2, aggregation=agg)
        assert loss.item() == pytest.approx(want, rel=1e-12), agg
        assert m["pg_loss"] == pytest.approx(want, rel=1e-12)
        assert m["n_tokens"] == 3 and m["n_sequences"] == 2
        assert m["clip_frac"] == 0.0
        assert m["ratio_mean"] == pytest.approx((1 + E(0.1) + E(0.2)) / 3)
        assert m["ratio_max"] == pytest.approx(E(0.2))
        # k3 of KL(old || new) with log-ratio x: e^x - x - 1
        assert m["approx_kl"] == pytest.approx((0 + E(0.1) - 1.1 + E(0.2) - 1.2) / 3)
    assert loss_normaliser(mask, "token_mean") == 3
    assert loss_normaliser(mask, "seq_mean_token_mean") == 2


def test_clip_fraction_counts_active_clipped_branch():
    logp = torch.tensor([[0.5, -0.5, 0.5, -0.5]])
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    # A > 0: ratio e^0.5 is clipped to 1.2 (active); ratio e^-0.5 stays (unclipped is larger)
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), mask)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert loss.item() == pytest.approx((-1.2 - E(-0.5) - 1.2 - E(-0.5)) / 4, rel=1e-6)


@pytest.mark.parametrize(
    "adv, log_ratio, grad_zero",
    [
        (1.0, 0.5, True),  # A > 0, ratio above 1 + eps: clipped, no push further up
        (1.0, -0.5, False),  # A > 0, ratio below 1 - eps: unclipped side, still pushes up
        (-1.0, -0.5, True),  # A < 0, ratio below 1 - eps: clipped, no push further down
        (-1.0, 0.5, False),  # A < 0, ratio above 1 + eps: unclipped side, pushes down
        (1.0, 0.1, False),  # inside the band
    ],
)
def test_clipping_zeroes_the_gradient_on_the_clipped_side(adv, log_ratio, grad_zero):
    logp = torch.tensor([[log_ratio]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), clip_eps=0.2)
    loss.backward()
    g = logp.grad.item()
    if grad_zero:
        assert g == 0.0
    else:
        assert g == pytest.approx(-adv * E(log_ratio))


def test_clip_eps_high_widens_only_the_upper_band():
    logp = torch.tensor([[0.25]], requires_grad=True)  # ratio 1.284
    loss, m = policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1),
                          clip_eps=0.2, clip_eps_high=0.28)
    loss.backward()
    assert m["clip_frac"] == 1.0 and logp.grad.item() == 0.0  # 1.284 > 1.28
    logp2 = torch.tensor([[0.24]], requires_grad=True)  # ratio 1.271 < 1.28: not clipped
    loss2, m2 = policy_loss(logp2, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1),
                            clip_eps=0.2, clip_eps_high=0.28)
    loss2.backward()
    assert m2["clip_frac"] == 0.0 and logp2.grad.item() == pytest.approx(-E(0.24))
    logp3 = torch.tensor([[-0.25]], requires_grad=True)  # lower band stays at 0.8
    policy_loss(logp3, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1),
                clip_eps=0.2, clip_eps_high=0.28)[0].backward()
    assert logp3.grad.item() == 0.0


def test_kl_to_reference_k3():
    logp, old, mask, adv, row0, row1 = tiny()
    ref = logp.clone()
    ref[0, 0] += 0.3
    ref[1, 0] -= 0.2
    loss0, _ = policy_loss(logp, old, adv, mask)
    loss, m = policy_loss(logp, old, adv, mask, ref_logprobs=ref, kl_coef=0.5)
    k3 = [E(0.3) - 0.3 - 1, 0.0, E(-0.2) + 0.2 - 1]
    assert m["kl_ref"] == pytest.approx(sum(k3) / 3)
    assert loss.item() == pytest.approx(loss0.item() + 0.5 * sum(k3) / 3, rel=1e-12)
    # the reference alone is reported but not added with kl_coef = 0
    loss_r, m_r = policy_loss(logp, old, adv, mask, ref_logprobs=ref)
    assert loss_r.item() == pytest.approx(loss0.item()) and m_r["kl_ref"] > 0
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, old, adv, mask, kl_coef=0.1)


@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_global_normaliser_makes_shard_losses_add_up(aggregation):
    g = torch.Generator().manual_seed(0)
    n, length = 7, 9
    logp = (-torch.rand(n, length, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(n, length, generator=g, dtype=torch.float64)
    lengths = torch.tensor([0, 3, 9, 1, 5, 7, 2])
    mask = (torch.arange(length)[None] < lengths[:, None]).double()
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    full, _ = policy_loss(logp, old, adv, mask, aggregation=aggregation)
    (g_full,) = torch.autograd.grad(full, logp)
    norm = loss_normaliser(mask, aggregation)
    parts = [slice(0, 3), slice(3, 4), slice(4, 7)]
    assert sum(loss_normaliser(mask[s], aggregation) for s in parts) == norm
    total = sum(policy_loss(logp[s], old[s], adv[s], mask[s], aggregation=aggregation, normaliser=norm)[0]
                for s in parts)
    (g_parts,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(full.item(), rel=1e-12)
    assert torch.allclose(g_parts, g_full, atol=1e-14)


def test_masked_positions_cannot_poison_the_loss():
    logp, old, mask, adv, _, _ = tiny()
    logp = logp.clone()
    old = old.clone()
    logp[0, 2] = -float("inf")
    old[1, 2] = float("nan")
    logp.requires_grad_()
    loss, m = policy_loss(logp, old, adv, mask, entropy=torch.where(mask > 0, 1.0, float("nan")))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
    assert (logp.grad[mask == 0] == 0).all()
    assert m["entropy"] == 1.0


def test_empty_mask_and_bad_inputs():
    loss, m = policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3))
    assert loss.item() == 0.0 and m["n_tokens"] == 0
    with pytest.raises(ValueError, match="same"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="normaliser"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3), normaliser=0)
    with pytest.raises(KeyError, match="valid names"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3), aggregation="sum")
