"""RolloutLogCallback: a plain TRL GRPOTrainer's rollout log, and the advisor run on it (docs/advisor.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from rlvr_core.integrations.trl import RolloutLogCallback, stable_prompt_id  # noqa: E402
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROWS = arithmetic_rows(24)
PASS = {stable_prompt_id(r["id"]): r["pass_rate"] for r in ROWS}


def test_prompt_ids_are_stable_non_negative_int64():
    assert stable_prompt_id(7) == 7
    a = stable_prompt_id("train-3")
    assert a == stable_prompt_id("train-3") != stable_prompt_id("train-4") and 0 <= a < 2**63
    assert stable_prompt_id([{"role": "user", "content": "hi"}]) >= 0


def test_plain_grpo_trainer_log_then_advise_prints_table_and_recommendation(tmp_path):
    path = tmp_path / "rollouts.parquet"
    log = RolloutLogCallback(path)
    reward = ScriptedReward()
    trainer = GRPOTrainer(model=tiny_model(tmp_path / "chat"), reward_funcs=[log.wrap(reward)],
                          args=grpo_config(tmp_path / "out", max_steps=4, eval_strategy="no"),
                          train_dataset=Dataset.from_list(ROWS), callbacks=[log])
    trainer.train()
    df = pd.read_parquet(path)
    assert sorted(df["step"].unique().tolist()) == [1, 2, 3, 4]
    assert df.groupby("step")["rollouts"].sum().tolist() == [8, 8, 8, 8]  # 2 prompts x 4 generations a step
    assert (df["rollouts"] == 4).all() and len(df) == 8
    for row in df.itertuples():  # passes follow the scripted pass rate of the row's prompt
        assert row.passes == {0.0: 0, 0.5: 2, 1.0: 4}[PASS[row.prompt_id]] == row.reward_sum
        assert 4 <= row.tokens <= 4 * 6  # 1..max_completion_length tokens per completion
    assert len(reward.rows) == 32  # the wrapped function still scored every completion
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "rlvr_core.cli", "advise", str(path), "--k", "4", "--batch", "2", "--seeds", "2",
           "--steps", "4", "--out", str(tmp_path / "advice")]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "**Recommendation.**" in r.stdout and "| grpo |" in r.stdout and "| early |" in r.stdout
    advice = json.loads((tmp_path / "advice" / "advice.json").read_text())
    assert advice["steps"] == 4 and advice["rows"] == 8 and advice["recommendation"]


def test_a_resumed_run_keeps_the_rows_up_to_its_checkpoint_and_logs_each_step_once(tmp_path):
    path, model = tmp_path / "rollouts.parquet", tiny_model(tmp_path / "chat")

    def run(resume: str | None) -> pd.DataFrame:
        log = RolloutLogCallback(path)
        trainer = GRPOTrainer(model=model, reward_funcs=[log.wrap(ScriptedReward())],
                              args=grpo_config(tmp_path / "out", max_steps=3, save_strategy="steps", save_steps=2),
                              train_dataset=Dataset.from_list(ROWS), callbacks=[log])
        trainer.train(resume_from_checkpoint=resume)
        return pd.read_parquet(path)

    first = run(None)
    assert first["step"].tolist() == [1, 1, 2, 2, 3, 3]
    second = run(str(tmp_path / "out" / "checkpoint-2"))
    assert second["step"].tolist() == [1, 1, 2, 2, 3, 3]
    pd.testing.assert_frame_equal(second[second.step <= 2], first[first.step <= 2])


def test_unscored_completions_are_counted_and_warned_about_once(tmp_path):
    from types import SimpleNamespace

    from rlvr_core.rollout_log import RolloutLog

    log = RolloutLogCallback(tmp_path / "rollouts.parquet")
    log.log, log._in_step = RolloutLog(log.path, rows=[], upto=0), True

    def verifier(prompts, completions, **kwargs):
        return [1.0, None, float("nan"), 0.0]

    wrapped = log.wrap(verifier)
    state = SimpleNamespace(global_step=0)
    with pytest.warns(UserWarning, match=r"verifier returned None or a non-finite reward for 2 completion\(s\) of "
                                         r"step 1; they are left out"):
        assert wrapped(prompts=["a", "a", "b", "b"], completions=["x"] * 4, trainer_state=state)[1] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per run, not once per call
        wrapped(prompts=["a", "a", "b", "b"], completions=["x"] * 4, trainer_state=state)
    assert log.unscored == 4
