"""Shared helpers of the reliability tests: the tiny dataset, run comparison, the driver subprocess."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

PROJECT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("driver.py")
TIMING = ("generate_s", "verify_s", "allocate_s", "update_s", "step_s", "eval_s")
# a small sara run: checkpoints at steps 2, 4 and 5 (the last), posteriors carried between steps
CFG: dict[str, Any] = dict(allocator="sara", steps=5, batch_size=8, k=4, eval_every=2, eval_size=20, eval_samples=4,
                           checkpoint_every=2, keep_last=2, seed=1)


@functools.lru_cache(maxsize=1)
def dataset() -> Any:
    """The crash tests' data: ``make_arithmetic(400, 60, 0, digits=(1, 2, 3))`` (train, test)."""
    from rlvr_core.data.arithmetic import make_arithmetic

    return make_arithmetic(400, 60, 0, digits=(1, 2, 3))


def strip_timing(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_state(run_dir: Path, step: int) -> dict[str, Any]:
    from rlvr_core.checkpoint import read_state

    return read_state(run_dir / "checkpoints" / f"step_{step:06d}")


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Deep equality of checkpoint states: tensors and arrays bit-exact, NumPy RNG tuples included."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), path
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"


def driver_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RLVR_FAULT_KILL_AT", None)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(PROJECT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def run_driver(policy: Path, run_dir: Path, cfg: Mapping[str, Any], *, kill_at: str | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the driver to the end (or to its self-inflicted SIGKILL when ``kill_at`` is given)."""
    env = driver_env(**({"RLVR_FAULT_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run([sys.executable, str(DRIVER), str(policy), str(run_dir), json.dumps(dict(cfg))], env=env,
                          cwd=PROJECT, capture_output=True, text=True, timeout=timeout)


def make_flow_root(root: Path, policy_dir: Path, params: str, monkeypatch: Any, *, data: Any = None,
                   generate: bool = False) -> Path:
    """A pipeline root for calling a flow function in process: data/arithmetic (``data``, default
    ``dataset()``), models/warmstart (a copy of ``policy_dir``), params.yaml (``params``), and the env
    pointing RLVR_ROOT, RLVR_PARAMS and MLflow (root/mlflow.db) at it. Unless ``generate``, any rollout
    fails the test: the flow must refuse before generating."""
    from rlvr_core.rollout.hf import HFEngine

    (data if data is not None else dataset()).save_to_disk(str(root / "data/arithmetic"))
    shutil.copytree(policy_dir, root / "models/warmstart")
    (root / "params.yaml").write_text(params)
    monkeypatch.setenv("RLVR_ROOT", str(root))
    monkeypatch.setenv("RLVR_PARAMS", str(root / "params.yaml"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    if not generate:
        monkeypatch.setattr(HFEngine, "generate", lambda self, r: (_ for _ in ()).throw(AssertionError("generated")))
    return root
