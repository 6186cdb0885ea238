"""The allocator state in TRL checkpoints: pickle-free, an old allocator_state.pkl refused before anything
unpickles it, tampered files refused with the file and field named, the explicit conversion command, and a resume
under other allocator parameters refused naming both values."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402

import rlvr_core.integrations.trl as trl_mod  # noqa: E402
from rlvr_core.checkpoint import CheckpointError  # noqa: E402
from rlvr_core.errors import ConfigError  # noqa: E402
from rlvr_core.integrations.trl import LEGACY_STATE_FILE as LEGACY  # noqa: E402
from rlvr_core.integrations.trl import STATE_DIR, AllocatedGRPOTrainer  # noqa: E402
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class _RunsCode:
    """Unpickling this runs a shell command (the attack: a crafted allocator_state.pkl)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory.mktemp("trl-state") / "chat")


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return Dataset.from_list(arithmetic_rows(48))


def make(out: Path, model_dir: str, dataset: Dataset, allocator_params: dict | None = None,
         **over) -> AllocatedGRPOTrainer:
    args = grpo_config(out, **{"max_steps": 2, "save_strategy": "steps", "save_steps": 2, **over})
    return AllocatedGRPOTrainer(model=model_dir, reward_funcs=[ScriptedReward()], args=args, train_dataset=dataset,
                                allocator="sara", allocator_params=allocator_params)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir, dataset):
    """(trainer, checkpoint-2 folder) of a 2-step sara run; tests copy the folder before changing it."""
    out = tmp_path_factory.mktemp("trl-run")
    tr = make(out, model_dir, dataset)
    tr.train()
    return tr, out / "checkpoint-2"


def _copy(ckpt: Path, dst: Path) -> Path:
    return Path(shutil.copytree(ckpt, dst / ckpt.name))


def _as_legacy(ckpt: Path, payload) -> None:
    """Make ``ckpt`` look like a checkpoint of the earlier release: allocator_state.pkl, no new state."""
    shutil.rmtree(ckpt / STATE_DIR)
    with open(ckpt / LEGACY, "wb") as f:
        pickle.dump(payload, f)


def test_checkpoints_hold_no_pickle(trained):
    _, ckpt = trained
    assert (ckpt / STATE_DIR / "manifest.json").is_file()
    assert not (ckpt / LEGACY).exists()


def test_resume_refuses_a_crafted_pickle_before_unpickling_it(tmp_path, trained, model_dir, dataset):
    _, ckpt = trained
    ckpt = _copy(ckpt, tmp_path)
    marker = tmp_path / "pwned"
    _as_legacy(ckpt, {"allocator": "sara", "x": _RunsCode(marker)})
    tr = make(tmp_path / "out", model_dir, dataset, max_steps=4)
    with pytest.raises(Exception) as e:  # any exception: the marker is checked first (the code must not run)
        tr.train(resume_from_checkpoint=str(ckpt))
    assert not marker.exists(), "the pickle was loaded: its code ran"
    assert isinstance(e.value, CheckpointError), repr(e.value)
    msg = str(e.value)
    assert str(ckpt / LEGACY) in msg and "convert-state" in msg and "--trust-pickle" in msg
    # resume_from_checkpoint=True (the newest checkpoint of output_dir) is refused the same way
    out = tmp_path / "out2"
    shutil.copytree(ckpt, out / ckpt.name)
    tr = make(out, model_dir, dataset, max_steps=4)
    with pytest.raises(CheckpointError, match="allocator_state.pkl"):
        tr.train(resume_from_checkpoint=True)
    assert not marker.exists()


