"""One source of defaults: every config dataclass default is params.yaml's value, and every knob is in it once.

A key a params file leaves out (or code that builds ``TrainConfig()`` directly, as the benchmarks do)
then means what ``make run`` means. TrainerConfig, the update's settings, is built from the train
section by ``TrainerConfig.from_train``; each of its fields is a train key with the same default.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlvr_core.config import SECTIONS, TrainConfig
from rlvr_core.grpo.trainer import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_dataclass_default_is_the_params_yaml_value(section: str) -> None:
    fields = dataclasses.fields(SECTIONS[section])
    assert sorted(PARAMS[section]) == sorted(f.name for f in fields), "params.yaml lists every key exactly once"
    differ = {f.name: (_default(f), PARAMS[section][f.name]) for f in fields
              if _plain(_default(f)) != _plain(PARAMS[section][f.name])}
    assert not differ, f"{section}: dataclass default vs params.yaml: {differ}"


def test_trainer_config_is_built_from_the_train_section() -> None:
    train_fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for f in dataclasses.fields(TrainerConfig):
        assert f.name in train_fields, f"TrainerConfig.{f.name} cannot be set from params.yaml"
        assert _plain(_default(f)) == _plain(_default(train_fields[f.name])), f.name
    assert TrainerConfig.from_train(TrainConfig()) == TrainerConfig()
    cfg = TrainConfig(clip_eps_high=0.28, grad_clip=None, betas=[0.8, 0.95], epochs=2, only_effective=False)
    tc = TrainerConfig.from_train(cfg)
    assert (tc.clip_eps_high, tc.grad_clip, tc.betas, tc.epochs, tc.only_effective) == (0.28, None, (0.8, 0.95), 2,
                                                                                          False)


def test_dvc_train_stages_list_every_train_key() -> None:
    """A train key dvc.yaml does not list would not make `dvc repro` run the stages again when it changes."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    listed = set(stages["train"]["params"])
    # a train stage's allocator and seed come from its matrix entry (the cmd's --allocator, --seed): train.allocator
    # and train.seed do not change what it trains, and neither do the lists the matrix is made of
    per_run = {"train.allocator", "train.seed"}
    expected = {f"train.{f.name}" for f in dataclasses.fields(TrainConfig)} - per_run - {"train.allocators",
                                                                                          "train.seeds"}
    assert not expected - listed, sorted(expected - listed)
    assert not per_run & listed, sorted(per_run & listed)
    experiment = stages["experiment"]["params"]
    shared = [set(p["params.yaml"]) for p in experiment if isinstance(p, dict) and "params.yaml" in p]
    assert per_run <= set(p for p in experiment if isinstance(p, str)) and shared == [listed]  # the same keys
