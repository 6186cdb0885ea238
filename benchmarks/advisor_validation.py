"""Does the advice hold? The advisor's predictions against the training study's measured runs.

    python -m benchmarks.advisor_validation [--seeds 5] [--out DIR]

For every regime with a uniform-GRPO rollout log in benchmarks/replay/ (``<regime>_grpo_s0.parquet``), and
every cell of the training study of that regime (benchmarks/results/study/<regime>/<protocol>/<variant>/
s<seed>.json, read only; the reference, equal-batch and equal-rollouts protocols), the advisor's replay
(rlvr_core.advise.model.simulate: the simulated engine's replay scenario on that log) runs the cell's
allocator with the cell's parameters, k and batch size for as many steps as the cell's runs took, with
``--seeds`` replay seeds. Measured: each run's rollouts per effective group from its ledger
(rollouts_per_step / effective_groups_per_step), mean over the cell's seeds. The error is
(predicted - measured) / measured.

Limits of the replay model, visible in the table: it replays the pass-rate population the GRPO run met, so
an allocator whose prompt choice changes the population it sees (sara+dps's selection, greso's skipping,
contextual priors, which need the rows' features, absent from the simulated pool) and an allocator whose
training changes the policy differently from GRPO are predicted from GRPO's population. Training-side
settings of a variant (vigor[prompt]'s group weighting) are invisible to the replay.

Writes advisor_validation.md and advisor_validation.json under benchmarks/results/advisor_validation/
(with the default --seeds; otherwise a temporary folder, or --out DIR: DIR/advisor_validation/). The advisor
reads the json's error figures (rlvr_core.advise.core.VALIDATION_FILE) and states them in its output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # a run sets its environment before numpy loads; an import leaves the caller's alone
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from benchmarks.common import output_dir, results_dir
from benchmarks.study.store import RunStore
from rlvr_core.advise.core import default_pool
from rlvr_core.advise.logs import load_log
from rlvr_core.advise.model import simulate, token_model

ROOT = Path(__file__).resolve().parents[1]
STUDY = RunStore(ROOT / "benchmarks" / "results")  # the study's committed run files
REPLAY = ROOT / "benchmarks" / "replay"
PROTOCOLS = ("reference", "equal-batch", "equal-rollouts")
SEEDS = 5


def cells(regime: str) -> list[dict[str, Any]]:
    """The study's cells of ``regime``: variant, allocator, params, k, batch, steps and measured rpeg per seed."""
    out = []
    for proto in PROTOCOLS:
        for runs in STUDY.folders(regime, proto):
            runs = [r for r in runs if not r.get("quick") and r["ledger"].get("effective_groups_per_step")]
            if not runs:
                continue
            r0 = runs[0]
            measured = [r["ledger"]["rollouts_per_step"] / r["ledger"]["effective_groups_per_step"] for r in runs]
            out.append({"regime": regime, "protocol": proto, "variant": r0["variant"], "allocator": r0["allocator"],
                        "params": r0["allocator_params"], "k": r0["k"], "batch": r0["batch_size"],
                        "steps": int(round(np.mean([r["ledger"]["steps"] for r in runs]))),
                        "measured": measured})
    return out


def predict(cell: dict[str, Any], log: Path, pool: int, tokens: Any, seeds: int) -> list[float]:
    params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cell["params"].items()}
    return [simulate(log, cell["allocator"], k=cell["k"], batch=cell["batch"], seed=s, steps=cell["steps"],
                     pool=pool, tokens=tokens, params=params).rollouts_per_effective_group for s in range(seeds)]


def validate(seeds: int) -> tuple[list[dict[str, Any]], list[str]]:
    rows, missing = [], []
    for regime in sorted(STUDY.regimes()):
        log = REPLAY / f"{regime}_grpo_s0.parquet"
        if not log.exists():
            missing.append(regime)
            continue
        df = load_log(log)
        pool, tokens = default_pool(df), token_model(df)
        for cell in cells(regime):
            pred = predict(cell, log, pool, tokens, seeds)
            m, p = float(np.mean(cell["measured"])), float(np.mean(pred))
            rows.append({**{k: v for k, v in cell.items() if k != "measured"}, "runs": len(cell["measured"]),
                         "measured_rpeg": m, "measured_sd": float(np.std(cell["measured"], ddof=1)),
                         "predicted_rpeg": p, "predicted_sd": float(np.std(pred, ddof=1)) if seeds > 1 else 0.0,
                         "error": p / m - 1.0})
            print(f"{regime} {cell['protocol']} {cell['variant']}: measured {m:.2f}, predicted {p:.2f}", flush=True)
    return rows, missing


