"""The training study (benchmarks/study/): statistics, unreached counting, the quick path's files, resume."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import regimes
from benchmarks import training as training_bench
from benchmarks.common import RESULTS, default_out
from benchmarks.study import cli, execute, plan, stats, tables
from benchmarks.study import data as study_data
from benchmarks.study.store import BELIEFS, RunStore, log_of

KEYS = {"regime", "protocol", "allocator", "seeds", "reached", "rollouts_to_target", "seconds_to_target",
        "final_accuracy"}


def curve(accs: list[float], per_step: int = 100) -> list[dict[str, float]]:
    return [{"step": i, "updates": i, "cum_rollouts": i * per_step, "cum_tokens": 4 * i * per_step,
             "cum_trained_tokens": 2 * i * per_step, "seconds": 0.5 * i, "greedy_acc": a} for i, a in enumerate(accs)]


def run(accs: list[float], seed: int, per_step: int = 100) -> dict:
    ledger = {"rollouts": per_step * (len(accs) - 1), "updates": len(accs) - 1, "generate_s": 1.0}
    return {"curve": curve(accs, per_step), "seed": seed, "eval_size": 2000, "ledger": ledger}


def test_median_ci_brackets_the_median_and_narrows_with_agreement():
    wide = stats.median_ci([100, 400, 900, 1600, 2500, 3600], seed=1)
    assert wide["lo"] <= wide["median"] <= wide["hi"]
    assert wide["lo"] < wide["hi"]
    same = stats.median_ci([700.0] * 5)
    assert same["median"] == same["lo"] == same["hi"] == 700.0
    assert stats.median_ci([])["median"] is None


def test_median_ci_counts_never_reached_runs_as_infinite():
    # 2 of 5 never reach: the median is still finite, the upper bound falls on an unreached run
    ci = stats.median_ci([100, 200, 300, float("nan"), math.inf])
    assert ci["median"] == 300 and ci["hi"] is None and ci["finite"] == 3 and ci["n"] == 5
    # 3 of 5 never reach: the median itself is "never"; dropping them would have reported 150
    ci = stats.median_ci([100, 200, float("nan"), float("nan"), float("nan")])
    assert ci["median"] is None and ci["finite"] == 2


def test_cell_counts_unreached_runs_and_interpolates():
    runs = [run([0.3, 0.4, 0.5, 0.6], 0), run([0.3, 0.35, 0.45, 0.55], 1), run([0.3, 0.31, 0.32, 0.33], 2)]
    cell = stats.cell_rows(runs, target=0.45)
    assert cell["seeds"] == 3 and cell["reached"] == 2
    hits = [stats.reach(r["curve"], 0.45)["cum_rollouts"] for r in runs]
    assert hits[0] == pytest.approx(150.0) and hits[1] == pytest.approx(200.0) and math.isnan(hits[2])
    assert cell["rollouts_to_target"]["median"] == pytest.approx(200.0)
    assert cell["seconds_to_target"]["median"] == pytest.approx(1.0)
    assert cell["final_accuracy"] == pytest.approx(0.55)
    assert cell["final_accuracy_se"] == pytest.approx(math.sqrt(0.55 * 0.45 / 2000))


def test_target_is_frozen_once_set(tmp_path):
    refs = [run([0.3, 0.5, 0.6, 0.7, 0.7, 0.7], s) for s in range(3)]
    t = execute.set_target(RunStore(tmp_path), "hard", refs)
    assert t["target"] == pytest.approx(0.3 + 0.8 * 0.4)
    other = [run([0.3, 0.9, 0.9, 0.9], s) for s in range(3)]
    assert execute.set_target(RunStore(tmp_path), "hard", other)["target"] == pytest.approx(t["target"])


def test_regimes_build_from_params_yaml():
    easy, hard = plan.regime_params("easy"), plan.regime_params("hard")
    from rlvr_core.config import load_params

    base = load_params(plan.PARAMS_FILE)
    assert hard.train == base.train and hard.warmstart == base.warmstart and easy.train == base.train
    assert easy.prepare.n_test == plan.TEST_ROWS + plan.VALIDATION_ROWS
    assert hard.prepare.digits != easy.prepare.digits or hard.warmstart != easy.warmstart
    p = execute.run_params("hard", "sara[carry]", 3, protocol="equal-batch")
    assert p.train.allocator == "sara" and p.train.seed == 3
    assert p.train.allocator_params["sara"]["prior"] == "carry+eb"
    assert p.train.allocator_params["dapo"] == base.train.allocator_params["dapo"]  # params.yaml's cap kept
    pods = execute.run_params("hard", "pods", 0, protocol="equal-rollouts").train
    assert pods.batch_size * 2 * pods.k == base.train.batch_size * base.train.k  # equal rollouts per update


def test_quick_never_defaults_to_benchmarks_results():
    assert cli.default_out(None, True) != RESULTS
    assert cli.default_out(None, False) == RESULTS
    assert cli.default_out(Path("x"), True) == Path("x")
    # the superseded training benchmark writes to its own folder of the archive, never beside the study's files
    assert training_bench.OUT == RESULTS / "archive" / "training" and (training_bench.OUT / "training.md").is_file()
    assert default_out(None, False, "training", full=training_bench.OUT) == training_bench.OUT
    assert default_out(None, True, "training", full=training_bench.OUT) not in (RESULTS, training_bench.OUT)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    assert cli.main(["--quick", "--regime", "easy", "--protocol", "equal-batch", "--out", str(out)]) == 0
    return out


def test_quick_writes_the_schema(quick):
    recs = json.loads((quick / "study" / "training_protocols.json").read_text())
    assert {(r["protocol"], r["allocator"]) for r in recs} == {("reference", "grpo"), ("equal-batch", "dapo")}
    for r in recs:
        assert KEYS <= set(r) and r["regime"] == "easy" and r["seeds"] == 2 and 0 <= r["reached"] <= r["seeds"]
        for key in ("rollouts_to_target", "seconds_to_target"):
            assert set(r[key]) >= {"median", "lo", "hi"}
        assert 0.0 <= r["final_accuracy"] <= 1.0
    for ext in ("csv", "md", "png"):
        assert (quick / "study" / f"training_easy_equal-batch.{ext}").stat().st_size > 0
    first = next((quick / "study" / "easy" / "equal-batch").glob("*/s0.json"))
    one = json.loads(first.read_text())
    log = first.with_suffix(".rollouts.parquet")  # every run keeps its decision log, its digest in the run file
    assert one["decision_log"] == {"file": log.name, "sha256": hashlib.sha256(log.read_bytes()).hexdigest()}
    assert set(pd.read_parquet(log)["status"]) <= {"committed", "dropped", "abandoned"}
    led = one["ledger"]
    for key in ("rollouts", "generated_tokens", "trained_tokens", "generate_s", "verify_s", "allocate_s", "update_s",
                "eval_s", "flops"):
        assert key in led
    assert led["rollouts"] > 0 and led["generated_tokens"] >= led["rollouts"]
    assert led["flops"] == pytest.approx(2 * led["params"] * led["generated_tokens"] + 6 * led["params"]
                                         * led["trained_tokens"])
    assert json.loads((quick / "study" / "easy" / "target.json").read_text())["reference_seeds"] == [0, 1]
    table = (quick / "study" / "training_easy_equal-batch.md").read_text()
    assert "never" in table or all(r["reached"] == r["seeds"] for r in recs)


def test_resume_skips_finished_runs_and_redoes_a_missing_one(quick, capsys):
    files = sorted((quick / "study").glob("*/*/*/s*.json"))
    assert len(files) == 4
    stamps = {f: f.stat().st_mtime_ns for f in files}
    victim = files[-1]
    victim.unlink()
    assert cli.main(["--quick", "--regime", "easy", "--protocol", "equal-batch", "--out", str(quick)]) == 0
    log = capsys.readouterr().out
    assert log.count("skipped (done)") == 3 and log.count(": trained;") == 1
    for f, t in stamps.items():
        if f != victim:
            assert f.stat().st_mtime_ns == t
    assert victim.exists()
    recs = json.loads((quick / "study" / "training_protocols.json").read_text())
    assert all(r["seeds"] == 2 for r in recs)


def test_backfill_gives_a_run_its_decision_log_only_when_the_rerun_is_the_recorded_run(quick, tmp_path, capsys):
    """A run file without a decision log (made before every run kept one) is rerun from its recorded settings; the
    same run gets back the very log it wrote, with its digest; a run whose recorded curve the rerun does not give
    keeps none, and the outcome of each is recorded so that no run is tried twice."""
    import shutil

    from benchmarks.study import backfill

    out = tmp_path / "copy"
    shutil.copytree(quick, out)
    cell = out / "study" / "easy" / "equal-batch"
    runs = sorted(cell.glob("*/s*.json"))
    same, other = runs[0], runs[1]
    want = json.loads(same.read_text())["decision_log"]["sha256"]
    for path in (same, other):
        r = json.loads(path.read_text())
        del r["decision_log"]
        if path == other:
            r["curve"][1]["greedy_acc"] += 0.01  # a recorded curve this code does not train
        path.write_text(json.dumps(r) + "\n")
        path.with_suffix(".rollouts.parquet").unlink()
    store = RunStore(out)
    assert backfill.missing(store, "easy") == [same, other]
    for folder in {same.parent.name, other.parent.name}:  # --cells: one cell's runs only
        assert backfill.missing(store, "easy", [f"equal-batch/{folder}"]) == [
            p for p in (same, other) if p.parent.name == folder]
    assert backfill.missing(store, "easy", ["equal-batch/absent"]) == []
    assert cli.main(["--quick", "--regime", "easy", "--backfill-logs", "--limit", "1", "--out", str(out)]) == 0
    got = json.loads(same.read_text())
    assert got["decision_log"]["sha256"] == want == hashlib.sha256(
        same.with_suffix(".rollouts.parquet").read_bytes()).hexdigest()
    assert set(got["decision_log"]["backfilled"]) == {"commit", "at"}
    assert backfill.missing(store, "easy") == [other]  # --limit 1: the next command resumes
    assert cli.main(["--quick", "--regime", "easy", "--backfill-logs", "--out", str(out)]) == 0
    assert "decision_log" not in json.loads(other.read_text()) and not other.with_suffix(".rollouts.parquet").exists()
    rec = backfill.record(store, "easy")["runs"]
    rel = other.relative_to(out / "study").as_posix()
    assert rec[rel]["result"] == "differs" and "evaluation 1" in rec[rel]["why"] and "greedy_acc" in rec[rel]["why"]
    assert rec[same.relative_to(out / "study").as_posix()]["result"] == "reproduced"
    assert backfill.missing(store, "easy") == []  # tried once, never again
    assert "backfill: nothing to do" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--regime", "easy", "--limit", "2", "--out", str(out)])  # --limit belongs to --backfill-logs
    with pytest.raises(SystemExit):
        cli.main(["--regime", "easy", "--backfill-logs", "--backfill-beliefs", "--out", str(out)])  # one per command


def test_backfill_beliefs_replaces_a_log_only_by_the_same_log_with_prior_and_p_eff(tmp_path, capsys):
    """A log written before the allocator's beliefs were recorded (no prior, no p_eff) is replaced by the rerun's
    when the rerun is the recorded run: the very log the run first wrote, both columns back; a log the rerun does not
    give is kept, the outcome recorded; an allocator that holds no beliefs is never rerun for them."""
    from benchmarks.study import backfill

    out = tmp_path / "study"
    assert cli.main(["--quick", "--regime", "easy", "--protocol", "equal-batch", "--variants", "sara",
                     "--out", str(out)]) == 0
    assert {json.loads(p.read_text())["allocator"] for p in (out / "study" / "easy").glob("*/*/s*.json")} == {
        "grpo", "sara"}
    same, other = sorted((out / "study" / "easy").glob("equal-batch/*/s*.json"))
    grpo = sorted((out / "study" / "easy").glob("reference/*/s*.json"))
    full = {p: p.with_suffix(".rollouts.parquet").read_bytes() for p in (same, other)}
    assert pd.read_parquet(same.with_suffix(".rollouts.parquet"))["prior"].notna().all()
    for path in (same, other, *grpo):  # as a log made before the beliefs were recorded
        log = path.with_suffix(".rollouts.parquet")
        df = pd.read_parquet(log).drop(columns=list(BELIEFS))
        if path == other:
            df.loc[0, "tokens"] += 1  # a log this code does not write
        df.to_parquet(log, index=False)
        r = json.loads(path.read_text())
        r["decision_log"]["sha256"] = hashlib.sha256(log.read_bytes()).hexdigest()
        path.write_text(json.dumps(r) + "\n")
    stripped = json.loads(same.read_text())["decision_log"]["sha256"]
    store = RunStore(out)
    assert backfill.lacks_beliefs(store, "easy") == [same, other]  # grpo holds none: never rerun for them
    assert store.log_coverage("easy") == {"runs": 4, "logged": 4, "to_backfill": 0, "not_reproduced": 0,
                                                "holds": 2, "beliefs": 0, "to_fill": 2}
    row = next(line for line in tables.decision_logs(store) if line.startswith("| easy |"))
    assert row == "| easy | 4 | 4 | 0 | 0 | 0 of 2 | `python -m benchmarks.study --regime easy --backfill-beliefs` |"
    assert cli.main(["--quick", "--regime", "easy", "--backfill-beliefs", "--limit", "1", "--out", str(out)]) == 0
    got = json.loads(same.read_text())["decision_log"]
    assert same.with_suffix(".rollouts.parquet").read_bytes() == full[same]
    assert got["sha256"] == hashlib.sha256(full[same]).hexdigest() and got["replaced"] == stripped
    assert set(got["backfilled"]) == {"commit", "at"}
    assert backfill.lacks_beliefs(store, "easy") == [other]  # --limit 1: the next command resumes
    assert cli.main(["--quick", "--regime", "easy", "--backfill-beliefs", "--out", str(out)]) == 0
    rec = backfill.record(store, "easy", backfill.BELIEFS_RECORD)["runs"]
    assert rec[same.relative_to(out / "study").as_posix()]["result"] == "reproduced"
    one = rec[other.relative_to(out / "study").as_posix()]
    assert (one["result"], one["why"]) == ("differs", "column 'tokens' differs")
    assert "prior" not in pd.read_parquet(other.with_suffix(".rollouts.parquet")).columns  # kept as it was
    assert "replaced" not in json.loads(other.read_text())["decision_log"]
    assert backfill.lacks_beliefs(store, "easy") == []  # tried once, never again
    after = RunStore(out).log_coverage("easy")  # a fresh store: runs() reads the run files once
    assert (after["holds"], after["beliefs"], after["to_fill"]) == (2, 1, 0)
    assert "beliefs: nothing to do" not in capsys.readouterr().out


def test_a_run_file_names_its_decision_log_only_beside_it(tmp_path):
    """A run file is input: the log it names counts only when it is the one beside it and exists."""
    path = tmp_path / "s0.json"
    beside = path.with_suffix(".rollouts.parquet")
    (tmp_path / "other.parquet").write_bytes(b"x")
    assert log_of(path, {"decision_log": {"file": beside.name}}) is None  # not there
    beside.write_bytes(b"x")
    assert log_of(path, {"decision_log": {"file": beside.name}}) == beside
    for named in ({"file": "other.parquet"}, {"file": "../s0.rollouts.parquet"}, {}, "s0.rollouts.parquet", None):
        assert log_of(path, {"decision_log": named}) is None
    assert log_of(path, {}) is None


def test_a_run_without_a_policy_digest_is_not_rerun_and_nothing_is_loaded_for_it(tmp_path):
    """Its policy cannot be shown to be the run's, so the rerun is refused before the regime's data (and a warm start
    it would build) is loaded; the outcome is recorded, so the run is not tried again."""
    from benchmarks.study import backfill

    store = RunStore(tmp_path)
    path = store.run_file("hard", "reference", "grpo", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"variant": "grpo", "protocol": "reference", "seed": 0}))

    def one(path, quick):
        raise AssertionError("loaded data for a run without a policy digest")

    counts = backfill.rerun_each(store, "hard", [path], one, done="decision_log", log=lambda _m: None)
    assert counts == {"not rerun": 1}
    assert backfill.record(store, "hard")["runs"]["hard/reference/grpo/s0.json"] == backfill.NO_POLICY


def test_backfill_refuses_a_run_this_checkout_would_not_train_as_recorded(tmp_path):
    from benchmarks.study import backfill

    store = RunStore(tmp_path)
    cfg = execute.run_params("pool-ws3", "sara", 0, protocol="equal-batch").train
    run = {"variant": "sara", "protocol": "equal-batch", "seed": 0, "grid": None, "batch_size": cfg.batch_size,
           "lr": cfg.lr, "k": cfg.k, "allocator_params": cfg.allocator_params.get("sara", {})}
    assert backfill.settings_differ(store, run, "pool-ws3") is None
    assert backfill.settings_differ(store, {**run, "lr": 1.0}, "pool-ws3").startswith("lr: this checkout trains")
    assert backfill.settings_differ(store, {**run, "allocator_params": {"tau_low": 0.5}}, "pool-ws3").startswith(
        "allocator_params")
    assert "no longer in the plan" in backfill.settings_differ(store, {**run, "variant": "gone"}, "pool-ws3")
    assert "matched.json" in backfill.settings_differ(store, {**run, "protocol": "matched-updates"}, "pool-ws3")
    assert backfill.same_run({"curve": [{"step": 0, "greedy_acc": 0.2, "new": 1, "seconds": 9.0}],
                              "ledger": {"rollouts": 8, "train_s": 2.0}},
                             {"curve": [{"step": 0, "greedy_acc": 0.2, "seconds": 1.0}],
                              "ledger": {"rollouts": 8, "train_s": 1.0}}) is None
    assert backfill.same_run({"curve": [], "ledger": {"rollouts": 9}}, {"curve": [], "ledger": {"rollouts": 8}}) == \
        "ledger: rollouts 9 != 8"


def test_large_held_out_set_adds_unseen_problems_of_the_test_splits_cells():
    """The large set is the test split and fresh problems of its cells that no split holds, drawn the same way each
    time; the used-up cells (one digit, two-digit products) keep their test rows only; another task is refused."""
    from benchmarks.study import heldout

    the_set = heldout.large_set("hard", fresh=600)
    train, test, val = study_data.splits(study_data.dataset(plan.regime_params("hard")))
    rows = the_set["rows"]
    assert rows[: len(test)] == test and len(rows) == len(test) + 600 == len(test) + the_set["fresh"]
    fresh = [r["prompt"] for r in rows[len(test):]]
    assert len(set(fresh)) == 600 and not set(fresh) & {r["prompt"] for r in (*train, *test, *val)}
    assert all(r["id"].startswith("arith-heldout-") and set(r) == set(test[0]) for r in rows[len(test):])
    cells = the_set["cells"][len(test):]
    assert not any(d == 1 or (d, op) == (2, "*") for d, op in cells)
    assert math.isclose(sum(the_set["shares"].values()), 1.0)
    open_cells = [c for c in the_set["shares"] if c[0] > 1 and c != (2, "*")]
    share = the_set["shares"][(3, "+")] / sum(the_set["shares"][c] for c in open_cells)
    assert abs(cells.count((3, "+")) / 600 - share) < 0.01  # each open cell gets its share of the test split
    assert heldout.large_set("hard", fresh=600)["sha256"] == the_set["sha256"]
    with pytest.raises(ValueError, match="arithmetic only"):
        heldout.large_set("steps", fresh=10)


def test_large_held_out_accuracy_weights_cells_as_the_test_split_does():
    from benchmarks.study import heldout

    shares = {(1, "+"): 0.25, (2, "+"): 0.75}
    cells = [(1, "+")] * 4 + [(2, "+")] * 8
    got = heldout.score([1, 1, 0, 0] + [1, 1, 0, 0, 0, 0, 0, 0], cells, shares)
    assert got["greedy_acc"] == pytest.approx(0.25 * 0.5 + 0.75 * 0.25)  # not the plain mean, 4/12
    assert got["se"] == pytest.approx(math.sqrt(0.25 ** 2 * 0.25 / 4 + 0.75 ** 2 * 0.1875 / 8))
    assert got["greedy_acc_d1"] == 0.5 and got["greedy_acc_d2"] == 0.25 and got["n_problems"] == 12
    with pytest.raises(ValueError, match="has no row"):
        heldout.score([1], [(1, "+")], shares)
    with pytest.raises(ValueError, match="2 evaluations of the large set against 1"):
        heldout.large_curve([{"step": 0}], [got, got])


def test_heldout_large_keeps_a_curve_only_from_a_rerun_that_is_the_recorded_run(quick, tmp_path):
    """Runs are trained again with one more evaluation, on the large set, after each of their own: a rerun equal
    to the recorded run gives the run file its large-set curve (one point per recorded evaluation, each with its
    standard error), a run whose recorded curve this code does not train gains nothing, and every outcome is
    recorded so that --limit resumes and nothing is tried twice. Training itself is untouched."""
    import shutil

    from benchmarks.study import heldout
    from rlvr_core import training

    out = tmp_path / "copy"
    shutil.copytree(quick, out)
    dapo = sorted((out / "study" / "easy" / "equal-batch" / "dapo").glob("s*.json"))
    r = json.loads(dapo[1].read_text())
    r["curve"][1]["greedy_acc"] += 0.01  # a recorded curve this code does not train
    dapo[1].write_text(json.dumps(r) + "\n")
    before = {p: json.loads(p.read_text()) for p in dapo}
    store, evaluate = RunStore(out), training._Run.evaluate
    cells = ["equal-batch/dapo"]
    assert heldout.todo(store, "easy", cells) == dapo
    args = ["--quick", "--regime", "easy", "--heldout-large", "--cells", *cells, "--out", str(out)]
    assert cli.main([*args, "--limit", "1"]) == 0
    assert training._Run.evaluate is evaluate  # the extra evaluation is gone after the block
    got = json.loads(dapo[0].read_text())
    large = got.pop("heldout_large")
    assert got == before[dapo[0]]  # nothing else in the run file changed
    assert large["problems"] == 2000 + heldout.QUICK_FRESH and len(large["curve"]) == len(got["curve"])
    for mine, theirs in zip(large["curve"], got["curve"]):
        assert mine["cum_rollouts"] == theirs["cum_rollouts"] and 0 <= mine["greedy_acc"] <= 1
        assert 0 <= mine["se"] < 0.02  # 2,200 problems (0: the quick policy fails every cell)
    assert heldout.todo(store, "easy", cells) == [dapo[1]]  # --limit 1: the next command resumes
    assert cli.main(args) == 0
    assert json.loads(dapo[1].read_text()) == before[dapo[1]]
    rec = backfill_record(store)
    assert rec[dapo[1].relative_to(out / "study").as_posix()]["result"] == "differs"
    assert rec[dapo[0].relative_to(out / "study").as_posix()]["result"] == "reproduced"
    assert heldout.todo(store, "easy", cells) == []
    with pytest.raises(ValueError, match="not protocol/variant"):
        heldout.todo(store, "easy", ["dapo"])


def backfill_record(store: RunStore) -> dict:
    from benchmarks.study import backfill, heldout

    return backfill.record(store, "easy", heldout.RECORD)["runs"]


def test_round_price_compares_rounds_with_one_batched_call(quick):
    assert cli.main(["--quick", "--regime", "easy", "--round-price", "--out", str(quick)]) == 0
    res = json.loads((quick / "study" / "training_round_price.json").read_text())
    rows = {r["allocator"]: r for r in res["rows"]}
    assert set(rows) == {"grpo", "dapo"}
    assert rows["grpo"]["rounds_per_step"] == 1.0 and rows["grpo"]["rollouts_per_step"] == 256
    assert rows["dapo"]["rounds_per_step"] >= 1.0
    for r in rows.values():
        assert r["rounds_rollouts_per_s"] > 0 and r["batched_rollouts_per_s"] > 0
        assert r["slowdown"] == pytest.approx(r["batched_rollouts_per_s"] / r["rounds_rollouts_per_s"])


def test_tuned_chooses_each_allocator_on_validation_then_reports_it_on_test(quick, capsys):
    """One allocator at a time: its grid on the validation split, its recorded choice, then its test seeds."""
    assert cli.main(["--quick", "--regime", "easy", "--protocol", "tuned", "--variants", "sara",
                       "--out", str(quick)]) == 0
    log = capsys.readouterr().out
    tuned = quick / "study" / "easy" / "tuned"
    val = sorted(p.parent.name for p in tuned.glob("*-val/s*.json"))
    assert val == [f"sara{plan.grid_tag(g)}-val" for g in plan.GRID[:2]]
    choice = json.loads((tuned / "choice.json").read_text())
    assert set(choice) == {"sara"} and tuple(choice["sara"]["grid"]) in plan.GRID[:2]
    chosen = tuned / f"sara{plan.grid_tag(tuple(choice['sara']['grid']))}"
    assert sorted(p.name for p in chosen.glob("s*.json")) == ["s0.json", "s1.json"]
    lines = log.splitlines()
    order = [i for i, ln in enumerate(lines) if "/tuned" in ln and ("(validation)" in ln or "chose" in ln
                                                                   or "(test)" in ln)]
    kinds = ["val" if "(validation)" in lines[i] else "chose" if "chose" in lines[i] else "test" for i in order]
    assert kinds == ["val", "val", "chose", "test", "test"]
    for p in chosen.glob("s*.json"):
        r = json.loads(p.read_text())
        assert r["split"] == "test" and r["grid"] == choice["sara"]["grid"]
    recs = json.loads((quick / "study" / "training_protocols.json").read_text())
    assert [r["allocator"] for r in recs if r["protocol"] == "tuned"] == ["sara"]
    with pytest.raises(ValueError, match="no allocator"):
        cli.main(["--quick", "--regime", "easy", "--protocol", "equal-batch", "--variants", "vigor",
                    "--out", str(quick)])


def _ref_file(out, regime, seed, eff, batch=32):
    p = RunStore(out).run_file(regime, "reference", "grpo", seed)
    p.parent.mkdir(parents=True, exist_ok=True)
    r = run([0.3, 0.4], seed)
    r.update(batch_size=batch, ledger={**r["ledger"], "effective_groups_per_step": eff})
    p.write_text(json.dumps(r))


def test_matched_sizes_come_from_the_reference_runs_and_are_frozen(tmp_path):
    for s, eff in enumerate((11.0, 12.2, 13.0)):
        _ref_file(tmp_path, "pool", s, eff)
    # median 12.2 effective groups of 32: grpo needs 32 x 32 / 12.2 = 84 prompts for 32; the others get 12
    assert execute.matched_sizes(RunStore(tmp_path), "pool", "matched-updates") == 84
    assert execute.matched_sizes(RunStore(tmp_path), "pool", "matched-updates-small") == 12
    _ref_file(tmp_path, "pool", 3, 30.0)
    _ref_file(tmp_path, "pool", 4, 30.0)  # later reference runs do not move a frozen choice
    assert execute.matched_sizes(RunStore(tmp_path), "pool", "matched-updates") == 84
    _ref_file(tmp_path, "dead", 0, 0.0)
    with pytest.raises(RuntimeError, match="no effective group"):
        execute.matched_sizes(RunStore(tmp_path), "dead", "matched-updates")


def test_the_dapo_replication_trains_grpo_at_the_matched_batch_and_dapo_at_b(tmp_path):
    from benchmarks.study import backfill

    assert plan.labels("null-dapo", "pool-ws2") == ("dapo", "grpo") and plan.labels("null-dapo", "hard-ws2") == ()
    assert plan.PROTOCOLS["null-dapo"].first_seed == 5 and plan.PROTOCOLS["null-dapo"].shares == ()
    assert plan.matched_entry("null-dapo", "grpo") == "matched-updates"
    assert plan.matched_entry("null-dapo", "dapo") is None
    assert plan.matched_entry("matched-updates-small", "sara") == "matched-updates-small"
    for s, eff in enumerate((11.0, 12.2, 13.0)):
        _ref_file(tmp_path, "pool", s, eff)
    store = RunStore(tmp_path)
    assert execute.matched_sizes(store, "pool", "matched-updates") == 84  # frozen before a matched run trains
    for label, batch in (("grpo", 84), ("dapo", 32)):
        cfg = execute.run_params("pool", label, 5, protocol="null-dapo",
                                 batch=84 if label == "grpo" else None).train
        run = {"variant": label, "protocol": "null-dapo", "seed": 5, "grid": None, "batch_size": batch, "lr": cfg.lr,
               "k": cfg.k, "allocator_params": cfg.allocator_params.get(label, {})}
        assert backfill.settings_differ(store, run, "pool") is None, label  # sizes grpo's batch from matched.json
        assert "batch_size" in backfill.settings_differ(store, {**run, "batch_size": 116 - batch}, "pool")


def test_matched_protocols_share_the_cells_they_are_compared_with():
    p = execute.run_params("pool", "grpo", 0, protocol="matched-updates", batch=84).train
    assert p.batch_size == 84 and p.eval_every == 0 and p.eval_every_rollouts == plan.EVAL_GRID
    legacy = execute.run_params("hard", "grpo", 0).train
    assert legacy.eval_every == 6 and legacy.eval_every_rollouts == 0  # the step-grid runs stay reproducible
    vig = execute.run_params("pool", "vigor", 0, protocol="equal-rollouts").train
    assert vig.allocator_params["vigor"]["fill"] is True
    legacy_vigor = execute.run_params("hard", "vigor", 0, protocol="equal-rollouts").train.allocator_params
    assert "fill" not in legacy_vigor.get("vigor", {})
    assert plan.baseline_of("equal-batch") == "dapo" and plan.baseline_of("matched-updates-small") == "grpo"
    ws = execute.run_params("hard-ws2", "sara", 0, protocol="equal-batch")
    assert ws.warmstart.seed == 2 and ws.train.eval_every_rollouts == plan.EVAL_GRID
    assert execute.run_params("pool-k16", "sara", 0).train.k == 16


def test_the_length_aware_candidate_runs_in_the_worked_answer_regimes_only():
    assert "sara[tokens]" in plan.labels("equal-batch", "steps")
    assert "sara[tokens]" in plan.labels("equal-batch", "steps-ws1")
    assert "sara[tokens]" not in plan.labels("equal-batch", "pool")
    with pytest.raises(ValueError, match="no allocator"):
        plan.select("equal-batch", "pool", False, ["sara[tokens]"])
    p = execute.run_params("steps", "sara[tokens]", 0, protocol="equal-batch").train
    assert p.allocator == "sara" and p.allocator_params["sara"]["price"] == "tokens"


def test_pool_rows_are_stratified_by_cell():
    rows = [{"id": i, "difficulty": 1 + i % 4, "op": "+-*"[i % 3]} for i in range(2400)]
    pool = study_data.pool_rows(rows, 120)
    assert len(pool) == 120 and len({r["id"] for r in pool}) == 120
    cells = {}
    for r in pool:
        cells[(r["difficulty"], r["op"])] = cells.get((r["difficulty"], r["op"]), 0) + 1
    assert len(cells) == 12 and set(cells.values()) == {10}  # 12 equal cells of 200: 10 each
    assert study_data.pool_rows(rows, 120) == pool  # seeded
    with pytest.raises(ValueError):
        study_data.pool_rows(rows[:10], 20)


def test_a_regime_refuses_runs_from_another_warm_start(tmp_path):
    store = RunStore(tmp_path)
    t = store.target_path("hard")
    t.parent.mkdir(parents=True)
    t.write_text(json.dumps({"target": 0.3}))  # a target that recorded no policy (built on another machine)
    with pytest.raises(SystemExit, match="warm-start variant"):
        execute.check_policy(RunStore(tmp_path), "hard", "ab" * 32)
    t.write_text(json.dumps({"target": 0.3, "policy_sha256": "cd" * 32}))
    with pytest.raises(SystemExit, match="frozen from policy"):
        execute.check_policy(RunStore(tmp_path), "hard", "ab" * 32)
    execute.check_policy(RunStore(tmp_path), "hard", "cd" * 32)  # the same policy: fine
    execute.check_policy(RunStore(tmp_path), "pool", "ab" * 32)  # no target yet: fine


def _verify_setup(tmp_path, monkeypatch, rerun_curve):
    store = RunStore(tmp_path)
    store.freeze(store.target_path("pool-ws2"), {"target": 0.3, "policy_sha256": "cd" * 32})
    recorded = store.run_file("pool-ws2", "reference", "grpo", 0)
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps({"curve": curve([0.2, 0.25, 0.3]), "commit": "abc"}))
    monkeypatch.setattr(study_data, "load_data", lambda *a, **k: {"policy_sha256": "ab" * 32})
    calls = []

    def fake_run_one(scratch, regime, proto, lab, seed, **kw):
        calls.append((scratch.out, regime, proto, lab, seed))
        return {"curve": rerun_curve}, True

    monkeypatch.setattr(execute, "run_one", fake_run_one)
    return store, calls


def test_the_target_waits_for_reference_runs_another_process_still_trains(tmp_path, monkeypatch):
    """Two processes share a regime's reference runs: the one that finishes first must not freeze the target from
    the runs that happen to be done (it once froze steps-fine's from 4 of 5 seeds); it waits for the held seed."""
    store = RunStore(tmp_path)
    monkeypatch.setattr(study_data, "load_data", lambda *a, **k: {"policy_sha256": "ab" * 32})
    monkeypatch.setattr(execute, "preregister", lambda *a, **k: {})
    monkeypatch.setattr(execute, "log_preregistration", lambda *a, **k: None)
    held = store.run_file("pool-ws2", "reference", "grpo", 2)

    def fake_run_one(st, regime, proto, lab, seed, **kw):
        path = st.run_file(regime, proto, lab, seed)
        if seed == 2:  # another live process holds it
            held.parent.mkdir(parents=True, exist_ok=True)
            held.with_suffix(".lock").write_text(str(os.getpid()))
            return {}, False
        r = run([0.2, 0.3 + 0.01 * seed, 0.4], seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r))
        return r, True

    def other_process_finishes(_s):
        held.write_text(json.dumps(run([0.2, 0.5, 0.6], 2)))
        held.with_suffix(".lock").unlink()

    monkeypatch.setattr(execute, "run_one", fake_run_one)
    monkeypatch.setattr(execute.time, "sleep", other_process_finishes)
    execute.run_protocol("pool-ws2", "reference", [0, 1, 2], out=tmp_path, work=tmp_path / "w", quick=False,
                         log=lambda m: None)
    assert store.target("pool-ws2")["reference_seeds"] == [0, 1, 2]


