"""The pretrained-model path on CPU: hub MATH rows -> base-model snapshot -> GRPO on a chat model -> evaluation.

A random tiny Qwen2 with a byte-level BPE tokenizer and a chat template (tests/models/chat_model.py)
stands in for Qwen/Qwen2.5-1.5B-Instruct, and local files in the hub format (tests/fixtures/hub) for
MATH / MATH-500. Everything runs offline.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

import rlvr_core.training as training
from rlvr_core.checkpoint import read_state
from rlvr_core.config import PrepareConfig, TrainConfig, load_params
from rlvr_core.errors import ConfigError
from rlvr_core.models.policy import PolicyLoadError, load_any_policy, snapshot_base_model
from rlvr_core.rewards import scoring
from tasks.data import hub_dataset, load_split
from tests.models.chat_model import build_chat_model
from tests.pipeline.conftest import PROJECT, PY

FIX = PROJECT / "tests" / "fixtures" / "hub"
MATH_FILE = FIX / "math" / "test.jsonl"  # 6 MATH-format problems: the training split here
MATH500_DIR = FIX / "math500"  # 3 MATH-500 problems: the held-out split


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("hub_model") / "tiny-qwen2-instruct")


@pytest.fixture(scope="module")
def math_rows() -> tuple[list[dict], list[dict]]:
    cfg = PrepareConfig(task="math", dataset="math", path=str(MATH_FILE), eval_dataset="math500",
                        eval_path=str(MATH500_DIR))
    ds, extra = hub_dataset(cfg)
    return list(ds["train"]), list(ds["test"])


def _train_cfg(**kw) -> TrainConfig:
    base = dict(allocator="grpo", k=4, batch_size=4, steps=2, max_new_tokens=12, eval_every=1, eval_size=3,
                eval_samples=0, checkpoint_every=1, keep_last=2, seed=0, lr=1e-3)
    base.update(kw)
    return TrainConfig(**base)


def _coin(text: str, row) -> float:
    """Deterministic stand-in reward (half the completions pass) so that groups are mixed and updates happen."""
    return float(sum(text.encode()) % 2)


def _record_engine_prompts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    seen: list[list[str]] = []
    build = training._build_engine

    def recording(cfg, model, tok, prompts, **kw):
        seen.append(list(prompts))
        return build(cfg, model, tok, prompts, **kw)

    monkeypatch.setattr(training, "_build_engine", recording)
    return seen


# ------------------------------------------------------------------------------------------ prepare


def test_prepare_math_from_local_hub_files(math_rows) -> None:
    train_rows, test_rows = math_rows
    assert len(train_rows) == 6 and len(test_rows) == 3
    assert train_rows[0]["prompt"] == r"Compute $\frac{3}{6}$ in lowest terms."  # the raw problem text
    assert train_rows[0]["answer"] == r"\frac{1}{2}" and test_rows[2]["answer"] == "3"
    assert {r["source"] for r in test_rows} == {"math500"}


def test_prepare_drops_training_rows_that_are_held_out_problems() -> None:
    cfg = PrepareConfig(task="math", path=str(MATH_FILE), eval_path=str(MATH_FILE), eval_split="test", eval_limit=2)
    ds, extra = hub_dataset(cfg)
    assert extra == {"dropped_overlap": 2, "dropped_near_duplicate": 0}
    assert len(ds["train"]) == 4 and not set(ds["train"]["prompt"]) & set(ds["test"]["prompt"])


def test_bad_prepare_values_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"prepare\.dataset: unknown dataset 'hendrycks'.*math500"):
        load_params(_params_file(tmp_path, prepare={"task": "math", "dataset": "hendrycks"}))
    with pytest.raises(ConfigError, match=r"prepare\.dataset: applies to task 'code' or 'math' only"):
        load_params(_params_file(tmp_path, prepare={"task": "arithmetic", "dataset": "math"}))
    with pytest.raises(ConfigError, match=r"prepare\.eval_limit"):
        load_params(_params_file(tmp_path, prepare={"task": "math", "eval_limit": 0}))
    # a GSM8K file read as MATH
    with pytest.raises(ConfigError, match=r"train split from .*gsm8k.*missing field 'solution'"):
        hub_dataset(PrepareConfig(task="math", path=str(FIX / "gsm8k" / "main" / "test.jsonl"),
                                  eval_path=str(MATH500_DIR), eval_dataset="math500"))


# --------------------------------------------------------------------------------- base model, loader


def test_snapshot_and_general_loader(chat_model: Path, tmp_path: Path) -> None:
    info = snapshot_base_model(str(chat_model), tmp_path / "warm")
    assert info["mode"] == "pretrained" and info["model_type"] == "qwen2" and info["chat_template"]
    model, tok = load_any_policy(tmp_path / "warm")
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.training
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    ref, _ = load_any_policy(chat_model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    bf16, _ = load_any_policy(tmp_path / "warm", dtype="bfloat16")
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_missing_or_broken_base_model_is_a_policy_load_error(chat_model: Path, tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="does not exist"):
        snapshot_base_model(str(tmp_path / "no_such_model"), tmp_path / "warm")
    assert not (tmp_path / "warm").exists()
    with pytest.raises(PolicyLoadError, match="does not exist"):
        load_any_policy(tmp_path / "no_such_policy")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(PolicyLoadError, match="not a causal LM"):
        load_any_policy(broken)
    (broken / "config.json").write_text((chat_model / "config.json").read_text())
    with pytest.raises(PolicyLoadError, match="no tokenizer files"):
        load_any_policy(broken)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (chat_model / name).is_file():
            (broken / name).write_bytes((chat_model / name).read_bytes())
    with pytest.raises(PolicyLoadError, match="could not load the weights"):
        load_any_policy(broken)


# ------------------------------------------------------------------------------------------ training


def test_train_chat_model_on_math_rows(chat_model, math_rows, tmp_path, monkeypatch) -> None:
    """2 GRPO steps on the Qwen2 chat model: chat-templated prompts, real updates, reloadable checkpoints."""
    from rlvr_core.models.policy import load_checkpoint_policy

    train_rows, test_rows = math_rows
    seen = _record_engine_prompts(monkeypatch)
    monkeypatch.setattr(scoring, "get_verifier", lambda name: _coin)  # the Scorer's verifier only
    t0 = time.perf_counter()
    res = training.check_and_train(_train_cfg(), policy_dir=chat_model, train_rows=train_rows, test_rows=test_rows,
                                   run_dir=tmp_path / "run", task="math")
    assert time.perf_counter() - t0 < 300
    assert res.steps_done == 2 and "greedy_acc" in res.final_eval
    prompts = seen[0]
    assert len(prompts) == len(train_rows)
    assert prompts[0].startswith("<|im_start|>user\n" + train_rows[0]["prompt"])
    assert prompts[0].endswith("within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    steps = [r for r in res.metrics if r["step"] >= 1]
    assert sum(1 for r in steps if not r["update_skipped"]) >= 1, steps  # mixed groups -> a real backward pass

    model, tok, step = load_checkpoint_policy(str(tmp_path / "run/checkpoints/step_000002"), str(chat_model))
    base, _ = load_any_policy(chat_model)
    assert step == 2 and type(model).__name__ == "Qwen2ForCausalLM"
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed, "the checkpoint holds the base weights: no update reached it"


def test_engine_prompts_encode_chat_tokens_once(chat_model) -> None:
    from rlvr_core.models.policy import policy_prompts
    from rlvr_core.rollout.base import encode_prompt_pool

    _, tok = load_any_policy(chat_model)
    [prompt] = policy_prompts(tok, [{"prompt": "Compute $1+1$."}], "math")
    [ids] = encode_prompt_pool(tok, [prompt])
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == im_start and ids.count(im_start) == 2  # user turn + assistant turn, each one id
    assert tok.decode(ids, skip_special_tokens=False) == prompt


def test_bf16_autocast_training_step_on_cpu(chat_model, math_rows, tmp_path, monkeypatch) -> None:
    train_rows, test_rows = math_rows
    monkeypatch.setattr(scoring, "get_verifier", lambda name: _coin)
    res = training.check_and_train(_train_cfg(steps=1, dtype="bfloat16"), policy_dir=chat_model, train_rows=train_rows,
                                   test_rows=test_rows, run_dir=tmp_path / "run", task="math")
    assert res.steps_done == 1
    state = read_state(tmp_path / "run/checkpoints/step_000001")
    assert all(v.dtype == torch.float32 for v in state["trainer"]["model"].values() if v.is_floating_point())


def test_bad_device_dtype_and_policy_fail_before_any_rollout(chat_model, math_rows, tmp_path, monkeypatch) -> None:
    train_rows, test_rows = math_rows

    def no_engine(*a, **kw):
        raise AssertionError("an engine was built")

    monkeypatch.setattr(training, "_build_engine", no_engine)
    for kw, pattern in ((dict(device="gpu"), "device: got 'gpu'"), (dict(dtype="float16"), "dtype: got 'float16'")):
        with pytest.raises(ConfigError, match=pattern):
            _train_cfg(**kw)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device is visible"):
            training.check_and_train(_train_cfg(device="cuda"), policy_dir=chat_model, train_rows=train_rows,
                                     test_rows=test_rows, run_dir=tmp_path / "a", task="math")
    with pytest.raises(PolicyLoadError, match="does not exist"):
        training.check_and_train(_train_cfg(), policy_dir=tmp_path / "missing", train_rows=train_rows,
                                 test_rows=test_rows,
                       run_dir=tmp_path / "b", task="math")


# ---------------------------------------------------------------------------------------- the flows


def _params_file(tmp: Path, **sections) -> Path:
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def _flow(env: dict[str, str], *args: str) -> str:
    p = subprocess.run([PY, "-m", *args], env=env, cwd=PROJECT, capture_output=True, text=True, timeout=720)
    assert p.returncode == 0, f"{args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr


@pytest.mark.slow
def test_flows_prepare_warmstart_train_evaluate(chat_model, pipeline_env, tmp_path) -> None:
    """The flows on task math with a pretrained base: data/math, the snapshot, 2 steps (hf engine, math verifier)."""
    params = _params_file(
        tmp_path,
        prepare={"task": "math", "dataset": "math", "path": str(MATH_FILE), "eval_dataset": "math500",
                 "eval_path": str(MATH500_DIR)},
        warmstart={"base_model": str(chat_model)},
        train={"allocator": "grpo", "allocators": ["grpo"], "k": 2, "batch_size": 4, "steps": 2,
               "max_new_tokens": 12, "eval_every": 1, "eval_size": 3, "eval_samples": 0, "checkpoint_every": 1,
               "keep_last": 2, "device": "cpu", "dtype": "float32", "seeds": [0],
               "allow_no_update": True},  # a random 2-layer model on MATH: the path runs, it need not learn
        evaluate={"k": 2, "n_samples": 2, "max_new_tokens": 12},
    )
    env = {**pipeline_env, "RLVR_PARAMS": str(params)}
    _flow(env, "flows.prepare")
    counts = json.loads((tmp_path / "data/math/counts.json").read_text())
    assert counts["rows"] == {"train": 6, "test": 3} and counts["dropped_overlap"] == 0
    assert load_split(str(tmp_path / "data/math"), "test")[0]["id"] == "test/prealgebra/101.json"

    _flow(env, "flows.warmstart")
    report = json.loads((tmp_path / "reports/warmstart.json").read_text())
    assert report["mode"] == "pretrained" and report["base_model"] == str(chat_model)
    assert (tmp_path / "models/warmstart/config.json").is_file()

    _flow(env, "flows.train", "--allocator", "grpo")
    run = tmp_path / "runs/grpo-s0"  # pipeline/paths.run_dir: <allocator>-s<train.seed>
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and "greedy_acc" in summary["final_eval"]
    model, _ = load_any_policy(run / "final_model")
    assert type(model).__name__ == "Qwen2ForCausalLM"

    out = _flow(env, "flows.evaluate", "--checkpoint", str(run / "checkpoints/step_000002"))
    assert '"step": 2' in out and '"pass_at_2"' in out
