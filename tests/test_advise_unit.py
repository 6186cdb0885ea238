"""The advisor's comparable unit (docs/advisor.md, "The unit"): rollouts per trained row, at most k rows of a group
counted, so that a small group (AR3PO stops at its first pass) is not a cheaper one and a group grown past k
(VIGOR) is not more than one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlvr_core.advise import advise
from rlvr_core.advise.model import SimRun, trained_rows
from rlvr_core.types import Rollouts, TrainBatch


def test_trained_rows_count_effective_groups_at_most_k_rows_each_and_reused_rows_apart():
    # groups: 0 has 2 mixed rows, 1 has 12 mixed rows (grown past k = 8), 2 has 8 all-fail rows
    gid = np.array([0] * 2 + [1] * 12 + [2] * 8)
    reward = np.array([1.0, 0.0] + [1.0, 0.0] * 6 + [0.0] * 8)
    n = len(gid)
    batch = TrainBatch(Rollouts(gid.copy(), reward, np.ones(n, np.int64)), gid, np.array([True, True, False]))
    assert trained_rows(batch, 8) == 2 + 8
    run = SimRun("x", 0, rollouts=40.0, tokens=0.0, effective_groups=2.0, steps=1, trained_rows=10.0)
    assert run.rollouts_per_effective_group == 20.0 and run.rollouts_per_trained_row == 4.0
    assert SimRun("x", 0, 40.0, 0.0, 0.0, 1).rollouts_per_trained_row == float("inf")


def uniform_fresh_log(path, steps: int = 30, prompts: int = 32, n: int = 8, seed: int = 0):
    """Pass rates ~ Beta(1, 1), every prompt logged at one step only."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        s = rng.binomial(n, rng.beta(1.0, 1.0, prompts))
        rows += [{"step": t, "prompt_id": t * prompts + j, "rollouts": n, "passes": int(s[j])} for j in range(prompts)]
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def test_ar3po_is_not_ranked_below_the_screening_floor_on_a_fresh_stream_for_its_small_groups(tmp_path):
    """AR3PO's groups stop at the first pass (about 3 rows of k = 8): per effective group it costs less than k, below
    the screening floor and below the oracle. Per trained row it is above the floor, as every allocator that draws
    at most k rollouts per fresh prompt must be, and its proxy saving against uniform GRPO is not above zero."""
    adv = advise(uniform_fresh_log(tmp_path / "log.parquet"), k=8, batch=32, seeds=2, steps=20,
                 allocators=["grpo", "ar3po", "sara"])
    assert adv.replay == "fresh"
    by = {a.name: a for a in adv.allocators}
    ar3po, floor = by["ar3po"], adv.floor_ratio_to_k
    assert ar3po.rollouts_per_effective_group[0] / adv.k < min(floor, 1.0)  # the old unit flattered it
    assert ar3po.rollouts_per_trained_row[0] >= floor
    for a in adv.allocators:  # every allocator here decides from a prompt's own rewards on fresh prompts
        assert a.rollouts_per_trained_row[0] >= 0.95 * floor, a.name
    assert ar3po.saving_vs_grpo[0] <= 0.0
    for a in adv.allocators:  # k rows a group: rollouts per trained row is rollouts per effective group / k
        if a.name != "ar3po":
            assert a.rollouts_per_trained_row[0] * adv.k == pytest.approx(a.rollouts_per_effective_group[0])
