"""What AR3PO and valor[reuse] train, read off decision logs (issue 55, item 1): the measures of one log, the
pairing of seeds within warm starts, and the refusal to read a cell whose logs are incomplete."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import ar3po_anatomy as A
from benchmarks.study.store import RunStore


def _log(path: Path, rows: list[tuple[int, int, int, int, int, int]]) -> None:
    pd.DataFrame(rows, columns=list(A.COLUMNS)).assign(tokens=10).to_parquet(path)


def test_the_measures_of_one_log(tmp_path: Path) -> None:
    p = tmp_path / "s0.rollouts.parquet"
    # (step, prompt, rollouts, passes, trained rows, reused rows): step 1 trains a group of 2 and a group of 9
    # (8 all-fail rollouts and one reused completion) and skips an all-pass prompt; step 2 trains prompt 1 again
    # with 4 rows; step 3 trains nothing
    _log(p, [(1, 1, 2, 1, 2, 0), (1, 2, 8, 0, 9, 1), (1, 3, 4, 4, 0, 0),
             (2, 1, 4, 2, 4, 0), (3, 4, 8, 0, 0, 0)])
    m = A.log_measures(p)
    assert m["updates"] == 2 and m["rollouts_per_update"] == 26 / 2 and m["rows_per_update"] == 15 / 2
    assert m["reused_per_update"] == 0.5 and m["groups_per_update"] == 1.5 and m["rows_per_group"] == 5
    assert (m["size_<= 2"], m["size_3-4"], m["size_5-8"], m["size_> 8"]) == pytest.approx((1 / 3, 1 / 3, 0, 1 / 3))
    assert m["distinct_prompts"] == 2 and m["trained_before"] == pytest.approx(1 / 3)
    assert m["pass_rate"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    assert m["untrained_rollout_share"] == pytest.approx(12 / 26)
    _log(p, [(1, 1, 8, 8, 0, 0)])
    with pytest.raises(ValueError, match="trained no row"):
        A.log_measures(p)


def _cell(store: RunStore, regime: str, protocol: str, label: str, seeds, rows_of, *, log: bool = True) -> None:
    for s in seeds:
        path = store.run_file(regime, protocol, label, s)
        path.parent.mkdir(parents=True, exist_ok=True)
        run = {"regime": regime, "protocol": protocol, "variant": label, "seed": s, "split": "test",
               "curve": [{"step": 0, "cum_rollouts": 0, "greedy_acc": 0.3}], "ledger": {"rollouts": 100},
               "grid": None, "allocator_params": {}}
        if log:
            _log(path.with_suffix(".rollouts.parquet"), rows_of(s))
            run["decision_log"] = {"file": path.with_suffix(".rollouts.parquet").name, "sha256": "-"}
        path.write_text(json.dumps(run))


def _warm_start(store: RunStore, regime: str) -> None:
    store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5})
    store.freeze(store.preregistration_path(regime), {"conditioning": {"conditioned": True}})


def test_the_difference_pairs_seeds_within_warm_starts_and_skips_incomplete_logs(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    small = lambda s: [(1, 1, 2, 1, 2, 0), (2, 2, 2, 1, 2, 0), (3, 3, 2, 1, 2, 0)]  # noqa: E731
    full = lambda s: [(1, 1, 8, 4, 8, 0), (1, 2, 8, 0, 9, 1)]  # noqa: E731
    for regime in ("pool-ws2", "pool-ws3"):
        _warm_start(store, regime)
        _cell(store, regime, "equal-rollouts", "ar3po", range(3), small)
        _cell(store, regime, "equal-rollouts", "valor[reuse]", range(3), full, log=regime == "pool-ws2")
    res = A.measure(RunStore(tmp_path))
    assert res["warm_starts"] == ["pool-ws2"] and res["pairs"] == 3  # pool-ws3's valor[reuse] has no logs
    d = res["difference"]["updates"]
    assert d["mean"] == 3 - 1 and d["lo"] == d["hi"] == 2  # no spread within the warm start
    assert res["sides"]["ar3po"]["rows_per_group"] == 2 and res["sides"]["valor[reuse]"]["reused_per_update"] == 1
    md = A.markdown(res)
    assert "| updates in the budget | 3 | 1 | 2 [2, 2] |" in md
    A.write(res, tmp_path)
    assert (tmp_path / "ar3po_anatomy" / "ar3po_anatomy.png").exists()


def test_without_a_pair_it_says_so(tmp_path: Path) -> None:
    res = A.measure(RunStore(tmp_path))
    assert res["pairs"] == 0 and "No warm start of `pool`" in A.markdown(res)
