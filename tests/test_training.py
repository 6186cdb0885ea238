"""The training loop on the tiny policy: it learns-ready, resumes exactly, refuses bad input."""

import inspect
import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from rlvr_core.checkpoint import read_state
from rlvr_core.config import TrainConfig
from rlvr_core.data.arithmetic import make_arithmetic
from rlvr_core.errors import ConfigError
from rlvr_core.models.warmstart import warm_start
from rlvr_core.rollout_log import read_log
from rlvr_core.training import check_and_train

TIMING = ("generate_s", "verify_s", "allocate_s", "update_s", "step_s", "eval_s")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    ds = make_arithmetic(400, 60, seed=0)
    warm_start(ds["train"], steps=40, seed=0, out_dir=root / "policy", log_every=20)
    return root, ds


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in recs]


def _cfg(**kw):
    base = dict(allocator="sara", steps=4, batch_size=8, eval_every=2, eval_size=20, eval_samples=8,
                checkpoint_every=2, seed=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("allocator", ["sara", "vigor"])
def test_resume_matches_an_uninterrupted_run(setup, tmp_path, allocator):
    root, ds = setup
    full = check_and_train(_cfg(allocator=allocator), policy_dir=root / "policy", train_rows=ds["train"],
                           test_rows=ds["test"], run_dir=tmp_path / "full")
    # stop after step 2 (a checkpoint), then start again with the full step count
    check_and_train(_cfg(allocator=allocator, steps=2), policy_dir=root / "policy", train_rows=ds["train"],
                    test_rows=ds["test"], run_dir=tmp_path / "split")
    assert sorted(read_log(tmp_path / "split" / "rollouts.parquet")["step"].unique()) == [1, 2]
    # a run killed after writing rows of steps its newest checkpoint (step 2) does not hold: the rows of
    # steps 3 and 4 of the full run stand in for them; the resumed run must drop and regenerate them
    shutil.copy(tmp_path / "full" / "rollouts.parquet", tmp_path / "split" / "rollouts.parquet")
    resumed = check_and_train(_cfg(allocator=allocator), policy_dir=root / "policy", train_rows=ds["train"],
                              test_rows=ds["test"], run_dir=tmp_path / "split")
    assert resumed.resumed_from == 2
    assert _strip(resumed.metrics) == _strip(full.metrics)
    lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3, 4]  # nothing missing or duplicated
    log_full = read_log(tmp_path / "full" / "rollouts.parquet")
    log_split = read_log(tmp_path / "split" / "rollouts.parquet")
    pd.testing.assert_frame_equal(log_split, log_full)  # the same rows, once each
    assert not log_split.duplicated(["step", "prompt_id"]).any()
    per_step = log_split.groupby("step")["rollouts"].sum()
    assert per_step.to_dict() == {r["step"]: r["rollouts"] for r in resumed.metrics[1:]}
    a = read_state(tmp_path / "full" / "checkpoints" / "step_000004")
    b = read_state(tmp_path / "split" / "checkpoints" / "step_000004")
    for k, v in a["trainer"]["model"].items():
        assert torch.equal(v, b["trainer"]["model"][k]), k


def test_step_metrics_account_rollouts_and_tokens(setup, tmp_path):
    root, ds = setup
    res = check_and_train(_cfg(allocator="grpo", steps=2, checkpoint_every=1, keep_last=1), policy_dir=root / "policy",
                          train_rows=ds["train"], test_rows=ds["test"], run_dir=tmp_path / "r")
    s1 = res.metrics[1]
    assert s1["rollouts"] == 8 * 8
    assert s1["tokens"] >= s1["rollouts"]
    assert s1["cum_rollouts"] == s1["rollouts"]
    assert res.metrics[2]["cum_rollouts"] == 2 * 64
    for key in ("effective_groups", "committed", "abandoned", "rounds", "reward_mean", "loss", "kl", "grad_norm",
                "generate_s", "verify_s", "update_s"):
        assert key in s1
    assert "eval/greedy_acc" in res.metrics[0] and "eval/pass_at_8" in res.metrics[-1]
    assert len(list((tmp_path / "r" / "checkpoints").glob("step_*"))) == 1  # keep_last


