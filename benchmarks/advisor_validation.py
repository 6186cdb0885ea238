"""Does the advice hold? The advisor's predictions against the training study's measured runs.

    python -m benchmarks.advisor_validation [--seeds 5] [--out DIR]

For every regime with a uniform-GRPO rollout log in benchmarks/replay/ (``<regime>_grpo_s0.parquet``), and
every cell of the training study of that regime (benchmarks/results/study/<regime>/<protocol>/<variant>/
s<seed>.json, read only; the reference, equal-batch and equal-rollouts protocols), the advisor's replay
(rlvr_core.advise.model.simulate: the simulated engine's replay scenario on that log, with the recurrence the
advisor gives that log, rlvr_core.advise.core.replay_mode) runs the cell's allocator with the cell's
parameters, k and batch size for as many steps as the cell's runs took, and uniform GRPO beside it, with
``--seeds`` replay seeds.

Two comparisons:

- the proxy itself: each run's rollouts per effective group from its ledger (rollouts_per_step /
  effective_groups_per_step), mean over the cell's seeds, against the replay's; error (predicted - measured) /
  measured;
- the saving to target: the replayed proxy saving (1 - rollouts per trained row / uniform GRPO's, paired by
  replay seed) against the measured saving in fitted rollouts to the regime's target against the regime's
  uniform GRPO runs (benchmarks.study.stats.saving, the study's statistic; where the cell's median run never
  reached the target, its misses count at their whole budget, an upper bound on the saving, marked "at most").
  rlvr_core.advise.calibration fits the map from the one to the other over every non-reference cell; the
  error of each cell's predicted saving to target is that of a fit to the other cells (leave one out).

Limits of the replay model, visible in the tables: it replays the pass-rate population the GRPO run met, so
an allocator whose prompt choice changes the population it sees (sara+dps's selection, greso's skipping,
contextual priors, which need the rows' features, absent from the simulated pool) and an allocator whose
training changes the policy differently from GRPO are predicted from GRPO's population. Training-side
settings of a variant (vigor[prompt]'s group weighting) are invisible to the replay.

Writes advisor_validation.md and advisor_validation.json under benchmarks/results/advisor_validation/
(with the default --seeds; otherwise a temporary folder, or --out DIR: DIR/advisor_validation/). The advisor
reads the json's error figures and its calibration (rlvr_core.advise.core.VALIDATION_FILE) and states them in
its output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # a run sets its environment before numpy loads; an import leaves the caller's alone
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from benchmarks.common import output_dir, results_dir
from benchmarks.study import stats
from benchmarks.study.store import RunStore
from rlvr_core.advise.calibration import Point, family_key, fit, leave_one_out
from rlvr_core.advise.core import interval, replay_mode
from rlvr_core.advise.logs import load_log
from rlvr_core.advise.model import simulate, token_model
from rlvr_core.advise.recurrence import measure

ROOT = Path(__file__).resolve().parents[1]
STUDY = RunStore(ROOT / "benchmarks" / "results")  # the study's committed run files
REPLAY = ROOT / "benchmarks" / "replay"
PROTOCOLS = ("reference", "equal-batch", "equal-rollouts")
SEEDS = 5
CONTEXT = "contextual prior"


def family(cell: dict[str, Any], mode: str | None = None) -> str:
    """The family of a cell: its allocator, cells using a contextual prior apart (the simulated pool has no
    prompt features, so the replay cannot see what they use); with the replay's ``mode``, the calibration's
    family (rlvr_core.advise.calibration.family_key: a recurring replay credits prompt history, a fresh one
    cannot)."""
    base = CONTEXT if "context" in str(cell["params"].get("prior", "")) else cell["allocator"]
    return base if mode is None else family_key(base, mode)


def cells(regime: str) -> list[dict[str, Any]]:
    """The study's cells of ``regime``: variant, allocator, params, k, batch, steps, measured rpeg per seed and the
    runs themselves."""
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
                        "measured": measured, "runs_data": runs})
    return out


def replay(cell: dict[str, Any], name: str, log: Path, pool: int | None, tokens: Any, seeds: int,
           params: dict[str, Any] | None = None) -> list[Any]:
    return [simulate(log, name, k=cell["k"], batch=cell["batch"], seed=s, steps=cell["steps"], pool=pool,
                     tokens=tokens, params=params) for s in range(seeds)]


def measured_saving(cell: dict[str, Any], base: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The cell's saving in fitted rollouts to ``target`` against ``base`` (the regime's uniform GRPO runs):
    benchmarks.study.stats.saving, with its bootstrap interval; where the cell's median run never reached, the
    bound that counts its misses at their whole budget (``censored``: the saving is at most that)."""
    s = stats.saving(cell["runs_data"], base, target)
    out = {"value": s["value"], "lo": s["lo"], "hi": s["hi"], "censored": False}
    if s["value"] is None:
        ours = [stats.cost_of(r, target, "cum_rollouts", False) for r in cell["runs_data"]]
        theirs = [stats.cost_of(r, target, "cum_rollouts", False) for r in base]
        out.update(value=1.0 - float(np.median(ours)) / float(np.median(theirs)), censored=True)
    return out


