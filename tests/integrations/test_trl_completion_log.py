"""A plain TRL GRPOTrainer's own completion log (GRPOConfig(log_completions=True)) read by the advisor
(rlvr_core.advise.trl_log, docs/advisor.md "TRL completion logs"): the files TRL itself writes, not a copy."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from rlvr_core.advise import advise, load_log  # noqa: E402
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model  # noqa: E402

ROWS = arithmetic_rows(24)


def test_the_completion_log_trl_writes_is_an_advisor_log(tmp_path):
    reward = ScriptedReward()
    trainer = GRPOTrainer(model=tiny_model(tmp_path / "chat"), reward_funcs=[reward],
                          args=grpo_config(tmp_path / "out", max_steps=4, eval_strategy="no", log_completions=True),
                          train_dataset=Dataset.from_list(ROWS))
    trainer.train()
    folder = tmp_path / "out" / "completions"
    files = sorted(p.name for p in folder.iterdir())
    assert files == [f"completions_{t:05d}.parquet" for t in (1, 2, 3, 4)]
    raw = pd.read_parquet(folder / files[0])
    assert {"step", "prompt", "completion", "advantage"} <= set(raw.columns)
    df = load_log(folder)
    assert sorted(df["step"].unique().tolist()) == [1, 2, 3, 4]
    assert df["rollouts"].sum() == len(reward.rows) == 32 and (df["tokens"] >= 1).all()
    truth = pd.concat([pd.read_parquet(folder / f) for f in files], ignore_index=True)
    names = [c for c in truth.columns if c not in ("step", "prompt", "completion", "advantage")]
    assert df["passes"].sum() == int((truth[names].fillna(0).sum(axis=1) > 0).sum())
    adv = advise(folder, k=4, batch=2, seeds=2, steps=4, allocators=["grpo", "dapo"])
    assert adv.rows == len(df) and adv.recurrence.prompts == df["prompt_id"].nunique()