def test_convert_state_needs_trust_and_converts_a_trusted_pickle(tmp_path, trained, model_dir, dataset):
    straight, ckpt = trained
    ckpt = _copy(ckpt, tmp_path)
    # the state as the earlier release pickled it (the same dict, through plain pickle)
    _as_legacy(ckpt, straight.allocation_state())
    cmd = [sys.executable, "-m", "rlvr_core.integrations.trl", "convert-state", str(ckpt)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 2 and "--trust-pickle" in r.stderr, r.stdout + r.stderr
    assert not (ckpt / STATE_DIR).exists()
    r = subprocess.run(cmd + ["--trust-pickle"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ckpt / STATE_DIR / "manifest.json").is_file() and str(ckpt / STATE_DIR) in r.stdout
    # the converted state is what the pickle held, read back without pickle
    st = trl_mod.read_allocation_state(ckpt)
    want = straight.allocation_state()
    assert st["allocator"] == "sara" and st["history"] == want["history"] and st["totals"] == want["totals"]
    assert st["state"]["rng"] == want["state"]["rng"] and st["source"]["pos"] == want["source"]["pos"]
    # and training resumes from it (the leftover .pkl is ignored, never loaded)
    tr = make(tmp_path / "out", model_dir, dataset, max_steps=3)
    tr.train(resume_from_checkpoint=str(ckpt))
    assert len(tr.allocation_history) == 3 and tr.allocation_history[:2] == want["history"]


def _rewrite_state(folder: Path, edit) -> None:
    """Change state.json with ``edit(tree)`` and recompute the manifest's hashes (a deliberate tamper)."""
    tree = json.loads((folder / "state.json").read_text())
    edit(tree)
    data = json.dumps(tree).encode()
    (folder / "state.json").write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("edit,field", [
    (lambda t: t.pop("allocator"), "allocator"),
    (lambda t: t.update(history="not a list"), "history"),
    (lambda t: t.update(totals={"rollouts": "many"}), "totals"),
    (lambda t: t["state"].pop("rng"), "state"),
    (lambda t: t["source"].update(pos=[1, 2]), "source"),
    (lambda t: t.update(allocator="dapo"), "allocator"),
    (lambda t: t["params"].update(tau_low=0.05), "params"),
])
def test_a_tampered_state_is_refused_naming_file_and_field(tmp_path, trained, edit, field):
    tr, ckpt = trained
    ckpt = _copy(ckpt, tmp_path)
    _rewrite_state(ckpt / STATE_DIR, edit)
    with pytest.raises(ValueError) as e:
        tr.load_allocation_state(trl_mod.read_allocation_state(ckpt), where=ckpt / STATE_DIR)
    msg = str(e.value)
    assert str(ckpt / STATE_DIR) in msg and f"'{field}'" in msg, msg


def test_a_damaged_or_missing_state_is_refused_naming_the_file(tmp_path, trained):
    _, ckpt = trained
    ckpt = _copy(ckpt, tmp_path)
    state_json = ckpt / STATE_DIR / "state.json"
    state_json.write_bytes(state_json.read_bytes()[:-5])  # truncated, hashes no longer match
    with pytest.raises(ValueError, match=re.escape(str(ckpt / STATE_DIR))):
        trl_mod.read_allocation_state(ckpt)
    shutil.rmtree(ckpt / STATE_DIR)
    with pytest.raises(FileNotFoundError, match=re.escape(str(ckpt / STATE_DIR))):
        trl_mod.read_allocation_state(ckpt)


def test_state_records_every_parameter_the_allocator_was_built_with(trained):
    _, ckpt = trained
    params = trl_mod.read_allocation_state(ckpt)["params"]
    assert params == {"k": 4, "batch_size": 2, "seed": 0, "reward_threshold": 0.0}  # TRL's settings filled in


@pytest.mark.parametrize("params,over,shown", [
    ({"tau_low": 0.05}, {}, "tau_low=absent there, 0.05 now"),
    (None, {"seed": 3}, "seed=0 there, 3 now"),
])
def test_resume_with_other_parameters_is_refused_before_trl_loads_it(tmp_path, monkeypatch, trained, model_dir,
                                                                      dataset, params, over, shown):
    _, ckpt = trained
    ckpt = _copy(ckpt, tmp_path)
    tr = make(tmp_path / "out", model_dir, dataset, allocator_params=params, max_steps=4, **over)

    def loads(*a, **kw):
        raise AssertionError("TRL's train ran: the checkpoint was loaded before the parameters were compared")

    monkeypatch.setattr(trl_mod.GRPOTrainer, "train", loads)
    with pytest.raises(ConfigError) as e:
        tr.train(resume_from_checkpoint=str(ckpt))
    msg = str(e.value)
    assert str(ckpt / STATE_DIR) in msg and "field 'params'" in msg and shown in msg, msg
    # the restore itself (TRL's _load_optimizer_and_scheduler) refuses the same state the same way
    with pytest.raises(ConfigError, match=re.escape(shown)):
        tr.load_allocation_state(trl_mod.read_allocation_state(ckpt), where=ckpt / STATE_DIR)
    assert tr.allocation_history == []
