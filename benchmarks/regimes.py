"""The regime search: the candidates that regime ``hard`` was chosen from, each trained under uniform GRPO.

The study's regimes themselves are records of its plan (benchmarks/study/plan.py REGIMES): a regime is a set of
overrides {section: {key: value}} applied to params.yaml through the project's params loader
(``rlvr_core.config.load_params``), so the study trains what the pipeline would train with the same overrides.
``hard`` is params.yaml as it is (the pipeline's default since the study chose it); ``easy`` is the setting
of the first studies, 1-3 digit arithmetic with the sloppy teacher (noise 0.6) on 2- and 3-digit cells, given
as overrides (``EASY``). The search's candidates are overrides on ``easy``, the setting they were declared
against.

The criteria for ``hard`` were fixed before any candidate ran (docs/training-study.md), and only uniform
GRPO is trained here, so the choice cannot favour an allocator:

1. at the start of RL, at least 50% of groups of k = 8 are zero-variance (all-fail plus all-pass),
   measured on 1,000 training prompts with 8 samples each (expected shares);
2. under uniform GRPO the held-out greedy accuracy keeps rising: with the target at 80% of the gain at
   the end of the budget (the mean of the last three evaluations), at least 10 evaluations lie below
   the target after the start, and the target is first reached after at least 20,000 rollouts.

Among the candidates that meet both, the one whose rise spans the most rollouts is chosen; if none
meets both, the one closest to meeting them (most evaluations below target) is kept and the miss is
written down. ``python -m benchmarks.regimes`` trains every candidate (one seed) and writes
benchmarks/results/regimes/regimes.{json,md}: each candidate's group shares at the start, its GRPO curve and
the criteria.

    python -m benchmarks.regimes [--candidates a,b] [--rollouts 40000] [--out DIR] [--work DIR]
    python -m benchmarks.regimes --write-only    # regimes.md again, with the sections of the regimes that have
                                                 # extra criteria (plan.Regime.extra_criteria)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, output_dir
from benchmarks.study import ENVIRONMENT
from benchmarks.study.data import dataset, policy_dir, splits, start_shares
from benchmarks.study.plan import CRITERIA, EASY, REGIMES, Overrides, merge, regime_params
from benchmarks.study.store import RunStore

# The regime search: one lever or a combination per candidate (decided before any result was read), each
# on top of ``EASY``. Candidate regimes; study_targets' "candidates" are another thing: the allocators of ours that
# have no declared target of their own.
CANDIDATES: dict[str, Overrides] = {
    # the measured lever alone (notes/measured-2026-12-01.md): 4-digit cells, default warm start
    "d1234": {"prepare": {"digits": [1, 2, 3, 4]}},
    # the teacher's noise also on the 4-digit cells: the right behaviour in their samples, not their mode
    "d1234-noisy234": {"prepare": {"digits": [1, 2, 3, 4]}, "warmstart": {"noisy_difficulties": [2, 3, 4]}},
    # weight on the hard cells (few 1-digit all-pass groups), teacher noisy on 2-4 digits
    "d1234w-noisy234": {"prepare": {"digits": [1, 2, 3, 4], "digit_weights": [0.1, 0.3, 0.3, 0.3]},
                        "warmstart": {"noisy_difficulties": [2, 3, 4]}},
    # a sloppier teacher on 2-4 digits: the right answers rarer in the samples of the hard cells
    "d1234-noisy234-n08": {"prepare": {"digits": [1, 2, 3, 4]},
                           "warmstart": {"noisy_difficulties": [2, 3, 4], "noise": 0.8}},
    "d1234-noisy234-n09": {"prepare": {"digits": [1, 2, 3, 4]},
                           "warmstart": {"noisy_difficulties": [2, 3, 4], "noise": 0.9}},
    # a larger policy (hidden 192, 3 layers) on the same data as d1234-noisy234 (not run: its warm start
    # alone takes over 30 minutes on this machine's share of a core)
    "d1234-noisy234-big": {"prepare": {"digits": [1, 2, 3, 4]},
                           "warmstart": {"noisy_difficulties": [2, 3, 4], "hidden": 192, "layers": 3,
                                         "intermediate": 768, "heads": 6}},
}

# ``hard`` is the candidate the search chose (benchmarks/results/regimes/regimes.md), ``merge(EASY,
# CANDIDATES[CHOSEN])``, and params.yaml holds it (tests/benchmarks/test_regimes_default.py).
CHOSEN = "d1234-noisy234-n08"


def criteria(curve: list[dict[str, float]]) -> dict[str, Any]:
    """The rise criteria on one GRPO curve (list of {cum_rollouts, greedy_acc}, starting at step 0)."""
    xs = np.asarray([c["cum_rollouts"] for c in curve], float)
    ys = np.asarray([c["greedy_acc"] for c in curve], float)
    start, end = float(ys[0]), float(ys[-3:].mean())
    target = start + CRITERIA["target_fraction"] * (end - start)
    hit = np.flatnonzero(ys[1:] >= target)
    first = int(hit[0]) + 1 if len(hit) else len(ys)
    below = int(first - 1)  # evaluations after the start and before the first at or above the target
    rise = float(xs[first]) if first < len(xs) else float("nan")
    return {"start": start, "end": end, "gain": end - start, "target": target, "evals_below_target": below,
            "rollouts_to_target": rise}


def run_candidate(name: str, over: Overrides, args: argparse.Namespace) -> dict[str, Any]:
    from rlvr_core.training import check_and_train

    params = regime_params(merge(EASY, over), {"train": {"allocator": "grpo", "steps": 100000,
                                                         "max_rollouts": args.rollouts, "eval_every": args.eval_every,
                                                         "eval_size": args.eval_size, "eval_samples": 0,
                                                         "checkpoint_every": 100000, "seed": 0}})
    ds = dataset(params)
    train_rows, test_rows, _ = splits(ds)
    t0 = time.perf_counter()
    policy = policy_dir(params, args.work, train_rows)
    ws_s = time.perf_counter() - t0
    shares = start_shares(policy, train_rows)
    t1 = time.perf_counter()
    res = check_and_train(params.train, policy_dir=policy, train_rows=train_rows, test_rows=test_rows,
                          run_dir=args.work / f"regime-{name}", resume=False)
    train_s = time.perf_counter() - t1
    curve = [{"step": r["step"], "cum_rollouts": r["cum_rollouts"], "greedy_acc": r["eval/greedy_acc"],
              **{k[5:]: v for k, v in r.items() if k.startswith("eval/greedy_acc_d")}}
             for r in res.metrics if "eval/greedy_acc" in r]
    steps = [r for r in res.metrics if r["step"] > 0]
    crit = criteria(curve)
    zv = shares["zero_variance_share"]
    crit["zero_variance_share"] = zv
    crit["first_step_effective_ratio"] = steps[0]["effective_ratio"] if steps else None
    crit["meets"] = bool(zv >= CRITERIA["min_zero_variance_share"]
                         and crit["evals_below_target"] >= CRITERIA["min_evals_below_target"]
                         and crit["rollouts_to_target"] >= CRITERIA["min_rise_rollouts"])
    out = {"candidate": name, "overrides": over, "warm_start_s": ws_s, "train_s": train_s, "shares": shares,
           "criteria": crit, "curve": curve}
    print(f"{name}: zero-variance {zv:.2f}, acc {crit['start']:.3f} -> {crit['end']:.3f}, "
          f"{crit['evals_below_target']} evals below target, target at {crit['rollouts_to_target']:.0f} rollouts, "
          f"meets={crit['meets']} ({train_s:.0f} s)", flush=True)
    return out


def write(results: list[dict[str, Any]], out: Path) -> None:
    """regimes.{json,md} under the results root ``out``'s regimes/ (the cost sections read ``out``'s study/)."""
    dest = output_dir(out, "regimes")
    (dest / "regimes.json").write_text(json.dumps({"criteria": CRITERIA, "candidates": results}, indent=1,
                                                 default=float) + "\n")
    lines = ["Regime search: uniform GRPO (params.yaml train section, seed 0) on each candidate; criteria fixed "
             "before the runs (benchmarks/regimes.py).", "",
             "| candidate | overrides | all-pass | all-fail | zero-variance | start acc | end acc | target | "
             "evals below target | rollouts to target | meets |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s, c = r["shares"], r["criteria"]
        lines.append(f"| {r['candidate']} | `{json.dumps(r['overrides'])}` | {s['all_pass_share_k8']:.2f} | "
                     f"{s['all_fail_share_k8']:.2f} | {c['zero_variance_share']:.2f} | {c['start']:.3f} | "
                     f"{c['end']:.3f} | {c['target']:.3f} | {c['evals_below_target']} | "
                     f"{c['rollouts_to_target']:,.0f} | {'yes' if c['meets'] else 'no'} |")
    lines += ["", "GRPO curves (cumulative rollouts: greedy accuracy):", ""]
    for r in results:
        pts = ", ".join(f"{c['cum_rollouts'] // 1000}k: {c['greedy_acc']:.3f}" for c in r["curve"][::3])
        lines.append(f"- {r['candidate']}: {pts}")
    store = RunStore(out)
    for regime in (name for name, r in REGIMES.items() if r.extra_criteria):  # then its pre-registered warm starts
        variants = [n for n in store.warm_starts(regime) if store.preregistration(n) is not None]
        for name in (regime, *variants):
            lines += cost_section(name, out)
    (dest / "regimes.md").write_text("\n".join(lines) + "\n")


def cost_section(regime: str, out: Path) -> list[str]:
    """regimes.md's section on a regime with extra criteria (plan.Regime.extra_criteria), from its pre-registration
    (``<out>/study/<regime>/preregistration.json``, written by benchmarks.study on its reference runs)."""
    head = ["", f"## Regime `{regime}`: pre-registration on uniform GRPO alone", ""]
    if (p := RunStore(out).preregistration(regime)) is None:
        return head + [f"Not run yet: `python -m benchmarks.study --regime {regime} --protocol reference --seeds 5`."]
    c, e = p["criteria"], p["extra"]
    lengths, ec = e["start_lengths"], e["criteria"]
    mark = {True: "meets", False: "**misses**"}
    ratio, share = lengths["fail_pass_length_ratio"], e["median_generate_share"]
    reach = p["median_fit_rollouts_to_target"]
    rows = [("zero-variance share of k-groups at the start", f">= {c['min_zero_variance_share']}",
             f"{p['zero_variance_share']:.2f}", p["zero_variance_share"] >= c["min_zero_variance_share"]),
            ("median evaluations below the target", f">= {c['min_evals_below_target']}",
             f"{p['median_evals_below_target']:.0f}", p["median_evals_below_target"] >= c["min_evals_below_target"]),
            ("median fitted rollouts to the target", f">= {c['min_rise_rollouts']:,}",
             "never" if reach is None else f"{reach:,.0f}", reach is not None and reach >= c["min_rise_rollouts"]),
            ("median generation share of a GRPO step's wall-clock", f">= {ec['min_generate_share']}",
             "none" if share is None else f"{share:.2f}", share is not None and share >= ec["min_generate_share"]),
            ("failing / passing completions, median tokens at the start", f">= {ec['min_fail_pass_length_ratio']}",
             "none" if ratio is None else f"{ratio:.2f} ({lengths['median_tokens_fail']:.0f} / "
             f"{lengths['median_tokens_pass']:.0f})", ratio is not None and ratio >= ec["min_fail_pass_length_ratio"])]
    lines = head + [f"Reference runs: seeds {[r['seed'] for r in p['runs']]}; the hard regime's criteria plus "
                    f"its extra criteria (benchmarks/study/plan.py). Overall: {mark[bool(p['meets'])]}.", "",
                    "| criterion | required | measured | |", "|---|---|---|---|"]
    lines += [f"| {name} | {need} | {got} | {mark[bool(ok)]} |" for name, need, got, ok in rows]
    lines += ["", f"Completions at the start of RL ({lengths['samples']:,} samples, k per prompt): "
              f"{lengths['pass_share']:.1%} pass; tokens from {lengths['tokens_min']} to {lengths['tokens_max']} "
              f"(10th-90th percentile {lengths['tokens_p10']:.0f}-{lengths['tokens_p90']:.0f}); "
              f"{lengths['hit_max_new_tokens_share']:.1%} stop at max_new_tokens.", "",
              "| seed | generate s | update s | training s | generation share | generated tokens | rollouts |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['generate_s']:.0f} | {r['update_s']:.0f} | {r['train_s']:.0f} | "
              f"{r['generate_share']:.2f} | {r['generated_tokens']:,} | {r['rollouts']:,} |" for r in e["runs"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    for key, value in ENVIRONMENT.items():  # the study's, before torch loads
        os.environ.setdefault(key, value)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--rollouts", type=int, default=40000)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-size", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=Path("runs/study"))
    ap.add_argument("--out", type=Path, default=RESULTS, help="results root: writes its regimes/, reads its study/")
    ap.add_argument("--write-only", action="store_true",
                    help="rewrite regimes.md from regimes.json and the pre-registrations; train nothing")
    args = ap.parse_args(argv)
    prev = args.out / "regimes" / "regimes.json"
    results = {r["candidate"]: r for r in json.loads(prev.read_text())["candidates"]} if prev.exists() else {}
    if args.write_only:
        write([results[n] for n in CANDIDATES if n in results], args.out)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    names = [c.strip() for c in args.candidates.split(",") if c.strip()]
    for name in names:
        results[name] = run_candidate(name, CANDIDATES[name], args)
        write([results[n] for n in CANDIDATES if n in results], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
