"""The data of a regime: its splits, prompt pool and warm-started policy, and what a policy does at the start of RL.

Reads the regime's records from ``benchmarks.study.plan``; nothing here is cached between calls (``load_data``
returns a fresh dict: a caller that needs it twice keeps it).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.study.plan import PARAMS_FILE, RECORDED, TEST_ROWS, regime_params
from benchmarks.study.plan import regime as regime_of
from rlvr_core.config import Params


def policy_key(params: Params) -> str:
    from rlvr_core.models.recorded import policy_key

    return policy_key(params.prepare, params.warmstart)


STUDY_TASKS = ("arithmetic", "arithmetic-steps")  # generated, with a warm start for the tiny policy


def dataset(params: Params) -> Any:
    """The regime's DatasetDict (train, test) as the prepare stage builds it (the STUDY_TASKS only)."""
    p = params.prepare
    if p.task not in STUDY_TASKS:
        raise ValueError(f"the study supports tasks {', '.join(STUDY_TASKS)}, got {p.task!r}")
    from rlvr_core.tasks import get_task

    return get_task(p.task).build(p)[0]


def splits(ds: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, test, validation) row lists: the test split's first TEST_ROWS rows are test, the rest validation."""
    held = list(ds["test"])
    return list(ds["train"]), held[:TEST_ROWS], held[TEST_ROWS:]


def pool_rows(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` of ``rows`` stratified by (difficulty, op): each cell's share of the pool is its share of ``rows``
    (largest remainders), drawn at random within the cell; the pool keeps ``rows``' order."""
    if n > len(rows):
        raise ValueError(f"a pool of {n} prompts needs at least {n} training rows, got {len(rows)}")
    cells: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        cells.setdefault((r.get("difficulty"), r.get("op")), []).append(i)
    keys = sorted(cells, key=str)
    exact = np.asarray([n * len(cells[k]) / len(rows) for k in keys])
    quota = np.floor(exact).astype(int)
    for j in np.argsort(-(exact - quota), kind="stable")[: n - int(quota.sum())]:
        quota[j] += 1
    rng = np.random.default_rng(seed)
    pick = sorted(i for k, q in zip(keys, quota) for i in rng.choice(cells[k], size=int(q), replace=False).tolist())
    return [rows[i] for i in pick]


def policy_dir(params: Params, work: Path, train_rows: Any, *, quick: bool = False) -> Path:
    """The warm-started policy of ``params``: the one recorded under artifacts/warmstart/ for these prepare and
    warmstart settings (its sha256 verified; RecordedPolicyMismatch refuses another), else one built under
    ``work`` (cached by the same settings)."""
    from rlvr_core.models.recorded import recorded_policy
    from rlvr_core.models.warmstart import warm_start
    from rlvr_core.tasks import warm_start_teacher

    if not quick and (found := recorded_policy(RECORDED, policy_key(params))) is not None:
        print(f"warm start: the recorded policy {found[0]} (sha256 verified)", flush=True)
        return found[0]
    ws = params.warmstart
    kwargs = ws.sft_kwargs()
    if quick:
        kwargs["steps"] = 30
    out = work / f"policy-{policy_key(params)}{'-quick' if quick else ''}"
    if not (out / "config.json").exists():
        print(f"warm start ({kwargs['steps']} steps) -> {out}", flush=True)
        t0 = time.perf_counter()
        tmp = out.with_name(out.name + ".tmp")
        warm_start(train_rows, teacher=warm_start_teacher(params.prepare.task), **kwargs, out_dir=tmp)
        os.replace(tmp, out) if not out.exists() else None
        print(f"warm start done in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _pick(rows: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [rows[i] for i in np.sort(rng.choice(len(rows), size=min(n, len(rows)), replace=False))]


def start_shares(policy: Path, rows: list[dict[str, Any]], k: int = 8, n: int = 1000, seed: int = 0, *,
                 task: str = "arithmetic", max_new_tokens: int = 8) -> dict[str, float]:
    """Group shares of k samples at the start of RL on ``n`` training prompts, and greedy accuracy per cell."""
    from rlvr_core.evaluation import evaluate_policy
    from rlvr_core.models.policy import load_any_policy

    model, tok = load_any_policy(policy, device="cpu")
    ev = evaluate_policy((model, tok), _pick(rows, n, seed), task, k=k, n_samples=k, seed=seed,
                         max_new_tokens=max_new_tokens)
    ev["zero_variance_share"] = ev[f"all_pass_share_k{k}"] + ev[f"all_fail_share_k{k}"]
    return ev


def start_lengths(policy: Path, rows: list[dict[str, Any]], *, task: str, k: int = 8, n: int = 1000, seed: int = 0,
                  max_new_tokens: int = 64, temperature: float = 1.0) -> dict[str, Any]:
    """Completion lengths at the start of RL: k samples of the warm-started policy (as GRPO's first step draws
    them) on ``n`` training prompts, scored by the task's verifier; the median generated tokens (``<eos>``
    included, as the trainer counts them) of the passing and the failing samples, and their ratio."""
    from rlvr_core.models.policy import load_any_policy, policy_prompts
    from rlvr_core.rewards import get_verifier
    from rlvr_core.rollout.hf import HFEngine

    model, tok = load_any_policy(policy, device="cpu")
    pick = _pick(rows, n, seed)
    engine = HFEngine(model, tok, policy_prompts(tok, pick, task), temperature=temperature,
                      max_new_tokens=max_new_tokens, seed=seed)
    ro = engine.generate({i: k for i in range(len(pick))})
    verify = get_verifier(task)
    passed = np.asarray([verify(pl["text"], pick[int(i)]) > 0.5 for i, pl in zip(ro.prompt_id, ro.payload or [])])
    tokens = np.asarray(ro.tokens, float)
    med = {name: float(np.median(tokens[sel])) if sel.any() else None
           for name, sel in (("pass", passed), ("fail", ~passed))}
    ratio = med["fail"] / med["pass"] if med["pass"] and med["fail"] is not None else None
    return {"samples": int(len(tokens)), "pass_share": float(passed.mean()), "median_tokens_pass": med["pass"],
            "median_tokens_fail": med["fail"], "fail_pass_length_ratio": ratio,
            "tokens_min": int(tokens.min()), "tokens_max": int(tokens.max()),
            "tokens_p10": float(np.percentile(tokens, 10)), "tokens_p90": float(np.percentile(tokens, 90)),
            "hit_max_new_tokens_share": float(np.mean(tokens >= max_new_tokens))}


def policy_sha256(policy: Path) -> str:
    """One digest of a policy folder: every file's name and bytes, in name order."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(policy).rglob("*") if p.is_file()):
        h.update(f.relative_to(policy).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def load_data(regime: str, work: Path, quick: bool, params_file: Path | None = None) -> dict[str, Any]:
    """The regime's splits and warm-started policy (warm-started under ``work`` on first use: the policy folder is
    the cache), its parameter count and digest."""
    from rlvr_core.models.policy import load_any_policy
    from rlvr_core.models.tiny import num_parameters

    params = regime_params(regime, params_file=params_file or PARAMS_FILE)
    ds = dataset(params)
    train_rows, test_rows, val_rows = splits(ds)
    policy = policy_dir(params, work, train_rows, quick=quick)  # warm-started on the whole train split
    if (pool := regime_of(regime).pool):
        train_rows = pool_rows(train_rows, pool)  # RL draws from the finite pool only
    model, _ = load_any_policy(policy, device="cpu")
    return {"train": train_rows, "test": test_rows, "validation": val_rows, "policy": policy,
            "n_params": int(num_parameters(model)), "policy_sha256": policy_sha256(policy)}
