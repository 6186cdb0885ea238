"""Any policy folder: the tiny character-level Llama or a pretrained causal LM.

``load_any_policy(folder)`` loads the tiny policy of the CPU default through
``rlvr_core.models.tiny.load_policy`` (with its vocabulary checks) and any other
causal LM folder (``save_pretrained`` layout, e.g. a snapshot of
``Qwen/Qwen2.5-1.5B-Instruct``) through ``AutoModelForCausalLM`` /
``AutoTokenizer``, offline, from the folder alone. Problems raise
``PolicyLoadError`` naming the folder and what is wrong.

Also here: the device and precision settings of the ``train`` section
(``resolve_device``, ``precision``), the prompt strings a policy is given
(``policy_prompts``: the tokenizer's chat template when it has one, the raw
prompt otherwise) and the snapshot of a pretrained base model that replaces
the supervised warm start (``snapshot_base_model``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from rlvr_core.errors import ConfigError
from rlvr_core.models.tiny import PolicyLoadError, _quiet_progress, load_policy, num_parameters, save_policy
from rlvr_core.models.tokenizer import VOCAB

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise PolicyLoadError(f"policy folder {str(path)!r} does not exist; run the warm start "
                              "(python -m flows.warmstart) to create it")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise PolicyLoadError(f"policy folder {str(path)!r} has no config.json; it is not a saved model "
                              "(save_pretrained / save_policy layout)")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise PolicyLoadError(f"{cfg_file}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise PolicyLoadError(f"{cfg_file}: expected a JSON object")
    return raw


def is_tiny_policy(folder: str | os.PathLike) -> bool:
    """True when ``folder`` holds the tiny character-level policy (a Llama over the 22-token vocabulary)."""
    path = Path(folder)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return raw.get("model_type") == "llama" and raw.get("vocab_size") == len(VOCAB)


def _torch_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: got {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise PolicyLoadError(f"policy folder {str(path)!r} has no tokenizer files ({' / '.join(_TOKENIZER_FILES)}); "
                              "save the tokenizer with the model (tokenizer.save_pretrained)")
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - it also parses config.json, whose validators raise their own types
        raise PolicyLoadError(f"policy folder {str(path)!r}: could not load the tokenizer ({e}); "
                              "save the tokenizer with the model (tokenizer.save_pretrained)") from e
    return _with_special_tokens(tok, f"policy folder {str(path)!r}")


def _with_special_tokens(tok: Any, what: str) -> Any:
    """``tok`` after checking it has an eos token (PolicyLoadError naming ``what`` if not); a missing
    pad token becomes the eos token."""
    if tok.eos_token_id is None:
        raise PolicyLoadError(f"{what}: the tokenizer has no eos token; generation could never stop")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # padding positions are masked out; any id works
    return tok


def check_policy_folder(folder: str | os.PathLike) -> dict[str, Any]:
    """Check, without loading a large model's weights, that ``folder`` can be loaded as a policy.

    The tiny policy is loaded in full (it is 2 MB). Any other model must have a
    causal-LM config, a weights file and a loadable tokenizer with an eos token.
    Returns {"kind": "tiny"|"pretrained", "model_type": ..., "chat_template": bool}.
    Raises PolicyLoadError naming the folder and the problem.
    """
    path = Path(folder)
    raw = _read_config(path)
    if is_tiny_policy(path):
        _, tok = load_policy(path)
        return {"kind": "tiny", "model_type": "llama", "chat_template": bool(getattr(tok, "chat_template", None))}
    _check_causal_lm(path, raw)
    if not any((path / f).is_file() for f in _WEIGHT_FILES):
        raise PolicyLoadError(f"policy folder {str(path)!r} has no weights ({' / '.join(_WEIGHT_FILES)})")
    tok = _load_tokenizer(path)
    return {"kind": "pretrained", "model_type": raw.get("model_type"),
            "chat_template": bool(getattr(tok, "chat_template", None))}


def _check_causal_lm(path: Path, raw: Mapping[str, Any]) -> None:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = raw.get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise PolicyLoadError(f"policy folder {str(path)!r}: model_type {model_type!r} is not a causal LM "
                              "transformers knows (AutoModelForCausalLM)")
    try:
        AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - config validators raise their own types (huggingface_hub dataclasses)
        raise PolicyLoadError(f"policy folder {str(path)!r}: config.json does not load ({e})") from e


def _refuse_partial_load(what: str, info: Mapping[str, Any]) -> None:
    """PolicyLoadError when the weights file does not fit the config: transformers only warns, and the
    parameters it could not fill would train from random values."""
    problems = {k: list(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        detail = "; ".join(f"{len(v)} {k.replace('_', ' ')} (e.g. {sorted(map(str, v))[0]})"
                           for k, v in problems.items())
        raise PolicyLoadError(f"{what}: the weights do not match config.json ({detail}); "
                              "the folder mixes files of different models")


def load_any_policy(
    folder: str | os.PathLike, *, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
) -> tuple[Any, Any]:
    """(model, tokenizer) of any policy folder, offline, in eval mode on ``device``.

    The tiny policy goes through ``tiny.load_policy`` (float32). Any other causal
    LM is loaded with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and
    ``local_files_only=True``; a tokenizer without a pad token gets its eos token
    as pad token. ``dtype`` ("float32", "bfloat16" or a torch dtype) casts the
    weights; None keeps float32 for the tiny policy and loads other models in
    float32 too (the trainer keeps float32 master weights; bf16 compute is
    autocast, see ``precision``).

    Raises PolicyLoadError for a missing folder, config, tokenizer or weights,
    a model type that is not a causal LM, or weights that do not load.
    """
    path = Path(folder)
    raw = _read_config(path)
    want = _torch_dtype(dtype)
    if is_tiny_policy(path):
        model, tok = load_policy(path, device=device)
        if want is not None and want != torch.float32:
            model.to(dtype=want)
        return model, tok
    from transformers import AutoModelForCausalLM

    _check_causal_lm(path, raw)
    tok = _load_tokenizer(path)
    try:
        with _quiet_progress():
            model, info = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=want or torch.float32,
                                                               output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - transformers and huggingface_hub raise many types for a bad folder
        raise PolicyLoadError(f"policy folder {str(path)!r}: could not load the weights "
                              f"({e.__class__.__name__}: {e})") from e
    _refuse_partial_load(f"policy folder {str(path)!r}", info)
    if getattr(model.generation_config, "pad_token_id", None) is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    model.to(device)
    model.eval()
    return model, tok


def load_checkpoint_policy(checkpoint: str | os.PathLike, base_policy_dir: str | os.PathLike,
                           device: str = "cpu") -> tuple[Any, Any, int]:
    """(model, tokenizer, step) of a training checkpoint folder ``runs/<name>/checkpoints/step_N``.

    The base policy folder (tiny or any causal LM, ``load_any_policy``) gives the architecture and tokenizer;
    the checkpoint's trainer state gives the weights (safetensors and JSON only: a pickle-format checkpoint is
    refused, and only the policy weights' tensors are read).
    """
    from rlvr_core.checkpoint import manifest_step, read_state

    weights = read_state(checkpoint, part=("trainer", "model"))
    model, tok = load_any_policy(base_policy_dir)
    model.load_state_dict(weights)
    del weights
    model.to(device)
    model.eval()
    return model, tok, manifest_step(checkpoint)


def save_any_policy(model: Any, tok: Any, folder: str | os.PathLike) -> Path:
    """Write model and tokenizer with ``save_pretrained`` (any causal LM, tiny included), and the folder's
    ``sha256.json`` (``rlvr_core.models.integrity``)."""
    from rlvr_core.models.integrity import write_policy_record

    path = save_policy(model, tok, folder)
    write_policy_record(path)
    return path


# ------------------------------------------------------------------ device and precision


def resolve_device(device: str) -> str:
    """"cpu" / "cuda" / "cuda:N" / "auto" -> a torch device string; ConfigError when CUDA is asked for but absent."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device: {device!r} but no CUDA device is visible to this process "
                              "(torch.cuda.is_available() is False); use 'cpu' or 'auto'")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"train.device: {device!r} but only {torch.cuda.device_count()} CUDA device(s) "
                              "are visible")
        return device
    if device != "cpu":
        raise ConfigError(f"train.device: got {device!r}; use 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return device


@contextlib.contextmanager
def precision(device: str | torch.device, dtype: str) -> Iterator[None]:
    """Context for the forward/backward passes: nothing for float32, bfloat16 autocast for "bfloat16"."""
    if dtype == "float32":
        yield
        return
    if dtype != "bfloat16":
        raise ConfigError(f"train.dtype: got {dtype!r}; use 'float32' or 'bfloat16'")
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        yield


# ------------------------------------------------------------------------------ prompts


def policy_prompts(tokenizer: Any, rows: Sequence[Mapping[str, Any]], task: str) -> list[str]:
    """The prompt string the policy is given for each row.

    With a chat template (instruction-tuned models): ``templates.render_prompt``
    of the row's problem text with the task's instruction (``templates.INSTRUCTIONS``;
    tasks without one keep their raw prompt). Without (the tiny policy): the
    row's ``prompt`` unchanged.
    """
    from rlvr_core.data.templates import INSTRUCTIONS, has_chat_template, render_prompt

    raw = [r["prompt"] for r in rows]
    if not has_chat_template(tokenizer) or task not in INSTRUCTIONS:
        return raw
    return [render_prompt(p, tokenizer, task=task) for p in raw]


# ----------------------------------------------------------------------- base model snapshot


def _looks_like_path(name: str) -> bool:
    """A name that can only be a folder (hub ids are ``name`` or ``org/name``)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def snapshot_base_model(base_model: str, out_dir: str | os.PathLike, *, local_files_only: bool | None = None
                        ) -> dict[str, Any]:
    """Copy a pretrained causal LM and its tokenizer into ``out_dir`` (``save_pretrained`` layout).

    ``base_model``: a local folder, or a hub id (``Qwen/Qwen2.5-1.5B-Instruct``)
    found in the Hugging Face cache, or downloaded when ``local_files_only`` is
    False (None: False only when neither HF_HUB_OFFLINE nor TRANSFORMERS_OFFLINE
    is set). Weights keep their stored dtype. Returns what was done (for
    reports/warmstart.json). Raises PolicyLoadError when the model cannot be
    found or loaded, before anything is written to ``out_dir``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    local = Path(os.path.expanduser(base_model))
    if local.is_dir():
        source, offline = local, True
        raw = _read_config(local)
        _check_causal_lm(local, raw)
    elif _looks_like_path(base_model):
        raise PolicyLoadError(f"warmstart.base_model: folder {base_model!r} does not exist; give an existing "
                              "model folder or a hub id such as 'Qwen/Qwen2.5-1.5B-Instruct'")
    else:
        env_offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes")
                          for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        source, offline = base_model, env_offline if local_files_only is None else local_files_only
    try:
        tok = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        with _quiet_progress():
            model, info = AutoModelForCausalLM.from_pretrained(source, local_files_only=offline, dtype="auto",
                                                               output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - transformers and huggingface_hub raise many types for a bad source
        hint = (f" (offline: download it once with `huggingface-cli download {base_model}` or unset HF_HUB_OFFLINE)"
                if offline and not local.is_dir() else "")
        raise PolicyLoadError(f"warmstart.base_model {base_model!r}: could not load model and tokenizer{hint}: "
                              f"{e}") from e
    _refuse_partial_load(f"warmstart.base_model {base_model!r}", info)
    tok = _with_special_tokens(tok, f"warmstart.base_model {base_model!r}")
    out = Path(out_dir)
    if out.exists():  # files of an earlier warm start (another model's shards) must not linger
        shutil.rmtree(out)
    save_any_policy(model, tok, out)  # with its sha256.json
    return {
        "mode": "pretrained",
        "base_model": base_model,
        "model_type": model.config.model_type,
        "params": num_parameters(model),
        "dtype": str(model.dtype).replace("torch.", ""),
        "vocab_size": len(tok),
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "seconds": time.perf_counter() - t0,
    }


__all__ = ["DTYPES", "PolicyLoadError", "check_policy_folder", "is_tiny_policy", "load_any_policy", "policy_prompts",
           "precision", "resolve_device", "save_any_policy", "snapshot_base_model"]
