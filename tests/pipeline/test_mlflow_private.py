"""mlflow.db holds every run's parameters and tags: the local store is this user's alone (design.md §8.7)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pipeline import tracking


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_store_is_made_0600_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    old = os.umask(0o022)
    try:
        run_id = tracking.start_run("private", {"lr": 1e-4}, {"allocator": "sara"})
        tracking.end_run(run_id)
    finally:
        os.umask(old)
    assert _mode(db) == 0o600
    assert tracking.get_run(run_id).data.params == {"lr": "0.0001"}  # the empty file became a working store


def test_a_store_an_older_version_made_0644_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"")
    db.chmod(0o644)
    tracking.private_store(f"sqlite:///{db}")
    assert _mode(db) == 0o600


def test_server_uris_and_links_are_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"")
    target.chmod(0o644)
    (tmp_path / "mlflow.db").symlink_to(target)
    tracking.private_store(f"sqlite:///{tmp_path / 'mlflow.db'}")  # not followed
    tracking.private_store("http://127.0.0.1:9/")
    assert _mode(target) == 0o644
    assert not (tmp_path / "missing").exists()
    tracking.private_store(f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}")  # no folder: MLflow reports it
    assert not (tmp_path / "missing").exists()
