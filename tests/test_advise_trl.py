"""TRL's completion logs as advisor input (rlvr_core.advise.trl_log, docs/advisor.md "TRL completion logs").

The logs are built here exactly as TRL 1.16 writes them (trl/trainer/grpo_trainer.py, ``GRPOTrainer.log`` with
``log_completions=True``): a ``table`` dict of ``step`` (global step, repeated), ``prompt`` and ``completion``
(conversations: lists of messages), one column per reward function named after it, the ``log_extra`` columns and
``advantage``, written by ``pd.DataFrame(table).to_parquet(<output_dir>/completions/completions_{step:05d}.parquet)``.
No network, no model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlvr_core.advise import LogError, advise, load_log
from rlvr_core.advise.report import main

FAST = {"k": 4, "batch": 8, "seeds": 2, "steps": 6, "allocators": ["grpo", "dapo"]}


def trl_tables(steps: int = 6, prompts: int = 8, n: int = 4, seed: int = 0) -> list[dict]:
    """One TRL ``table`` per logged step: prompts that recur every step, a pass/fail reward ``correct`` and a
    text ``log_extra`` column ``source``."""
    rng = np.random.default_rng(seed)
    p = rng.beta(0.6, 1.2, prompts)
    tables = []
    for t in range(1, steps + 1):
        prompt, completion, correct = [], [], []
        for j in range(prompts):
            for _ in range(n):
                ok = float(rng.random() < p[j])
                prompt.append([{"role": "user", "content": f"What is {j} + {j}?"}])
                completion.append([{"role": "assistant", "content": "x" * int(rng.integers(5, 40))}])
                correct.append(ok)
        r = np.asarray(correct).reshape(prompts, n)
        adv = (r - r.mean(1, keepdims=True)).reshape(-1).tolist()
        tables.append({"step": [t] * len(prompt), "prompt": prompt, "completion": completion, "correct": correct,
                       "source": ["gsm"] * len(prompt), "advantage": adv})
    return tables


def write_folder(folder: Path, tables: list[dict]) -> Path:
    (folder / "completions").mkdir(parents=True)
    for tb in tables:
        pd.DataFrame(tb).to_parquet(folder / "completions" / f"completions_{tb['step'][0]:05d}.parquet")
    return folder / "completions"


def as_rows(tables: list[dict]) -> pd.DataFrame:
    """The same completions as (step, prompt_id, reward, tokens) rows; tokens = ceil(characters / 4)."""
    df = pd.concat([pd.DataFrame(tb) for tb in tables], ignore_index=True)
    return pd.DataFrame({"step": df["step"], "prompt_id": [json.dumps(p, sort_keys=True) for p in df["prompt"]],
                         "reward": df["correct"],
                         "tokens": [math.ceil(len(c[0]["content"]) / 4) for c in df["completion"]]})


def test_a_trl_completions_folder_reads_as_the_same_completions_in_a_csv(tmp_path):
    tables = trl_tables()
    folder = write_folder(tmp_path, tables)
    as_rows(tables).to_csv(tmp_path / "same.csv", index=False)
    got, want = load_log(folder), load_log(tmp_path / "same.csv")
    pd.testing.assert_frame_equal(got, want)
    assert len(got) == 6 * 8 and set(got["rollouts"]) == {4}
    with pytest.raises(LogError, match=r"completions_00002.parquet: column 'step': every row is from step 2"):
        load_log(folder / "completions_00002.parquet")  # one per-step file holds one step


def test_one_trl_parquet_or_jsonl_of_several_steps_is_a_log_and_is_advised_on(tmp_path, capsys):
    tables = trl_tables()
    df = pd.concat([pd.DataFrame(tb) for tb in tables], ignore_index=True)
    df.to_parquet(tmp_path / "all.parquet")
    df.to_json(tmp_path / "all.jsonl", orient="records", lines=True)
    want = load_log(write_folder(tmp_path, tables))
    for name in ("all.parquet", "all.jsonl"):
        pd.testing.assert_frame_equal(load_log(tmp_path / name), want)
    adv = advise(tmp_path / "completions", **FAST)
    assert {a.name for a in adv.allocators} == {"grpo", "dapo"} and adv.rows == 48 and adv.token_model is not None
    assert (adv.recurrence.recurring, adv.recurrence.mean_gap) == (8, 1.0) and adv.replay == "pool"
    assert main([str(tmp_path / "completions"), "--k", "4", "--batch", "8", "--seeds", "2", "--steps", "6",
                 "--out", str(tmp_path / "out")]) == 0
    assert "Log: 48 (step, prompt) rows over 6 steps" in capsys.readouterr().out


def test_several_reward_columns_are_summed_nan_as_zero_and_unscorable_completions_dropped(tmp_path):
    tables = trl_tables(steps=3, prompts=2, n=2)
    for tb in tables:
        tb["fmt"] = [0.0, float("nan"), float("nan"), 0.0]
        tb["correct"] = [1.0, 0.0, float("nan"), 0.0]
        tb["fmt"][2] = float("nan")  # row 3: every reward None in TRL: unscorable
    df = load_log(write_folder(tmp_path, tables))
    assert df["rollouts"].tolist() == [2, 1] * 3 and df["passes"].tolist() == [1, 0] * 3
    assert df.attrs["unscorable"] == 3
    adv = advise(tmp_path / "completions", k=2, batch=2, seeds=1, steps=2, allocators=["grpo"])
    assert any("3 completion(s) of the TRL log had every reward NaN" in w for w in adv.warnings)


def test_reward_column_chooses_the_pass_fail_reward(tmp_path, capsys):
    tables = trl_tables()
    for tb in tables:
        tb["length_penalty"] = [-0.1] * len(tb["step"])
    folder = write_folder(tmp_path, tables)
    with pytest.raises(LogError, match=r"completions_00001.parquet: row 2, column 'correct': reward \(sum of "
                       r"\['correct', 'length_penalty'\]\) outside \[0, 1\].*--reward-column"):
        load_log(folder)
    assert load_log(folder, reward_columns=["correct"]).equals(load_log(write_folder(tmp_path / "b", trl_tables())))
    args = [str(folder), "--k", "4", "--batch", "8", "--seeds", "2", "--steps", "6", "--out", str(tmp_path / "o")]
    assert main(args) == 2 and "--reward-column NAME" in capsys.readouterr().err
    assert main(args + ["--reward-column", "correct"]) == 0


def _bad(tables: list[dict], step: int, row: int, column: str, value) -> list[dict]:
    tables[step][column][row] = value
    return tables


@pytest.mark.parametrize("column, value, pattern", [
    ("correct", "yes", r"row 3, column 'correct': not a number \(value 'yes'"),
    ("correct", 1.5, r"row 3, column 'correct': reward \(correct\) outside \[0, 1\] \(value 1.5"),
    ("step", 2.5, r"row 3, column 'step': not a whole number \(value 2.5"),
    ("prompt", None, r"row 3, column 'prompt': neither text nor a conversation \(a list of messages\) \(value None"),
    ("completion", 7, r"row 3, column 'completion': neither text nor a conversation \(a list of messages\) \(value 7"),
])
def test_a_malformed_trl_log_is_refused_naming_file_row_and_column(tmp_path, column, value, pattern):
    tables = _bad(trl_tables(), 1, 2, column, value)
    text = column == "correct" and isinstance(value, str)
    if text:  # parquet holds no text in a float column: all text, so that it is no default reward column
        tables[1]["correct"] = [str(v) for v in tables[1]["correct"]]
    if column != "completion":  # parquet holds no number in a column of conversations: JSONL only
        with pytest.raises(LogError, match=r"completions_00002\.parquet: " + pattern):
            load_log(write_folder(tmp_path, tables), reward_columns=["correct"] if text else None)
    df = pd.concat([pd.DataFrame(tb) for tb in _bad(trl_tables(), 0, 2, column, value)], ignore_index=True)
    df.to_json(tmp_path / "log.jsonl", orient="records", lines=True)
    with pytest.raises(LogError, match=r"log\.jsonl: " + pattern.replace("row 3,", r"row 3 \(line 3\),")):
        load_log(tmp_path / "log.jsonl")


def test_missing_trl_columns_and_an_empty_folder_are_refused(tmp_path):
    tables = trl_tables(steps=2)
    for tb in tables:
        del tb["correct"]
    with pytest.raises(LogError, match=r"completions_00001.parquet: every row: no reward column .*--reward-column"):
        load_log(write_folder(tmp_path / "a", tables))
    with pytest.raises(LogError, match=r"completions_00001.parquet: every row: no reward column \['score'\]"):
        load_log(write_folder(tmp_path / "b", trl_tables(steps=2)), reward_columns=["score"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(LogError, match=r"empty: a folder with no completions_\*\.parquet"):
        load_log(tmp_path / "empty")
