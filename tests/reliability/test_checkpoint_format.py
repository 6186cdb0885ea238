"""Checkpoints hold safetensors and JSON only: every state round-trips exactly, a pickle is never run,
names past step 999,999 order by number, and a full disk leaves nothing behind and names the path."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlvr_core import checkpoint as ck
from rlvr_core.checkpoint import CheckpointError, list_checkpoints, load_latest, read_state, save_checkpoint, verify
from rlvr_core.types import Rollouts
from tests.reliability.common import assert_same


class _Payload:
    """Unpickling this creates ``path``: the stand-in for code a hostile checkpoint would run."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def _rich_state() -> dict[str, Any]:
    w = torch.randn(4, 3)
    np.random.seed(3)
    np.random.rand(5)
    return {
        "w": w, "tied": w, "view": w[1:, :2], "bf16": torch.randn(3).bfloat16(), "scalar": torch.tensor(7.5),
        "empty": torch.zeros(0), "torch_rng": torch.get_rng_state(), "np_rng": np.random.get_state(),
        "pcg": np.random.default_rng(11).bit_generator.state, "u32": np.arange(5, dtype=np.uint32),
        "mask": np.array([True, False]), "f32": np.float32(1.25), "i64": np.int64(-3), "nan": float("nan"),
        "big": 2**100, "betas": (0.9, 0.999), "by_int": {0: {"step": torch.tensor(3.0)}, 7: [1, 2.5]},
        "dollar": {"$tensor": "not a reference"}, "none": None, "flag": True, "text": "naïve",
        "ledger": [Rollouts([1, 2], [1.0, 0.0], [3, 4], payload=[{"text": "a", "ids": [1, 2]}, {"text": "b"}])],
    }


def test_every_state_type_round_trips_exactly(tmp_path: Path) -> None:
    state = _rich_state()
    folder = save_checkpoint(tmp_path, 1, state)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "state.json", "tensors.safetensors"]
    back = read_state(folder)
    assert_same(state, back)
    for key in ("betas", "np_rng"):
        assert type(back[key]) is tuple
    assert type(back["f32"]) is np.float32 and type(back["i64"]) is np.int64
    assert back["u32"].dtype == np.uint32 and back["bf16"].dtype == torch.bfloat16
    assert set(back["by_int"]) == {0, 7}
    np.random.set_state(back["np_rng"])  # the restored RNG states are usable as they are
    rng = np.random.default_rng(0)
    rng.bit_generator.state = back["pcg"]
    assert rng.random() == np.random.default_rng(11).random()
    assert read_state(folder, part=("by_int",)) == {0: {"step": torch.tensor(3.0)}, 7: [1, 2.5]}


def test_state_that_is_not_plain_data_is_refused_on_save(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"state\.extra\.obj: _Payload values cannot be stored"):
        save_checkpoint(tmp_path, 1, {"extra": {"obj": _Payload(tmp_path / "x")}})
    with pytest.raises(TypeError, match="dtype object"):
        save_checkpoint(tmp_path, 1, {"a": np.array([object()])})
    assert not list(tmp_path.iterdir())


def _rewrite_manifest(folder: Path, files: list[str], fmt: int | None) -> None:
    """What someone who can write the checkpoint can do: make the manifest match whatever is there."""
    manifest = {"step": ck.checkpoint_step(folder), "meta": {},
                "files": {n: {"sha256": hashlib.sha256((folder / n).read_bytes()).hexdigest(),
                              "bytes": (folder / n).stat().st_size} for n in files}}
    if fmt is not None:
        manifest["format"] = fmt
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_the_payload_runs_when_unpickled(tmp_path: Path) -> None:
    """Control: the payload the refusal tests plant really runs code when a pickle loader reads it."""
    buf = io.BytesIO()
    torch.save({"trainer": _Payload(tmp_path / "ran")}, buf)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert (tmp_path / "ran").exists()


def test_a_pickle_format_checkpoint_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, {"w": torch.ones(2)})
    folder = root / "step_000002"
    folder.mkdir()
    torch.save({"trainer": _Payload(marker), "w": torch.ones(2)}, folder / "state.pt")
    _rewrite_manifest(folder, ["state.pt"], None)  # an old-format checkpoint, hashes consistent
    assert verify(folder) is None
    with pytest.raises(CheckpointError, match=r"step_000002 is in the old pickle format \(state\.pt\).*fresh folder"):
        load_latest(root)
    with pytest.raises(CheckpointError, match="old pickle format"):
        read_state(folder)
    from rlvr_core.models.policy import load_checkpoint_policy

    with pytest.raises(CheckpointError, match="old pickle format"):
        load_checkpoint_policy(str(folder), str(tmp_path / "no-policy-needed"))
    assert not marker.exists()


@pytest.mark.parametrize("disguised_as", ["tensors.safetensors", "state.json"])
def test_a_pickle_under_a_new_format_name_is_never_unpickled(tmp_path: Path, disguised_as: str) -> None:
    marker = tmp_path / "ran"
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, {"w": torch.ones(2)})
    folder = save_checkpoint(root, 2, {"w": torch.zeros(2)})
    pickle.dump({"w": _Payload(marker)}, open(folder / disguised_as, "wb"))
    _rewrite_manifest(folder, ["state.json", "tensors.safetensors"], ck.FORMAT)
    with pytest.warns(RuntimeWarning, match=r"skipping damaged checkpoint .*step_000002: contents unreadable"):
        step, state = load_latest(root)
    assert step == 1 and torch.equal(state["w"], torch.ones(2))
    with pytest.raises(ValueError, match="contents unreadable"):
        read_state(folder)
    assert not marker.exists()


