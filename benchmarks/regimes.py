"""Training regimes of the study: overrides on params.yaml, declared in one place, and the search
that chose regime ``hard``.

A regime is a set of overrides {section: {key: value}} applied to params.yaml through the project's
params loader (``rlvr_core.config.load_params``), so the study trains what the pipeline would train
with the same overrides. ``hard`` is params.yaml as it is (the pipeline's default since the study chose it);
``easy`` is the setting of the first studies, 1-3 digit arithmetic with the sloppy teacher (noise 0.6) on 2-
and 3-digit cells, given as overrides (``EASY``). The search's candidates are overrides on ``easy``, the
setting they were declared against.

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
    python -m benchmarks.regimes --write-only    # regimes.md again, with the EXTRA_CRITERIA regimes' sections
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from benchmarks.common import RESULTS, output_dir
from rlvr_core.config import Params, load_params

ROOT = Path(__file__).resolve().parent.parent
PARAMS_FILE = ROOT / "params.yaml"
RECORDED = ROOT / "artifacts" / "warmstart"  # the recorded policies (rlvr_core.models.recorded)

Overrides = dict[str, dict[str, Any]]

# Held-out rows of every regime: the first TEST_ROWS rows of the prepared test split are the reported
# test split, the rest the validation split the tuned protocol selects on (disjoint from test and train).
TEST_ROWS = 2000
VALIDATION_ROWS = 1000
_HELDOUT: Overrides = {"prepare": {"n_test": TEST_ROWS + VALIDATION_ROWS}}

# Regime ``easy`` on top of params.yaml (whose prepare and warmstart sections are regime ``hard``).
EASY: Overrides = {"prepare": {"digits": [1, 2, 3]}, "warmstart": {"noise": 0.6, "noisy_difficulties": [2, 3]}}

# The regime search: one lever or a combination per candidate (decided before any result was read), each
# on top of ``EASY``.
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

# The study's regimes. ``hard`` is the candidate the search chose (benchmarks/results/regimes/regimes.md),
# ``merge(EASY, CANDIDATES[CHOSEN])``, and params.yaml holds it (tests/benchmarks/test_regimes_default.py).
# ``pool`` is hard's data and warm start, RL drawing from a finite pool of POOL_PROMPTS training prompts
# (stratified by digits x op) that recurs: GRPO sees each prompt about 5 times in 40k rollouts, as real RLVR
# trains many epochs over MATH (7.5k) or DAPO-Math-17k. ``pool-k16``: half the pool, k = 16, B = 16.
CHOSEN = "d1234-noisy234-n08"
# ``steps``: hard's problems with worked answers (task arithmetic-steps, rlvr_core/data/arithmetic_steps.py), so
# that generation dominates a step and failing completions run longer than passing ones, as in real RLVR; a
# shorter warm start (its sequences are about 4x longer) and completions of up to 64 tokens. params-steps.yaml
# is params.yaml with these overrides (tests/benchmarks/test_regimes_default.py). One alternative was tried on
# uniform GRPO alone before any other allocator ran, and dropped (docs/training-study.md): lr 2e-5 over 40k
# rollouts with max_new_tokens 96 (benchmarks/results/regimes_steps_lr2e-5_s0.json) missed the same criteria
# at three times the wall-clock.
STEPS: Overrides = {"prepare": {"task": "arithmetic-steps"},
                    "warmstart": {"steps": 1500, "batch_size": 32, "lr": 1e-3},
                    "train": {"max_new_tokens": 64}, "evaluate": {"max_new_tokens": 64}}
REGIMES: dict[str, Overrides] = {
    "easy": EASY,
    "hard": {},
    "pool": {},
    "pool-k16": {"train": {"k": 16, "batch_size": 16}},
    "steps": STEPS,
}
POOL_PROMPTS: dict[str, int] = {"pool": 1000, "pool-k16": 500}
# Regimes whose runs were evaluated every n steps from a warm start built on another machine (their targets
# record no policy hash); every other regime evaluates on one rollout grid (benchmarks/study.py).
STEP_GRID_REGIMES = ("easy", "hard")
WS_SEP = "-ws"  # "<regime>-ws<J>": the regime from warm start seed J (warmstart.seed = J)


def base_regime(name: str) -> tuple[str, int | None]:
    """(regime, warm-start seed) of a regime name such as ``hard-ws2`` (seed None: the regime's own)."""
    base, sep, ws = name.rpartition(WS_SEP)
    if sep and base in REGIMES and ws.isdigit():
        return base, int(ws)
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; regimes: {sorted(REGIMES)}, each also as <regime>{WS_SEP}<J>")
    return name, None

CRITERIA = {"min_zero_variance_share": 0.5, "min_evals_below_target": 10, "min_rise_rollouts": 20000,
            "target_fraction": 0.8}
# Criteria a regime adds to CRITERIA, fixed before its reference runs (benchmarks.study.preregister measures them):
# ``steps`` must have the cost structure of real RLVR: generation at least 65% of a GRPO step's training wall-clock
# (median over the reference runs of generate_s / (generate + verify + allocate + update)), and at the start of RL
# failing completions at least 1.5x as long as passing ones in median tokens (``start_lengths``).
EXTRA_CRITERIA: dict[str, dict[str, float]] = {"steps": {"min_generate_share": 0.65,
                                                         "min_fail_pass_length_ratio": 1.5}}


def merge(*layers: Mapping[str, Mapping[str, Any]]) -> Overrides:
    """Section-wise merge of override layers (later wins)."""
    out: Overrides = {}
    for layer in layers:
        for sec, vals in layer.items():
            out.setdefault(sec, {}).update(copy.deepcopy(dict(vals)))
    return out


def regime_params(regime: str | Mapping[str, Mapping[str, Any]], extra: Mapping[str, Mapping[str, Any]] | None = None,
                  params_file: Path = PARAMS_FILE) -> Params:
    """params.yaml + the held-out split sizes + the regime's overrides (+ ``extra``), validated. A name
    ``<regime>-ws<J>`` sets warmstart.seed = J on top of the regime."""
    if isinstance(regime, str):
        base, ws = base_regime(regime)
        over = merge(REGIMES[base], {} if ws is None else {"warmstart": {"seed": ws}})
    else:
        over = regime
    return load_params(params_file, merge(_HELDOUT, over, extra or {}))


def _key(params: Params) -> str:
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

    if not quick and (found := recorded_policy(RECORDED, _key(params))) is not None:
        print(f"warm start: the recorded policy {found[0]} (sha256 verified)", flush=True)
        return found[0]
    ws = params.warmstart
    kwargs = ws.sft_kwargs()
    if quick:
        kwargs["steps"] = 30
    out = work / f"policy-{_key(params)}{'-quick' if quick else ''}"
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
    from rlvr_core.training import train

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
    res = train(params.train, policy_dir=policy, train_rows=train_rows, test_rows=test_rows,
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
    for regime in EXTRA_CRITERIA:  # the regime, then its warm starts that have been pre-registered
        study = out / "study"
        variants = sorted((d.name for d in study.glob(f"{regime}{WS_SEP}*") if (d / "preregistration.json").exists()
                           and d.name[len(regime) + len(WS_SEP):].isdigit()), key=lambda n: base_regime(n)[1]) \
            if study.exists() else []
        for name in (regime, *variants):
            lines += cost_section(name, out)
    (dest / "regimes.md").write_text("\n".join(lines) + "\n")


def cost_section(regime: str, out: Path) -> list[str]:
    """regimes.md's section on a regime with EXTRA_CRITERIA, from its pre-registration
    (``<out>/study/<regime>/preregistration.json``, written by benchmarks.study on its reference runs)."""
    path = out / "study" / regime / "preregistration.json"
    head = ["", f"## Regime `{regime}`: pre-registration on uniform GRPO alone", ""]
    if not path.exists():
        return head + [f"Not run yet: `python -m benchmarks.study --regime {regime} --protocol reference --seeds 5`."]
    p = json.loads(path.read_text())
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
                    f"EXTRA_CRITERIA (benchmarks/regimes.py). Overall: {mark[bool(p['meets'])]}.", "",
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
