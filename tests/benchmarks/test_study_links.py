"""The study's bookkeeping never writes through a link (round 4, break 10; rlvr_core/safefs.py): links planted
at ``study/<regime>/backfill.lock`` and ``backfill.tmp`` (a hostile checkout, a shared results folder) made
``--backfill-logs`` truncate the first target to 0 bytes and write its record through the second, and
``write_run``, ``attach_log``, ``freeze`` and ``claim`` followed links the same way. Now each link is either
refused with UnsafeRunFolder, naming it, or replaced by the new file; what it points at is never changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.study import backfill
from benchmarks.study.store import BACKFILL_RECORD, RunStore
from rlvr_core.safefs import UnsafeRunFolder

SECRET = "root's secret\n"


@pytest.fixture
def victims(tmp_path: Path) -> list[Path]:
    out = []
    for name in ("victim_a", "victim_b"):
        v = tmp_path / "outside" / name
        v.parent.mkdir(exist_ok=True)
        v.write_text(SECRET)
        out.append(v)
    return out


def _unchanged(*victims: Path) -> bool:
    return all(v.read_text() == SECRET and v.stat().st_size == len(SECRET) for v in victims)


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    store = RunStore(tmp_path / "results")
    run = store.run_file("easy", "equal-batch", "sara", 0)
    run.parent.mkdir(parents=True)
    run.write_text(json.dumps({"curve": [], "variant": "sara", "seed": 0}) + "\n")  # no policy digest: not rerun
    return store


def _backfill(store: RunStore) -> dict[str, int]:
    """--backfill-logs' bookkeeping (claim, note, release) over the regime's one run, which is not rerun."""
    paths = backfill.missing(store, "easy")
    return backfill.rerun_each(store, "easy", paths, lambda p, q: pytest.fail("rerun"), done="decision_log",
                               log=lambda _: None)


def test_backfill_refuses_a_planted_lock_and_never_writes_its_temporary_name(store: RunStore,
                                                                            victims: list[Path]) -> None:
    regime = store.root / "easy"
    (regime / "backfill.lock").symlink_to(victims[0])
    (regime / "backfill.tmp").symlink_to(victims[1])
    with pytest.raises(UnsafeRunFolder, match=r"easy/backfill.lock: a symbolic link was planted"):
        _backfill(store)
    assert _unchanged(*victims)
    (regime / "backfill.lock").unlink()
    assert _backfill(store) == {"not rerun": 1}
    assert _unchanged(*victims) and (regime / "backfill.tmp").is_symlink()  # never used
    assert list(backfill.record(store, "easy")["runs"]) == ["easy/equal-batch/sara/s0.json"]


def test_a_record_planted_as_a_link_is_replaced(store: RunStore, victims: list[Path]) -> None:
    record = store.root / "easy" / BACKFILL_RECORD
    record.symlink_to(victims[0])  # reading it is harmless (a JSON object is expected); writing it was not
    victims[0].write_text('{"runs": {}}')
    backfill.note(store, "easy", "easy/x/s0.json", {"result": "differs"})
    assert victims[0].read_text() == '{"runs": {}}' and not record.is_symlink()
    assert json.loads(record.read_text())["runs"] == {"easy/x/s0.json": {"result": "differs"}}


def test_write_run_and_attach_log_replace_planted_links(store: RunStore, victims: list[Path],
                                                        tmp_path: Path) -> None:
    path = store.run_file("easy", "equal-batch", "sara", 0)
    path.with_suffix(".tmp").symlink_to(victims[0])  # where write_run used to put its temporary file
    backfill.write_run(path, {"seed": 0})
    assert _unchanged(victims[0]) and json.loads(path.read_text()) == {"seed": 0}
    path.unlink()
    path.symlink_to(victims[1])  # the run file itself
    backfill.write_run(path, {"seed": 1})
    assert _unchanged(*victims) and not path.is_symlink() and json.loads(path.read_text()) == {"seed": 1}

    rerun_log = tmp_path / "scratch.parquet"
    rerun_log.write_bytes(b"PAR1 a rerun's log")
    dest = path.with_suffix(".rollouts.parquet")
    dest.symlink_to(victims[0])
    got = backfill.attach_log(path, rerun_log, {"commit": "c", "at": "t"})
    assert _unchanged(*victims) and not dest.is_symlink() and dest.read_bytes() == b"PAR1 a rerun's log"
    assert got["file"] == dest.name and len(got["sha256"]) == 64


def test_freeze_and_claim_never_follow_a_link(store: RunStore, victims: list[Path]) -> None:
    target = store.target_path("easy")
    target.symlink_to(victims[0])
    store.freeze(target, {"target": 0.5})
    assert _unchanged(victims[0]) and not target.is_symlink() and json.loads(target.read_text()) == {"target": 0.5}

    run = store.run_file("easy", "equal-batch", "sara", 0)
    run.with_suffix(".lock").symlink_to(victims[1])
    with pytest.raises(UnsafeRunFolder, match=r"s0.lock: a symbolic link was planted"):
        store.claim(run)
    assert _unchanged(*victims)
    run.with_suffix(".lock").unlink()
    assert store.claim(run) and not store.claim(run)  # held by this live process
    store.release(run)