def test_a_rebuilt_policy_is_accepted_only_when_reference_seed_0_reruns_identically(tmp_path, monkeypatch):
    same = [{**c, "seconds": c["seconds"] + 7.0} for c in curve([0.2, 0.25, 0.3])]  # wall-clock aside
    store, calls = _verify_setup(tmp_path, monkeypatch, same)
    with pytest.raises(SystemExit, match="frozen from policy cdcdcdcdcdcd.*--verify-policy"):
        execute.check_policy(store, "pool-ws2", "ab" * 32)
    rec = execute.verify_policy(store, "pool-ws2", work=tmp_path / "work", log=lambda m: None)
    assert calls == [(tmp_path / "work" / "verify-policy" / "pool-ws2", "pool-ws2", "reference", "grpo", 0)]
    assert rec["policy_sha256"] == "ab" * 32 and rec["recorded_policy_sha256"] == "cd" * 32
    assert json.loads(store.policy_path("pool-ws2").read_text())["evaluations"] == 3
    assert RunStore(tmp_path).policy_record("pool-ws2")["recorded_policy_sha256"] == "cd" * 32  # read back
    execute.check_policy(RunStore(tmp_path), "pool-ws2", "ab" * 32)  # accepted from the frozen file
    execute.check_policy(RunStore(tmp_path), "pool-ws2", "cd" * 32)  # the original still is
    with pytest.raises(SystemExit):
        execute.check_policy(RunStore(tmp_path), "pool-ws2", "ef" * 32)  # a third is not


