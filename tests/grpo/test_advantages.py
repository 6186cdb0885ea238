"""Ragged-group advantage estimators against a plain per-group loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlvr_core.grpo.advantages import ADVANTAGES, get_advantage_fn
from rlvr_core.registry import UnknownNameError


def reference(name: str, rewards: np.ndarray, group_id: np.ndarray, eps: float) -> np.ndarray:
    """One group at a time, in plain Python."""
    out = np.zeros(len(rewards))
    for g in set(group_id.tolist()):
        rows = [i for i in range(len(rewards)) if group_id[i] == g]
        vals = [float(rewards[i]) for i in rows]
        n = len(vals)
        if n == 1 or max(vals) == min(vals):
            continue  # no signal: advantage 0
        mean = sum(vals) / n
        for i, v in zip(rows, vals):
            if name == "grpo":
                std = math.sqrt(sum((x - mean) ** 2 for x in vals) / (n - 1))
                out[i] = (v - mean) / (std + eps)
            elif name == "dr_grpo":
                out[i] = v - mean
            elif name == "rloo":
                out[i] = v - (sum(vals) - v) / (n - 1)
    return out


def ragged(seed: int, binary: bool) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled ragged groups (sizes 1..7) with some constant groups and an unused id."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 8, size=12)
    gid = np.repeat(np.arange(len(sizes)), sizes)
    gid[gid == 5] = 12  # a gap: id 5 unused, 12 used
    r = rng.integers(0, 2, size=len(gid)).astype(float) if binary else rng.normal(size=len(gid))
    r[gid == 0] = 1.0  # constant groups
    r[gid == 1] = 0.3
    perm = rng.permutation(len(gid))
    return r[perm], gid[perm]


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("binary", [True, False])
def test_matches_python_loop_on_ragged_groups(name, seed, binary):
    r, gid = ragged(seed, binary)
    fn = get_advantage_fn(name)
    adv, metrics = fn(r, gid, eps=1e-6)
    assert isinstance(adv, np.ndarray) and adv.dtype == np.float64 and adv.shape == r.shape
    np.testing.assert_allclose(adv, reference(name, r, gid, 1e-6), rtol=1e-10, atol=1e-12)
    # constant and size-1 groups are exactly zero
    for g in np.unique(gid):
        vals = r[gid == g]
        if len(vals) == 1 or np.ptp(vals) == 0:
            assert (adv[gid == g] == 0).all()
    assert metrics["groups"] == len(np.unique(gid))
    assert metrics["size1_groups"] == sum((gid == g).sum() == 1 for g in np.unique(gid))
    # torch in, torch out, same numbers
    adv_t, _ = fn(torch.tensor(r), torch.tensor(gid), eps=1e-6)
    assert isinstance(adv_t, torch.Tensor) and adv_t.dtype == torch.float64
    np.testing.assert_allclose(adv_t.numpy(), adv, rtol=1e-12, atol=1e-14)


def test_grpo_uses_unbiased_std_and_float32_stays_float32():
    adv, _ = get_advantage_fn("grpo")(np.array([0.0, 1.0]), np.array([0, 0]), eps=0.0)
    np.testing.assert_allclose(adv, [-1 / math.sqrt(2), 1 / math.sqrt(2)])
    adv32, _ = get_advantage_fn("grpo")(torch.tensor([0.0, 1.0, 1.0]), torch.tensor([3, 3, 3]))
    assert adv32.dtype == torch.float32


def test_rloo_and_dr_grpo_small_example():
    r = np.array([1.0, 0.0, 0.0, 1.0, 5.0])
    g = np.array([0, 0, 0, 1, 2])
    rloo, _ = get_advantage_fn("rloo")(r, g)
    np.testing.assert_allclose(rloo, [1.0, -0.5, -0.5, 0.0, 0.0])
    dr, _ = get_advantage_fn("dr_grpo")(r, g)
    np.testing.assert_allclose(dr, [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0])


def test_constant_non_binary_group_is_exactly_zero():
    r = np.full(3, 0.1)  # the mean of three 0.1s is not exactly 0.1 in floating point
    adv, m = get_advantage_fn("grpo")(r, np.zeros(3, np.int64), eps=1e-12)
    assert (adv == 0).all() and m["constant_groups"] == 1


def test_registry_and_errors():
    assert set(ADVANTAGES.names()) >= {"grpo", "dr_grpo", "rloo"}
    with pytest.raises(UnknownNameError, match="valid names"):
        get_advantage_fn("ppo")
    fn = get_advantage_fn("grpo")
    with pytest.raises(ValueError, match="one group id per reward"):
        fn(np.zeros(3), np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=">= 0"):
        fn(np.zeros(2), np.array([0, -1]))
    with pytest.raises(ValueError, match="num_groups"):
        fn(np.zeros(2), np.array([0, 3]), num_groups=2)
    adv, m = fn(np.zeros(0), np.zeros(0, np.int64))
    assert adv.shape == (0,) and m["groups"] == 0


def test_num_groups_allows_empty_groups():
    adv, m = get_advantage_fn("rloo")(np.array([1.0, 0.0]), np.array([1, 1]), num_groups=4)
    np.testing.assert_allclose(adv, [1.0, -1.0])
    assert m["groups"] == 1
