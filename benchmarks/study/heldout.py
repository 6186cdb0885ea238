"""A larger held-out set for the arithmetic regimes, and recorded runs evaluated on it by reproducing them.

    python -m benchmarks.study --regime pool --warm-start 3 --heldout-large [--cells P/V ...] [--limit N]

The study's test split holds 2,000 problems, so one evaluation's standard error is up to 1.1 points; the
measurement issue (36) asks for at most half a point. The test split cannot simply grow: the generator draws the
train and held-out splits together, so another ``n_test`` is another training set, and every recorded run would
be a different run. The large set is built beside it instead (``large_set``):

- every test row, plus ``FRESH`` problems drawn (seed ``SEED``) from the regime's own (digit count, op) cells,
  none of them in the training split (the whole split, on which the policy was warm-started), the test split or the
  validation split; each cell gets its share of the test split (largest remainders), capped at the problems it
  has left. The one-digit cells and the two-digit products are used up by the generator, so they keep only their
  test rows;
- its accuracy is the test split's own estimand, read more precisely: each (digit count, op) cell's greedy accuracy
  weighted by that cell's share of the test split (``score``), with the plug-in standard error
  sqrt(sum of share^2 x p(1 - p) / rows) over the cells. A cell whose rows all pass or all fail adds nothing to
  that error, so it is a lower bound where a cell sits at 0 or 1.

A run is evaluated on it by training it again from its recorded settings (as ``backfill`` does) with one more
greedy evaluation after each of the run's own (``extra_evaluation``); the run keeps the new curve only if the rerun
is the recorded run (``backfill.same_run``: every evaluation on the test split and every ledger field equal,
wall-clock aside), so the recorded training is what the new curve measures. The run file gains
``heldout_large`` (the set's size, seed and digest, and the curve: the same steps and cost axes, ``greedy_acc``,
``se`` and per-difficulty accuracy), and a run without a decision log gets the rerun's (the backfill rule);
nothing else in it changes. Outcomes go to ``study/<regime>/heldout_large.json``; runs are claimed as the study
claims them and ``--limit`` bounds one command, so a command resumes where the last stopped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from benchmarks.large_set import RECORD
from benchmarks.study import backfill as B
from benchmarks.study import data as D
from benchmarks.study.plan import PARAMS_FILE, regime_params
from benchmarks.study.store import RunStore

Log = Callable[[str], Any]
FRESH = 12000  # problems beside the test split's 2,000: an SE of at most 0.5 points at any accuracy
QUICK_FRESH = 200  # a --quick run's (its runs evaluate 100 problems)
SEED = 36
# the cells whose runs the DAPO control reads (docs/training-study.md, "Null controls"): its target's reference
# runs, DAPO and the matched GRPO runs
CONTROL_CELLS = ("reference/grpo", "equal-batch/dapo", "matched-updates/grpo")
RULE = ("a run is trained again from its recorded settings with one more greedy evaluation, on the large held-out "
        "set, after each of its own; the new curve is kept only if every evaluation on the test split and every "
        "ledger field the run recorded equal the recorded run's, wall-clock aside")


# ----- the set -------------------------------------------------------------------------------------------
def large_set(regime: str, fresh: int = FRESH, seed: int = SEED,
              params_file: Path = PARAMS_FILE) -> dict[str, Any]:
    """The regime's large held-out set: its rows (the test rows, then the fresh ones), each row's cell, the test
    split's cell shares (the weights), and a digest of its prompts."""
    from rlvr_core.data.arithmetic import _decode, cell_size, make_row
    from rlvr_core.data.splits import apportion

    params = regime_params(regime, params_file=params_file)
    if params.prepare.task != "arithmetic":
        raise ValueError(f"regime {regime!r}: the large held-out set is built for task arithmetic only, "
                         f"not {params.prepare.task!r}")
    train, test, validation = D.splits(D.dataset(params))
    cell_of = lambda r: (int(r["difficulty"]), str(r["op"]))  # noqa: E731
    cells = sorted({cell_of(r) for r in test})
    shares = {c: sum(cell_of(r) == c for r in test) / len(test) for c in cells}
    taken = {r["prompt"] for r in (*train, *test, *validation)}
    used = {c: sum(cell_of(r) == c for r in (*train, *test, *validation)) for c in cells}
    left = [cell_size(*c) - used[c] for c in cells]
    quotas = apportion(min(fresh, sum(left)), [shares[c] for c in cells], left)
    rng = np.random.default_rng(seed)
    rows = list(test)
    for (d, op), q in zip(cells, quotas):
        picked = 0
        for i in rng.choice(cell_size(d, op), size=min(cell_size(d, op), q + used[(d, op)]), replace=False):
            a, b = _decode(d, op, int(i))
            row = make_row("heldout", len(rows), a, op, b)
            if picked < q and row["prompt"] not in taken:
                rows.append(row)
                picked += 1
    digest = hashlib.sha256("\n".join(r["prompt"] for r in rows).encode()).hexdigest()
    return {"rows": rows, "cells": [cell_of(r) for r in rows], "shares": shares, "test_rows": len(test),
            "fresh": len(rows) - len(test), "seed": seed, "sha256": digest, "task": params.prepare.task}