def row(cell: dict[str, Any], pred: list[Any], grpo: list[Any], saving: dict[str, Any], seeds: int,
        mode: str) -> dict[str, Any]:
    """One cell's line of the validation: proxy against the ledger, proxy saving against the saving to target."""
    rpeg = [r.rollouts_per_effective_group for r in pred]
    m, p = float(np.mean(cell["measured"])), float(np.mean(rpeg))
    proxy = interval(np.asarray([1.0 - a.rollouts_per_trained_row / b.rollouts_per_trained_row
                                 for a, b in zip(pred, grpo)]))
    keep = ("regime", "protocol", "variant", "allocator", "params", "k", "batch", "steps")
    return {**{k: cell[k] for k in keep}, "family": family(cell), "replay": mode,
            "calibration_family": family(cell, mode), "runs": len(cell["measured"]),
            "measured_rpeg": m, "measured_sd": float(np.std(cell["measured"], ddof=1)), "predicted_rpeg": p,
            "predicted_sd": float(np.std(rpeg, ddof=1)) if seeds > 1 else 0.0, "error": p / m - 1.0,
            "proxy_saving": list(proxy), "measured_saving": saving}


def validate(seeds: int) -> tuple[list[dict[str, Any]], list[str]]:
    rows, missing = [], []
    for regime in sorted(STUDY.regimes()):
        log = REPLAY / f"{regime}_grpo_s0.parquet"
        if not log.exists():
            missing.append(regime)
            continue
        df = load_log(log)
        tokens, base, target = token_model(df), STUDY.reference_runs(regime), STUDY.target_value(regime)
        grpo: dict[tuple[int, int, int], list[Any]] = {}
        for cell in cells(regime):
            mode, pool, _ = replay_mode(measure(df), None, df, cell["steps"], cell["batch"])
            params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in cell["params"].items()}
            pred = replay(cell, cell["allocator"], log, pool, tokens, seeds, params)
            key = (cell["k"], cell["batch"], cell["steps"])
            if key not in grpo:
                grpo[key] = replay(cell, "grpo", log, pool, tokens, seeds)
            rows.append(row(cell, pred, grpo[key], measured_saving(cell, base, target), seeds, mode))
            r = rows[-1]
            print(f"{regime} {cell['protocol']} {cell['variant']}: rpeg measured {r['measured_rpeg']:.2f}, predicted "
                  f"{r['predicted_rpeg']:.2f}; proxy saving {r['proxy_saving'][0]:+.1%}, measured saving to target "
                  f"{r['measured_saving']['value']:+.1%}", flush=True)
    return rows, missing


def calibrate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The map from proxy saving to saving to target over the non-reference cells (rlvr_core.advise.calibration),
    each cell's leave-one-out prediction written into its row ("predicted_saving", "target_error")."""
    use = [r for r in rows if r["protocol"] != "reference"]
    points = [Point(r["calibration_family"], r["proxy_saving"][0], r["measured_saving"]["value"]) for r in use]
    cal = fit(points)
    for r, pred in zip(use, leave_one_out(points)):
        r["predicted_saving"] = None if pred is None else list(pred)
        r["target_error"] = None if pred is None else pred[0] - r["measured_saving"]["value"]
    err = [abs(r["target_error"]) for r in use if r.get("target_error") is not None]
    cover = [r["predicted_saving"][1] <= r["measured_saving"]["value"] <= r["predicted_saving"][2]
             for r in use if r.get("predicted_saving") is not None]
    return {"calibration": None if cal is None else cal.to_json(), "target_cells": len(points),
            "target_median_abs_error": float(np.median(err)) if err else None,
            "target_max_abs_error": float(max(err)) if err else None,
            "target_interval_coverage": float(np.mean(cover)) if cover else None,
            "target_censored_cells": sum(r["measured_saving"]["censored"] for r in use)}


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
        groups.setdefault(r["family"], []).append(r["error"])
    return {**calibrate(rows), "cells": len(rows), "regimes": sorted({r["regime"] for r in rows}),
            "missing_logs": missing,
            "family_signed_error": {k: [float(np.mean(v)), float(np.min(v)), float(np.max(v)), len(v)]
                                    for k, v in groups.items()},
            "seeds": seeds, "median_abs_error": float(np.median(err)), "max_abs_error": float(err.max()),
            "mean_signed_error": float(np.mean([r["error"] for r in rows])),
            "per_variant_error": {k: float(np.mean(v)) for k, v in per.items()},
            "per_allocator_error": {k: float(np.mean(v)) for k, v in per_alloc.items()}, "rows": rows}


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.0%}"


