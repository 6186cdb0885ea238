"""The reward contract inside TRL: -1/+1 rewards, summed reward functions, a completion no function scores."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402

from rlvr_core.errors import RewardError  # noqa: E402
from rlvr_core.integrations.trl import REWARD_THRESHOLD, AllocatedGRPOTrainer, _resolve_params  # noqa: E402
from tests.integrations.test_trl import _strip, spy_batches  # noqa: E402
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model  # noqa: E402

B = 2  # generation_batch_size 8 / num_generations 4: effective groups a step


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory.mktemp("trl_rewards") / "chat")


@pytest.fixture(scope="module")
def alternating() -> Dataset:
    """Every row's completions alternate pass, fail, pass, ... within a round (the scripted 0.5 prompts)."""
    return Dataset.from_list([dict(r, pass_rate=0.5) for r in arithmetic_rows(48)])


@pytest.fixture(scope="module")
def mixed() -> Dataset:
    return Dataset.from_list(arithmetic_rows(48))  # pass rates 0, 0.5, 1 in turn


class Signed(ScriptedReward):
    """The scripted reward as -1 (fail) / +1 (pass)."""

    __name__ = "signed"

    def __call__(self, *a, **kw) -> list[float]:
        return [2.0 * r - 1.0 for r in super().__call__(*a, **kw)]


def well_formatted(completions, **kw) -> list[float]:
    """A format reward every completion earns, summed with the correctness reward by TRL (weights 1, 1)."""
    return [1.0] * len(completions)


def train(tmp_path, model_dir, ds, reward_funcs, allocator, params=None, steps=2):
    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=reward_funcs, args=grpo_config(tmp_path, max_steps=steps),
                              train_dataset=ds, allocator=allocator, allocator_params=params)
    batches = spy_batches(tr)
    tr.train()
    return tr.allocation_history, batches


def test_the_default_threshold_is_zero_and_can_be_overridden(tmp_path):
    args = grpo_config(tmp_path)
    assert REWARD_THRESHOLD == 0.0
    assert _resolve_params("sara", args, None)["reward_threshold"] == 0.0
    assert _resolve_params("sara", args, {"reward_threshold": 1.0})["reward_threshold"] == 1.0
    assert _resolve_params("sara", args, {"reward_threshold": None})["reward_threshold"] is None


@pytest.mark.parametrize("allocator", ["sara", "pilot-commit", "dapo"])
def test_signed_rewards_train_as_0_1_rewards_do(tmp_path, model_dir, alternating, allocator):
    """The measurement: the alternating reward as -1/+1 took sara from 2 effective groups a step to 0 (58 rollouts,
    29 prompts abandoned: a [+1, -1] prefix summed to 0 passes) and pilot-commit to 0 (its pilots' pass rate was
    0); dapo was unchanged. Under the default threshold (a pass is a reward > 0) each finds its 2 groups."""
    hist, batches = train(tmp_path / "signed", model_dir, alternating, [Signed()], allocator)
    for h, out in zip(hist, batches):
        assert h["effective_groups"] == h["groups"] == B, h
        assert h["abandoned"] == 0, h  # every prompt of this dataset is mixed
        assert int((out["advantages"] != 0).sum()) == h["useful_rollouts"] > 0
    binary, _ = train(tmp_path / "binary", model_dir, alternating, [ScriptedReward()], allocator)
    assert [_strip(h) for h in hist] == [_strip(h) for h in binary]  # every decision the 0/1 run's


@pytest.mark.parametrize("allocator", ["sara", "pilot-commit", "dapo"])
def test_a_summed_reward_keeps_the_groups_whose_rewards_differ(tmp_path, model_dir, mixed, allocator):
    """correct (0/1) + well_formatted (always 1) gives 1 or 2: every completion passes the default threshold, yet a
    0.5 prompt's group (1, 2, 1, 2) carries a gradient. It raised ``p_effective needs 0 <= s <= n <= k`` in sara
    (2 + 1 made 3 "passes" of 2 rollouts); now sara commits it and pilot-commit keeps its pilot."""
    hist, batches = train(tmp_path, model_dir, mixed, [ScriptedReward(), well_formatted], allocator)
    for h, out in zip(hist, batches):
        assert h["effective_groups"] == h["groups"] == B, h
        assert int((out["advantages"] != 0).sum()) == h["useful_rollouts"]
    if allocator == "pilot-commit":  # constant pilots all "pass": skipped as too easy, never kept
        assert sum(h["survived"] for h in hist) >= 2 * B and sum(h["deferred"] for h in hist) == 0


def test_pass_fail_only_refuses_signed_rewards_naming_step_row_and_function(tmp_path, model_dir, alternating):
    with pytest.raises(RewardError) as e:
        train(tmp_path, model_dir, alternating, [Signed()], "sara", {"reward_threshold": None}, steps=1)
    msg = str(e.value)
    assert msg.startswith(f"AllocatedGRPOTrainer, training step 1, train_dataset row {e.value.prompt} "
                          "(reward functions: signed: -1.0): sara: reward -1.0 of prompt"), msg
    assert "not pass/fail" in msg and "reward_threshold" in msg


def test_a_completion_no_reward_function_scores_stops_training(tmp_path, model_dir, mixed):
    """It was counted as a fail (reward 0) by the allocator. Now training stops at its round, naming the step, the
    dataset row and each function's value, before any update. Here no function scores the 0.5 prompts (whose
    completions would have made mixed groups)."""

    def correct(prompts, completions, id, pass_rate, **kw):
        return [None if p == 0.5 else float(p) for p in pass_rate]

    def fmt(prompts, completions, pass_rate, **kw):  # a penalty that never fires (0), None where correct is
        return [None if p == 0.5 else 0.0 for p in pass_rate]

    tr = AllocatedGRPOTrainer(model=model_dir, reward_funcs=[correct, fmt], train_dataset=mixed, allocator="sara",
                              args=grpo_config(tmp_path, max_steps=2))
    with pytest.raises(RewardError) as e:
        tr.train()
    row = e.value.prompt
    assert mixed[row]["pass_rate"] == 0.5 and tr.state.global_step == 0
    msg = str(e.value)
    assert msg.startswith(f"AllocatedGRPOTrainer, training step 1, train_dataset row {row} (reward functions: "
                          "correct: nan, fmt: nan) (NaN: every reward function returned None"), msg
    assert f"sara: reward nan of prompt {row}" in msg and "not a finite number" in msg