def summary(rows: list[dict[str, Any]], missing: list[str], seeds: int) -> dict[str, Any]:
    err = np.abs([r["error"] for r in rows])
    per: dict[str, list[float]] = {}
    for r in rows:
        per.setdefault(r["variant"], []).append(abs(r["error"]))
    per_alloc: dict[str, list[float]] = {}
    for r in rows:
        if r["variant"] == r["allocator"]:  # the allocator at its default parameters, as the advisor runs it
            per_alloc.setdefault(r["allocator"], []).append(abs(r["error"]))
    groups: dict[str, list[float]] = {}
    for r in rows:  # the families the replay may miss: contextual priors (no features in the pool), by allocator
        fam = "contextual prior" if "context" in str(r["params"].get("prior", "")) else r["allocator"]
        groups.setdefault(fam, []).append(r["error"])
    return {"cells": len(rows), "regimes": sorted({r["regime"] for r in rows}), "missing_logs": missing,
            "family_signed_error": {k: [float(np.mean(v)), float(np.min(v)), float(np.max(v)), len(v)]
                                    for k, v in groups.items()},
            "seeds": seeds, "median_abs_error": float(np.median(err)), "max_abs_error": float(err.max()),
            "mean_signed_error": float(np.mean([r["error"] for r in rows])),
            "per_variant_error": {k: float(np.mean(v)) for k, v in per.items()},
            "per_allocator_error": {k: float(np.mean(v)) for k, v in per_alloc.items()}, "rows": rows}


def markdown(s: dict[str, Any]) -> str:
    lines = ["# Advisor validation: predicted against measured rollouts per effective group", "",
             "Generated by `python -m benchmarks.advisor_validation`. Predicted: the advisor's replay of the "
             "regime's uniform-GRPO log (benchmarks/replay/<regime>_grpo_s0.parquet) with the cell's allocator, "
             f"parameters, k, batch and steps, mean of {s['seeds']} replay seeds. Measured: the training study's "
             "runs of the cell (ledger rollouts_per_step / effective_groups_per_step), mean over seeds. Error = "
             "predicted / measured - 1.", "",
             f"Over {s['cells']} cells ({', '.join(s['regimes'])}): median |error| {s['median_abs_error']:.1%}, "
             f"largest {s['max_abs_error']:.1%}, mean signed error {s['mean_signed_error']:+.1%}."]
    if s["missing_logs"]:
        lines += ["", f"Not validated: {', '.join(s['missing_logs'])} (no uniform-GRPO rollout log of that regime "
                  "in benchmarks/replay/; the study's run files hold ledgers, not per-step logs)."]
    lines += ["", "## Where the replay is systematically off", "",
              "Mean signed error by family (cells using a contextual prior apart, as the simulated pool has no "
              "prompt features; the others by allocator). A family whose errors all share a sign is marked.", "",
              "| family | cells | mean signed error | range | same sign |", "|---|---|---|---|---|"]
    for fam, (m, lo, hi, n) in sorted(s["family_signed_error"].items(), key=lambda kv: -abs(kv[1][0])):
        same = "yes" if n > 1 and (lo > 0 or hi < 0) else "no"
        lines.append(f"| {fam} | {n} | {m:+.1%} | {lo:+.1%} .. {hi:+.1%} | {same} |")
    lines += ["", "## Every cell", "", "| regime | protocol | variant | runs | measured | predicted | error |",
              "|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        lines.append(f"| {r['regime']} | {r['protocol']} | {r['variant']} | {r['runs']} | "
                     f"{r['measured_rpeg']:.2f} ± {r['measured_sd']:.2f} | {r['predicted_rpeg']:.2f} ± "
                     f"{r['predicted_sd']:.2f} | {r['error']:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = output_dir(results_dir(args.out, args.seeds == SEEDS, "advisor_validation"), "advisor_validation")
    rows, missing = validate(args.seeds)
    s = summary(rows, missing, args.seeds)
    (out / "advisor_validation.json").write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
    (out / "advisor_validation.md").write_text(markdown(s), encoding="utf-8")
    print(f"advisor_validation: {s['cells']} cells, median |error| {s['median_abs_error']:.1%} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
