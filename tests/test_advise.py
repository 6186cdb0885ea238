"""The allocation advisor (rlvr_core.advise, docs/advisor.md): its three log formats, its errors, its replay of
every registered allocator and its command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlvr_core.advise import LogError, advise, load_log
from rlvr_core.advise.core import AllocatorAdvice, recommend
from rlvr_core.allocation import ALLOCATORS
from rlvr_core.allocation.grpo import GRPOAllocator

ROOT = Path(__file__).resolve().parents[1]
FAST = {"k": 4, "batch": 8, "seeds": 2, "steps": 6}


def completions(steps: int = 6, prompts: int = 24, n: int = 4, beta=(0.3, 2.0), seed: int = 0) -> pd.DataFrame:
    """Per-completion rows of a run whose prompts have pass rates ~ Beta(beta), fresh prompts every step."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(1, steps + 1):
        p = rng.beta(*beta, prompts)
        for j in range(prompts):
            r = (rng.random(n) < p[j]).astype(float)
            for x in r:
                rows.append({"step": t, "prompt_id": f"q{t}-{j}", "reward": x, "tokens": int(10 + 20 * (1 - x))})
    return pd.DataFrame(rows)


def test_csv_and_jsonl_rows_sum_to_one_row_per_step_and_prompt(tmp_path):
    df = completions(steps=3, prompts=5)
    df.to_csv(tmp_path / "log.csv", index=False)
    with open(tmp_path / "log.jsonl", "w") as f:
        for rec in df.to_dict("records"):
            f.write(json.dumps(rec) + "\n")
    a, b = load_log(tmp_path / "log.csv"), load_log(tmp_path / "log.jsonl")
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 15 and (a["rollouts"] == 4).all()
    assert a["passes"].sum() == int((df["reward"] > 0).sum()) and a["tokens"].sum() == df["tokens"].sum()
    assert a["prompt_id"].nunique() == 15  # string ids are numbered


def test_parquet_log_keeps_its_counts(tmp_path):
    log = pd.DataFrame({"step": [1, 1, 2], "prompt_id": [3, 7, 3], "rollouts": [8, 8, 4], "passes": [0, 8, 2],
                        "reward_sum": [0.0, 8.0, 2.0], "tokens": [80, 40, 30]})
    log.to_parquet(tmp_path / "rollouts.parquet")
    got = load_log(tmp_path / "rollouts.parquet")
    rows = got[["step", "prompt_id", "rollouts", "passes"]].values.tolist()
    assert rows == [[1, 3, 8, 0], [1, 7, 8, 8], [2, 3, 4, 2]]


@pytest.mark.parametrize("case,pattern", [
    ("missing", r"log\.csv: header \(line 1\): missing column\(s\) \['reward'\]"),
    ("range", r"log\.csv: row 5 \(line 6\), column 'reward': reward outside \[0, 1\] \(value 2\.0"),
    ("empty", r"log\.csv: the log is empty"),
    ("one_step", r"log\.csv: column 'step': every row is from step 3; .* at least two steps"),
    ("not_number", r"log\.csv: row 2 \(line 3\), column 'step': not a finite number"),
])
def test_bad_csv_logs_name_file_row_and_column(tmp_path, case, pattern):
    df = completions(steps=2, prompts=2)
    if case == "missing":
        df = df.drop(columns="reward")
    elif case == "range":
        df.loc[4, "reward"] = 2.0
    elif case == "empty":
        df = df.iloc[:0]
    elif case == "one_step":
        df["step"] = 3
    elif case == "not_number":
        df["step"] = df["step"].astype(object)
        df.loc[1, "step"] = "two"
    df.to_csv(tmp_path / "log.csv", index=False)
    with pytest.raises(LogError, match=pattern):
        load_log(tmp_path / "log.csv")


