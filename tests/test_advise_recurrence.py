"""The advisor honours the log's recurrence (rlvr_core.advise.recurrence, docs/advisor.md "Recurrence"): a log whose
prompts never recur is replayed over fresh prompts, so no allocator is credited for prompt history it would never
have had; ``--pool N`` forces a recurring pool."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from rlvr_core.advise import advise
from rlvr_core.advise.recurrence import FreshSource, measure
from rlvr_core.advise.report import main
from rlvr_core.rollout.simulated import SimulatedEngine

HISTORY = ["grpo", "greso", "sara+dps"]


def fresh_log(path, steps: int = 40, prompts: int = 32, n: int = 8, seed: int = 0):
    """A per-(step, prompt) log of ``steps`` x ``prompts`` x ``n`` rollouts, each prompt logged at one step only."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        p = rng.beta(0.4, 1.5, prompts)
        s = rng.binomial(n, p)
        rows += [{"step": t, "prompt_id": t * prompts + j, "rollouts": n, "passes": int(s[j])} for j in range(prompts)]
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def record_draws(monkeypatch) -> dict:
    """Every replay engine's prompts with rollouts, by policy update: {engine: {prompt: {updates}}}."""
    seen: dict = defaultdict(lambda: defaultdict(set))
    generate = SimulatedEngine.generate

    def spy(self, requests):
        for q, c in requests.items():
            if c > 0:
                seen[self][int(q)].add(self.updates)
        return generate(self, requests)

    monkeypatch.setattr(SimulatedEngine, "generate", spy)
    return seen


def test_a_log_whose_prompts_never_recur_is_replayed_without_a_prompt_in_two_steps(tmp_path, monkeypatch):
    seen = record_draws(monkeypatch)
    adv = advise(fresh_log(tmp_path / "log.parquet"), k=8, batch=32, seeds=2, steps=60, allocators=HISTORY)
    assert len(seen) == 2 * len(HISTORY)  # one engine per allocator and seed (kept alive as keys)
    for draws in seen.values():
        assert len(draws) >= 60 * 32 > 1280  # more prompts than the log has, none of them in two steps
        assert max(len(u) for u in draws.values()) == 1
    r = adv.recurrence
    assert (r.prompts, r.recurring, r.share, r.mean_gap) == (1280, 0, 0.0, None)
    assert adv.replay == "fresh" and adv.pool is None
    for a in adv.allocators:
        assert a.replayed_recurring_prompts == 0 and a.replayed_prompts >= 60 * 32


def test_history_based_allocators_gain_nothing_from_history_on_fresh_prompts(tmp_path):
    """greso and sara+dps save over uniform GRPO only when prompts recur: on a fresh stream their saving is no
    more than noise around 0, and below what the same log gives them when a small pool makes prompts recur."""
    log = fresh_log(tmp_path / "log.parquet")
    fresh = {a.name: a for a in advise(log, seeds=3, steps=60, allocators=HISTORY).allocators}
    pooled = {a.name: a for a in advise(log, seeds=3, steps=60, pool=256, allocators=HISTORY).allocators}
    for name in ("greso", "sara+dps"):
        assert fresh[name].saving_vs_grpo[1] <= 0.0  # the interval reaches 0 or below: no credit
        assert pooled[name].replayed_recurring_prompts > 0
        assert fresh[name].saving_vs_grpo[0] < pooled[name].saving_vs_grpo[0]


def test_recurrence_counts_prompts_in_several_steps_and_their_mean_gap():
    df = pd.DataFrame({"step": [1, 3, 7, 2, 3, 5], "prompt_id": [0, 0, 0, 1, 1, 2],
                       "rollouts": 4, "passes": 1})
    r = measure(df)
    assert (r.prompts, r.recurring) == (3, 2)
    assert r.share == pytest.approx(2 / 3)
    assert r.mean_gap == pytest.approx((2 + 4 + 1) / 3)


def test_a_log_whose_prompts_recur_keeps_the_recurring_pool(tmp_path):
    rows = [{"step": t, "prompt_id": j, "rollouts": 4, "passes": (t + j) % 5} for t in range(6) for j in range(8)]
    pd.DataFrame(rows).to_parquet(tmp_path / "log.parquet", index=False)
    adv = advise(tmp_path / "log.parquet", k=4, batch=8, seeds=2, steps=6, allocators=["grpo"])
    assert adv.replay == "pool" and adv.pool == 8
    assert (adv.recurrence.recurring, adv.recurrence.mean_gap) == (8, 1.0)


def test_the_report_states_the_recurrence_and_pool_forces_a_recurring_replay(tmp_path, capsys):
    log = fresh_log(tmp_path / "log.parquet", steps=10, prompts=16, n=4)
    args = [str(log), "--k", "4", "--batch", "8", "--seeds", "2", "--steps", "10"]
    assert main(args + ["--out", str(tmp_path / "fresh")]) == 0
    out = capsys.readouterr().out
    assert "Recurrence: 0 of 160 distinct prompts (0.0%) were logged at more than one step." in out
    assert "a stream of fresh prompts" in out and "0.0 of them in more than one step" in out
    js = json.loads((tmp_path / "fresh" / "advice.json").read_text())
    assert js["recurrence"] == {"prompts": 160, "recurring": 0, "share": 0.0, "mean_gap": None}
    assert js["replay"] == "fresh" and js["pool"] is None
    assert main(args + ["--pool", "16", "--out", str(tmp_path / "pool")]) == 0
    assert "recurring pool of 16 prompts, forced by --pool" in capsys.readouterr().out
    js = json.loads((tmp_path / "pool" / "advice.json").read_text())
    assert js["replay"] == "pool" and js["pool"] == 16
    assert max(a["replayed_recurring_prompts"] for a in js["allocators"]) > 0


def test_a_fresh_source_never_repeats_and_gives_back_first():
    src = FreshSource(seed=3)
    a = src.take(5)
    src.give_back(a[3:])
    b = src.take(4)
    assert a.tolist() == [0, 1, 2, 3, 4] and b.tolist() == [3, 4, 5, 6] and src.drawn == 7