def test_training_on_a_pickle_format_run_folder_says_what_to_do(policy_dir: Path, tmp_path: Path) -> None:
    from rlvr_core.config import TrainConfig
    from rlvr_core.errors import ConfigError
    from rlvr_core.training import check_and_train
    from tests.reliability.common import CFG, dataset

    folder = tmp_path / "run" / "checkpoints" / "step_000004"
    folder.mkdir(parents=True)
    torch.save({"trainer": _Payload(tmp_path / "ran")}, folder / "state.pt")
    _rewrite_manifest(folder, ["state.pt"], None)
    ds = dataset()
    with pytest.raises(ConfigError, match="old pickle format.*fresh folder"):  # a ConfigError: Prefect does not retry
        check_and_train(TrainConfig(**CFG), policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                        run_dir=tmp_path / "run")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_train_flow_refuses_a_pickle_format_run_folder_before_tracking(policy_dir: Path, tmp_path: Path) -> None:
    from flows.train import check_inputs
    from rlvr_core.config import TrainConfig
    from tests.reliability.common import CFG, dataset

    dataset().save_to_disk(str(tmp_path / "data"))
    out = tmp_path / "run"
    folder = out / "checkpoints" / "step_000002"
    folder.mkdir(parents=True)
    torch.save({"trainer": _Payload(tmp_path / "ran")}, folder / "state.pt")
    _rewrite_manifest(folder, ["state.pt"], None)
    with pytest.raises(CheckpointError, match="old pickle format"):  # check_inputs runs before MLflow opens a run
        check_inputs(TrainConfig(**CFG), "arithmetic", tmp_path / "data", policy_dir, out)
    assert not (tmp_path / "ran").exists() and not (out / "tracking.json").exists()


def test_checkpoints_order_by_step_number_past_999999(tmp_path: Path) -> None:
    for s in (999_998, 999_999):
        save_checkpoint(tmp_path, s, {"step": s, "w": torch.full((2,), float(s))}, keep_last=2)
    save_checkpoint(tmp_path, 1_000_000, {"step": 1_000_000, "w": torch.full((2,), 1e6)}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_999999", "step_1000000"]
    step, state = load_latest(tmp_path)
    assert step == 1_000_000 and state["step"] == 1_000_000
    save_checkpoint(tmp_path, 1_000_001, {"step": 1_000_001}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1000000", "step_1000001"]
    (tmp_path / "step_notanumber").mkdir()
    (tmp_path / "step_12").mkdir()  # an unpadded name still orders by its number (and is incomplete)
    assert [ck.checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [12, 1_000_000, 1_000_001]


@pytest.mark.parametrize("failing", ["state.json.tmp", "tensors.safetensors.tmp", "manifest.json.tmp"])
def test_disk_full_removes_the_temporary_folder_and_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    failing: str) -> None:
    save_checkpoint(tmp_path, 1, {"w": torch.ones(3)})
    real_open = open

    def full_disk_open(file: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        if "w" in mode and Path(file).name == failing:
            f = real_open(file, mode, *a, **kw)
            f.write(b"partial")
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", full_disk_open)
    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path, 2, {"w": torch.zeros(3)}, keep_last=1)
    monkeypatch.undo()
    e = info.value
    assert e.errno == errno.ENOSPC
    assert e.filename == str(tmp_path / ".tmp_step_000002" / failing.removesuffix(".tmp"))
    assert "No space left on device while writing checkpoint 2" in str(e) and str(tmp_path) in str(e)
    assert not list(tmp_path.glob(".tmp_*"))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]
    assert load_latest(tmp_path)[0] == 1
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_checkpoint_files_never_contain_a_pickle(tmp_path: Path) -> None:
    folder = save_checkpoint(tmp_path, 1, _rich_state())
    header_len = int.from_bytes((folder / "tensors.safetensors").read_bytes()[:8], "little")
    header = json.loads((folder / "tensors.safetensors").read_bytes()[8:8 + header_len])
    assert all(set(v) == {"dtype", "shape", "data_offsets"} for k, v in header.items() if k != "__metadata__")
    json.loads((folder / "state.json").read_text())  # plain JSON
    for p in folder.iterdir():
        assert p.read_bytes()[:1] != b"\x80" and not p.read_bytes().startswith(b"PK"), p.name  # pickle, torch zip
    assert os.path.getsize(folder / "state.json") > 0


def test_checkpoint_readers_give_the_manifest_facts(tmp_path):
    """newest_intact skips a damaged newest checkpoint; meta, digest and step come from the manifest."""
    import torch

    from rlvr_core.checkpoint import checkpoint_digest, checkpoint_meta, manifest_step, newest_intact, save_checkpoint

    root = tmp_path / "checkpoints"
    for step in (2, 4):
        save_checkpoint(root, step, {"w": torch.ones(2) * step}, meta={"config": {"allocator": "sara"}})
    assert newest_intact(root).name == "step_000004"
    assert manifest_step(root / "step_000004") == 4
    assert checkpoint_meta(root / "step_000002") == {"config": {"allocator": "sara"}}
    d2, d4 = checkpoint_digest(root / "step_000002"), checkpoint_digest(root / "step_000004")
    assert d2 != d4 and len(d2) == 2 * 64
    victim = next(p for p in (root / "step_000004").iterdir() if p.name != "manifest.json")
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert newest_intact(root).name == "step_000002"
    assert newest_intact(tmp_path / "none") is None