def test_bad_parquet_rows_and_formats_are_refused(tmp_path):
    log = pd.DataFrame({"step": [1, 2], "prompt_id": [0, 1], "rollouts": [8, 8], "passes": [3, 9]})
    log.to_parquet(tmp_path / "r.parquet")
    with pytest.raises(LogError, match=r"r\.parquet: row 2, column 'passes': passes outside \[0, rollouts\]"):
        load_log(tmp_path / "r.parquet")
    log.drop(columns="passes").to_parquet(tmp_path / "r.parquet")
    with pytest.raises(LogError, match=r"missing column\(s\) \['passes'\]"):
        load_log(tmp_path / "r.parquet")
    (tmp_path / "x.txt").write_text("step\n")
    with pytest.raises(LogError, match="unknown format"):
        load_log(tmp_path / "x.txt")
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "prompt_id": 0, "reward": 1}\n\n[1, 2]\n')
    with pytest.raises(LogError, match=r"bad\.jsonl: row 2 \(line 3\): not a JSON object"):
        load_log(tmp_path / "bad.jsonl")


def test_the_value_baselines_are_in_the_advisors_table_and_vip_is_skipped_below_its_n_min():
    """knapsack-rl, vip and mopps (issue 37) are registered, so the advisor replays them; vip needs k >= n_min = 4."""
    from rlvr_core.advise.model import registered_allocators

    names, skipped = registered_allocators(k=4, batch=8)
    assert {"knapsack-rl", "vip", "mopps", "cures", "valor"} <= set(names)  # valor: ours
    names, skipped = registered_allocators(k=2, batch=8)
    assert "vip" in skipped and "n_min" in skipped["vip"] and {"knapsack-rl", "mopps"} <= set(names)


def test_advice_on_a_hard_population_covers_every_allocator_and_its_phases(tmp_path):
    completions(steps=9, prompts=24, beta=(0.3, 2.0)).to_csv(tmp_path / "log.csv", index=False)
    adv = advise(tmp_path / "log.csv", **FAST)
    names = [a.name for a in adv.allocators]
    assert sorted(names + list(adv.skipped)) == ALLOCATORS.names()
    assert [p.name for p in adv.phases] == ["early", "middle", "late"]
    assert [(p.first_step, p.last_step) for p in adv.phases] == [(1, 3), (4, 6), (7, 9)]
    for p in adv.phases:  # a hard population: most groups all-fail, the floor well above k
        assert p.zero_variance_logged > 0.5 and p.floor_ratio_to_k > 1.2 and p.logged_group_size == 4
    by = {a.name: a for a in adv.allocators}
    assert by["grpo"].saving_vs_grpo == (0.0, 0.0, 0.0)
    for a in adv.allocators:  # nobody goes below the oracle; intervals hold their mean
        m, lo, hi = a.rollouts_per_effective_group
        assert m >= adv.k and lo <= m <= hi
        assert a.tokens_per_effective_group is not None and a.tokens_per_effective_group[0] > 10 * adv.k
    for name in ("grpo", "dapo", "sara", "vigor", "pods"):  # own-reward allocators stay above the screening floor
        assert by[name].rollouts_per_effective_group[0] >= 0.9 * adv.floor_ratio_to_k * adv.k
    assert adv.recommendation and "floor leaves at most" in adv.recommendation


def test_the_replay_is_the_allocation_benchmarks_replay():
    """Given the benchmark's pool (its replay scenario's 20,000 prompts), the advisor's replay is the benchmark's;
    by default it replays fresh prompts, as none of the log's 5,024 prompts recurs (test_advise_recurrence.py)."""
    from benchmarks.allocation import VARIANTS, run_one

    log = ROOT / "benchmarks" / "replay" / "hard_grpo_s0.parquet"
    adv = advise(log, k=8, batch=32, seeds=2, steps=8, pool=20000, allocators=["grpo", "sara"])
    assert adv.pool == 20000 and adv.steps == 157 and adv.replay == "pool"
    assert (adv.recurrence.prompts, adv.recurrence.recurring) == (5024, 0)
    for a in adv.allocators:
        variant = next(v for v in VARIANTS if v.label == a.name)
        bench = [run_one(variant, "replay", 8, s, 8, 32)["rollouts_per_effective_group"] for s in (0, 1)]
        assert a.rollouts_per_effective_group[0] == pytest.approx(np.mean(bench), rel=1e-12)


