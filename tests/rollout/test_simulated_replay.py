"""The simulated engine's replay scenario follows the pass rates of a rollout log."""

import numpy as np
import pandas as pd
import pytest

from rlvr_core.errors import ConfigError
from rlvr_core.rollout.simulated import REPLAY_FILE, Scenario, SimulatedEngine
from rlvr_core.rollout_log import read_log


def _rising_log(path, steps=100, prompts=200, k=8, lo=0.1, hi=0.9, seed=0):
    """A log whose prompts' pass rates rise from ``lo`` to ``hi`` in mean over the steps (Beta spread)."""
    rng = np.random.default_rng(seed)
    rows = []
    for st in range(1, steps + 1):
        mean = lo + (hi - lo) * (st - 1) / (steps - 1)
        p = rng.beta(6 * mean, 6 * (1 - mean), prompts)
        for q, s in enumerate(rng.binomial(k, p)):
            rows.append({"step": st, "prompt_id": st * prompts + q, "rollouts": k, "passes": int(s), "tokens": 50})
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def test_replayed_pass_rates_rise_with_the_logged_ones(tmp_path):
    log = _rising_log(tmp_path / "rollouts.parquet")
    share = read_log(log).groupby("step").apply(lambda g: g.passes.sum() / g.rollouts.sum())
    eng = SimulatedEngine("replay", seed=3, replay_path=log, horizon=60)
    means, observed, logged = [], [], []
    for _ in range(61):
        means.append(float(eng.pass_rate().mean()))
        ro = eng.generate({int(q): 8 for q in range(0, eng.pool_size, 4)})
        observed.append(float(ro.reward.mean()))
        logged.append(share[eng.logged_step()])
        eng.update_weights()
    assert means[0] == pytest.approx(0.1, abs=0.04) and means[-1] == pytest.approx(0.9, abs=0.04)
    assert means[30] == pytest.approx(0.5, abs=0.05)  # update 30 of 60 replays the middle logged step
    assert np.max(np.abs(np.asarray(means) - logged)) < 0.04  # the pool has the replayed step's pass rates
    assert np.max(np.abs(np.asarray(observed) - logged)) < 0.06  # and the rollouts' rewards follow them
    assert np.max(np.abs(np.asarray(means) - (0.1 + 0.8 * np.arange(61) / 60))) < 0.08
    assert np.corrcoef(np.arange(61), observed)[0, 1] > 0.98


def test_logged_steps_are_mapped_onto_the_horizon(tmp_path):
    log = _rising_log(tmp_path / "rollouts.parquet", steps=100, prompts=10)
    eng = SimulatedEngine("replay", replay_path=log, horizon=60)
    seen = []
    for _ in range(70):
        seen.append(eng.logged_step())
        eng.update_weights()
    assert seen[0] == 1 and seen[60] == 100 and seen[69] == 100  # past the horizon the last step stays
    assert seen[30] == 51  # round(30 / 60 * 99) = 50th position, step 51
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert SimulatedEngine("drift").logged_step() is None


def test_the_step_population_is_kept_not_flattened(tmp_path):
    # every step: half the prompts fail all 8 rollouts, half pass all 8
    rows = [{"step": st, "prompt_id": q, "rollouts": 8, "passes": 8 * (q % 2)} for st in (1, 2) for q in range(100)]
    pd.DataFrame(rows).to_parquet(tmp_path / "u.parquet")
    p = SimulatedEngine("replay", seed=0, replay_path=tmp_path / "u.parquet").pass_rate()
    assert np.mean(p < 0.1) == pytest.approx(0.5, abs=0.05)
    assert np.mean(p > 0.9) == pytest.approx(0.5, abs=0.05)
    # a flat Jeffreys prior pulls the 0/8 prompts' draws up, away from 0
    jeff = SimulatedEngine(Scenario("r", 4096, replay=str(tmp_path / "u.parquet"), replay_prior="jeffreys"),
                           seed=0).pass_rate()
    assert np.mean(jeff < 0.01) < np.mean(p < 0.01)


def test_a_prompt_keeps_its_rank_and_a_seed_its_pool(tmp_path):
    log = _rising_log(tmp_path / "rollouts.parquet", steps=20, prompts=50)
    a = SimulatedEngine("replay", seed=5, replay_path=log)
    early = a.pass_rate()
    a.updates = 40
    late = a.pass_rate()
    order = np.argsort(early, kind="stable")
    assert np.all(np.diff(late[order]) >= 0)  # harder than another early, no easier later
    assert late.mean() > early.mean() + 0.3
    b = SimulatedEngine("replay", seed=5, replay_path=log)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(b.pass_rate(), late)
    req = {1: 8, 17: 8, 300: 4}
    assert np.array_equal(a.generate(req).reward, b.generate(req).reward)
    assert not np.array_equal(SimulatedEngine("replay", seed=6, replay_path=log).pass_rate(), early)


@pytest.mark.parametrize("frame, match", [
    (None, "no such file"),
    ("not parquet", "not a readable parquet"),
    (pd.DataFrame({"step": [1], "prompt_id": [0], "rollouts": [8]}), r"missing column\(s\) \['passes'\]"),
    (pd.DataFrame({"step": [1], "prompt_id": [0], "rollouts": [8], "passes": [9]}), r"passes outside \[0, rollouts\]"),
    (pd.DataFrame({"step": [1], "prompt_id": [0], "rollouts": [0], "passes": [0]}), "rollouts < 1"),
    (pd.DataFrame({"step": [1.0, float("nan")], "prompt_id": [0, 1], "rollouts": [8, 8], "passes": [1, 2]}),
     "not finite numbers"),
    (pd.DataFrame({"step": pd.Series([], dtype="int64"), "prompt_id": pd.Series([], dtype="int64"),
                   "rollouts": pd.Series([], dtype="int64"), "passes": pd.Series([], dtype="int64")}), "no rows"),
])
def test_a_bad_log_is_refused_with_its_name(tmp_path, frame, match):
    path = tmp_path / "log.parquet"
    if isinstance(frame, str):
        path.write_text(frame)
    elif frame is not None:
        frame.to_parquet(path, index=False)
    with pytest.raises(ConfigError, match=match) as e:
        SimulatedEngine("replay", replay_path=path)
    assert str(path) in str(e.value)


def test_only_a_replay_scenario_takes_a_log(tmp_path):
    with pytest.raises(ConfigError, match="replay_path"):
        SimulatedEngine("drift", replay_path=_rising_log(tmp_path / "r.parquet", steps=2, prompts=2))


def test_the_default_replay_is_the_committed_hard_run():
    log = read_log(REPLAY_FILE)
    eng = SimulatedEngine("replay", seed=0)
    assert eng.pool_size == 20000 and len(eng.replay) == log["step"].nunique()
    assert log.prompt_id.max() < eng.pool_size and not log.duplicated("prompt_id").any()  # no prompt recurred
    start = eng.pass_rate().mean()
    eng.updates = eng.horizon
    end = eng.pass_rate().mean()
    # the replayed pool has the logged run's pass rates at its first and last step (smoothed)
    for rate, step in ((start, log.step.min()), (end, log.step.max())):
        sub = log[log.step == step]
        assert rate == pytest.approx(sub.passes.sum() / sub.rollouts.sum(), abs=0.1)