def test_a_rebuilt_policy_that_trains_differently_is_refused_naming_the_evaluation(tmp_path, monkeypatch):
    store, _ = _verify_setup(tmp_path, monkeypatch, curve([0.2, 0.25, 0.31]))
    with pytest.raises(SystemExit, match="evaluation 2 .*greedy_acc 0.31 != 0.3"):
        execute.verify_policy(store, "pool-ws2", work=tmp_path / "work", log=lambda m: None)
    assert not store.policy_path("pool-ws2").exists()
    with pytest.raises(SystemExit):
        execute.check_policy(RunStore(tmp_path), "pool-ws2", "ab" * 32)
    assert execute.curve_difference(curve([0.2]), curve([0.2, 0.3])) == "1 evaluations against 2"


def test_a_policy_record_for_another_target_accepts_nothing(tmp_path):
    store = RunStore(tmp_path)
    store.freeze(store.target_path("pool-ws2"), {"target": 0.3, "policy_sha256": "cd" * 32})
    store.freeze(store.policy_path("pool-ws2"), {"policy_sha256": "ab" * 32, "recorded_policy_sha256": "ef" * 32})
    assert RunStore(tmp_path).accepted_policies("pool-ws2") == {"cd" * 32}


def test_recurrence_counts_prompts_rolled_out_in_several_steps(tmp_path):
    import pandas as pd

    pd.DataFrame({"step": [1, 1, 2, 3, 3], "prompt_id": [5, 6, 5, 5, 7]}).to_parquet(tmp_path / "r.parquet")
    assert execute.recurrence(tmp_path / "r.parquet") == {"prompts_rolled_out": 3, "prompts_in_several_steps": 1,
                                                         "max_steps_per_prompt": 3}
    assert execute.recurrence(tmp_path / "missing.parquet") == {}


