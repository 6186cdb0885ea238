"""The README's rows against uniform GRPO read on the large held-out set (benchmarks/large_set.py): a row is read
only once all its runs are evaluated there, on both sets side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import large_set
from benchmarks.study.store import RunStore
from rlvr_core.stats import TARGET_FRACTION, gain_target
from tests.benchmarks.test_null_controls import _add_large, _write

ROW = ("equal-rollouts", "ar3po")


def _store(tmp_path: Path) -> RunStore:
    """pool and pool-ws1: reference GRPO runs and AR3PO runs, AR3PO faster on the test split."""
    store = RunStore(tmp_path)
    for regime in ("pool", "pool-ws1"):
        store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5, "reference_seeds": [0, 1, 2, 3, 4]})
        for s in range(5):
            _write(store, regime, "reference", "grpo", s, 0.04 + 0.004 * s)
            _write(store, regime, *ROW, s, 0.06 + 0.004 * s)
    return RunStore(tmp_path)


def _evaluate(tmp_path: Path, regimes: tuple[str, ...], skip: int | None = None) -> RunStore:
    """Large-set curves, alike for both cells, for every run of ``regimes`` but AR3PO's seed ``skip``."""
    store = RunStore(tmp_path)
    for regime in regimes:
        for s in range(5):
            _add_large(store, regime, "reference", "grpo", s, 0.03 + 0.004 * s)
            if s != skip:
                _add_large(store, regime, *ROW, s, 0.03 + 0.004 * s)
    return RunStore(tmp_path)


def _row(rows: list[dict], ours: str = ROW[1]) -> dict:
    (row,) = [r for r in rows if r["ours"] == ours]
    return row


@pytest.fixture
def conditioned(monkeypatch):
    monkeypatch.setattr(large_set, "is_conditioned", lambda store, regime: True)


def test_the_rows_are_the_readme_ones_against_uniform_grpo() -> None:
    labels = {c.ours for c in large_set.ROWS}
    assert {"sara[budget]", "sara+dps[context]", "ar3po", "valor", "valor[reuse]", "knapsack-rl"} <= labels
    assert all(c.baseline == "grpo" for c in large_set.ROWS) and "dapo" not in labels


def test_a_row_is_not_read_until_every_run_has_a_large_curve(tmp_path: Path, conditioned) -> None:
    store = _store(tmp_path)
    row = _row(large_set.measure(store, bases=("pool",)))
    assert row["warm_starts"] == ["pool", "pool-ws1"] and row["missing"] == 20 and "large" not in row
    assert large_set.resume_command(row["missing_cells"]) == [
        "python -m benchmarks.study --regime pool --heldout-large --cells 'reference/grpo' 'equal-rollouts/ar3po'",
        "python -m benchmarks.study --regime pool --warm-start 1 --heldout-large --cells 'reference/grpo' "
        "'equal-rollouts/ar3po'"]
    store = _evaluate(tmp_path, ("pool", "pool-ws1"), skip=3)  # one AR3PO run of each warm start left
    row = _row(large_set.measure(store, bases=("pool",)))
    assert row["missing"] == 2 and "large" not in row
    assert row["missing_cells"] == [["pool", "equal-rollouts/ar3po"], ["pool-ws1", "equal-rollouts/ar3po"]]
    md = large_set.markdown([row, {**row, "ours": "valor", "missing_cells": [["pool", "equal-rollouts/valor"]]}])
    assert "| pool | ar3po | equal-rollouts | pool, pool-ws1 | - | 2 runs to evaluate | - |" in md
    # one command per warm start, whatever rows its runs serve
    assert "--regime pool --heldout-large --cells 'equal-rollouts/ar3po' 'equal-rollouts/valor'\n" in md
    assert "--regime pool --warm-start 1 --heldout-large --cells 'equal-rollouts/ar3po'\n" in md
    large_set.write([row], tmp_path / "results")  # nothing read: no figure
    assert not (tmp_path / "results" / "large_set" / "large_set.png").exists()