def score(correct: Sequence[float], cells: Sequence[tuple[int, str]], shares: Mapping[tuple[int, str], float],
          ) -> dict[str, float]:
    """The test split's estimand from per-row correctness: the share-weighted mean of the cells' accuracies, its
    plug-in standard error, and the same within each digit count (``greedy_acc_d<d>``)."""
    x = np.asarray(correct, float)
    keys = np.asarray([f"{d}{op}" for d, op in cells])
    acc, var = {}, {}
    for c in shares:
        sel = x[keys == f"{c[0]}{c[1]}"]
        if not len(sel):
            raise ValueError(f"cell {c} has no row in the large held-out set")
        acc[c], var[c] = float(sel.mean()), float(sel.mean() * (1 - sel.mean()) / len(sel))
    out = {"greedy_acc": sum(shares[c] * acc[c] for c in shares),
           "se": math.sqrt(sum(shares[c] ** 2 * var[c] for c in shares)), "n_problems": float(len(x))}
    for d in sorted({c[0] for c in shares}):
        mine = [c for c in shares if c[0] == d]
        out[f"greedy_acc_d{d}"] = sum(shares[c] * acc[c] for c in mine) / sum(shares[c] for c in mine)
    return out


# ----- one more evaluation after each of a run's own -----------------------------------------------------
@contextlib.contextmanager
def extra_evaluation(the_set: Mapping[str, Any], found: list[dict[str, float]]) -> Iterator[None]:
    """Inside the block, every training run's held-out evaluation is followed by a greedy pass over the large set
    on the same parameters, its ``score`` appended to ``found`` (the class's method is restored on exit). The pass
    draws no random number: its engine has its own generator, and greedy decoding samples nothing."""
    from rlvr_core import training
    from rlvr_core.models.policy import policy_prompts
    from rlvr_core.rewards import get_verifier
    from rlvr_core.rollout.hf import HFEngine

    original = training._Run.evaluate
    verify, rows = get_verifier(the_set["task"]), the_set["rows"]
    engines: dict[int, Any] = {}

    def evaluate(self: Any) -> dict[str, float]:
        out = original(self)
        if id(self.model) not in engines:
            engines[id(self.model)] = HFEngine(self.model, self.tok, policy_prompts(self.tok, rows, self.task),
                                               max_new_tokens=self.cfg.max_new_tokens, seed=0, device=self.device)
        text = engines[id(self.model)].greedy(list(range(len(rows))), self.cfg.max_new_tokens)
        found.append(score([float(verify(t, r)) > 0.5 for t, r in zip(text, rows)], the_set["cells"],
                           the_set["shares"]))
        return out

    training._Run.evaluate = evaluate
    try:
        yield
    finally:
        training._Run.evaluate = original