def target_section(s: dict[str, Any]) -> list[str]:
    """The predicted saving to target: the map, each family's verdict and every cell's leave-one-out error."""
    cal = s["calibration"]
    if cal is None:
        return ["## Predicted saving to target", "", "Too few cells to fit the map (rlvr_core.advise.calibration)."]
    lines = ["## Predicted saving to target", "",
             "Proxy: the replayed saving against uniform GRPO in rollouts per trained row (paired by replay seed). "
             "Measured: the saving in fitted rollouts to the regime's target against the regime's uniform GRPO runs "
             "(benchmarks.study.stats.saving; 'at most': the cell's median run never reached the target, its misses "
             "counted at their whole budget). Map (rlvr_core.advise.calibration): least squares over the "
             f"{cal['cells']} cells of the families that carry over, measured = {cal['intercept']:+.3f} + "
             f"{cal['slope']:.3f} x proxy, residual sd {cal['residual_sd']:.3f}; a family whose mean residual lies "
             "outside its 95% bound does not carry over, and is predicted by its own offset from the line.", "",
             f"Leave one out, over {s['target_cells']} cells ({s['target_censored_cells']} 'at most'): median "
             f"|predicted - measured| {s['target_median_abs_error']:.1%} (points of saving), largest "
             f"{s['target_max_abs_error']:.1%}; the 95% prediction interval held the measured saving in "
             f"{s['target_interval_coverage']:.0%} of cells.", "",
             "| family | cells | mean offset from the line | 95% bound | proxy carries over |", "|---|---|---|---|---|"]
    for fam, f in sorted(cal["families"].items()):
        verdict = "no" if not f["carries_over"] else "yes" if f["cells"] >= 3 else "too few cells to tell"
        lines.append(f"| {fam} | {f['cells']} | {f['offset']:+.1%} | ±{f['bound']:.1%} | {verdict} |")
    lines += ["", "| regime | protocol | variant | proxy saving | measured saving to target [study 95%] | predicted "
              "(leave one out) [95%] | error |", "|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        if r.get("predicted_saving") is None:
            continue
        m, p = r["measured_saving"], r["predicted_saving"]
        meas = (f"at most {m['value']:+.0%}" if m["censored"] else f"{m['value']:+.0%}") + \
            f" [{_pct(m['lo'])}, {_pct(m['hi'])}]"
        lines.append(f"| {r['regime']} | {r['protocol']} | {r['variant']} | {r['proxy_saving'][0]:+.1%} | {meas} | "
                     f"{p[0]:+.0%} [{p[1]:+.0%}, {p[2]:+.0%}] | {r['target_error']:+.0%} |")
    return lines + [""]


def markdown(s: dict[str, Any]) -> str:
    lines = ["# Advisor validation: predicted against measured rollouts per effective group and saving to target",
             "",
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
    lines += [""] + target_section(s)
    lines += ["## Where the replay is systematically off (rollouts per effective group)", "",
              "Mean signed error by family (cells using a contextual prior apart, as the simulated pool has no "
              "prompt features; the others by allocator). A family whose errors all share a sign is marked.", "",
              "| family | cells | mean signed error | range | same sign |", "|---|---|---|---|---|"]
    for fam, (m, lo, hi, n) in sorted(s["family_signed_error"].items(), key=lambda kv: -abs(kv[1][0])):
        same = "yes" if n > 1 and (lo > 0 or hi < 0) else "no"
        lines.append(f"| {fam} | {n} | {m:+.1%} | {lo:+.1%} .. {hi:+.1%} | {same} |")
    lines += ["", "## Every cell: rollouts per effective group", "",
              "| regime | protocol | variant | runs | measured | predicted | error |",
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
    print(f"advisor_validation: {s['cells']} cells, median |error| {s['median_abs_error']:.1%}; saving to target: "
          f"median |error| {s['target_median_abs_error'] or math.nan:.1%} (leave one out) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