def test_cost_structure_measures_the_generation_share_and_the_length_ratio(tmp_path, monkeypatch):
    """regime steps's extra criteria: the median over reference runs of generate_s / training seconds, and the
    failing/passing median length ratio at the start of RL; both must hold; regimes.md reports them."""
    def ref(seed: int, gen: float) -> dict:
        led = {"generate_s": gen, "verify_s": 1.0, "allocate_s": 0.0, "update_s": 9.0 - gen, "generated_tokens": 900,
               "rollouts": 30}
        return {"seed": seed, "ledger": led}

    lengths = {"samples": 80, "pass_share": 0.25, "median_tokens_pass": 16.0, "median_tokens_fail": 40.0,
               "fail_pass_length_ratio": 2.5, "tokens_min": 8, "tokens_max": 64, "tokens_p10": 12.0, "tokens_p90": 55.0,
               "hit_max_new_tokens_share": 0.01}
    monkeypatch.setattr(study_data, "start_lengths", lambda *a, **k: dict(lengths))
    params = plan.regime_params("steps")
    extra = plan.REGIMES["steps"].extra_criteria
    refs = [ref(0, 8.0), ref(1, 5.0), ref(2, 7.0)]  # shares 0.8, 0.5, 0.7
    got = execute.cost_structure(refs, {"policy": tmp_path, "train": []}, params, extra, quick=True)
    assert got["median_generate_share"] == pytest.approx(0.7) and got["meets"]
    assert [r["generate_share"] for r in got["runs"]] == pytest.approx([0.8, 0.5, 0.7])
    low = execute.cost_structure([ref(0, 5.0), ref(1, 6.0)], {"policy": tmp_path, "train": []}, params, extra, True)
    assert low["median_generate_share"] == pytest.approx(0.55) and not low["meets"]
    lengths["fail_pass_length_ratio"] = 1.2
    assert not execute.cost_structure(refs, {"policy": tmp_path, "train": []}, params, extra, True)["meets"]
    pre = tmp_path / "study" / "steps" / "preregistration.json"
    pre.parent.mkdir(parents=True)
    pre.write_text(json.dumps({"criteria": plan.CRITERIA, "meets": False, "zero_variance_share": 0.7,
                               "median_evals_below_target": 12, "median_fit_rollouts_to_target": 15000.0,
                               "runs": [{"seed": 0}], "extra": got}))
    section = "\n".join(regimes.cost_section("steps", tmp_path))
    assert "| median generation share of a GRPO step's wall-clock | >= 0.65 | 0.70 | meets |" in section
    assert "| median fitted rollouts to the target | >= 20,000 | 15,000 | **misses** |" in section
    assert "Not run yet" in "\n".join(regimes.cost_section("steps", tmp_path / "elsewhere"))
    # regimes.md gives a section to each pre-registered warm start of the regime too, in seed order
    for ws in (2, 1):
        (tmp_path / "study" / f"steps-ws{ws}").mkdir()
        (tmp_path / "study" / f"steps-ws{ws}" / "preregistration.json").write_text(pre.read_text())
    regimes.write([], tmp_path)
    md = (tmp_path / "regimes" / "regimes.md").read_text()
    heads = [ln for ln in md.splitlines() if ln.startswith("## Regime")]
    assert [h.split("`")[1] for h in heads] == ["steps", "steps-ws1", "steps-ws2"]


