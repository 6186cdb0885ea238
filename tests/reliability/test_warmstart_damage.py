"""A damaged warm start is refused before training, naming the folder and the file (issue #41).

Every policy folder the project writes records the sha256 of its files in ``sha256.json``
(``rlvr_core.models.integrity``); preflight checks the folder against it before anything parses a file. A
flipped bit in the config or tokenizer JSON used to be a raw JSONDecodeError, one in the safetensors header a
raw SafetensorError, and half of the flips in the weights loaded without any error at all.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from rlvr_core.config import TrainConfig
from rlvr_core.models.integrity import RECORD, PolicyFilesMismatch, file_hashes
from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.preflight import preflight
from tests.reliability.common import CFG, dataset, make_flow_root

PARAMS = """\
prepare: {task: arithmetic, n_train: 400, n_test: 60, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 2, eval_every: 1, eval_size: 20,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2}
"""


def _weights_offsets(policy: Path) -> tuple[int, list[int]]:
    """(header length, 14 byte offsets spread over the tensor data) of the folder's model.safetensors."""
    data = (policy / "model.safetensors").read_bytes()
    header = struct.unpack("<Q", data[:8])[0]
    start = 8 + header
    return header, [start + (len(data) - start - 1) * i // 13 for i in range(14)]


def _flips(policy: Path) -> list[tuple[str, int]]:
    """(file, byte offset) of every flip tried: each JSON file, the safetensors header and 14 weights bytes."""
    header, weights = _weights_offsets(policy)
    jsons = [(name, (policy / name).stat().st_size // 2) for name in
             ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")]
    return jsons + [("model.safetensors", 3), ("model.safetensors", 8 + header // 2)] + \
        [("model.safetensors", off) for off in weights]


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.fixture
def damaged(policy_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "models/warmstart"
    shutil.copytree(policy_dir, folder)
    return folder


def test_every_policy_folder_the_project_writes_records_its_files(policy_dir: Path) -> None:
    record = json.loads((policy_dir / RECORD).read_text())
    assert record["files"] == file_hashes(policy_dir)
    assert set(record["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}


@pytest.mark.parametrize("index", range(20))
def test_every_flipped_byte_is_refused_naming_the_folder_and_file(damaged: Path, index: int) -> None:
    name, offset = _flips(damaged)[index]
    _flip(damaged / name, offset)
    ds = dataset()
    with pytest.raises(PolicyFilesMismatch, match=rf"{re.escape(str(damaged))}.*{re.escape(name)} has sha256 "):
        preflight(TrainConfig(**CFG), "arithmetic", ds["train"], ds["test"], damaged, damaged.parent / "run")


@pytest.mark.parametrize("damage, message", [
    ("truncate", r"model\.safetensors has \d+ bytes, its sha256\.json records \d+"),
    ("remove", r"has no tokenizer\.json, which its sha256\.json lists"),
    ("extra", r"\['model\.safetensors\.index\.json'\] not in its sha256\.json"),
    ("record", r"its record sha256\.json is damaged"),
])
def test_a_truncated_missing_or_added_file_is_refused(damaged: Path, damage: str, message: str) -> None:
    if damage == "truncate":
        weights = damaged / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4])
    elif damage == "remove":
        (damaged / "tokenizer.json").unlink()
    elif damage == "extra":
        (damaged / "model.safetensors.index.json").write_text("{}")
    else:
        record = damaged / RECORD
        record.write_bytes(record.read_bytes()[:40])
    ds = dataset()
    with pytest.raises(PolicyLoadError, match=rf"policy folder '{re.escape(str(damaged))}'.*{message}"):
        preflight(TrainConfig(**CFG), "arithmetic", ds["train"], ds["test"], damaged, damaged.parent / "run")


def test_the_train_flow_refuses_a_damaged_or_unrecorded_warm_start_before_tracking(
        policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train import train as train_flow

    root = make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch)
    base = root / "models/warmstart"
    _, weights = _weights_offsets(base)
    _flip(base / "model.safetensors", weights[5])
    with pytest.raises(PolicyFilesMismatch, match=rf"{re.escape(str(base))}.*model\.safetensors has sha256"):
        train_flow.fn(allocator="sara")
    shutil.copy2(policy_dir / "model.safetensors", base / "model.safetensors")
    (base / RECORD).unlink()  # a folder whose files cannot be checked
    with pytest.raises(PolicyFilesMismatch, match=rf"{re.escape(str(base))}' has no sha256\.json"):
        train_flow.fn(allocator="sara")
    assert not (root / "runs").exists() and not (root / "mlflow.db").exists()
