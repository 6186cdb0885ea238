"""Exact replication, part one: a training stage's results do not depend on the thread environment, nor on the
CPU kernels the machine would choose (flows.common.fix_cpu pins them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr_core.training import TIMING_KEYS
from tests.pipeline.conftest import PROJECT, PY, sh, threads_env

pytestmark = pytest.mark.slow


def results(run: Path) -> dict[str, bytes]:
    """Every result file of a run folder, by relative path: checkpoints, final policy, metrics, summary, curve."""
    files = [p for d in ("checkpoints", "final_model") for p in (run / d).rglob("*") if p.is_file()]
    files += [run / n for n in ("metrics.jsonl", "summary.json", "curve.csv")]
    return {str(p.relative_to(run)): p.read_bytes() for p in files}


def test_training_stage_is_byte_identical_whatever_the_thread_environment(pipeline_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    for mod in ("flows.prepare", "flows.warmstart"):
        sh(pipeline_env, PROJECT, PY, "-m", mod, timeout=300)
    # "other": as on a processor without AVX-512, whose torch and MKL would choose other kernels than this one's
    other = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    for out, env in (("one", threads_env(pipeline_env, 1)), ("two", threads_env(pipeline_env, 2)),
                     ("other", dict(threads_env(pipeline_env, 1), **other))):
        sh(env, PROJECT, PY, "-m", "flows.train", "--allocator", "sara", "--out", f"runs/{out}", timeout=1800)
    one, two = results(tmp_path / "runs/one"), results(tmp_path / "runs/two")
    assert results(tmp_path / "runs/other") == one, "the run's bytes depend on the processor's kernels"
    assert any(k.endswith("tensors.safetensors") for k in one) and "final_model/model.safetensors" in one, sorted(one)
    assert one == two, sorted(k for k in one if one[k] != two.get(k))  # OMP_NUM_THREADS=2 changed nothing
    # torch ran on train.threads (1), not on the environment's two threads
    assert json.loads((tmp_path / "runs/two/train_timings.json").read_text())["threads"] == 1
    # the seconds live beside the results, one line per step record
    metrics = [json.loads(x) for x in one["metrics.jsonl"].decode().splitlines()]
    timings = [json.loads(x) for x in (tmp_path / "runs/one/timings.jsonl").read_text().splitlines()]
    assert not any(k in r for r in metrics for k in TIMING_KEYS)
    assert [t["step"] for t in timings] == [r["step"] for r in metrics] and all(t["step_s"] > 0 for t in timings[1:])
    assert json.loads((tmp_path / "runs/one/train_timings.json").read_text())["step_s"] > 0
