"""benchmarks/floor.py: the screening floor beside the measured allocators, and its place in the targets."""

from __future__ import annotations

import json

import pytest

from benchmarks import floor as F
from benchmarks import study_targets as T
from rlvr_core.allocation.floor import screening_floor


def measured(sc: str, k: int, alloc: str, rpeg: float) -> dict:
    return {"allocator": alloc, "scenario": sc, "k": k, "rollouts_per_effective_group": rpeg}


def eb_run(seed: int, rollouts: int, steps: int, variant: str) -> dict:
    return {"seed": seed, "variant": variant, "split": "test",
            "ledger": {"rollouts": rollouts, "steps": steps, "effective_groups_per_step": 32.0},
            "curve": [{"updates": 0, "cum_rollouts": 0, "seconds": 0, "greedy_acc": 0.0},
                      {"updates": steps, "cum_rollouts": rollouts, "seconds": 1, "greedy_acc": 1.0}]}


def test_floor_files_put_the_measured_allocators_beside_the_floor(tmp_path):
    rows = [measured("early", 8, "sara", 16.9), measured("early", 8, "sara+dps", 13.9),
            measured("early", 8, "oracle", 8.0), measured("late", 16, "dapo", 30.0)]
    (tmp_path / "allocation").mkdir()
    (tmp_path / "allocation" / "allocation.json").write_text(json.dumps(rows))
    for lab, sub, per in (("dapo", "dapo", 25.6), ("sara", "sara", 20.0)):
        d = tmp_path / "study" / "hard" / "equal-batch" / sub
        d.mkdir(parents=True)
        for s in range(3):
            (d / f"s{s}.json").write_text(json.dumps(eb_run(s, int(per * 32 * 50), 50, lab)))
    res = F.write(tmp_path)
    early = next(r for r in res["static"] if r["scenario"] == "early" and r["k"] == 8)
    assert early["floor"] == pytest.approx(screening_floor(8, beta=(0.4, 2.5)).rollouts_per_effective_group)
    assert early["best_without_history"]["allocator"] == "sara"  # the oracle row is not an allocator
    assert early["best_with_history"]["allocator"] == "sara+dps"
    assert early["best_with_history"]["over_floor"] < 1 < early["best_without_history"]["over_floor"]
    late16 = next(r for r in res["static"] if r["scenario"] == "late" and r["k"] == 16)
    assert late16["best_without_history"]["allocator"] == "dapo" and "best_with_history" not in late16
    rep = res["replay"]
    assert rep["summary"]["steps"] == len(rep["steps"]) > 100  # every logged step of the committed log
    assert all(8 <= r["floor"] <= r["filter"] for r in rep["steps"])
    study = {r["allocator"]: r for r in res["study_equal_batch"]}
    assert study["sara"]["saving_over_dapo"] == pytest.approx(1 - 20.0 / 25.6, abs=1e-3)
    mean_floor = rep["summary"]["floor_over_k"]["mean"] * 8
    assert study["dapo"]["ceiling_without_prompt_information"] == pytest.approx(1 - mean_floor / 25.6, abs=1e-3)
    md = (tmp_path / "floor" / "allocation_floor.md").read_text()
    assert "| early | 8 | 1.82x |" in md and "sara+dps 1.74x" in md and "| sara | 3 | 20.00 |" in md
    assert (tmp_path / "floor" / "allocation_floor.png").stat().st_size > 10_000


def test_targets_show_the_floor_and_the_ceiling(tmp_path):
    rows = [measured(sc, 8, "sara+dps", 8 * x) for sc, x in (("early", 1.74), ("late", 1.77), ("ushape", 1.91))]
    (tmp_path / "allocation").mkdir()
    (tmp_path / "allocation" / "allocation.json").write_text(json.dumps(rows))
    sim = T._simulator_row(tmp_path / "allocation" / "allocation.json")
    assert "floor" not in T.fmt(sim)  # without the floor file: the measured values alone
    got = {r["target"]: r for r in T.measure(tmp_path, floor=F.write(tmp_path))}
    sim = next(r for t, r in got.items() if t.startswith("simulator"))
    assert sim["per_scenario"]["ushape"]["floor_over_k"] == pytest.approx(2.125, abs=1e-3)
    assert "ushape: sara+dps 1.91x (floor 2.12x); floor: the least" in T.fmt(sim)
    assert sim["met"] is False


def test_a_missing_allocation_file_still_writes_the_floor(tmp_path, capsys):
    assert F.main(["--out", str(tmp_path)]) == 0
    assert "is missing" in capsys.readouterr().out
    res = json.loads((tmp_path / "floor" / "allocation_floor.json").read_text())
    assert res["study_equal_batch"] == [] and all("best_without_history" not in r for r in res["static"])
