"""Held-out evaluation of a policy: greedy accuracy, pass@k and group shares.

pass@k uses the unbiased estimator of Chen et al. (2021, "Evaluating Large
Language Models Trained on Code"): with n samples of which c pass,

    pass@k = 1 - C(n - c, k) / C(n, k).

The same hypergeometric argument gives unbiased estimates of the share of
size-k GRPO groups that would be all-pass, all-fail or mixed, the quantity that
decides how much an allocator can save (docs/design.md §1):

    all_fail = C(n - c, k) / C(n, k),  all_pass = C(c, k) / C(n, k),
    mixed = 1 - all_fail - all_pass.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
from scipy.special import gammaln

from rlvr_core.errors import require

Verifier = Callable[[str, Mapping], float]


def _log_comb(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    return gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)


def _prob_all_in(n: np.ndarray, m: np.ndarray, k: np.ndarray) -> np.ndarray:
    """C(m, k) / C(n, k): probability that k draws without replacement from n all land in m."""
    out = np.zeros(np.broadcast(n, m, k).shape, dtype=np.float64)
    ok = np.broadcast_to(m >= k, out.shape)
    nb, mb, kb = (np.broadcast_to(x, out.shape).astype(np.float64) for x in (n, m, k))
    out[ok] = np.exp(_log_comb(mb[ok], kb[ok]) - _log_comb(nb[ok], kb[ok]))
    return out


def _check_nck(n: Any, c: Any, k: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_a, c_a, k_a = (np.asarray(x) for x in (n, c, k))
    for name, a in (("n", n_a), ("c", c_a), ("k", k_a)):
        if a.size and not np.all(np.equal(np.mod(a, 1), 0)):
            raise ValueError(f"pass_at_k: {name} must hold integers, got {a}")
    if np.any(k_a < 1):
        raise ValueError(f"pass_at_k: k must be >= 1, got {k_a}")
    if np.any(c_a < 0) or np.any(c_a > n_a):
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n_a}, c={c_a}")
    if np.any(n_a < k_a):
        raise ValueError(f"pass_at_k: need n >= k samples per problem, got n={n_a}, k={k_a}")
    return n_a.astype(np.int64), c_a.astype(np.int64), k_a.astype(np.int64)


def pass_at_k(n: Any, c: Any, k: Any) -> np.ndarray | float:
    """Unbiased pass@k from n samples with c correct (arrays broadcast).

    n, c, k: ints or arrays of ints with 0 <= c <= n and 1 <= k <= n.
    Returns a float for scalar input, else an array of the broadcast shape.
    """
    n_a, c_a, k_a = _check_nck(n, c, k)
    out = 1.0 - _prob_all_in(n_a, n_a - c_a, k_a)
    return float(out) if out.ndim == 0 else out


def group_shares(n: Any, c: Any, k: int) -> dict[str, float]:
    """Expected shares of all-pass, all-fail and mixed groups of size k over problems.

    n, c: (P,) samples and passes per problem. Returns mean shares (unbiased).
    """
    n_a, c_a, k_a = _check_nck(n, c, k)
    all_fail = _prob_all_in(n_a, n_a - c_a, k_a)
    all_pass = _prob_all_in(n_a, c_a, k_a)
    return {
        "all_pass": float(np.mean(all_pass)),
        "all_fail": float(np.mean(all_fail)),
        "mixed": float(np.mean(1.0 - all_pass - all_fail)),
    }


def _as_rows(rows: Any) -> list[Mapping]:
    if hasattr(rows, "to_list"):
        return list(rows.to_list())
    return [dict(r) for r in rows]


def _resolve_verifier(verifier: Verifier | str, template_task: str | None) -> tuple[Verifier, str | None]:
    """A registered verifier's callable for a name (which also becomes the default template task)."""
    if isinstance(verifier, str):
        from rlvr_core.rewards import get_verifier

        template_task = verifier if template_task is None else template_task
        verifier = get_verifier(verifier)
    return verifier, template_task


def _model_tokenizer_device(policy: Any, device: str | None) -> tuple[Any, Any, Any]:
    """(model, tokenizer, device) of an ``HFEngine`` or a ``(model, tokenizer)`` pair; ``device`` wins when given."""
    from rlvr_core.rollout.hf import HFEngine

    if isinstance(policy, HFEngine):
        return policy.model, policy.tokenizer, device or policy.device
    model, tok = policy
    return model, tok, device or next(model.parameters()).device


