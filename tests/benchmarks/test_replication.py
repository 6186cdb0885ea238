"""The confirmatory replication (issue 54, item 6): its declaration is checked before anything runs, warm starts are
admitted in the declared order by the conditioning of their reference runs alone, they stay out of the
exploratory families, and each claim is read against the tuned uniform GRPO with the declared decision."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks import replication as reading
from benchmarks.study import replication as R
from benchmarks.study import tuning
from benchmarks.study.plan import HYPOTHESES_FILE, TUNED
from benchmarks.study.store import RunStore

DECLARED = json.loads(HYPOTHESES_FILE.read_text())


def _write(tmp_path: Path, d: dict) -> Path:
    p = tmp_path / "hypotheses.json"
    p.write_text(json.dumps(d))
    return p


def _changed(tmp_path: Path, edit) -> Path:
    d = copy.deepcopy(DECLARED)
    edit(d)
    return _write(tmp_path, d)


def test_the_committed_declaration_loads_with_the_four_claims_the_issue_names() -> None:
    h = R.load()
    assert [(c.regime, c.ours) for c in h.claims] == [("pool", "ar3po"), ("pool", "valor[reuse]"), ("pool", "valor"),
                                                      ("hard", "ar3po")]
    assert h.seeds == tuple(range(10)) and h.per_regime == 2 and h.candidates == (5, 6, 7, 8, 9)
    assert all(c.protocol == "equal-rollouts" for c in h.claims) and h.level == 0.05


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d.pop("claims"), "claims is missing"),
    (lambda d: d["claims"].clear(), "claims must name"),
    (lambda d: d["admission"].update(per_regime=0), "admission.per_regime"),
    (lambda d: d["admission"].update(candidates=[5, 5]), "admission.candidates"),
    (lambda d: d["admission"].update(reference_seeds=[0, 11]), "admission.reference_seeds"),
    (lambda d: d.update(seeds="0-9"), "seeds must be"),
    (lambda d: d["comparator"].update(label="grpo"), "comparator.label"),
    (lambda d: d["decision"].update(level=5), "decision.level"),
    (lambda d: d["claims"][1].update(id="H1"), "claims[1].id"),
    (lambda d: d["claims"][0].update(regime="easy"), "claims[0].regime"),
    (lambda d: d["claims"][2].update(protocol="sideways"), "claims[2].protocol"),
    (lambda d: d["claims"][3].update(ours="nobody"), "claims[3].ours"),
    (lambda d: d["claims"][0].pop("direction"), "claims[0].direction is missing"),
    (lambda d: d.update(format=2), "format must be 1"),
])
def test_a_declaration_that_does_not_say_what_the_reading_needs_is_refused_naming_the_field(tmp_path, edit,
                                                                                            field) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        R.load(_changed(tmp_path, edit))


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "hypotheses.json"
    p.write_text("{claims: H1}")
    with pytest.raises(ValueError, match="not JSON"):
        R.load(p)


def _curve(accs: list[float]) -> list[dict[str, float]]:
    return [{"step": i, "updates": i, "cum_rollouts": 1000 * i, "cum_tokens": 4000 * i, "cum_trained_tokens": 0,
             "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]


def _cell(store: RunStore, regime: str, protocol: str, label: str, accs: list[float], seeds) -> None:
    for seed in seeds:
        path = store.run_file(regime, protocol, label, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        bump = [a + 0.002 * seed * (i > 0) for i, a in enumerate(accs)]
        path.write_text(json.dumps({"regime": regime, "protocol": protocol, "variant": label, "seed": seed,
                                    "split": "test", "curve": _curve(bump), "ledger": {"rollouts": 1000 * len(accs)},
                                    "grid": None, "eval_size": 2000, "allocator_params": {}}))


def _candidate(store: RunStore, regime: str, conditioned: bool) -> None:
    store.freeze(store.target_path(regime), {"regime": regime, "target": 0.5})
    store.freeze(store.preregistration_path(regime), {"conditioning": {
        "conditioned": conditioned, "slope_points_per_1k": 0.3 if conditioned else 0.02, "headroom_points": 2.0,
        "evals_before_target": 12, "meets": {"slope": conditioned, "headroom": True, "evals": True}}})


def test_candidates_are_admitted_in_order_by_their_conditioning_until_two_are_in(tmp_path: Path) -> None:
    store, h = RunStore(tmp_path), R.load()
    assert R.admission(store, "pool", h) == {"admitted": [], "missed": [], "next": "pool-ws5"}
    _candidate(store, "pool-ws5", True)
    _candidate(store, "pool-ws6", False)
    st = R.admission(store, "pool", h)
    assert st["admitted"] == ["pool-ws5"] and st["next"] == "pool-ws7"
    assert st["missed"][0]["regime"] == "pool-ws6" and st["missed"][0]["slope_points_per_1k"] == 0.02
    _candidate(store, "pool-ws7", True)
    _candidate(store, "pool-ws8", True)  # after the second admitted: not a replication warm start
    st = R.admission(store, "pool", h)
    assert st["admitted"] == ["pool-ws5", "pool-ws7"] and st["next"] is None
    # hard's admission is its own
    assert R.admission(store, "hard", h)["next"] == "hard-ws5"
    md = reading.markdown(reading.measure(store, h))
    assert "| pool | pool-ws5, pool-ws7 | pool-ws6 (slope 0.02, headroom 2.0, 12 evaluations) | - |" in md


def test_the_candidates_stay_out_of_the_exploratory_families(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for regime in ("pool-ws2", "pool-ws5", "pool-ws9"):
        _candidate(store, regime, True)
    assert store.family("pool") == ["pool-ws2"]


def _one_claim(tmp_path: Path) -> R.Hypotheses:
    return R.load(_changed(tmp_path, lambda d: d.update(claims=d["claims"][:1])))


def _replicated(store: RunStore, ours: list[float]) -> None:
    seeds = range(10)
    for regime in ("pool-ws5", "pool-ws6"):
        _candidate(store, regime, True)
        store.freeze(tuning.frozen_path(store, regime, "choice.json"), {"best": "grpo[k4_e2]", "k": 4, "lr": 1e-4,
                                                                        "epochs": 2})
        _cell(store, regime, "grpo-tuning", "grpo[k4_e2]", [0.3, 0.35, 0.45, 0.55, 0.6], seeds)
        _cell(store, regime, "equal-rollouts", "ar3po", ours, seeds)


def test_a_claim_is_confirmed_when_its_holm_p_and_its_interval_say_so(tmp_path: Path) -> None:
    h, store = _one_claim(tmp_path), RunStore(tmp_path / "out")
    _replicated(store, [0.3, 0.5, 0.55, 0.6, 0.6])
    (row,) = reading.measure(store, h)["claims"]
    assert row["warm_starts"] == ["pool-ws5", "pool-ws6"] and row["baseline"] == TUNED
    assert row["ours_runs"] == row["base_runs"] == 20 and row["pooled_lo"] > 0
    assert row["p_holm"] < 0.05 and row["verdict"] == "confirmed"
    md = reading.markdown(reading.measure(store, h))
    assert "| H1 | pool | ar3po vs grpo[tuned] (equal-rollouts) | pool-ws5, pool-ws6 |" in md and "**confirmed**" in md


def test_a_claim_no_faster_than_the_tuned_grpo_is_not_confirmed(tmp_path: Path) -> None:
    h, store = _one_claim(tmp_path), RunStore(tmp_path / "out")
    _replicated(store, [0.3, 0.35, 0.45, 0.55, 0.6])
    (row,) = reading.measure(store, h)["claims"]
    assert row["verdict"] == "not confirmed" and row["pooled_saving"] == pytest.approx(0.0)


def test_a_claim_whose_cells_miss_a_seed_or_whose_family_is_open_is_not_read(tmp_path: Path) -> None:
    h, store = _one_claim(tmp_path), RunStore(tmp_path / "out")
    _replicated(store, [0.3, 0.5, 0.55, 0.6, 0.6])
    store.run_file("pool-ws6", "equal-rollouts", "ar3po", 9).unlink()
    (row,) = reading.measure(store, h)["claims"]
    assert row["verdict"] == "not read yet" and row["missing"] == ["pool-ws6: ar3po has 9 of 10 seeds"]
    # with every claim of the file, the pool claim waits for hard's admission and the other claims' cells
    _cell(store, "pool-ws6", "equal-rollouts", "ar3po", [0.3, 0.5, 0.55, 0.6, 0.6], [9])
    rows = reading.measure(RunStore(tmp_path / "out"))["claims"]
    assert {r["verdict"] for r in rows} == {"not read yet"} and "p_holm" not in rows[0]
    assert not rows[0]["missing"] and rows[1]["missing"] == [f"{r}: valor[reuse] has 0 of 10 seeds"
                                                              for r in ("pool-ws5", "pool-ws6")]
    assert rows[0]["p_value_stratified"] < 0.05  # read, but not decided while the family is open
    assert rows[3]["missing"] == ["admission not over (0 of 2 warm starts admitted)"]


def test_the_study_s_plan_resumes_a_candidate_by_the_replication_alone(tmp_path: Path) -> None:
    from benchmarks.study.tables import remaining

    store = RunStore(tmp_path)
    for regime in ("pool-ws2", "pool-ws5"):
        _candidate(store, regime, True)
        _cell(store, regime, "reference", "grpo", [0.3, 0.4], range(2))
    lines = [ln for ln in remaining(RunStore(tmp_path)) if ln.startswith("| pool-ws")]
    mine = [ln for ln in lines if ln.startswith("| pool-ws5 ")]
    assert mine == ["| pool-ws5 | replication | 2 | benchmarks/study/hypotheses.json | "
                    "`python -m benchmarks.study --regime pool --replication` |"]
    assert any("--warm-start 2 --protocol equal-rollouts" in ln for ln in lines)  # the others keep their protocols


def test_the_declaration_is_frozen_with_the_first_run_and_may_not_change_after(tmp_path: Path) -> None:
    store, h = RunStore(tmp_path / "out"), R.load()
    d = R.freeze_declaration(store, h)  # the committed file: its commit is the one that added it
    assert d["hypotheses_sha256"] == h.sha256 and d == R.freeze_declaration(RunStore(tmp_path / "out"), h)
    assert len(d["declared_in"]) == 40
    edited = _one_claim(tmp_path)  # another declaration read against runs that followed the first
    with pytest.raises(SystemExit, match="changed after the replication's runs began"):
        R.freeze_declaration(RunStore(tmp_path / "out"), edited)
    _replicated(store, [0.3, 0.5, 0.55, 0.6, 0.6])
    res = reading.measure(RunStore(tmp_path / "out"), edited)
    assert res["hypotheses"]["changed_since"] and res["claims"][0]["verdict"].startswith("not read: the declaration")
    assert "the file changed after the runs began" in reading.markdown(res)


def test_a_declaration_git_does_not_hold_is_refused_before_any_run(tmp_path: Path) -> None:
    p = _changed(tmp_path, lambda d: None)  # a copy outside the repository: no commit added it
    with pytest.raises(SystemExit, match="not committed as it stands"):
        R.freeze_declaration(RunStore(tmp_path / "out"), R.load(p), p)
    assert not R.declaration_path(RunStore(tmp_path / "out")).exists()
