"""Sizes the machine cannot run are refused when the params load, before the train flow opens an MLflow run (#40).

The issue's reproductions: ``threads=4000`` started 8,000 OS threads in one matmul; vigor ``budget=1e9``, pods
``n_generate=1e9`` and sara ``batch_size=1e8`` passed every check and ended in a MemoryError mid-step, after the
MLflow run had opened. Each is now a ConfigError naming the key, raised by ``load_params`` (so by the flow before
``fix_cpu``, preflight or MLflow), without starting a thread or allocating the arrays it asks for. The
ceilings are read from the machine (``rlvr_core.config.limits``); the memory tests pin it to at most
``SMALL_HOST`` so that they refuse the same sizes on a bigger one.
"""

from __future__ import annotations

import os
import re
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.study.plan import REGIMES, VARIANTS, regime_params
from rlvr_core.allocation import make_allocator
from rlvr_core.config import TrainConfig, limits, load_params
from rlvr_core.errors import ConfigError
from tests.reliability.common import make_flow_root

ROOT = Path(__file__).resolve().parents[2]
SMALL_HOST = 64 * 2**30  # vigor's 1e9 rollouts need >= 149 GiB at max_new_tokens 8; a 64 GiB host refuses them
PARAMS = """\
prepare: {task: arithmetic, n_train: 300, n_test: 40, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 2, eval_every: 1, eval_size: 20,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2}
"""


@pytest.fixture
def small_host(monkeypatch: pytest.MonkeyPatch) -> int:
    """The machine's memory, but at most SMALL_HOST."""
    memory = min(limits.host_memory() or SMALL_HOST, SMALL_HOST)
    monkeypatch.setattr(limits, "host_memory", lambda: memory)
    return memory


@pytest.fixture
def flow_root(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch)


def _with(line: str) -> str:
    """PARAMS with ``line``'s train keys (the ones it sets in place of PARAMS's)."""
    text = PARAMS
    for key in re.findall(r"(?:^|, )(\w+): ", line):
        text = re.sub(rf"(?<=[{{\s]){key}: [^,}}]+,\s*", "", text)
    return text.replace("keep_last: 2}", f"keep_last: 2, {line}}}")


@pytest.mark.parametrize("line, message", [
    ("threads: 4000", r"train\.threads = 4000: at most \d+ on this machine \(the CPUs this process may use\)"),
    ("allocator: vigor, allocators: [vigor], allocator_params: {vigor: {budget: 1000000000}}",
     r"train\.allocator_params\.vigor\.budget = 1000000000: a vigor step's 1,000,000,000 rollouts \(160 bytes each "
     r"at max_new_tokens=8\) need at least ~149\.0 GiB, and this machine has [\d,.]+ GiB of memory"),
    ("allocator: pods, allocators: [pods], allocator_params: {pods: {n_generate: 1000000000}}",
     r"train\.allocator_params\.pods\.n_generate = 1000000000: a pods step's 8,000,000,000 rollouts"),
    ("allocator_params: {sara: {batch_size: 100000000}}",
     r"train\.allocator_params\.sara\.batch_size = 100000000: a sara step's 3,200,000,000 rollouts"),
    ("batch_size: 100000000", r"train\.batch_size = 100000000: a sara step's 3,200,000,000 rollouts"),
])
def test_the_issues_sizes_are_refused_before_anything_runs(flow_root: Path, small_host: int, line: str,
                                                           message: str) -> None:
    from flows.train import train as train_flow

    (flow_root / "params.yaml").write_text(_with(line))
    threads = torch.get_num_threads()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ConfigError, match=message) as err:
            train_flow.fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(flow_root / "params.yaml") in str(err.value)
    assert time.perf_counter() - t0 < 300 and peak < 256 * 2**20, "the size was acted on before the refusal"
    assert torch.get_num_threads() == threads, "torch's threads were set before the refusal"
    assert not (flow_root / "mlflow.db").exists(), "an MLflow run was opened before the refusal"
    assert not list(flow_root.rglob("tracking.json")) and not (flow_root / "runs").exists()


def test_threads_up_to_the_usable_cpus_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "usable_cpus", lambda: 4)
    assert TrainConfig(threads=4).threads == 4
    with pytest.raises(ConfigError, match=r"^threads = 5: at most 4 on this machine"):
        TrainConfig(threads=5)