def test_ar3po_reuse_is_counted_apart_and_its_buffer_survives_resume(setup, tmp_path):
    """A pool of 8 prompts recurs every step, so AR3PO's buffer of correct completions fills and is reused. The
    record counts reused completions apart: rollouts (and cum_rollouts) new ones only, tokens both; the buffer is
    in the checkpoint, and a run resumed from step 2 makes the uninterrupted run's steps 3 and 4."""
    root, ds = setup
    rows = ds["train"].select(range(8))
    cfg = dict(allocator="ar3po", steps=4, eval_every=2, checkpoint_every=2)
    full = check_and_train(_cfg(**cfg), policy_dir=root / "policy", train_rows=rows, test_rows=ds["test"],
                           run_dir=tmp_path / "full")
    steps = full.metrics[1:]
    assert sum(r["reused_rollouts"] for r in steps) > 0
    log = read_log(tmp_path / "full" / "rollouts.parquet")
    assert log["rollouts"].sum() == steps[-1]["cum_rollouts"] == sum(r["rollouts"] for r in steps)
    assert 0 < log["reused_rows"].sum() <= sum(r["reused_rollouts"] for r in steps)  # the decision log sees reuse
    assert (log["reused_rows"] <= log["trained_rows"]).all()
    assert log["tokens"].sum() + sum(r["reused_tokens"] for r in steps) == steps[-1]["cum_tokens"]
    for r in steps:
        assert r["trained_sequences"] <= r["rollouts"] + r["reused_rollouts"]
    buffer = read_state(tmp_path / "full" / "checkpoints" / "step_000002")["allocator"]["extra"]["buffer"]
    assert buffer and all(row.reward[0] > 0.5 for _, row in buffer)
    check_and_train(_cfg(**{**cfg, "steps": 2}), policy_dir=root / "policy", train_rows=rows, test_rows=ds["test"],
                    run_dir=tmp_path / "split")
    resumed = check_and_train(_cfg(**cfg), policy_dir=root / "policy", train_rows=rows, test_rows=ds["test"],
                              run_dir=tmp_path / "split")
    assert resumed.resumed_from == 2
    assert _strip(resumed.metrics) == _strip(full.metrics)


@pytest.mark.parametrize("allocator", ["pilot-commit", "reinforce-ada"])
def test_published_baselines_train_on_the_tiny_policy(setup, tmp_path, allocator):
    root, ds = setup
    res = check_and_train(_cfg(allocator=allocator, steps=2, eval_every=0, checkpoint_every=2),
                          policy_dir=root / "policy",
                train_rows=ds["train"], test_rows=ds["test"], run_dir=tmp_path / "r")
    steps = res.metrics[1:]
    assert [r["step"] for r in steps] == [1, 2]
    log = read_log(tmp_path / "r" / "rollouts.parquet")
    assert log["rollouts"].sum() == steps[-1]["cum_rollouts"] and log["tokens"].sum() == steps[-1]["cum_tokens"]
    for r in steps:
        assert 0 < r["rollouts"] and r["groups"] <= 8 and r["reused_rollouts"] == 0
        assert r["trained_sequences"] <= r["rollouts"]
    if allocator == "pilot-commit":  # every group of the batch is a committed prompt's
        assert all(r["committed"] == r["groups"] for r in steps)
    state = read_state(tmp_path / "r" / "checkpoints" / "step_000002")["allocator"]
    assert state["name"] == allocator


def test_rollout_log_holds_every_rollout_per_step_and_prompt(setup, tmp_path):
    root, ds = setup
    res = check_and_train(_cfg(allocator="sara", steps=3, checkpoint_every=2), policy_dir=root / "policy",
                          train_rows=ds["train"], test_rows=ds["test"], run_dir=tmp_path / "r")
    log = read_log(tmp_path / "r" / "rollouts.parquet")
    assert list(log.columns) == ["step", "prompt_id", "rollouts", "passes", "reward_sum", "tokens", "first_round",
                                 "last_round", "trained_rows", "reused_rows", "status", "prior", "p_eff",
                                 "difficulty", "op"]
    last = res.metrics[-1]
    assert log["rollouts"].sum() == last["cum_rollouts"]
    assert log["tokens"].sum() == last["cum_tokens"]
    for rec in res.metrics[1:]:
        sub = log[log.step == rec["step"]]
        assert sub["rollouts"].sum() == rec["rollouts"] and sub["tokens"].sum() == rec["tokens"]
    assert not log.duplicated(["step", "prompt_id"]).any()
    assert ((log.passes >= 0) & (log.passes <= log.rollouts)).all()
    assert np.allclose(log.passes, log.reward_sum)  # the arithmetic verifier's rewards are 0 or 1
    rows = ds["train"]
    assert log["difficulty"].tolist() == [rows[i]["difficulty"] for i in log.prompt_id]
    assert log["op"].tolist() == [rows[i]["op"] for i in log.prompt_id]
    # the warm-started policy passes some rollouts and fails others
    assert 0 < log["passes"].sum() < log["rollouts"].sum()
    # a fresh run in the same folder does not keep the earlier run's rows
    check_and_train(_cfg(allocator="grpo", steps=1), policy_dir=root / "policy", train_rows=ds["train"],
                    test_rows=ds["test"], run_dir=tmp_path / "r", resume=False)
    again = read_log(tmp_path / "r" / "rollouts.parquet")
    assert again["step"].unique().tolist() == [1] and again["rollouts"].sum() == 8 * 8