def test_a_newly_registered_allocator_is_replayed_without_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(ALLOCATORS._items, "grpo-copy", GRPOAllocator)
    completions(steps=3, prompts=16).to_csv(tmp_path / "log.csv", index=False)
    adv = advise(tmp_path / "log.csv", **FAST)
    by = {a.name: a for a in adv.allocators}
    assert by["grpo-copy"].rollouts_per_effective_group == by["grpo"].rollouts_per_effective_group


def test_recommendation_is_by_the_predicted_saving_to_target_and_stays_without_a_lower_bound_above_zero():
    def row(name, saving, predicted):
        return AllocatorAdvice(name, (20.0, 19.0, 21.0), None, saving, None, rollouts_per_trained_row=(2.5, 2.4, 2.6),
                               predicted_saving_to_target=predicted)

    grpo = row("grpo", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    # the largest proxy saving (sara+dps) predicts the least: the recommendation follows the prediction
    table = [grpo, row("sara+dps", (0.4, 0.3, 0.5), (-0.1, -0.6, 0.4)),
             row("sara", (0.05, 0.0, 0.1), (0.2, 0.05, 0.35))]
    line = recommend(table, 1.25, 5)
    assert line.startswith("sara: predicted 20% [5%, 35%] fewer rollouts to the target accuracy than uniform GRPO")
    assert "proxy: saving 5% [0%, 10%] in rollouts per trained row over 5 replay seeds" in line
    assert line.endswith("the floor leaves at most 50% without prompt history")
    table[2] = row("sara", (0.05, 0.0, 0.1), (0.2, -0.05, 0.45))
    line = recommend(table, 1.25, 5)
    assert line.startswith("stay with uniform GRPO: no allocator's predicted saving in rollouts to target has an "
                           "interval above zero (best, sara: 20% [-5%, 45%]")
    table = [grpo, row("sara", (0.3, 0.2, 0.4), None)]  # no calibration: the proxy is named, and not followed
    assert recommend(table, 1.25, 5).startswith("stay with uniform GRPO: no calibration of the proxy")


def test_cli_prints_the_tables_and_writes_md_json_png(tmp_path):
    completions(steps=4, prompts=16).to_csv(tmp_path / "log.csv", index=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "rlvr_core.cli", "advise", str(tmp_path / "log.csv"), "--k", "4", "--batch", "8",
           "--seeds", "2", "--steps", "4", "--out", str(tmp_path / "out")]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "**Recommendation.**" in r.stdout and "| sara |" in r.stdout and "| early |" in r.stdout
    data = json.loads((tmp_path / "out" / "advice.json").read_text())
    assert data["k"] == 4 and {a["name"] for a in data["allocators"]} >= {"grpo", "dapo", "sara", "vigor"}
    assert (tmp_path / "out" / "advice.png").stat().st_size > 1000
    assert (tmp_path / "out" / "advice.md").read_text() in r.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("step,prompt_id\n1,0\n")
    r = subprocess.run([sys.executable, "-m", "rlvr_core.advise", str(bad)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 2 and "missing column(s) ['reward']" in r.stderr


def test_rlvr_alloc_dispatcher_lists_commands_and_refuses_unknown_ones(capsys):
    from rlvr_core.cli import main

    assert main([]) == 2 and "advise" in capsys.readouterr().out
    assert main(["--help"]) == 0
    assert main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    with open(ROOT / "pyproject.toml", encoding="utf-8") as f:
        assert 'rlvr-alloc = "rlvr_core.cli:main"' in f.read()


def test_validation_sentence_states_the_error_and_the_contextual_offset():
    from rlvr_core.advise.core import load_validation, validation_sentence

    rows = [{"params": {}, "error": 0.02}, {"params": {"prior": "eb"}, "error": -0.1},
            {"params": {"prior": "carry+context"}, "error": 0.3}]
    line = validation_sentence({"rows": rows, "median_abs_error": 0.1, "cells": 3, "regimes": ["hard"]})
    assert line.startswith("predictions were within 10% (median) of measured runs on 3 cells")
    assert "at most 10% off for allocators without a contextual prior" in line and "over-predicts by 30%" in line
    assert validation_sentence(None).startswith("not validated")
    committed = load_validation()  # the committed benchmarks/results/advisor_validation/advisor_validation.json
    assert committed is not None and committed["cells"] == len(committed["rows"]) > 0
