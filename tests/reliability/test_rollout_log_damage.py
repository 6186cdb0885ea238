"""A damaged rollouts.parquet does not block a resume, and the log is written durably (issue #41).

The log used to be rewritten every step without fsync, and a truncated file made every resume fail in
``read_log`` (Prefect retried it twice), though the checkpoints were intact. Now each rewrite is fsynced
(file and folder), and a resume that finds the file unreadable sets it aside (``rollouts.parquet.damaged``),
warns, and goes on; the steps whose rows were lost are recorded in the new file (``attrs["lost_steps"]``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from rlvr_core.config import TrainConfig
from rlvr_core.rollout_log import FILENAME, RolloutLog, read_log
from rlvr_core.safefs import set_aside
from rlvr_core.training import check_and_train
from rlvr_core.types import Rollouts
from tests.reliability.common import CFG, dataset

RUN = dict(CFG, steps=2, eval_every=0, eval_samples=0, checkpoint_every=2)


@pytest.fixture(scope="module")
def two_step_run(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("rollout_log") / "run"
    ds = dataset()
    check_and_train(TrainConfig(**RUN), policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                    run_dir=run)
    return run


def _resume(policy_dir: Path, run: Path) -> None:
    ds = dataset()
    check_and_train(TrainConfig(**{**RUN, "steps": 4}), policy_dir=policy_dir, train_rows=ds["train"],
                    test_rows=ds["test"],
          run_dir=run)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_resume_sets_a_damaged_log_aside_and_goes_on(policy_dir: Path, two_step_run: Path, tmp_path: Path,
                                                       damage: str) -> None:
    intact, damaged = tmp_path / "intact", tmp_path / "damaged"
    shutil.copytree(two_step_run, intact)
    shutil.copytree(two_step_run, damaged)
    log = damaged / FILENAME
    data = log.read_bytes()
    cut = {"truncate": data[: len(data) // 2], "garbage": b"\x00" * len(data), "empty": b""}[damage]
    log.write_bytes(cut)

    _resume(policy_dir, intact)
    with pytest.warns(RuntimeWarning, match=rf"rollout log {log}: not a readable parquet file.*set aside as "
                                            rf"{log}\.damaged.*the rows of steps 1-2 are lost"):
        _resume(policy_dir, damaged)
    assert (damaged / f"{FILENAME}.damaged").read_bytes() == cut  # kept as it was found
    got, want = read_log(log), read_log(intact / FILENAME)
    assert got.attrs == {"lost_steps": [1, 2]} and want.attrs == {}
    assert sorted(set(got["step"])) == [3, 4] and sorted(set(want["step"])) == [1, 2, 3, 4]
    later = want[want["step"] > 2].reset_index(drop=True)
    assert got.reset_index(drop=True).equals(later)  # the steps after the checkpoint: as a resume of an intact log
    assert (damaged / "metrics.jsonl").read_text().count("\n") == 5  # steps 0-4


def test_lost_steps_stay_recorded_through_later_resumes(tmp_path: Path) -> None:
    rows = [{"prompt": f"p{i}"} for i in range(3)]
    path = tmp_path / FILENAME
    path.write_bytes(b"PAR1 cut")
    with pytest.warns(RuntimeWarning, match="steps 1-2 are lost"):
        first = RolloutLog(path, rows, upto=2)
    first.add(3, Rollouts(prompt_id=np.array([1, 1]), reward=np.array([1.0, 0.0]), tokens=np.array([3, 4])))
    first.end_step(3)
    first.flush()
    again = RolloutLog(path, rows, upto=3)  # a later resume: the file is readable, the gap is still recorded
    assert again.lost == [1, 2] and read_log(path).attrs == {"lost_steps": [1, 2]}
    assert RolloutLog(path, rows, upto=1).lost == [1]  # a resume from an earlier step keeps what it covers


def test_each_rewrite_is_fsynced_file_and_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stat

    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode)
                                                               else "file"), real(fd))[1])
    log = RolloutLog(tmp_path / FILENAME, [{"prompt": "p"}])
    log.add(1, Rollouts(prompt_id=np.array([0]), reward=np.array([1.0]), tokens=np.array([2])))
    log.end_step(1)
    log.flush()
    assert synced == ["file", "dir"] and read_log(tmp_path / FILENAME)["rollouts"].tolist() == [1]


def test_set_aside_never_overwrites(tmp_path: Path) -> None:
    for content in (b"one", b"two", b"three"):
        (tmp_path / "f").write_bytes(content)
        set_aside(tmp_path / "f")
    assert [(tmp_path / n).read_bytes() for n in ("f.damaged", "f.damaged.1", "f.damaged.2")] == \
        [b"one", b"two", b"three"]
    assert not (tmp_path / "f").exists()


def test_a_resume_without_the_log_records_its_steps_as_lost(policy_dir: Path, two_step_run: Path,
                                                            tmp_path: Path) -> None:
    """rollouts.parquet is no DVC output: a worker's `dvc pull` lacks it. The resume goes on, warns, and the
    new file records steps 1-2 as lost_steps instead of passing for a log of steps 3-4 alone."""
    run = tmp_path / "pulled"
    shutil.copytree(two_step_run, run)
    (run / FILENAME).unlink()
    with pytest.warns(RuntimeWarning, match=rf"rollout log {run / FILENAME}: missing at the resume from step 2.*"
                                            r"the rows of steps 1-2 are lost"):
        _resume(policy_dir, run)
    got = read_log(run / FILENAME)
    assert got.attrs == {"lost_steps": [1, 2]} and sorted(set(got["step"])) == [3, 4]


def test_a_resume_from_an_older_log_records_the_steps_it_lacks(policy_dir: Path, two_step_run: Path,
                                                               tmp_path: Path) -> None:
    run = tmp_path / "older"
    shutil.copytree(two_step_run, run)
    old = read_log(run / FILENAME)
    old[old["step"] == 1].to_parquet(run / FILENAME, index=False)  # the copy of the file written after step 1
    with pytest.warns(RuntimeWarning, match=r"holds no row of step 2, which metrics.jsonl gives rollouts.*"
                                            r"the rows of step 2 are lost"):
        _resume(policy_dir, run)
    got = read_log(run / FILENAME)
    assert got.attrs == {"lost_steps": [2]} and sorted(set(got["step"])) == [1, 3, 4]


def test_lost_steps_of_a_missing_log_are_written_without_new_rows(tmp_path: Path) -> None:
    path = tmp_path / FILENAME
    with pytest.warns(RuntimeWarning, match="missing at the resume from step 3.*steps 1, 3 are lost"):
        log = RolloutLog(path, [{"prompt": "p"}], upto=3, logged=[1, 3])  # step 2 had no rollouts: nothing lost
    log.flush()  # a resumed run with no step left: the gap is still recorded
    assert log.lost == [1, 3] and read_log(path).attrs == {"lost_steps": [1, 3]} and not len(read_log(path))
