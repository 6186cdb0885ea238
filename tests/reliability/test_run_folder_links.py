"""A run folder is written without following links (issue 40, break 4; rlvr_core/safefs.py): a link planted
as run.lock, a metrics file, a temporary file or a summary is never written through, and a folder of
another user's, or one every user may write, is refused before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.common import write_json
from pipeline.curves import write_curve
from rlvr_core import safefs
from rlvr_core.rollout_log import RolloutLog
from rlvr_core.runlock import LOCK_NAME, hold_run_folder
from rlvr_core.safefs import UnsafeRunFolder
from rlvr_core.training import _append_metrics, _write_metrics


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim_file"
    v.write_text("root's secret\n")
    v.chmod(0o600)
    return v


def test_a_link_planted_as_run_lock_is_refused_and_its_target_untouched(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(victim)
    with pytest.raises(UnsafeRunFolder, match=r"run.lock: a symbolic link was planted"):
        hold_run_folder(run)
    assert victim.read_text() == "root's secret\n"


@pytest.mark.parametrize("name", ["summary.json", "tracking.json"])
def test_json_written_over_a_planted_link_replaces_the_link(tmp_path: Path, victim: Path, name: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(victim)
    (run / f"{name}.tmp").symlink_to(victim)  # where the writer used to put its temporary file
    write_json(run / name, {"ok": 1})
    assert victim.read_text() == "root's secret\n"
    assert not (run / name).is_symlink() and json.loads((run / name).read_text()) == {"ok": 1}


def test_metrics_appends_and_rewrites_never_go_through_a_link(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(UnsafeRunFolder, match="metrics.jsonl: a symbolic link was planted"):
        _append_metrics(run / "metrics.jsonl", {"step": 1})
    (run / "metrics.tmp").symlink_to(victim)
    _write_metrics(run / "metrics.jsonl", [{"step": 1}])
    assert victim.read_text() == "root's secret\n"
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n' and not (run / "metrics.jsonl").is_symlink()


def test_curve_and_rollout_log_replace_a_planted_link(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("curve.csv", "rollouts.parquet", "rollouts.parquet.tmp"):
        (run / name).symlink_to(victim)
    write_curve([], run / "curve.csv")
    log = RolloutLog(run / "rollouts.parquet", [])
    log.flush()
    assert victim.read_text() == "root's secret\n"
    assert not (run / "curve.csv").is_symlink()


def test_a_folder_of_another_user_or_one_anyone_may_write_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1234, 1234)
    with pytest.raises(UnsafeRunFolder, match=r"belongs to uid 1234, not to this user"):
        hold_run_folder(theirs)
    with pytest.raises(UnsafeRunFolder, match="belongs to uid 1234"):
        write_json(theirs / "summary.json", {"x": 1})
    assert not list(theirs.iterdir())


def test_a_world_writable_folder_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeRunFolder, match="every user may write it"):
        hold_run_folder(shared)
    assert not list(shared.iterdir())


def test_a_folder_reached_through_a_link_of_this_user_is_fine(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    safefs.write_text_atomic(tmp_path / "alias" / "x.txt", "hi")
    assert (real / "x.txt").read_text() == "hi"
    with hold_run_folder(tmp_path / "alias"):
        assert (real / LOCK_NAME).is_file()
