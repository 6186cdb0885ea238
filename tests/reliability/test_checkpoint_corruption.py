"""Damaged checkpoints are detected by their manifest, reported and skipped; writes are atomic; pruning keeps N."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr_core.checkpoint import list_checkpoints, load_latest, prune, save_checkpoint, verify
from rlvr_core.config import TrainConfig
from rlvr_core.training import check_and_train
from tests.reliability.common import CFG, assert_same, dataset, final_state, read_metrics, strip_timing


def _state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {"step": step, "w": torch.randn(64, generator=g), "note": f"state {step}"}


def _write(root: Path, steps: range, keep_last: int | None = None) -> None:
    for s in steps:
        save_checkpoint(root, s, _state(s), keep_last=keep_last)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, problem", [
    (lambda f: _truncate(f / "tensors.safetensors"), "bytes, manifest says"),
    (lambda f: _flip_byte(f / "tensors.safetensors"), "content hash does not match"),
    (lambda f: _flip_byte(f / "state.json"), "content hash does not match"),
    (lambda f: (f / "tensors.safetensors").unlink(), "tensors.safetensors missing"),
    (lambda f: (f / "manifest.json").write_text('{"step": 3, "fi'), "manifest unreadable"),
    (lambda f: (f / "manifest.json").unlink(), "manifest unreadable"),
])
def test_damaged_newest_checkpoint_is_reported_and_skipped(tmp_path: Path, damage: Any, problem: str) -> None:
    _write(tmp_path, range(1, 4))
    newest = tmp_path / "step_000003"
    damage(newest)
    assert problem in (verify(newest) or "")
    with pytest.warns(RuntimeWarning, match=rf"skipping damaged checkpoint .*step_000003: .*{problem}"):
        step, state = load_latest(tmp_path)
    assert step == 2 and torch.equal(state["w"], _state(2)["w"])


def test_every_checkpoint_damaged_means_a_fresh_start(tmp_path: Path) -> None:
    _write(tmp_path, range(1, 3))
    for f in list_checkpoints(tmp_path):
        _flip_byte(f / "tensors.safetensors")
    with pytest.warns(RuntimeWarning, match="skipping damaged checkpoint"):
        assert load_latest(tmp_path) is None


def test_failed_write_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, range(1, 3))

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path, 3, _state(3))
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001", "step_000002"]
    step, _ = load_latest(tmp_path)
    assert step == 2
    save_checkpoint(tmp_path, 3, _state(3), keep_last=5)  # the next save cleans the leftover temporary folder
    assert not list(tmp_path.glob(".tmp_*"))


def test_keep_last_prunes_old_checkpoints_and_temporaries(tmp_path: Path) -> None:
    (tmp_path / ".tmp_step_000009").mkdir(parents=True)
    _write(tmp_path, range(1, 6), keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000005"]
    assert not list(tmp_path.glob(".tmp_*"))
    manifest = json.loads((tmp_path / "step_000005/manifest.json").read_text())
    assert manifest["step"] == 5 and len(manifest["files"]["tensors.safetensors"]["sha256"]) == 64
    _flip_byte(tmp_path / "step_000005/tensors.safetensors")  # a damaged one is never counted among the kept
    prune(tmp_path, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000004", "step_000005"]
    with pytest.raises(ValueError, match="keep_last"):
        prune(tmp_path, keep_last=0)


def test_training_resumes_from_the_checkpoint_before_a_corrupted_one(policy_dir: Path, tmp_path: Path) -> None:
    ds = dataset()
    cfg = TrainConfig(**{**CFG, "steps": 4, "keep_last": 3})
    full = check_and_train(cfg, policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                           run_dir=tmp_path / "full")
    run = tmp_path / "damaged"
    check_and_train(cfg, policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"], run_dir=run)
    _truncate(run / "checkpoints/step_000004/tensors.safetensors")  # e.g. a disk that lost the tail of the newest file
    with pytest.warns(RuntimeWarning, match="step_000004"):
        again = check_and_train(cfg, policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"], run_dir=run)
    assert again.resumed_from == 2
    assert strip_timing(read_metrics(run)) == strip_timing(full.metrics)
    assert verify(run / "checkpoints/step_000004") is None  # rewritten intact
    assert_same(final_state(run, 4), final_state(tmp_path / "full", 4))


def test_a_fresh_run_clears_the_checkpoints_of_an_earlier_one(policy_dir: Path, tmp_path: Path) -> None:
    ds = dataset()
    run = tmp_path / "run"
    check_and_train(TrainConfig(**{**CFG, "steps": 4}), policy_dir=policy_dir, train_rows=ds["train"],
                    test_rows=ds["test"],
          run_dir=run)
    other = TrainConfig(**{**CFG, "steps": 2, "seed": 5})
    res = check_and_train(other, policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"], run_dir=run,
                          resume=False)
    assert res.resumed_from is None
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000002"]  # step 4 of the old run is gone
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert final_state(run, 2)["config"]["seed"] == 5


def _pad_sparse(path: Path, size: int, manifest: Path | None = None) -> None:
    """Pad ``path`` with a hole to ``size`` bytes (no disk used); with ``manifest``, re-record its size and hash."""
    os.truncate(path, size)
    if manifest is not None:
        import hashlib

        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        m = json.loads(manifest.read_text())
        m["files"][path.name] = {"sha256": h.hexdigest(), "bytes": size}
        manifest.write_text(json.dumps(m))


def test_verification_compares_sizes_before_reading_and_hashes_in_chunks(tmp_path: Path) -> None:
    """A 57 KB checkpoint padded to a 1 GiB sparse file took load_latest to 1.3 GB RSS (6 GiB: MemoryError):
    each file was read whole before its size was compared."""
    import tracemalloc

    _write(tmp_path, range(1, 4))
    padded = 256 << 20
    _pad_sparse(tmp_path / "step_000003" / "tensors.safetensors", padded)
    # the size differs from the manifest's: refused without reading the file
    tracemalloc.start()
    try:
        with pytest.warns(RuntimeWarning, match=rf"step_000003: tensors\.safetensors has {padded} bytes, manifest"):
            step, _ = load_latest(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert step == 2 and peak < 16 << 20, peak
    # the manifest re-recorded for the padded file: hashed in chunks, memory stays bounded
    _pad_sparse(tmp_path / "step_000002" / "tensors.safetensors", padded, tmp_path / "step_000002" / "manifest.json")
    tracemalloc.start()
    try:
        assert verify(tmp_path / "step_000002") is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    m = json.loads((tmp_path / "step_000001" / "manifest.json").read_text())
    m["files"]["state.json"]["bytes"] = "12"
    (tmp_path / "step_000001" / "manifest.json").write_text(json.dumps(m))
    assert verify(tmp_path / "step_000001") == "state.json: manifest entry malformed"


def _tamper_state(folder: Path, text: str) -> None:
    """Replace ``folder``'s state.json with ``text`` and re-record its size and hash (a deliberate edit)."""
    import hashlib

    data = text.encode()
    (folder / "state.json").write_bytes(data)
    m = json.loads((folder / "manifest.json").read_text())
    m["files"]["state.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("text, error", [
    ("[" * 200_000 + "]" * 200_000, "RecursionError"),
    ('{"step": 3, "w": {"$npscalar": 1000000000000000000000000000000, "dtype": "int64"}}', "OverflowError"),
    ('{"step": 3, "w": {"$tuple": 5}}', "TypeError"),
])
def test_a_tampered_state_with_recomputed_hashes_falls_back_to_the_previous_checkpoint(tmp_path: Path, text: str,
                                                                                       error: str) -> None:
    """RecursionError (state.json nested 200k deep) and OverflowError (an int64 of 10**30) escaped load_latest."""
    _write(tmp_path, range(1, 4))
    _tamper_state(tmp_path / "step_000003", text)
    assert verify(tmp_path / "step_000003") is None  # the hashes match: only reading the state finds it
    with pytest.warns(RuntimeWarning, match=rf"skipping damaged checkpoint .*step_000003: contents unreadable "
                                            rf"\({error}"):
        step, state = load_latest(tmp_path)
    assert step == 2 and torch.equal(state["w"], _state(2)["w"])


