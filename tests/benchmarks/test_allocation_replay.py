"""The allocation benchmark knows the replay scenario and reruns some scenarios without touching the others."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import allocation as A
from benchmarks import readme


def test_replay_is_a_benchmark_scenario_on_the_committed_log():
    assert "replay" in A.SCENARIOS
    grpo = next(v for v in A.VARIANTS if v.label == "grpo")
    r = A.run_one(grpo, "replay", 8, seed=0, steps=4, batch_size=16)
    assert r["scenario"] == "replay" and r["rollouts_per_step"] == 16 * 8
    assert 8 <= r["rollouts_per_effective_group"] < 16 * 8


def _main(out: Path, *extra: str) -> None:
    assert A.main(["--quick", "--seeds", "2", "--steps", "2", "--batch-size", "8", "--out", str(out), *extra]) == 0


def test_scenarios_rerun_replaces_only_their_rows(tmp_path):
    _main(tmp_path, "--scenarios", "early", "replay")
    runs0 = pd.read_csv(tmp_path / "allocation" / "allocation_runs.csv")
    timing0 = (tmp_path / "allocation" / "allocation_timing.csv").read_bytes()
    assert list(runs0.scenario.unique()) == ["early", "replay"]
    # mark the earlier replay rows, so the merge can be seen to replace them
    runs0.loc[runs0.scenario == "replay", "rollouts_per_effective_group"] = -1.0
    runs0.to_csv(tmp_path / "allocation" / "allocation_runs.csv", index=False)
    _main(tmp_path, "--scenarios", "replay", "drift")
    runs1 = pd.read_csv(tmp_path / "allocation" / "allocation_runs.csv")
    assert list(runs1.scenario.unique()) == ["early", "drift", "replay"]  # the table's scenario order
    pd.testing.assert_frame_equal(runs1[runs1.scenario == "early"].reset_index(drop=True),
                                  runs0[runs0.scenario == "early"].reset_index(drop=True))
    replay = runs1[runs1.scenario == "replay"]
    assert len(replay) == len(A.VARIANTS) * 2 * 2 and (replay.rollouts_per_effective_group > 0).all()
    assert (tmp_path / "allocation" / "allocation_timing.csv").read_bytes() == timing0  # kept from the earlier run
    summary = pd.read_csv(tmp_path / "allocation" / "allocation.csv")
    assert set(summary.scenario) == {"early", "drift", "replay"}
    sara = summary[(summary.allocator == "sara") & (summary.scenario == "early") & (summary.k == 8)]
    mine = runs1[(runs1.allocator == "sara") & (runs1.scenario == "early") & (runs1.k == 8)]
    assert np.isclose(sara.rollouts_per_effective_group.iloc[0], mine.rollouts_per_effective_group.mean())
    meta = json.loads((tmp_path / "allocation" / "allocation_targets.json").read_text())
    assert meta["run"]["scenarios_run"] == ["drift", "replay"] and meta["run"]["scenarios_kept"] == ["early"]
    tgt = meta["targets"]
    assert "sara_vs_dapo_saving_replay_k8" in tgt and "sara_vs_dapo_saving_early_k8" in tgt
    assert "replay/k8" in tgt["vigor_useful_share_above_grpo"]["value"]
    assert "| sara | replay |" in (tmp_path / "allocation" / "allocation.md").read_text()
    assert "replay" in readme.allocation_headline(meta)


def test_scenarios_rerun_refuses_files_of_another_protocol(tmp_path):
    _main(tmp_path, "--scenarios", "early")
    with pytest.raises(SystemExit, match="another protocol"):
        A.main(["--quick", "--seeds", "2", "--steps", "3", "--batch-size", "8", "--out", str(tmp_path),
                "--scenarios", "replay"])


def test_timing_only_remeasures_the_rounds_and_keeps_the_runs(tmp_path):
    _main(tmp_path, "--scenarios", "early")
    runs0 = (tmp_path / "allocation" / "allocation_runs.csv").read_bytes()
    timing = pd.read_csv(tmp_path / "allocation" / "allocation_timing.csv")
    timing["median_ms"] = 999.0  # a timing measured on a crowded machine
    timing.to_csv(tmp_path / "allocation" / "allocation_timing.csv", index=False)
    _main(tmp_path, "--timing-only")
    assert (tmp_path / "allocation" / "allocation_runs.csv").read_bytes() == runs0
    fresh = pd.read_csv(tmp_path / "allocation" / "allocation_timing.csv")
    assert set(fresh.allocator) == set(timing.allocator) and (fresh.median_ms < 999.0).all()
    meta = json.loads((tmp_path / "allocation" / "allocation_targets.json").read_text())
    assert "timing_remeasured" in meta["run"] and meta["run"]["scenarios_run"] == ["early"]
    assert meta["targets"]["decision_round_ms_1024_live"]["value"]["sara"] < 999.0
    assert "sara_vs_dapo_saving_early_k8" in meta["targets"]


def test_timing_only_needs_earlier_runs(tmp_path):
    with pytest.raises(SystemExit, match="no allocation_runs.csv"):
        _main(tmp_path, "--timing-only")
