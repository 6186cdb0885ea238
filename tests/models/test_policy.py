"""load_any_policy, device/precision settings and chat prompts (rlvr_core.models.policy)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr_core.errors import ConfigError
from rlvr_core.models.policy import (
    PolicyLoadError,
    check_policy_folder,
    is_tiny_policy,
    load_any_policy,
    policy_prompts,
    precision,
    resolve_device,
    snapshot_base_model,
)
from rlvr_core.models.tiny import build_tiny_policy, load_policy, save_policy
from tests.models.chat_model import build_chat_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64)
    return save_policy(model, tok, tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> Path:
    return build_chat_model(tmp_path_factory.mktemp("chat") / "model")


def test_tiny_folder_loads_as_the_tiny_policy(tiny_dir: Path) -> None:
    assert is_tiny_policy(tiny_dir)
    model, tok = load_any_policy(tiny_dir)
    ref, ref_tok = load_policy(tiny_dir)
    assert tok.get_vocab() == ref_tok.get_vocab() and tok.chat_template is None
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))
    assert check_policy_folder(tiny_dir) == {"kind": "tiny", "model_type": "llama", "chat_template": False}
    assert next(load_any_policy(tiny_dir, dtype="bfloat16")[0].parameters()).dtype == torch.bfloat16


def test_other_causal_lm_folder(chat_dir: Path) -> None:
    assert not is_tiny_policy(chat_dir)
    info = check_policy_folder(chat_dir)
    assert info == {"kind": "pretrained", "model_type": "qwen2", "chat_template": True}
    model, tok = load_any_policy(chat_dir)
    assert next(model.parameters()).dtype == torch.float32 and tok.pad_token_id is not None


def test_tiny_prompts_unchanged_chat_prompts_rendered(tiny_dir: Path, chat_dir: Path) -> None:
    rows = [{"prompt": "0047+0083="}, {"prompt": "0003*0004="}]
    _, tiny_tok = load_any_policy(tiny_dir)
    assert policy_prompts(tiny_tok, rows, "arithmetic") == ["0047+0083=", "0003*0004="]
    _, chat_tok = load_any_policy(chat_dir)
    [p] = policy_prompts(chat_tok, [{"prompt": "Solve $x+2=5$."}], "math")
    assert p == ("<|im_start|>user\nSolve $x+2=5$.\n\nReason step by step, and put your final answer within "
                 "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    assert policy_prompts(chat_tok, rows, "arithmetic") == ["0047+0083=", "0003*0004="]  # no instruction: raw


def test_evaluation_renders_chat_prompts(chat_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlvr_core.rollout.hf as hf
    from rlvr_core.evaluation import evaluate_policy

    seen = []
    original = hf.HFEngine.set_prompts

    def record(self, prompts):
        seen.append(list(prompts))
        original(self, prompts)

    monkeypatch.setattr(hf.HFEngine, "set_prompts", record)
    policy = load_any_policy(chat_dir)
    ev = evaluate_policy(policy, [{"id": "a", "prompt": "Solve $x+2=5$.", "answer": "3"}], "math", k=1,
                         n_samples=0, max_new_tokens=4)
    assert ev["n_problems"] == 1.0 and seen[0][0].startswith("<|im_start|>user\nSolve $x+2=5$.")


def test_resolve_device_and_precision() -> None:
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="use 'cpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with precision("cpu", "float32"):
        assert lin(x).dtype == torch.float32
    with precision("cpu", "bfloat16"):
        assert lin(x).dtype == torch.bfloat16
    with pytest.raises(ConfigError):
        with precision("cpu", "float16"):
            pass


def test_snapshot_of_a_hub_id_not_in_the_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_cache"))
    with pytest.raises(PolicyLoadError, match="huggingface-cli download rlvr-test/no-such-model"):
        snapshot_base_model("rlvr-test/no-such-model", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_snapshot_replaces_an_earlier_policy_folder(tiny_dir: Path, chat_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "warm"
    save_policy(*load_policy(tiny_dir), out)
    (out / "stale.bin").write_bytes(b"x")
    snapshot_base_model(str(chat_dir), out)
    assert not (out / "stale.bin").exists() and not is_tiny_policy(out)
    assert check_policy_folder(out)["model_type"] == "qwen2"


def test_weights_of_another_model_are_refused(chat_dir: Path, tmp_path: Path) -> None:
    """A config.json that does not describe the weights file loads in transformers with a warning and
    random parameters; the loader and the base-model snapshot refuse it."""
    import json
    import shutil

    bad = tmp_path / "model"
    shutil.copytree(chat_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(num_hidden_layers=cfg["num_hidden_layers"] + 1, layer_types=cfg["layer_types"] + ["full_attention"])
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyLoadError, match=r"weights do not match config.json \(.*missing keys"):
        load_any_policy(bad)
    with pytest.raises(PolicyLoadError, match="base_model.*weights do not match config.json"):
        snapshot_base_model(str(bad), tmp_path / "snapshot")
    cfg.pop("layer_types")
    cfg["num_hidden_layers"] = -1  # a config transformers refuses to build
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyLoadError, match="config.json does not load"):
        load_any_policy(bad)
