"""params-gpu.yaml: a valid, complete params file for Qwen2.5-1.5B-Instruct on MATH with the vLLM engine."""

from __future__ import annotations

import inspect
from pathlib import Path

import yaml

from rlvr_core.allocation import ALLOCATORS
from rlvr_core.config import load_params
from rlvr_core.data.hub import DATASETS, MATH500_NAME, MATH_NAME
from rlvr_core.rollout.vllm import VLLMEngine

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "params-gpu.yaml"


def test_gpu_preset_loads_and_names_real_components() -> None:
    p = load_params(GPU)
    assert p.prepare.task == "math"
    src = p.prepare.hub_sources()
    assert src["train"]["dataset"] == "math" and src["train"]["split"] == "train"
    assert src["test"]["dataset"] == "math500" and src["test"]["split"] == "test"
    assert {s["dataset"] for s in src.values()} <= set(DATASETS.names())
    assert inspect.signature(DATASETS.get("math")).parameters["path_or_name"].default == MATH_NAME
    assert inspect.signature(DATASETS.get("math500")).parameters["path_or_name"].default == MATH500_NAME
    assert p.warmstart.base_model == "Qwen/Qwen2.5-1.5B-Instruct"
    t = p.train
    assert t.engine == "vllm" and t.device == "cuda" and t.dtype == "bfloat16"
    assert set(t.allocators) | {t.allocator} | set(t.allocator_params) <= set(ALLOCATORS.names())
    accepted = inspect.signature(VLLMEngine.__init__).parameters
    assert set(t.engine_options) <= set(accepted), set(t.engine_options) - set(accepted)
    assert t.engine_options["dtype"] == "bfloat16" and t.engine_options["enable_sleep_mode"] is True
    assert 0 < t.engine_options["gpu_memory_utilization"] < 0.6
    assert t.lr == 1e-6 and t.kl_coef == 0 and t.k == 8 and 32 <= t.batch_size <= 128
    assert 1024 <= t.max_new_tokens <= 2048 and t.micro_batch <= 8


def test_gpu_preset_has_every_key_dvc_yaml_and_params_yaml_have() -> None:
    """`cp params-gpu.yaml params.yaml && dvc repro` needs every params key a stage lists (DVC refuses missing ones)."""
    gpu = yaml.safe_load(GPU.read_text())
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section in ("prepare", "warmstart", "train", "evaluate"):
        assert section in gpu
    missing_vs_base = [f"train.{k}" for k in base["train"] if k not in gpu["train"]]
    missing_vs_base += [f"evaluate.{k}" for k in base["evaluate"] if k not in gpu["evaluate"]]
    assert not missing_vs_base
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    listed = {p for st in stages.values() for p in (st.get("do", st).get("params") or []) if isinstance(p, str)}
    for key in sorted(listed):
        node = gpu
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"params-gpu.yaml lacks {key} (listed in dvc.yaml)"
            node = node[part]


CODE_GPU = ROOT / "params-code-gpu.yaml"


def test_code_preset_loads_and_reads_livecodebench_releases() -> None:
    from rlvr_core.data.hub import LIVECODEBENCH_NAME
    from rlvr_core.tasks import get_task

    p = load_params(CODE_GPU)
    assert p.prepare.task == "code" and get_task("code").verifier == "code"
    src = p.prepare.hub_sources()
    assert src["train"]["dataset"] == src["test"]["dataset"] == "livecodebench"
    assert src["train"]["path"] is None and src["test"]["path"] is None  # the hub files, not a local copy
    assert (src["train"]["split"], src["test"]["split"]) == ("test", "test2")  # two releases: disjoint problems
    assert inspect.signature(DATASETS.get("livecodebench")).parameters["path_or_name"].default == LIVECODEBENCH_NAME
    assert p.warmstart.base_model == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    t = p.train
    assert t.engine == "vllm" and t.device == "cuda" and t.dtype == "bfloat16"
    assert set(t.engine_options) <= set(inspect.signature(VLLMEngine.__init__).parameters)


def test_code_preset_differs_from_the_math_preset_only_in_what_code_needs() -> None:
    math_p, code_p = (yaml.safe_load(f.read_text()) for f in (GPU, CODE_GPU))
    assert {s: set(v) for s, v in math_p.items()} == {s: set(v) for s, v in code_p.items()}  # the same keys
    changed = {(s, k) for s in math_p for k in math_p[s] if math_p[s][k] != code_p[s][k]}
    assert changed == {("prepare", "task"), ("prepare", "dataset"), ("prepare", "split"),
                       ("prepare", "eval_dataset"), ("prepare", "eval_split"), ("warmstart", "base_model")}
