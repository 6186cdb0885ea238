"""Build and record the warm starts the results start from: artifacts/warmstart/<key>/ + manifest.json.

    nice python -m benchmarks.record_policies default     # params.yaml's: the warmstart stage of `make run`
    nice python -m benchmarks.record_policies hard easy   # the study's regimes (benchmarks/study/plan.py)
    nice python -m benchmarks.record_policies hard-ws3    # a warm start of one (pool-ws3 shares its policy)

Each policy is built as its users build it (``warm_start`` on the prepared train split, on one torch thread),
recorded with the sha256 of every file (rlvr_core.models.recorded) and the warm start's metrics, which the
warmstart flow writes as reports/warmstart.json when it uses the recording, and its held-out greedy accuracy
on the regime's test rows (``start_heldout_greedy_acc``: the study's starting accuracy). A policy takes 4-5
minutes of one core; building one again on the same machine gives the same bytes (the recording says which
machine). Then `make run` and the study use the recording, verified, instead of building.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.study import data as D
from benchmarks.study import plan as P
from rlvr_core.config import Params, load_params
from rlvr_core.models.recorded import policy_key, record_policy

TIMING_KEYS = ("seconds", "train_seconds", "eval_seconds")  # flows/warmstart.py keeps them out of warmstart.json


def params_of(name: str) -> tuple[Params, list[dict[str, Any]]]:
    """(params, held-out rows) of ``default`` (params.yaml and its test split) or a study regime."""
    if name == "default":
        params = load_params(P.PARAMS_FILE)
        return params, list(D.dataset(params)["test"])
    params = P.regime_params(name)
    return params, D.splits(D.dataset(params))[1]


def regime_name(name: str) -> str:
    """``name`` if it is ``default``, a study regime or a warm start of one (``hard-ws3``); else argparse's error."""
    if name != "default":
        try:
            P.base_regime(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return name


def build(name: str) -> dict[str, Any]:
    """Build ``name``'s warm start and record it; returns its manifest entry."""
    from rlvr_core.evaluation import evaluate_policy
    from rlvr_core.models.warmstart import warm_start
    from rlvr_core.tasks import warm_start_teacher

    torch.set_num_threads(1)
    params, heldout = params_of(name)
    train_rows = list(D.dataset(params)["train"])
    key = policy_key(params.prepare, params.warmstart)
    with tempfile.TemporaryDirectory() as tmp:
        model, tok, metrics = warm_start(train_rows, teacher=warm_start_teacher(params.prepare.task),
                                         **params.warmstart.sft_kwargs(),
                                         out_dir=Path(tmp) / "policy")
        acc = evaluate_policy((model, tok), heldout, params.prepare.task, k=8, n_samples=0)["greedy_acc"]
        info = {"name": name, "metrics": {k: v for k, v in metrics.items() if k not in TIMING_KEYS},
                "start_heldout_greedy_acc": acc, "heldout_rows": len(heldout), "build_seconds": metrics["seconds"],
                "built_on": f"{platform.machine()} {platform.processor() or platform.platform()}, torch "
                            f"{torch.__version__}, 1 thread"}
        entry = record_policy(P.RECORDED, key, Path(tmp) / "policy", info)
    print(f"{name}: policy {key} recorded in {P.RECORDED / key} ({sum(f['bytes'] for f in entry['files'].values()):,}"
          f" bytes); held-out greedy accuracy {acc:.4f} on {len(heldout)} rows; built in {metrics['seconds']:.0f} s")
    return entry


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="+", type=regime_name, metavar="NAME",
                    help=f"default, a regime ({', '.join(P.REGIMES)}) or a warm start of one (<regime>{P.WS_SEP}<J>)")
    for n in ap.parse_args().names:
        build(n)