def test_start_lengths_scores_k_samples_per_prompt(tmp_path):
    from rlvr_core.models.tiny import build_tiny_policy, save_policy

    model, tok = build_tiny_policy(32, 1, 2, 64, seed=0)
    save_policy(model, tok, tmp_path / "p")
    rows = [{"id": f"r{i}", "prompt": f"000{i}+0001=", "answer": str(i + 1)} for i in range(5)]
    got = study_data.start_lengths(tmp_path / "p", rows, task="arithmetic-steps", k=2, n=3, max_new_tokens=6)
    assert got["samples"] == 6 and 1 <= got["tokens_min"] <= got["tokens_max"] <= 6
    assert got["pass_share"] == 0.0 and got["median_tokens_pass"] is None and got["fail_pass_length_ratio"] is None


def test_the_preregistration_log_line_reads_as_rollouts():
    lines = []
    pre = {"regime": "hard-ws1", "meets": False, "zero_variance_share": 0.71, "median_evals_below_target": 12,
           "median_fit_rollouts_to_target": 19120.55172413793}
    execute.log_preregistration(pre, lines.append)
    assert "median fitted reach 19,121 rollouts)" in lines[0] and "meets the criteria: False" in lines[0]
    execute.log_preregistration({**pre, "median_fit_rollouts_to_target": None}, lines.append)
    assert "median fitted reach never rollouts" not in lines[1] and "reach never" in lines[1]