def large_curve(curve: Sequence[Mapping[str, Any]], found: Sequence[Mapping[str, float]]) -> list[dict[str, Any]]:
    """The large set's curve: each recorded evaluation's step and cost axes with the large set's figures."""
    if len(found) != len(curve):
        raise ValueError(f"{len(found)} evaluations of the large set against {len(curve)} recorded")
    axes = ("step", "updates", "cum_rollouts", "cum_tokens", "cum_trained_tokens", "seconds")
    return [{**{k: c[k] for k in axes if k in c}, **f} for c, f in zip(curve, found)]


# ----- which runs, and the command -----------------------------------------------------------------------
def todo(store: RunStore, regime: str, cells: Sequence[str] = CONTROL_CELLS) -> list[Path]:
    """The run files of ``cells`` (``protocol/variant``) of ``regime`` without a large-set curve and not yet
    tried, in the order of ``cells``, then seed."""
    tried = set(B.record(store, regime, RECORD).get("runs", {}))
    out = []
    for cell in cells:
        protocol, _, label = cell.partition("/")
        if not protocol or not label:
            raise ValueError(f"--cells: {cell!r} is not protocol/variant (e.g. equal-batch/dapo)")
        for p in sorted(store.cell_dir(regime, protocol, label).glob("s*.json")):
            if p.relative_to(store.root).as_posix() not in tried and "heldout_large" not in json.loads(p.read_text()):
                out.append(p)
    return out


def heldout_large(store: RunStore, regime: str, *, work: Path, cells: Sequence[str] = CONTROL_CELLS,
                  limit: int | None = None, params_file: Path = PARAMS_FILE, log: Log = print) -> dict[str, int]:
    """Evaluate up to ``limit`` runs of ``cells`` of ``regime`` (all when None) on the large set; returns the
    outcomes counted."""
    paths = todo(store, regime, cells)
    loaded: dict[bool, tuple[dict[str, Any], dict[str, Any]]] = {}  # the set and the regime's data, by quick flag

    def one(path: Path, quick: bool) -> dict[str, Any]:
        if quick not in loaded:
            the_set = large_set(regime, QUICK_FRESH if quick else FRESH, params_file=params_file)
            loaded[quick] = the_set, D.load_data(regime, work, quick, params_file)
            log(f"[{regime}] large held-out set: {len(the_set['rows'])} problems ({the_set['fresh']} beside "
                f"the test split's {the_set['test_rows']}), sha256 {the_set['sha256'][:12]}")
        return evaluate_run(store, path, *loaded[quick], work=work, params_file=params_file)

    log(f"[{regime}] {len(paths)} run(s) of {', '.join(cells)} without the large held-out curve")
    counts = B.rerun_each(store, regime, paths, one, done="heldout_large", record=RECORD, rule=RULE, limit=limit,
                          log=log)
    log(f"[{regime}] large held-out set: {counts or 'nothing to do'}; {len(todo(store, regime, cells))} left")
    return counts


def evaluate_run(store: RunStore, path: Path, the_set: Mapping[str, Any], data: Mapping[str, Any], *, work: Path,
                 params_file: Path = PARAMS_FILE) -> dict[str, Any]:
    """Reproduce one run with the large set's evaluation beside its own; keep the curve if the rerun is the run."""
    found: list[dict[str, float]] = []
    with extra_evaluation(the_set, found):
        entry, log = B.reproduce(store, path, data, work=work, params_file=params_file)
    if entry["result"] != "reproduced":
        return entry
    run = json.loads(path.read_text())
    run["heldout_large"] = {"problems": len(the_set["rows"]), "fresh": the_set["fresh"], "seed": the_set["seed"],
                            "sha256": the_set["sha256"], "curve": large_curve(run["curve"], found),
                            "evaluated": {"commit": entry["commit"], "at": entry["at"]}}
    if "decision_log" not in run and log is not None:
        run["decision_log"] = B.attach_log(path, log, entry)
    B.write_run(path, run)
    B.clear(path, store, work)
    worst = max(f["se"] for f in found)
    return {**entry, "evaluations": len(found), "largest_se": round(worst, 5)}


__all__ = ["CONTROL_CELLS", "FRESH", "RECORD", "extra_evaluation", "heldout_large", "large_curve", "large_set",
           "score", "todo"]