@pytest.mark.parametrize("kw, message", [
    ({"verifier_workers": 100_000}, r"^verifier_workers = 100000: 100,000 verifier helper processes need at least "
                                    r"~6,250\.0 GiB"),
    ({"eval_samples": 10**8}, r"^eval_samples = 100000000: an evaluation's 50,000,000,000 rollouts"),
    ({"eval_size": 10**9}, r"^eval_size = 1000000000: an evaluation's 1,000,000,000 rollouts"),
    ({"k": 10**8, "allocator": "grpo", "allocators": ["grpo"]}, r"^k = 100000000: a grpo step's 3,200,000,000"),
    ({"allocator_params": {"dapo": {"max_gen_batches": 10**9}}},
     r"^allocator_params\.dapo\.max_gen_batches = 1000000000: a dapo step's 256,000,000,000 rollouts"),
    ({"allocators": ["grpo", "reinforce-ada"], "allocator_params": {"reinforce-ada": {"max_rounds": 10**9}}},
     r"^allocator_params\.reinforce-ada\.max_rounds = 1000000000: a reinforce-ada step's"),
    ({"allocator_params": {"ar3po": {"max_stages": 10**9}}}, r"^allocator_params\.ar3po\.max_stages = 1000000000"),
    ({"allocator_params": {"pilot-commit": {"gen_batch_size": 10**9}}},
     r"^allocator_params\.pilot-commit\.gen_batch_size = 1000000000"),
    ({"allocator_params": {"sara": {"mode": "rollouts", "budget": 10**9}}},
     r"^allocator_params\.sara\.budget = 1000000000: a sara step's 1,000,000,000 rollouts"),
    ({"allocator_params": {"sara+dps": {"candidates_factor": 10**9}}},
     r"^allocator_params\.sara\+dps\.candidates_factor = 1000000000: 256,000,000,000 items of a sara\+dps step's"),
    ({"allocator_params": {"vigor": {"T": 10**10, "gamma": 1.000000000001}}},
     r"^allocator_params\.vigor\.T = 10000000000: 10,000,000,001 items of a vigor step's arrays"),
    ({"max_new_tokens": 32_768, "allocator_params": {"sara": {"max_step_rollouts": 10**6}}},
     r"^allocator_params\.sara\.max_step_rollouts = 1000000: a sara step's 1,000,000 rollouts \(524,320 bytes each"),
])
def test_every_size_has_a_memory_ceiling(small_host: int, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kw)


def test_the_memory_rule_is_rollouts_times_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that fits exactly is accepted, a rollout more is not (grpo: batch_size * k rollouts)."""
    per = limits.rollout_bytes(8)
    assert per == 8 * (4 + 2 * 8)
    base = {"allocator": "grpo", "allocators": ["grpo"], "allocator_params": {}, "eval_size": 1, "verifier_workers": 1,
            "k": 2}
    monkeypatch.setattr(limits, "host_memory", lambda: 2**20 * 2 * per)  # 320 MiB
    assert TrainConfig(**base, batch_size=2**20).batch_size == 2**20
    with pytest.raises(ConfigError, match=r"^batch_size = 1048577: a grpo step's 2,097,154 rollouts \(160 bytes "
                                          r"each at max_new_tokens=8\) need at least ~320\.0 MiB, and this machine "
                                          r"has 320\.0 MiB"):
        TrainConfig(**base, batch_size=2**20 + 1)
    monkeypatch.setattr(limits, "host_memory", lambda: None)  # a machine whose memory cannot be read: no ceiling
    assert TrainConfig(**base, batch_size=10**9).batch_size == 10**9


def test_vigor_refuses_a_T_whose_sizes_overflow() -> None:
    """m0 * gamma**T past a float raised OverflowError at the step's first refinement, after MLflow opened."""
    with pytest.raises(ConfigError, match=r"vigor\.T: got 2000; m0 \* gamma\*\*T overflows a float"):
        make_allocator("vigor", k=8, batch_size=8, T=2000)
    with pytest.raises(ConfigError, match=r"^allocator_params\.vigor\.T: got 2000"):
        TrainConfig(allocator_params={"vigor": {"T": 2000}})
    assert make_allocator("vigor", k=8, batch_size=8, T=1000).params.T == 1000  # 4 * 2**1000 is a float


