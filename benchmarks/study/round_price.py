"""The price of synchronous rounds: rollouts per second at each allocator's round sizes against one batched call.

    python -m benchmarks.study --round-price --regime hard    # writes study/training_round_price.{json,md}

Each allocator runs a few allocation steps on the regime's warm-started policy (no updates: the policy is fixed,
so every allocator sees the same pass rates); every generate call's requests are recorded. Then the recorded
rounds of each step are replayed on a fresh engine, one call per round, and the same requests merged into one
call, and both are timed (HF engine, CPU).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from benchmarks.common import output_dir
from benchmarks.study.data import load_data
from benchmarks.study.execute import run_params
from benchmarks.study.plan import PARAMS_FILE, flagged

ROUND_VARIANTS = flagged("round_priced")  # the plan's records with ``round_priced`` set, in its table order


def record_rounds(cfg: Any, model: Any, tok: Any, prompts: Any, train_rows: Any, steps: int) -> list[list[dict]]:
    """The requests of every generate call of ``steps`` allocation steps of ``cfg``'s allocator, per step."""
    from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
    from rlvr_core.rollout.hf import HFEngine
    from rlvr_core.training import Scorer

    alloc = make_allocator(cfg.allocator, **cfg.allocator_kwargs())
    source = PromptSource(len(train_rows), seed=0)
    eng = HFEngine(model, tok, prompts, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=0)
    calls: list[list[dict[int, int]]] = []
    orig = eng.generate

    def rec(requests: Mapping[int, int], _c: list = calls, _gen: Any = orig) -> Any:
        _c[-1].append(dict(requests))
        return _gen(requests)

    eng.generate = rec  # type: ignore[method-assign]
    scorer = Scorer("arithmetic", train_rows)
    for _ in range(steps):
        calls.append([])
        run_allocation_step(alloc, eng, source, score=scorer)
    eng.generate = orig  # type: ignore[method-assign]
    return calls


def time_rounds(cfg: Any, model: Any, tok: Any, prompts: Any, calls: list[list[dict]], label: str,
                steps: int) -> dict[str, Any]:
    """Replay the recorded rounds on a fresh engine, one call per round and merged into one call, timed."""
    from rlvr_core.rollout.hf import HFEngine

    timed = HFEngine(model, tok, prompts, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=1)
    timed.generate({0: 8})  # warm-up
    t_rounds = t_one = 0.0
    n_roll = n_rounds = 0
    for step_calls in calls:
        t0 = time.perf_counter()
        for req in step_calls:
            timed.generate(req)
        t_rounds += time.perf_counter() - t0
        merged: dict[int, int] = {}
        for req in step_calls:
            for p, n in req.items():
                merged[p] = merged.get(p, 0) + n
        t0 = time.perf_counter()
        timed.generate(merged)
        t_one += time.perf_counter() - t0
        n_roll += sum(sum(r.values()) for r in step_calls)
        n_rounds += len(step_calls)
    sizes = [sum(r.values()) for sc in calls for r in sc]
    return {"allocator": label, "steps": steps, "rounds_per_step": n_rounds / steps,
            "rollouts_per_step": n_roll / steps, "median_round_size": float(np.median(sizes)),
            "min_round_size": int(min(sizes)), "rounds_rollouts_per_s": n_roll / t_rounds,
            "batched_rollouts_per_s": n_roll / t_one, "slowdown": t_rounds / t_one}


def markdown(regime: str, steps: int, rows: list[dict[str, Any]]) -> str:
    lines = [f"Price of synchronous rounds on the HF engine (regime `{regime}`, CPU, fixed warm-started policy, "
             f"{steps} allocation steps per allocator): rollouts per second when each step's rounds are generated one "
             "call per round, against the same requests merged into one batched call.", "",
             "| allocator | rounds/step | rollouts/step | median round size | rollouts/s in rounds | "
             "rollouts/s in one call | slowdown |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['allocator']} | {r['rounds_per_step']:.1f} | {r['rollouts_per_step']:.0f} | "
                     f"{r['median_round_size']:.0f} | {r['rounds_rollouts_per_s']:,.0f} | "
                     f"{r['batched_rollouts_per_s']:,.0f} | {r['slowdown']:.2f}x |")
    return "\n".join(lines) + "\n"


def round_price(regime: str, *, work: Path, results: Path, steps: int, quick: bool,
                params_file: Path = PARAMS_FILE) -> dict[str, Any]:
    """Rollouts per second at each allocator's round sizes against one batched call of the same total, written to
    the results root ``results``'s study/training_round_price.{json,md}."""
    from rlvr_core.models.policy import load_any_policy, policy_prompts

    d = load_data(regime, work, quick, params_file)
    model, tok = load_any_policy(d["policy"], device="cpu")
    prompts = policy_prompts(tok, d["train"], "arithmetic")
    rows = []
    for lab in ROUND_VARIANTS[:2] if quick else ROUND_VARIANTS:
        cfg = run_params(regime, lab, 0, quick=quick, params_file=params_file).train
        calls = record_rounds(cfg, model, tok, prompts, d["train"], steps)
        rows.append(time_rounds(cfg, model, tok, prompts, calls, lab, steps))
    res = {"regime": regime, "engine": "hf", "device": "cpu", "threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
           "rows": rows}
    summary = output_dir(results, "study")
    (summary / "training_round_price.json").write_text(json.dumps(res, indent=1) + "\n")
    (summary / "training_round_price.md").write_text(markdown(regime, steps, rows))
    return res