def test_a_run_file_records_the_eval_size_of_the_evaluation_it_ran(tmp_path, monkeypatch):
    """A validation run evaluates all 1,000 validation rows (rlvr_core.training draws min(eval_size, rows)), so its
    file says 1000, not the test split's 2000; a test run says 2000. The backfill's check expects the same."""
    import types

    import rlvr_core.training as training
    from benchmarks.study import backfill

    evaluated = []

    def fake_train(cfg, *, policy_dir, train_rows, test_rows, run_dir, resume, task):
        evaluated.append(min(cfg.eval_size, len(test_rows)))  # the rows the trainer's evaluation draws
        return types.SimpleNamespace(metrics=[{"step": 0, "cum_rollouts": 0, "cum_tokens": 0, "eval/greedy_acc": 0.2,
                                               "eval_s": 0.1}], resumed_from=None)

    monkeypatch.setattr(training, "check_and_train", fake_train)
    store = RunStore(tmp_path)
    data = {"test": [{"i": i} for i in range(plan.TEST_ROWS)], "validation": [{"i": i} for i in range(1000)],
            "train": [{"i": 0}], "policy": tmp_path, "n_params": 1, "policy_sha256": "ab" * 32}
    for split, rows in (("validation", 1000), ("test", plan.TEST_ROWS)):
        path = store.run_file("pool", "reference", "grpo", 100, None, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        res = execute.train_run(store, path, "pool", "reference", "grpo", 100, work=tmp_path / "w", quick=False,
                                grid=None, split=split, data=data, params_file=plan.PARAMS_FILE)
        recorded = json.loads(path.read_text())
        assert res["eval_size"] == recorded["eval_size"] == evaluated[-1] == rows, split
        assert backfill.settings_differ(store, recorded, "pool") is None, split
    assert plan.split_rows("validation") == plan.VALIDATION_ROWS == 1000
