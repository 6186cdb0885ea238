"""pass@k, group shares and evaluate_policy."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest

from rlvr_core.errors import ConfigError
from rlvr_core.evaluation import evaluate_policy, group_shares, pass_at_k
from rlvr_core.models.tiny import build_tiny_policy
from rlvr_core.rollout.hf import HFEngine


def _brute(n: int, c: int, k: int) -> tuple[float, float, float]:
    """Enumerate every size-k subset of n samples (c of them correct)."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    any_pass = np.mean([max(s) for s in subsets])
    all_pass = np.mean([min(s) for s in subsets])
    all_fail = np.mean([max(s) == 0 for s in subsets])
    return float(any_pass), float(all_pass), float(all_fail)


@pytest.mark.parametrize("n,k", [(1, 1), (5, 1), (5, 3), (8, 8), (10, 4)])
def test_pass_at_k_matches_brute_force(n: int, k: int) -> None:
    for c in range(n + 1):
        any_pass, all_pass, all_fail = _brute(n, c, k)
        assert pass_at_k(n, c, k) == pytest.approx(any_pass, abs=1e-12)
        shares = group_shares([n], [c], k)
        assert shares["all_pass"] == pytest.approx(all_pass, abs=1e-12)
        assert shares["all_fail"] == pytest.approx(all_fail, abs=1e-12)
        assert shares["mixed"] == pytest.approx(1 - all_pass - all_fail, abs=1e-12)


def test_pass_at_k_vectorised_and_large_n() -> None:
    n = np.array([16, 16, 200, 200])
    c = np.array([0, 3, 1, 200])
    out = pass_at_k(n, c, 8)
    assert out.shape == (4,)
    expected = [1 - comb(int(a - b), 8) / comb(int(a), 8) for a, b in zip(n, c)]
    np.testing.assert_allclose(out, expected, atol=1e-12)
    np.testing.assert_allclose(pass_at_k(n, c, 1), c / n, atol=1e-12)


def test_pass_at_k_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="n >= k"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(4, 1, 0)


def test_evaluate_policy_against_a_known_verifier() -> None:
    """A verifier that accepts exactly the greedy answer gives greedy_acc 1, and pass@k
    agrees with counting sampled completions directly."""
    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=0)
    rows = [{"prompt": f"{a:04d}+{b:04d}=", "difficulty": 1 + (a > 4), "answer": ""}
            for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    eng = HFEngine(model, tok, [r["prompt"] for r in rows], max_new_tokens=3)
    greedy = dict(zip([r["prompt"] for r in rows], eng.greedy(range(4), 3)))
    verifier = lambda text, row: float(text == greedy[row["prompt"]])  # noqa: E731
    out = evaluate_policy(eng, rows, verifier, k=2, n_samples=6, max_new_tokens=3, seed=1)
    assert out["greedy_acc"] == 1.0 and out["greedy_acc_d1"] == 1.0 and out["greedy_acc_d2"] == 1.0
    assert 0.0 <= out["pass_at_1"] <= out["pass_at_2"] <= 1.0
    assert out["all_pass_share_k2"] + out["all_fail_share_k2"] + out["mixed_share_k2"] == pytest.approx(1.0)
    # same numbers from (model, tokenizer) and the same seed
    again = evaluate_policy((model, tok), rows, verifier, k=2, n_samples=6, max_new_tokens=3, seed=1)
    assert again == out
    never = evaluate_policy((model, tok), rows, lambda t, r: 0.0, k=2, n_samples=2, max_new_tokens=3)
    assert never["greedy_acc"] == 0.0 and never["pass_at_2"] == 0.0 and never["all_fail_share_k2"] == 1.0


def test_evaluate_policy_settings() -> None:
    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=0)
    with pytest.raises(ConfigError, match="n_samples"):
        evaluate_policy((model, tok), [{"prompt": "1+2=", "answer": "3"}], k=4, n_samples=2)
    with pytest.raises(ConfigError, match="rows"):
        evaluate_policy((model, tok), [], k=1)
    greedy_only = evaluate_policy((model, tok), [{"prompt": "0001+0002=", "answer": "3"}], "arithmetic", n_samples=0)
    assert set(greedy_only) == {"n_problems", "greedy_acc"}


@pytest.mark.parametrize("pass_k", [None, 2])
def test_training_reports_pass_at_eval_pass_k(tmp_path, pass_k) -> None:
    """train.eval_pass_k is the k of the in-training pass@k, apart from the group size k; null keeps k."""
    from rlvr_core.config import TrainConfig
    from rlvr_core.data.arithmetic import make_arithmetic
    from rlvr_core.models.tiny import save_policy
    from rlvr_core.training import check_and_train

    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=0)
    folder = save_policy(model, tok, tmp_path / "policy")
    ds = make_arithmetic(40, 10, seed=0)
    base = dict(allocator="grpo", k=4, batch_size=2, steps=0, eval_size=5, eval_samples=4, checkpoint_every=1)
    with pytest.raises(ConfigError, match="eval_samples"):
        TrainConfig(**base, eval_pass_k=8)  # 4 samples cannot estimate pass@8
    cfg = TrainConfig(**base, eval_pass_k=pass_k)
    assert cfg.pass_k == (pass_k or 4)
    res = check_and_train(cfg, policy_dir=folder, train_rows=ds["train"], test_rows=ds["test"],
                          run_dir=tmp_path / "run")
    assert {k for k in res.final_eval if k.startswith("pass_at_")} == {"pass_at_1", f"pass_at_{cfg.pass_k}"}
    assert f"mixed_share_k{cfg.pass_k}" in res.final_eval