@pytest.mark.parametrize("edit, problem", [
    (lambda f: _tamper_state(f, json.dumps({"step": 10**30, "w": 1})), r"the state's step 1000.* is not the "
                                                                         r"manifest's 3"),
    (lambda f: _tamper_state(f, json.dumps({"step": -5, "w": 1})), r"the state's step -5 is not the manifest's 3"),
    (lambda f: _tamper_state(f, json.dumps({"step": 3.0, "w": 1})), r"the state's step 3\.0 is not the manifest's 3"),
    (lambda f: (f / "manifest.json").write_text(
        (f / "manifest.json").read_text().replace('"step": 3', '"step": 1000000000000000000000000000000')),
     r"the manifest's step 1000.* is not the folder's 3"),
])
def test_a_step_edited_in_the_state_or_manifest_falls_back(tmp_path: Path, edit: Any, problem: str) -> None:
    """A state step of 10**30 "resumed" and trained 0 steps, one of -5 ran from step -4: the manifest's step
    and the state's were never compared."""
    _write(tmp_path, range(1, 4))
    edit(tmp_path / "step_000003")
    with pytest.warns(RuntimeWarning, match=rf"skipping damaged checkpoint .*step_000003: {problem}"):
        step, state = load_latest(tmp_path)
    assert step == 2 and state["step"] == 2
