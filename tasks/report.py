"""Task: comparison report from the runs' metrics.jsonl and the held-out evaluation.

Where allocation pays: every (allocator, seed) run spends the same rollout budget; the target is set on the
reference allocator's runs (grpo when compared) as the training study sets it, median start + 0.8 x the
median gain at the end of the budget (``rlvr_core.stats.gain_target``); each allocator's rollouts to that
target are a median over seeds with a 95% bootstrap interval, a run that never reaches it counting as never
(``rlvr_core.stats.median_ci``).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.curves import CURVE_FIELDS, curve_rows, read_history
from rlvr_core.safefs import write_atomic, write_text_atomic
from rlvr_core.stats import TARGET_FRACTION, accuracy_at, first_reach, fitted_reach, gain_target, median_ci
from rlvr_core.types import step_updated

REFERENCE = "grpo"  # the allocator the target is set on, when compared (else the first one listed)


def _updates(history: list[dict[str, Any]]) -> int:
    """Steps that changed the policy (neither skipped nor non-finite)."""
    return sum(1 for r in history if step_updated(r))


def _per_effective_group(history: list[dict[str, Any]]) -> float | None:
    """A run's rollouts per effective (mixed, trained) group over its steps; None if it logs no groups."""
    steps = [r for r in history if r.get("step", 0) > 0 and "effective_groups" in r]
    eff = sum(float(r["effective_groups"]) for r in steps)
    return sum(float(r.get("rollouts", 0)) for r in steps) / eff if eff > 0 else None


def _fmt(v: float | None, digits: int = 0) -> str:
    return "never" if v is None else f"{v:,.{digits}f}"


def _ci(ci: Mapping[str, Any]) -> str:
    return f"{_fmt(ci['median'])} [{_fmt(ci['lo'])}, {_fmt(ci['hi'])}]"


