"""Warm start: the sloppy teacher, config validation, determinism, and that it learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr_core.data.arithmetic import apply_op, make_arithmetic
from rlvr_core.errors import ConfigError
from rlvr_core.evaluation import evaluate_policy
from rlvr_core.models.tiny import build_tiny_policy, load_policy
from rlvr_core.models.warmstart import WarmStartConfig, sloppy_value, warm_start

SMALL = dict(hidden=32, layers=1, heads=2, intermediate=64)


@pytest.mark.parametrize(
    "a,op,b,expected",
    [
        (47, "+", 83, 20),  # 7+3 -> 0, 4+8 -> 2, carry-out dropped
        (83, "-", 47, 46),  # 3-7 -> 6 (no borrow), 8-4 -> 4
        (47, "*", 3, 21),  # 7*3 -> 1, 4*3 -> 2
        (100, "-", 1, 109),  # 0-1 -> 9, 0-0 -> 0, 1-0 -> 1
        (5, "+", 5, 0),
        (9, "*", 9, 1),
    ],
)
def test_sloppy_value_drops_carries_and_borrows(a: int, op: str, b: int, expected: int) -> None:
    assert sloppy_value(a, op, b) == expected


def test_sloppy_value_is_exact_without_carries() -> None:
    for a, op, b in [(12, "+", 34), (98, "-", 21), (4321, "*", 2), (1000, "+", 8999)]:
        assert sloppy_value(a, op, b) == apply_op(a, op, b)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="noise"):
        WarmStartConfig(noise=1.5)
    with pytest.raises(ConfigError, match="steps"):
        WarmStartConfig(steps=0)
    with pytest.raises(ConfigError, match="noisy_difficulties"):
        WarmStartConfig(noisy_difficulties=(5,))
    with pytest.raises(ConfigError, match=r"warmstart\.stpes: unknown key \(did you mean 'steps'\?\)"):
        WarmStartConfig.from_dict({"stpes": 3})
    with pytest.raises(ConfigError, match="lr"):
        warm_start([{"prompt": "0001+0002=", "a": 1, "b": 2, "op": "+", "difficulty": 1}], steps=1, lr=0.0)
    cfg = WarmStartConfig.from_dict({"steps": 5, "noisy_difficulties": [2]})
    assert cfg.noisy_difficulties == (2,) and WarmStartConfig.from_dict(cfg.to_dict()) == cfg


def test_rows_must_carry_operands() -> None:
    with pytest.raises(ValueError, match=r"train_rows\[0\]: missing field 'a'"):
        warm_start([{"prompt": "0001+0002="}], steps=1)


def test_deterministic_by_seed_and_saves(tmp_path: Path) -> None:
    rows = make_arithmetic(200, 0, 0, digits=(1, 2))["train"]
    calls: list[int] = []
    m1, _, met1 = warm_start(rows, steps=6, batch_size=8, lr=1e-3, noise=0.5, seed=3, log_every=3,
                             out_dir=tmp_path, progress=lambda s, d: calls.append(s), **SMALL)  # fmt: skip
    m2, _, met2 = warm_start(rows, steps=6, batch_size=8, lr=1e-3, noise=0.5, seed=3, log_every=3, **SMALL)
    m3, _, _ = warm_start(rows, steps=6, batch_size=8, lr=1e-3, noise=0.5, seed=4, **SMALL)
    s1, s2, s3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not all(torch.equal(s1[k], s3[k]) for k in s1)
    assert met1["final_loss"] == met2["final_loss"]
    assert calls == [3, 6] and met1["steps"] == 6 and 0 <= met1["sloppy_fraction"] <= 0.5
    loaded, _ = load_policy(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], s1[k]) for k in s1)


def test_noise_zero_and_one_change_what_is_taught() -> None:
    rows = make_arithmetic(300, 0, 1, digits=(2,), ops=("+",))["train"]
    _, _, clean = warm_start(rows, steps=20, batch_size=16, lr=1e-3, noise=0.0, seed=0, **SMALL)
    _, _, sloppy = warm_start(rows, steps=20, batch_size=16, lr=1e-3, noise=1.0, seed=0, **SMALL)
    assert clean["sloppy_fraction"] == 0.0
    assert sloppy["sloppy_fraction"] > 0.2  # about half of 2-digit sums carry


def test_short_warm_start_beats_random_init() -> None:
    """A few hundred steps on 1-digit addition (all 100 problems) lift greedy accuracy on
    them far above the random init; pass@8 >= pass@1 as it must."""
    rows = make_arithmetic(100, 0, 0, digits=(1,), ops=("+",))["train"]
    model0, tok0 = build_tiny_policy(hidden=64, layers=2, heads=2, intermediate=128, seed=0)
    before = evaluate_policy((model0, tok0), rows, "arithmetic", n_samples=0, max_new_tokens=4)["greedy_acc"]
    _, _, met = warm_start(rows, steps=300, batch_size=32, lr=3e-3, noise=0.0, seed=0, warmup=20,
                           hidden=64, layers=2, heads=2, intermediate=128,
                           evaluate=lambda m, t: evaluate_policy((m, t), rows, "arithmetic", k=8, n_samples=8))
    assert before < 0.05
    assert met["heldout_greedy_acc"] >= before + 0.5, met
    assert met["heldout_pass_at_8"] >= met["heldout_pass_at_1"]


def test_sft_kwargs_are_the_warm_start_arguments() -> None:
    """Every config field but base_model is a warm_start keyword (the training benchmark passes them all)."""
    import inspect

    kwargs = WarmStartConfig(base_model="Qwen/Qwen2.5-1.5B-Instruct").sft_kwargs()
    assert "base_model" not in kwargs and set(kwargs) == set(WarmStartConfig().to_dict()) - {"base_model"}
    inspect.signature(warm_start).bind([], **kwargs, out_dir="unused")  # TypeError on a stray keyword