def test_a_complete_row_is_read_on_both_sets(tmp_path: Path, conditioned) -> None:
    """AR3PO learns faster on the test split only: a saving there, none on the large set, whose targets come from
    the reference runs' large curves."""
    _store(tmp_path)
    store = _evaluate(tmp_path, ("pool", "pool-ws1"))
    row = _row(large_set.measure(store, bases=("pool",)))
    assert row["missing"] == 0 and row["missing_cells"] == [] and row["problems"] == 14000
    test, large = row["test"], row["large"]
    assert test["pooled_saving"] > 0.2 and test["holds_in"] == 2 and test["targets"] == {"pool": 0.5, "pool-ws1": 0.5}
    assert abs(large["pooled_saving"]) < 0.01 and large["warm_starts"] == 2
    assert large["targets"]["pool"] == gain_target(
        [r["heldout_large"]["curve"] for r in store.reference_runs("pool")], TARGET_FRACTION)["target"]
    assert large["se"] == {"median": 0.004, "max": 0.004} and test["se"]["median"] > 0.01
    md = large_set.markdown([row])
    assert "(14,000 problems)" in md and "| pool | ar3po | equal-rollouts | pool, pool-ws1 |" in md
    assert " / 0.40 | " in md and "runs to evaluate" not in md and "```" not in md
    large_set.write([row], tmp_path / "results")
    folder = tmp_path / "results" / "large_set"
    assert (folder / "large_set.png").stat().st_size > 1000
    assert "large_set.png)" in (folder / "large_set.md").read_text()


def test_main_prints_what_it_wrote_figure_link_included(tmp_path: Path, conditioned, monkeypatch, capsys) -> None:
    _store(tmp_path / "results")
    _evaluate(tmp_path / "results", ("pool", "pool-ws1"))
    monkeypatch.setattr(large_set, "RESULTS", tmp_path / "results")
    assert large_set.main([]) == 0
    printed = capsys.readouterr().out
    assert printed == (tmp_path / "results" / "large_set" / "large_set.md").read_text()
    assert "large_set.png)" in printed and "| pool | ar3po |" in printed


def test_unconditioned_warm_starts_stay_out(tmp_path: Path, monkeypatch) -> None:
    _store(tmp_path)
    store = _evaluate(tmp_path, ("pool-ws1",))  # pool, left out, need not be evaluated
    monkeypatch.setattr(large_set, "is_conditioned", lambda store, regime: regime == "pool-ws1")
    row = _row(large_set.measure(store, bases=("pool",)))
    assert row["warm_starts"] == ["pool-ws1"] and row["missing"] == 0 and row["large"]["warm_starts"] == 1
    monkeypatch.setattr(large_set, "is_conditioned", lambda store, regime: False)
    assert large_set.measure(store, bases=("pool",)) == []


def test_a_warm_start_with_a_run_that_did_not_reproduce_is_left_out_and_named(tmp_path: Path, conditioned) -> None:
    import json

    _store(tmp_path)
    store = _evaluate(tmp_path, ("pool", "pool-ws1"), skip=3)
    (tmp_path / "study" / "pool-ws1" / large_set.RECORD).write_text(json.dumps({"runs": {
        "pool-ws1/equal-rollouts/ar3po/s3.json": {"result": "not rerun", "why": "policy lost"},
        "pool-ws1/equal-rollouts/ar3po/s2.json": {"result": "reproduced"}}}))
    row = _row(large_set.measure(store, bases=("pool",)))
    assert row["left_out_unreproduced"] == ["pool-ws1"] and row["warm_starts"] == ["pool"] and row["missing"] == 1
    md = large_set.markdown([row])
    assert "| pool | ar3po | equal-rollouts | pool (left out, a run not reproduced: pool-ws1) | - | 1 run to" in md
    _add_large(store, "pool", *ROW, 3, 0.042)  # pool complete: the row is read there
    row = _row(large_set.measure(RunStore(tmp_path), bases=("pool",)))
    assert row["large"]["warm_starts"] == 1 and row["left_out_unreproduced"] == ["pool-ws1"]