def test_allocator_params_are_checked_at_load_for_every_named_allocator(tmp_path: Path) -> None:
    """Not only the flow's allocator: a dvc repro trains each of train.allocators."""
    p = tmp_path / "params.yaml"
    p.write_text(PARAMS.replace("allocators: [sara]", "allocators: [sara, pilot-commit]").replace(
        "keep_last: 2}", "keep_last: 2, allocator_params: {pilot-commit: {n_pilot: 4}}}"))
    with pytest.raises(ConfigError, match=r"train\.allocator_params\.pilot-commit\.n_pilot: got 4; it must lie in "
                                          r"\[1, k=4\)"):
        load_params(p)


def test_the_cgroup_limits_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "_CGROUP", tmp_path)
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "memory.max").write_text(f"{2**30}\n")
    assert limits.usable_cpus() == min(2, len(os.sched_getaffinity(0)))
    assert limits.host_memory() == 2**30
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert limits.usable_cpus() == len(os.sched_getaffinity(0))
    phys = limits.host_memory()
    assert phys is not None and phys > 2**30


@pytest.mark.parametrize("name", ["params.yaml", "params-steps.yaml", "params-gpu.yaml", "params-code-gpu.yaml",
                                  "tests/pipeline/tiny_params.yaml"])
def test_the_committed_params_fit_a_small_machine(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Every committed params file (the GPU presets too: their sizes are host rollouts of a few hundred MB)
    loads on a 1-CPU, 4 GiB machine."""
    monkeypatch.setattr(limits, "usable_cpus", lambda: 1)
    monkeypatch.setattr(limits, "host_memory", lambda: 4 * 2**30)
    load_params(ROOT / name)


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_every_benchmark_regime_and_variant_fits_a_small_machine(monkeypatch: pytest.MonkeyPatch,
                                                                 regime: str) -> None:
    monkeypatch.setattr(limits, "usable_cpus", lambda: 1)
    monkeypatch.setattr(limits, "host_memory", lambda: 4 * 2**30)
    for v in VARIANTS.values():
        regime_params(regime, {"train": {"allocator": v.allocator, "allocators": [v.allocator],
                                         "allocator_params": {v.allocator: v.params}, **v.train}})



def test_an_update_whose_logits_cannot_fit_the_host_is_refused(tmp_path: Path, small_host: int) -> None:
    """micro_batch's ceiling needs the policy's vocabulary, so preflight checks it: min(micro_batch, the step's
    rollouts) x max_new_tokens x vocabulary x 4 bytes of float32 logits (Qwen2.5's vocabulary here)."""
    from rlvr_core.preflight import check_update_memory

    (tmp_path / "config.json").write_text('{"vocab_size": 151936}')
    cfg = TrainConfig(micro_batch=10**9, max_new_tokens=1024)
    rows = small_host // (1024 * 151936 * 4) + 1  # the fewest sequences whose logits pass the host
    with pytest.raises(ConfigError, match=rf"^micro_batch = 1000000000: an update's forward pass over {rows:,} "
                                          r"sequences \(float32 logits: 1,024 completion tokens x a vocabulary of "
                                          r"151,936 each\) need at least"):
        check_update_memory(cfg, tmp_path, rows)
    check_update_memory(cfg, tmp_path, rows - 1)  # a step of fewer rollouts fits: micro_batch is capped by it
    check_update_memory(TrainConfig(micro_batch=rows - 1, max_new_tokens=1024), tmp_path, 10**6)


def test_preflight_checks_the_update_before_the_flow_opens_mlflow(flow_root: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import rlvr_core.preflight
    from flows.train import train as train_flow

    seen: list[int] = []

    def refuse(cfg: TrainConfig, policy_dir: Any, step_rollouts: int) -> None:
        seen.append(step_rollouts)
        raise ConfigError("micro_batch = 256: refused")

    monkeypatch.setattr(rlvr_core.preflight, "check_update_memory", refuse)
    with pytest.raises(ConfigError, match="micro_batch = 256: refused"):
        train_flow.fn()
    assert seen and seen[0] > 0
    assert not (flow_root / "mlflow.db").exists(), "an MLflow run was opened before the refusal"
