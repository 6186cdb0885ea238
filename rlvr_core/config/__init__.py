"""Typed, frozen configuration per params.yaml section, validated on load.

Each stage reads only its own section: ``prepare`` (``PrepareConfig``), ``warmstart``
(``WarmStartConfig``, in ``rlvr_core.models.warmstart_config``: no torch), ``train`` (``TrainConfig``) and ``evaluate``
(``EvaluateConfig``). Every field documents itself: its ``help`` (field metadata, as TRL's
``GRPOConfig`` documents its fields) is the one text behind docs/configuration.md and params.yaml's
comments (``make docs``). Unknown keys are rejected with the closest valid key; impossible values
raise ConfigError naming ``section.key`` and how to fix it.

- ``reading``: params files and ``--set`` values as YAML (``read_yaml``, ``parse_set``);
- ``checks``: every field against its type annotation (``check_fields``);
- ``prepare``, ``train``, ``evaluate``: one section each, with its range checks;
- ``params``: a whole file (``load_params``) and the sections agreeing (``check_sections_agree``).

One source of defaults: every dataclass default equals the project's params.yaml
value (tests/pipeline/test_params_defaults.py), so a key a file leaves out means
the same as in ``make run``.
"""

from __future__ import annotations

from rlvr_core.config.checks import check_fields
from rlvr_core.config.evaluate import EvaluateConfig
from rlvr_core.config.params import REQUIRED_SECTIONS, SECTIONS, Params, check_sections_agree, load_params
from rlvr_core.config.prepare import PrepareConfig
from rlvr_core.config.reading import MAX_INT_DIGITS, MAX_YAML_NODES, ParamsLoader, parse_set, read_yaml, short_repr
from rlvr_core.config.train import DEVICES, DTYPES, MAX_NEW_TOKENS, MAX_VERIFIER_TIMEOUT_S, TrainConfig

__all__ = ["DEVICES", "DTYPES", "EvaluateConfig", "MAX_INT_DIGITS", "MAX_NEW_TOKENS", "MAX_VERIFIER_TIMEOUT_S",
           "MAX_YAML_NODES", "Params", "ParamsLoader", "PrepareConfig", "REQUIRED_SECTIONS", "SECTIONS", "TrainConfig",
           "check_fields", "check_sections_agree", "load_params", "parse_set", "read_yaml", "short_repr"]