@pytest.mark.parametrize("allocator", ["sara", "dapo", "grpo"])
def test_the_rollout_log_is_the_runs_decision_log(setup, tmp_path, allocator):
    """Each (step, prompt) row says what the allocator decided (rlvr_core.rollout_log): its rounds, its rows in
    the training batch and its status; they agree with the step's metrics."""
    root, ds = setup
    res = check_and_train(_cfg(allocator=allocator, steps=3, eval_every=0, checkpoint_every=3),
                          policy_dir=root / "policy", train_rows=ds["train"], test_rows=ds["test"],
                          run_dir=tmp_path / "r")
    log = read_log(tmp_path / "r" / "rollouts.parquet")
    assert set(log["status"]) <= {"committed", "dropped", "abandoned"}
    for rec in res.metrics[1:]:
        sub = log[log.step == rec["step"]]
        trained = sub[sub.status == "committed"]
        assert len(trained) == rec["groups"]
        assert trained["trained_rows"].sum() == rec["trained_sequences"]  # rows of mixed groups, the update's
        assert (trained["trained_rows"] > 0).sum() == rec["effective_groups"]
        assert (sub[sub.status != "committed"]["trained_rows"] == 0).all()
        mixed = (sub.passes > 0) & (sub.passes < sub.rollouts)
        assert (sub[sub.status == "dropped"].index.isin(sub[mixed].index)).all()
        assert (sub[sub.status == "abandoned"].index.isin(sub[~mixed].index)).all()
        assert ((0 <= sub.first_round) & (sub.first_round <= sub.last_round) & (sub.last_round < rec["rounds"])).all()
        assert rec["adv_abs_mean"] > 0 if rec["effective_groups"] else rec["adv_abs_mean"] == 0
    if allocator == "grpo":  # one round, every drawn prompt trained
        assert (log.status == "committed").all() and (log.last_round == 0).all()
    if allocator == "dapo":  # groups that are not mixed are sampled, then left out
        assert (log.status == "abandoned").any()
    if allocator == "sara":  # its uniform prior, and p_eff as each decision read it
        assert (log.prior == 0.5).all()
        mixed = (log.passes > 0) & (log.passes < log.rollouts)
        assert (log[mixed].p_eff == 1.0).all()  # a mixed prefix ends mixed
        # below tau_low (0.5) before the full group: exactly the prompts it abandoned
        k, tau_low = _cfg().k, 0.5
        assert sum(r["abandoned"] for r in res.metrics[1:]) > 0
        for rec in res.metrics[1:]:
            sub = log[log.step == rec["step"]]
            assert ((sub.p_eff < tau_low) & (sub.rollouts < k)).sum() == rec["abandoned"]
    else:  # they hold no prior and compute no p_eff
        assert log.prior.isna().all() and log.p_eff.isna().all()


def test_bad_train_config_is_refused_before_any_rollout():
    with pytest.raises(ConfigError, match="allocator"):
        TrainConfig(allocator="nope")
    with pytest.raises(ConfigError, match="steps"):
        TrainConfig(steps=-1)
    with pytest.raises(ConfigError, match="eval_samples"):
        TrainConfig(k=8, eval_samples=4)