def _greedy_metrics(engine: Any, data: list[Mapping], verifier: Verifier, max_new_tokens: int) -> dict[str, float]:
    """n_problems, greedy_acc and, when every row has a difficulty, greedy_acc_d{d}."""
    greedy = engine.greedy(list(range(len(data))), max_new_tokens)
    correct = np.asarray([float(verifier(g, r)) for g, r in zip(greedy, data)])
    out: dict[str, float] = {"n_problems": float(len(data)), "greedy_acc": float(correct.mean())}
    if all("difficulty" in r for r in data):
        diff = np.asarray([int(r["difficulty"]) for r in data])
        for d in sorted(set(diff.tolist())):
            out[f"greedy_acc_d{d}"] = float(correct[diff == d].mean())
    return out


def _sampled_metrics(engine: Any, data: list[Mapping], verifier: Verifier, n_samples: int, k: int) -> dict[str, float]:
    """n_samples, pass_at_1, pass_at_{k} and the group shares from ``n_samples`` samples per problem."""
    ro = engine.generate({i: n_samples for i in range(len(data))})
    passes = np.zeros(len(data))
    for pid, pl in zip(ro.prompt_id, ro.payload or []):
        passes[pid] += float(verifier(pl["text"], data[pid])) > 0.5
    n = np.full(len(data), n_samples)
    out: dict[str, float] = {"n_samples": float(n_samples)}
    out["pass_at_1"] = float(np.mean(pass_at_k(n, passes, 1)))
    out[f"pass_at_{k}"] = float(np.mean(pass_at_k(n, passes, k)))
    for name, v in group_shares(n, passes, k).items():
        out[f"{name}_share_k{k}"] = v
    return out


def evaluate_policy(
    policy: Any,
    rows: Any,
    verifier: Verifier | str = "arithmetic",
    *,
    k: int = 8,
    n_samples: int | None = None,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 0,
    micro_batch: int = 1024,
    device: str | None = None,
    template_task: str | None = None,
) -> dict[str, float]:
    """Greedy accuracy and sampled pass@1 / pass@k / group shares on ``rows``.

    Args:
        policy: an ``HFEngine`` (its model, tokenizer and device are used; its
            prompt pool and seed are left alone) or a ``(model, tokenizer)`` pair.
        rows: dataset rows (a ``datasets.Dataset`` or mappings) with "prompt" and
            the fields the verifier reads; "difficulty" (int), where present,
            adds per-difficulty greedy accuracy.
        verifier: callable ``(completion, row) -> float`` or a registered name.
        k: group size for pass@k and the group shares.
        n_samples: samples per problem at ``temperature`` (default k; must be >= k;
            0 skips sampling and reports greedy figures only).
        template_task: instruction kind for chat prompts (default: the verifier's name
            when given by name). When the tokenizer has a chat template, each row's
            prompt is rendered with it (``rlvr_core.models.policy.policy_prompts``);
            otherwise prompts are used as they are.
    Returns:
        flat dict (MLflow-safe names): n_problems, greedy_acc, greedy_acc_d{d},
        and with sampling n_samples, pass_at_1, pass_at_{k}, all_pass_share_k{k},
        all_fail_share_k{k}, mixed_share_k{k}.
    """
    from rlvr_core.models.policy import policy_prompts
    from rlvr_core.rollout.hf import HFEngine  # local: keeps this module light

    verifier, template_task = _resolve_verifier(verifier, template_task)
    n_samples = k if n_samples is None else n_samples
    require(isinstance(k, int) and k >= 1, "k", f"must be an int >= 1, got {k!r}")
    require(n_samples == 0 or n_samples >= k, "n_samples", f"must be 0 or >= k={k}, got {n_samples}")
    data = _as_rows(rows)
    require(len(data) > 0, "rows", "need at least one row to evaluate")
    model, tok, dev = _model_tokenizer_device(policy, device)
    engine = HFEngine(
        model,
        tok,
        policy_prompts(tok, data, template_task or ""),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        micro_batch=micro_batch,
        device=dev,
    )
    out = _greedy_metrics(engine, data, verifier, max_new_tokens)
    if n_samples:
        out.update(_sampled_metrics(engine, data, verifier, n_samples, k))
    return out


__all__ = ["evaluate_policy", "group_shares", "pass_at_k"]
