"""A whole params file: its sections (``SECTIONS``), read, checked and made to agree (``load_params``)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rlvr_core.config.checks import check_fields
from rlvr_core.config.evaluate import EvaluateConfig
from rlvr_core.config.prepare import PrepareConfig
from rlvr_core.config.reading import read_yaml, short_repr
from rlvr_core.config.train import TrainConfig
from rlvr_core.errors import ConfigError, from_mapping
from rlvr_core.models.warmstart_config import WarmStartConfig

REQUIRED_SECTIONS: tuple[str, ...] = ("prepare", "train")


@dataclass(frozen=True)
class Params:
    prepare: PrepareConfig
    warmstart: WarmStartConfig
    train: TrainConfig
    evaluate: EvaluateConfig


SECTIONS = {"prepare": PrepareConfig, "warmstart": WarmStartConfig, "train": TrainConfig, "evaluate": EvaluateConfig}


def load_params(path: str | Path = "params.yaml", overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
                text: str | None = None) -> Params:
    """Read and validate params.yaml; ``overrides`` {section: {key: value}} win over the file.

    The file must hold the sections ``REQUIRED_SECTIONS`` (prepare and train), and its sections must
    agree (``check_sections_agree``: a task without a tiny-policy warm start needs
    ``warmstart.base_model``); a section it leaves out
    (warmstart, evaluate) and keys a section leaves out take the dataclass defaults, which are the
    project's params.yaml values. An error about an overridden key says the value came from the
    overrides (the flows' --set and --steps/--seed/--allocator), not from the file.

    ``text``, when given, is the file's content, already read (a deployment's params file is read once, from
    the descriptor its checks ran on: pipeline/untrusted.py); ``path`` then only names it in messages and is
    not opened.
    """
    path = Path(path)
    if text is None:
        if not path.is_file():
            raise ConfigError(f"{path}: no such file; run from the project root or pass the params file")
        text = path.read_text()
    raw = read_yaml(text, str(path))
    need = f"a params file needs the sections {', '.join(REQUIRED_SECTIONS)} (see the project's params.yaml)"
    if raw is None:
        raise ConfigError(f"{path}: empty (or only comments); {need}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    for sec in raw:
        if sec not in SECTIONS and sec != "report":
            close = difflib.get_close_matches(str(sec), list(SECTIONS), n=1)
            hint = f" (did you mean {short_repr(close[0])}?)" if close else ""
            raise ConfigError(f"{path}: unknown section {short_repr(sec)}{hint}; valid: {', '.join(SECTIONS)}, report")
    for sec in SECTIONS:
        if raw.get(sec) is not None and not isinstance(raw[sec], Mapping):
            raise ConfigError(f"{path}: {sec}: got {short_repr(raw[sec])}; need a mapping of {sec} keys")
    merged = {sec: dict(raw.get(sec) or {}) for sec in SECTIONS}
    for sec, vals in (overrides or {}).items():
        if sec not in SECTIONS:
            raise ConfigError(f"overrides: unknown section {short_repr(sec)}; valid: {', '.join(SECTIONS)}")
        merged[sec].update(vals)
    try:
        for sec, cls in SECTIONS.items():
            try:
                check_fields(cls, merged[sec])
            except ConfigError as e:
                raise ConfigError(f"{sec}.{e}") from None
        params = Params(**{sec: from_mapping(cls, merged[sec], sec) for sec, cls in SECTIONS.items()})
    except ConfigError as e:
        msg = str(e) if len(str(e)) <= 600 else str(e)[:597] + "..."  # e.g. an unknown key 100k characters long
        raise ConfigError(f"{path}: {msg}{_from_overrides(msg, overrides or {}, path)}") from None
    missing = [sec for sec in REQUIRED_SECTIONS if raw.get(sec) is None]
    if missing:
        raise ConfigError(f"{path}: no {short_repr(missing[0])} section; {need}")
    check_sections_agree(params, path)
    return params


def check_sections_agree(params: Params, where: str | Path = "params") -> None:
    """ConfigError for sections that are each valid but cannot run together: a task without a warm
    start for the tiny policy (``rlvr_core.tasks``: math, code) needs ``warmstart.base_model``, and
    ``train.max_new_tokens`` / ``evaluate.max_new_tokens`` must fit the task's answers (countdown: 16)."""
    from rlvr_core.tasks import check_new_tokens, check_warm_start

    task = params.prepare.task
    problem = check_warm_start(task, params.warmstart.base_model)
    if problem:
        raise ConfigError(f"{where}: warmstart.base_model: {problem}")
    for key, value in (("train.max_new_tokens", params.train.max_new_tokens),
                       ("evaluate.max_new_tokens", params.evaluate.max_new_tokens)):
        if (problem := check_new_tokens(task, value)) is not None:
            raise ConfigError(f"{where}: {key}: {problem}")


def _from_overrides(message: str, overrides: Mapping[str, Mapping[str, Any]], path: Path) -> str:
    """" (train.lr came from --set ...)" when the key a message names was overridden, else ""."""
    for sec, vals in overrides.items():
        for key in vals:
            if re.match(rf"{re.escape(sec)}\.{re.escape(str(key))}\b", message):
                return f" (the value of {sec}.{key} came from --set or a command-line option, not from {path})"
    return ""
