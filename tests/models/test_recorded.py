"""Recorded warm starts (rlvr_core.models.recorded): found by their settings, used only when every file hashes
as recorded, refused with the file named otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr_core.config import load_params
from rlvr_core.errors import ConfigError
from rlvr_core.models.recorded import (
    RecordedPolicyMismatch,
    copy_recorded,
    file_hashes,
    policy_key,
    record_policy,
    recorded_policy,
)

ROOT = Path(__file__).resolve().parents[2]


def _policy(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden": 32}\n')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    return folder


def test_a_recorded_policy_is_found_verified_and_copied(tmp_path: Path) -> None:
    store = tmp_path / "artifacts/warmstart"
    assert recorded_policy(store, "abc") is None  # nothing recorded: the caller builds
    entry = record_policy(store, "abc", _policy(tmp_path / "built"), {"name": "t", "metrics": {"final_loss": 0.5}})
    assert entry["files"]["model.safetensors"]["bytes"] == 10240
    assert json.loads((store / "manifest.json").read_text())["abc"] == entry
    folder, got = recorded_policy(store, "abc")
    assert folder == store / "abc" and got == entry
    assert copy_recorded(store, "abc", tmp_path / "models/warmstart") == entry
    assert file_hashes(tmp_path / "models/warmstart") == entry["files"]
    assert copy_recorded(store, "other", tmp_path / "x") is None and not (tmp_path / "x").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove", "extra"])
def test_a_policy_that_differs_from_its_record_is_refused(tmp_path: Path, damage: str) -> None:
    store = tmp_path / "store"
    record_policy(store, "abc", _policy(tmp_path / "built"), {"metrics": {}})
    weights = store / "abc/model.safetensors"
    data = weights.read_bytes()
    if damage == "flip":
        weights.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncate":
        weights.write_bytes(data[:-1])
    elif damage == "remove":
        weights.unlink()
    else:
        (store / "abc/stray.bin").write_bytes(b"x")
    with pytest.raises(RecordedPolicyMismatch, match="stray.bin" if damage == "extra" else "model.safetensors"):
        recorded_policy(store, "abc")
    with pytest.raises(ConfigError):  # a ConfigError: not retried, nothing trains
        copy_recorded(store, "abc", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_key_is_the_study_s_cache_key_and_follows_every_setting() -> None:
    from benchmarks.study import data as D
    from benchmarks.study import plan as P

    params = load_params(ROOT / "params.yaml")
    assert policy_key(params.prepare, params.warmstart) == D.policy_key(params)
    hard = P.regime_params("hard")
    assert D.policy_key(hard) != policy_key(params.prepare, params.warmstart)  # the study's held-out split differs
    seeded = load_params(ROOT / "params.yaml", overrides={"warmstart": {"seed": 1}})
    assert policy_key(seeded.prepare, seeded.warmstart) != policy_key(params.prepare, params.warmstart)


def test_recorded_policies_in_the_repository_hash_as_recorded() -> None:
    store = ROOT / "artifacts/warmstart"
    manifest = json.loads((store / "manifest.json").read_text())
    for key, entry in manifest.items():
        folder, _ = recorded_policy(store, key)
        assert entry["built_on"] and 0 <= entry["start_heldout_greedy_acc"] <= 1
        assert sum(f["bytes"] for f in entry["files"].values()) < 5_000_000  # small enough for git