def test_engine_choice_is_validated():
    with pytest.raises(ConfigError, match="engine"):
        TrainConfig(engine="simulated")  # allocation-benchmark engine, not a policy
    with pytest.raises(ConfigError, match="engine"):
        TrainConfig(engine="tgi")
    with pytest.raises(ConfigError, match="lr"):
        TrainConfig(lr="fast")
    assert TrainConfig(engine="vllm", engine_options={"dtype": "float32"}).engine_options == {"dtype": "float32"}


def test_contextual_prior_learns_the_rows_feature_cells(setup, tmp_path):
    root, ds = setup
    cfg = _cfg(steps=2, eval_every=0, checkpoint_every=2, allocator_params={"sara": {"prior": "context"}})
    check_and_train(cfg, policy_dir=root / "policy", train_rows=ds["train"], test_rows=ds["test"],
                    run_dir=tmp_path / "ctx")
    post = read_state(tmp_path / "ctx" / "checkpoints" / "step_000002")["allocator"]["extra"]["posterior"]
    cells = {f"difficulty={r['difficulty']}|op={r['op']}" for r in ds["train"]}
    # the training loop gave the allocator each prompt's arithmetic cell as its context key
    assert len(post["keys"]) > 1 and set(post["keys"]) <= cells, (sorted(post["keys"]), sorted(cells))
    assert set(post["key_prior"]) == set(post["keys"])


def test_inputs_are_checked_once_on_the_flow_path(setup, tmp_path, monkeypatch):
    """preflight checks the splits, the prompts' fit, the device and the allocator parameters once and returns
    them; train(checked) checks none of them again and builds the allocator from the checked parameters,
    while check_and_train (the library entry point) runs preflight itself, once."""
    import rlvr_core.allocation.base as B
    import rlvr_core.models.policy as M
    import rlvr_core.preflight as P
    import rlvr_core.training as T

    root, ds = setup
    calls = {"splits": 0, "fit": 0, "device": 0, "params": 0, "digest": 0}

    def count(key, fn):
        def wrapped(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return wrapped

    # the configs are built first: a TrainConfig checks its allocators' parameters when it is made (at load)
    cfg = _cfg(allocator="sara", steps=1, eval_every=0, allocator_params={"sara": {"tau_low": 0.4}})
    for module, name, key in ((P, "validate_splits", "splits"), (P, "check_prompts_fit", "fit"),
                              (P, "resolve_device", "device"), (M, "resolve_device", "device"),
                              (P, "build_params", "params"), (B, "build_params", "params"),
                              (P, "data_digest", "digest")):
        monkeypatch.setattr(module, name, count(key, getattr(module, name)))
    checked = T.preflight(cfg, "arithmetic", ds["train"], ds["test"], root / "policy", tmp_path / "a")
    once = {"splits": 1, "fit": 2, "device": 1, "params": 1, "digest": 1}
    assert calls == once
    assert (checked.device, type(checked.allocator_params).__name__, checked.allocator_params.tau_low) == \
        ("cpu", "SARAParams", 0.4)
    T.train(checked)
    assert calls == once
    T.check_and_train(cfg, policy_dir=root / "policy", train_rows=ds["train"], test_rows=ds["test"],
                      run_dir=tmp_path / "b")
    assert calls == {k: 2 * v for k, v in once.items()}
    # train takes the checked inputs and nothing else: there is no second copy of them to disagree with
    assert list(inspect.signature(T.train).parameters) == ["checked", "on_step", "resume"]
    assert [p.kind for p in inspect.signature(T.train).parameters.values()][1:] == [inspect.Parameter.KEYWORD_ONLY] * 2


def test_eval_every_rollouts_evaluates_on_one_rollout_grid(setup, tmp_path):
    """Evaluations follow cumulative rollouts, not steps: one after each step that crosses a multiple of
    eval_every_rollouts (and the last), whatever the allocator spends per step."""
    root, ds = setup
    cfg = _cfg(allocator="grpo", steps=5, batch_size=4, k=4, eval_every=0, eval_every_rollouts=40,
               checkpoint_every=100, eval_samples=0)
    res = check_and_train(cfg, policy_dir=root / "policy", train_rows=ds["train"], test_rows=ds["test"],
                          run_dir=tmp_path)
    evals = [(r["step"], r["cum_rollouts"]) for r in res.metrics if "eval/greedy_acc" in r]
    # grpo spends 16 rollouts a step: 16, 32, 48 (crosses 40), 64, 80 (crosses 80, and the last step)
    assert evals == [(0, 0), (3, 48), (5, 80)]
