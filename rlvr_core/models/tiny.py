"""The tiny character-level policy of the CPU default: a small Llama.

Default size (``build_tiny_policy()``): vocabulary 22, hidden 128, 2 layers,
4 heads of 32, MLP 512, tied input/output embeddings: 0.53M parameters. It
is an ordinary ``LlamaForCausalLM``, so the same trainer, rollout engines and
checkpoint code serve it and a hub model alike. (Llama, not qwen2: when a
folder says qwen2, ``AutoTokenizer`` rebuilds the tokenizer as byte-level BPE
and the character vocabulary is lost.)

``save_policy`` / ``load_policy`` store and load model + tokenizer as one
folder that reloads offline (``HF_HUB_OFFLINE=1``) from the folder alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from rlvr_core.errors import ConfigError, require
from rlvr_core.models.tokenizer import (
    BOS_ID,
    EOS_ID,
    MAX_LENGTH,
    PAD_ID,
    VOCAB,
    build_char_tokenizer,
    vocabulary_problems,
)


class PolicyLoadError(ValueError):
    """A policy folder is missing, incomplete or not a tiny Llama policy."""


def tiny_config(hidden: int = 128, layers: int = 2, heads: int = 4, intermediate: int = 512) -> LlamaConfig:
    """LlamaConfig of the tiny policy; ConfigError names a bad field."""
    for name, v in (("hidden", hidden), ("layers", layers), ("heads", heads), ("intermediate", intermediate)):
        require(isinstance(v, int) and v > 0, name, f"must be a positive int, got {v!r}")
    require(hidden % heads == 0, "heads", f"hidden={hidden} must be divisible by heads={heads}")
    require((hidden // heads) % 2 == 0, "heads", f"head size hidden/heads={hidden // heads} must be even (RoPE)")
    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        attention_dropout=0.0,
        rms_norm_eps=1e-6,
    )


def build_tiny_policy(
    hidden: int = 128, layers: int = 2, heads: int = 4, intermediate: int = 512, seed: int = 0
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Fresh randomly initialised tiny policy and its character tokenizer.

    Initialisation is deterministic by ``seed`` and leaves the global torch RNG
    as it found it. The model is float32, on CPU, in eval mode.
    """
    config = tiny_config(hidden, layers, heads, intermediate)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.eval()
    return model, build_char_tokenizer()


def num_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide transformers' per-shard progress bars (noise for a 2 MB model in step logs)."""
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save_policy(model: LlamaForCausalLM, tok: PreTrainedTokenizerBase, folder: str | os.PathLike) -> Path:
    """Write model (safetensors + config) and tokenizer into ``folder``; returns its path."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    with _quiet_progress():
        model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def load_policy(
    folder: str | os.PathLike, *, device: str | torch.device = "cpu"
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Load a policy saved by ``save_policy``, offline, from the folder alone.

    Raises PolicyLoadError for a missing folder, a missing config or tokenizer,
    a config that is not Llama, or a tokenizer whose vocabulary does not match
    the character vocabulary or the model's embedding size.
    """
    path = Path(folder)
    if not path.is_dir():
        raise PolicyLoadError(
            f"policy folder {str(path)!r} does not exist; run the warm start (or save_policy) to create it"
        )
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise PolicyLoadError(f"policy folder {str(path)!r} has no config.json; it was not written by save_policy")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise PolicyLoadError(f"{cfg_file}: not valid JSON ({e})") from e
    model_type = raw.get("model_type")
    if model_type != "llama":
        raise PolicyLoadError(
            f"{cfg_file}: model_type is {model_type!r}, the tiny policy is 'llama'; "
            "point the path at a folder written by save_policy"
        )
    if not (path / "tokenizer.json").is_file():
        raise PolicyLoadError(f"policy folder {str(path)!r} has no tokenizer.json; save the tokenizer with it")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    problems = vocabulary_problems(tok)
    vocab_size = raw.get("vocab_size")
    if vocab_size != len(tok):
        problems.append(f"config vocab_size={vocab_size} but the tokenizer has {len(tok)} tokens")
    if problems:
        raise PolicyLoadError(f"policy folder {str(path)!r}: vocabulary mismatch: " + "; ".join(problems))
    try:
        with _quiet_progress():
            model = LlamaForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as e:
        raise PolicyLoadError(f"policy folder {str(path)!r}: could not load the weights ({e})") from e
    model.to(device)
    model.eval()
    return model, tok


__all__ = [
    "ConfigError",
    "PolicyLoadError",
    "build_tiny_policy",
    "load_policy",
    "num_parameters",
    "save_policy",
    "tiny_config",
]
