"""The replay leaderboard (benchmarks/leaderboard.py) and the advisor validation (benchmarks/advisor_validation.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import advisor_validation, leaderboard
from rlvr_core.allocation import ALLOCATORS

ROOT = Path(__file__).resolve().parents[2]
TRL_TRACE = ROOT / "benchmarks" / "replay" / "trl_tiny_scripted.parquet"


def test_every_committed_trace_has_a_complete_provenance():
    found = leaderboard.traces()
    assert {p.name for p, _ in found} >= {"hard_grpo_s0.parquet", "trl_tiny_scripted.parquet"}
    for path, meta in found:
        assert path.stat().st_size < 100_000 and all(meta[k] for k in leaderboard.PROVENANCE_KEYS)


def test_a_trace_without_provenance_is_refused(tmp_path):
    shutil.copy(TRL_TRACE, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"t\.parquet: no provenance file t\.json"):
        leaderboard.traces(tmp_path)
    (tmp_path / "t.json").write_text(json.dumps({"regime": "x", "command": "y"}))
    with pytest.raises(ValueError, match=r"provenance lacks \['commit', 'recorder'\]"):
        leaderboard.traces(tmp_path)


def test_leaderboard_ranks_every_allocator_on_every_trace(tmp_path):
    for name in ("a", "b"):
        shutil.copy(TRL_TRACE, tmp_path / f"{name}.parquet")
        shutil.copy(TRL_TRACE.with_suffix(".json"), tmp_path / f"{name}.json")
    assert leaderboard.main(["--traces", str(tmp_path), "--seeds", "2", "--steps", "4", "--k", "4", "--batch", "2",
                             "--out", str(tmp_path / "out")]) == 0
    df = pd.read_csv(tmp_path / "out" / "leaderboard" / "leaderboard.csv")
    assert sorted(df["trace"].unique()) == ["a", "b"]
    assert set(df["allocator"]) <= set(ALLOCATORS.names()) and "grpo" in set(df["allocator"])
    assert (df["rpeg_over_k"] >= 1.0).all() and (df["floor_over_k"] >= 1.0).all() and (df["rptr"] >= 1.0).all()
    grpo = df[df.allocator == "grpo"].iloc[0]  # groups of k rows: the two units agree
    assert grpo["rptr"] == pytest.approx(grpo["rpeg_over_k"])
    for _, g in df.groupby("trace"):  # the saving is in the ranked unit: its sign follows rptr against grpo's
        ref = g.set_index("allocator")["rptr"]["grpo"]
        clear = g[np.isfinite(g["saving_vs_grpo"]) & ((g["rptr"] / ref - 1).abs() > 0.2)]
        assert len(clear) and (np.sign(clear["saving_vs_grpo"]) == np.sign(ref - clear["rptr"])).all()
    a, b = (df[df.trace == t].set_index("allocator")["rpeg_over_k"] for t in ("a", "b"))
    pd.testing.assert_series_equal(a, b, check_names=False)  # the same trace gives the same figures
    md = (tmp_path / "out" / "leaderboard" / "leaderboard.md").read_text()
    assert "## Overall: mean rank over traces" in md and "| grpo |" in md and "rollouts / trained row" in md
    assert (tmp_path / "out" / "leaderboard" / "leaderboard.png").stat().st_size > 1000


def test_validation_reads_the_study_cells_and_their_ledgers():
    cells = advisor_validation.cells("hard")
    by = {(c["protocol"], c["variant"]): c for c in cells}
    ref = by[("reference", "grpo")]
    run = json.loads(advisor_validation.STUDY.run_file("hard", "reference", "grpo", 0).read_text())
    assert ref["measured"][0] == pytest.approx(run["ledger"]["rollouts_per_step"]
                                               / run["ledger"]["effective_groups_per_step"])
    assert ref["k"] == 8 and ref["batch"] == 32 and ref["steps"] == run["ledger"]["steps"]
    assert by[("equal-batch", "dapo")]["params"] == {"max_gen_batches": 4}