def against(ci: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """How an allocator's rollouts to target compare with the reference's: the ratio of medians (reference /
    this: above 1 is fewer rollouts) and whether the 95% intervals are disjoint."""
    m, r = ci["median"], ref["median"]
    if m is None:
        return "never reached (median)"
    if r is None:
        return "reference never reached"
    ratio = r / m if m > 0 else float("inf")
    hi, rlo, lo, rhi = ci["hi"], ref["lo"], ci["lo"], ref["hi"]
    if hi is not None and rlo is not None and hi < rlo:
        sep = "fewer, intervals disjoint"
    elif lo is not None and (rhi is not None and lo > rhi):
        sep = "more, intervals disjoint"
    else:
        sep = "intervals overlap"
    return f"{ratio:.2f}x ({sep})"


def _band(curves: list[list[dict[str, Any]]], x: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median and min-max over seeds on a common grid up to the shortest run's last evaluation."""
    top = min(c[-1][x] for c in curves)
    grid = np.linspace(0.0, float(top), 60)
    ys = np.vstack([np.interp(grid, [r[x] for r in c], [r["greedy_acc"] for r in c]) for c in curves])
    return grid, np.median(ys, 0), ys.min(0), ys.max(0)


@task(retries=0, cache_policy=NO_CACHE)
def write_report(runs: Mapping[str, Mapping[int, str]], evaluation: Mapping[str, Mapping[str, Any]], out_dir: str,
                 fraction: float = TARGET_FRACTION) -> dict[str, Any]:
    """Plots (accuracy vs cumulative rollouts / tokens, median over seeds, seed spread shaded), curves.csv,
    comparison.md (rollouts to target per allocator, and accuracy at the budget every run reached) and metrics.json
    under ``out_dir``.

    ``runs`` maps allocator -> {seed: run folder}; ``evaluation`` maps allocator -> {seed (str): held-out
    metrics of the run's final checkpoint}. Everything written is a function of the runs' metrics.jsonl
    and ``evaluation`` (no timings), so equal runs give byte-identical comparison.md and metrics.json.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hist = {a: {s: read_history(Path(d) / "metrics.jsonl") for s, d in sorted(seeds.items())}
            for a, seeds in runs.items()}
    curves = {a: {s: curve_rows(h) for s, h in by_seed.items()} for a, by_seed in hist.items()}
    for a, by_seed in curves.items():
        for s, c in by_seed.items():
            if not c:
                raise ValueError(f"run {runs[a][s]}: metrics.jsonl holds no evaluation")
    reference = REFERENCE if REFERENCE in curves else next(iter(curves))
    tgt = gain_target(list(curves[reference].values()), fraction)
    target = tgt["target"]

    # every file of the report is written through a fresh temporary name, never through a link planted at its
    # name (rlvr_core.safefs)
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=["allocator", "seed", *CURVE_FIELDS])
    w.writeheader()
    for a, by_seed in curves.items():
        for s, rows in by_seed.items():
            for r in rows:
                w.writerow({"allocator": a, "seed": s, **r})
    write_text_atomic(out / "curves.csv", f.getvalue())
    for x, fname, label in (("cum_rollouts", "accuracy_vs_rollouts.png", "cumulative rollouts"),
                            ("cum_tokens", "accuracy_vs_tokens.png", "cumulative generated tokens")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (a, by_seed) in enumerate(curves.items()):
            grid, med, lo, hi = _band(list(by_seed.values()), x)
            n = len(by_seed)
            ax.plot(grid, med, color=f"C{i}", label=f"{a} (median of {n} seed{'s' if n != 1 else ''})")
            if len(by_seed) > 1:
                ax.fill_between(grid, lo, hi, color=f"C{i}", alpha=0.18, lw=0)
        ax.axhline(target, color="k", ls=":", lw=1, label=f"target {target:.3f}")
        ax.set_xlabel(label)
        ax.set_ylabel("held-out greedy accuracy (band: seed min-max)")
        ax.set_title(f"equal rollout budget; target {target:.3f} = start + {fraction} x {reference}'s gain", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100, metadata={"Software": None})
        write_atomic(out / fname, png.getvalue())
        plt.close(fig)

    # the budget every run reached: a step that starts under train.max_rollouts ends past it, and one allocator's
    # step may be larger than another's, so final accuracies compare unequal costs
    common = min(c[-1]["cum_rollouts"] for by_seed in curves.values() for c in by_seed.values())
    metrics: dict[str, Any] = {}
    for a, by_seed in curves.items():
        hits = [fitted_reach([r["cum_rollouts"] for r in c], [r["greedy_acc"] for r in c], target)
                for c in by_seed.values()]
        raw = [first_reach([r["cum_rollouts"] for r in c], [r["greedy_acc"] for r in c], target)
               for c in by_seed.values()]
        ev = evaluation.get(a, {})
        finals = [ev.get(str(s), {}).get("greedy_acc", c[-1]["greedy_acc"]) for s, c in by_seed.items()]
        passk = [v for s in by_seed for k, v in sorted(ev.get(str(s), {}).items())
                 if k.startswith("pass_at_") and k != "pass_at_1"]
        last = [c[-1] for c in by_seed.values()]
        metrics[a] = {
            "seeds": sorted(by_seed), "reached": int(sum(np.isfinite(hits))),
            "rollouts_to_target": median_ci(hits), "raw_rollouts_to_target": median_ci(raw),
            "final_greedy_acc": float(np.median(finals)), "final_greedy_acc_min": float(min(finals)),
            "final_greedy_acc_max": float(max(finals)),
            "greedy_acc_at_common_budget": (lambda v: float(np.median(v)) if v else None)(
                [x for c in by_seed.values() if (x := accuracy_at(c, common)) is not None]),
            "pass_at_k": float(np.median(passk)) if passk else None,
            "start_greedy_acc": float(np.median([c[0]["greedy_acc"] for c in by_seed.values()])),
            "rollouts": int(np.median([r["cum_rollouts"] for r in last])),
            "tokens": int(np.median([r["cum_tokens"] for r in last])),
            "updates": int(np.median([_updates(h) for h in hist[a].values()])),
            "rollouts_per_effective_group": (lambda v: float(np.median(v)) if v else None)(
                [x for h in hist[a].values() if (x := _per_effective_group(h)) is not None]),
        }
    ref_ci = metrics[reference]["rollouts_to_target"]
    spent = [c[-1]["cum_rollouts"] for by_seed in curves.values() for c in by_seed.values()]
    seeds = sorted({s for m in metrics.values() for s in m["seeds"]})
    lines = ["# Allocator comparison: rollouts to a target at a fixed rollout budget", "",
             f"Runs spend {min(spent):,.0f} to {max(spent):,.0f} rollouts (train.max_rollouts ends a run at the first "
             "step past it, and steps differ in size between allocators); 'acc @ "
             f"{common:,.0f}': each run's isotonic fit at the budget every run reached, median over seeds, the "
             f"accuracy at equal cost. Seeds {seeds}. Target: held-out "
             f"greedy accuracy {target:.3f} = median start {tgt['start']:.3f} + {fraction} x the median gain "
             f"{tgt['gain']:+.3f} of the {reference} runs at the end of the budget (mean of each run's last three "
             "evaluations), as in benchmarks/study.py.",
             "Rollouts to target: where each run's isotonic (monotone) fit of its evaluations first reaches the "
             "target (every allocator is evaluated on one grid of rollouts, train.eval_every_rollouts), median over "
             "seeds [95% bootstrap interval]; the raw first crossing, which favours the run evaluated most often, "
             "beside it. 'never' where the median or a bound falls on a run that did not reach the target (such runs "
             f"are counted in 'reached', never dropped). 'vs {reference}': {reference}'s median / this one's (above "
             "1: fewer rollouts). 'rollouts / eff. group': rollouts per trained mixed group, median over seeds: "
             "where an allocator saves rollouts on the groups it trains on, which pays off only if the fewer "
             "updates it makes with them (column 'updates') learn as much.", ""]
    if tgt["gain"] <= 0:
        lines += [f"The {reference} runs did not gain over the budget (gain {tgt['gain']:+.3f}): the target sits at "
                  "or below the start, so rollouts to target say nothing here.", ""]
    passk_name = next((k for ev in evaluation.values() for e in ev.values() for k in sorted(e)
                       if k.startswith("pass_at_") and k != "pass_at_1"), "pass@k")
    lines += [f"| allocator | seeds | reached | rollouts to target (fit) | raw first crossing | vs {reference} | "
              f"acc @ {common:,.0f} | final greedy acc (min-max) | {passk_name} | updates | rollouts / eff. group | "
              "rollouts |", "|---" * 12 + "|"]
    for a, m in metrics.items():
        ci = m["rollouts_to_target"]
        vs = "reference" if a == reference else against(ci, ref_ci)
        pk = "-" if m["pass_at_k"] is None else f"{m['pass_at_k']:.3f}"
        per = m["rollouts_per_effective_group"]
        per_s = "-" if per is None else f"{per:.1f}"
        at = m["greedy_acc_at_common_budget"]
        lines.append(f"| {a} | {len(m['seeds'])} | {m['reached']}/{len(m['seeds'])} | {_ci(ci)} | "
                     f"{_ci(m['raw_rollouts_to_target'])} | {vs} | {'-' if at is None else f'{at:.3f}'} | "
                     f"{m['final_greedy_acc']:.3f} ({m['final_greedy_acc_min']:.3f}-{m['final_greedy_acc_max']:.3f}) | "
                     f"{pk} | {m['updates']} | {per_s} | {m['rollouts']:,} |")
    write_text_atomic(out / "comparison.md", "\n".join(lines) + "\n")
    result = {"target": {"reference": reference, "fraction": fraction, **tgt}, "allocators": metrics}
    write_text_atomic(out / "metrics.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result
