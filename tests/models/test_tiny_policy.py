"""Character tokenizer and tiny Llama policy: round trips, offline reload, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvr_core.errors import ConfigError
from rlvr_core.models.tiny import PolicyLoadError, build_tiny_policy, load_policy, num_parameters, save_policy
from rlvr_core.models.tokenizer import (
    BOS_ID,
    CHARACTERS,
    EOS_ID,
    PAD_ID,
    VOCAB,
    build_char_tokenizer,
    check_text,
    encode_prompts,
)

ARITH = ["0047+0083=", "9999*0009=", "0100-0099=", "031", "0"]
COUNTDOWN = ["3,7,25,50>125=", "(7-3)*25+25", "100/(5-1)", "1,2>3="]


@pytest.fixture(scope="module")
def policy():
    return build_tiny_policy(seed=0)


def test_vocabulary_covers_both_task_formats() -> None:
    tok = build_char_tokenizer()
    assert len(tok) == len(VOCAB) == 22
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    for ch in CHARACTERS:
        ids = tok(ch).input_ids
        assert ids == [BOS_ID, VOCAB[ch]], ch
        assert tok.decode(ids, skip_special_tokens=True) == ch


@pytest.mark.parametrize("text", ARITH + COUNTDOWN)
def test_round_trip_one_token_per_character(text: str) -> None:
    tok = build_char_tokenizer()
    ids = tok(text).input_ids
    assert ids[0] == BOS_ID and len(ids) == len(text) + 1
    assert tok.decode(ids + [EOS_ID, PAD_ID], skip_special_tokens=True) == text


def test_left_padding_for_batches() -> None:
    tok = build_char_tokenizer()
    enc = tok(["1+2=", "0047+0083="], padding=True)
    assert enc.input_ids[0][:6] == [PAD_ID] * 6 and enc.input_ids[0][6] == BOS_ID
    assert enc.attention_mask[0] == [0] * 6 + [1] * 5


def test_unknown_characters_are_named() -> None:
    with pytest.raises(ValueError, match="'a' at position 2"):
        check_text("12a")
    tok = build_char_tokenizer()
    with pytest.raises(ValueError, match="prompt 1"):
        encode_prompts(tok, ["1+2=", "1 + 2="])


def test_default_size_and_tied_embeddings(policy) -> None:
    model, _ = policy
    assert model.config.model_type == "llama"
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert 500_000 < num_parameters(model) < 560_000


def test_build_is_deterministic_by_seed() -> None:
    a, _ = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=3)
    b, _ = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=3)
    c, _ = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_bad_size_names_the_field() -> None:
    with pytest.raises(ConfigError, match="heads"):
        build_tiny_policy(hidden=130, heads=4)
    with pytest.raises(ConfigError, match="layers"):
        build_tiny_policy(layers=0)


_RELOAD_SCRIPT = """
import sys, torch
from rlvr_core.models.tiny import load_policy
model, tok = load_policy(sys.argv[1])
ids = torch.tensor([tok("0047+0083=").input_ids])
out = model.generate(ids, max_new_tokens=4, do_sample=False)
print(type(tok).__name__, out.shape[1], float(model(ids).logits.sum()))
"""


def test_save_and_reload_offline_in_a_fresh_process(policy, tmp_path: Path) -> None:
    model, tok = policy
    folder = save_policy(model, tok, tmp_path / "policy")
    ids = torch.tensor([tok("0047+0083=").input_ids])
    with torch.no_grad():
        expected = float(model(ids).logits.sum())
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "empty_hf_home"))
    res = subprocess.run(
        [sys.executable, "-c", _RELOAD_SCRIPT, str(folder)], capture_output=True, text=True, env=env, timeout=360
    )
    assert res.returncode == 0, res.stderr
    _name, length, total = res.stdout.split()
    assert int(length) == ids.shape[1] + 4
    assert float(total) == pytest.approx(expected, rel=1e-5)


def test_reload_in_process_matches(policy, tmp_path: Path) -> None:
    model, tok = policy
    save_policy(model, tok, tmp_path)
    model2, tok2 = load_policy(tmp_path)
    assert tok2.get_vocab() == tok.get_vocab()
    ids = torch.tensor(encode_prompts(tok2, ["3,7,25,50>125="]))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, model2(ids).logits, atol=1e-6)


def test_load_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="does not exist"):
        load_policy(tmp_path / "nope")
    with pytest.raises(PolicyLoadError, match="no config.json"):
        load_policy(tmp_path)


def test_load_rejects_non_llama_config(policy, tmp_path: Path) -> None:
    model, tok = policy
    save_policy(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyLoadError, match="model_type is 'gpt2'"):
        load_policy(tmp_path)


def test_load_rejects_vocabulary_mismatch(policy, tmp_path: Path) -> None:
    model, tok = policy
    save_policy(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["vocab_size"] = 30
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyLoadError, match="vocabulary mismatch.*vocab_size=30"):
        load_policy(tmp_path)
