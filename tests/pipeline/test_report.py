"""The report (tasks/report.py): rollouts to a target set on the grpo runs, medians over seeds with bootstrap
intervals, runs that never reach the target counted, the same files from the same runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.report import write_report


def write_run(folder: Path, accs: list[float], per_step: int = 100, skipped: tuple[int, ...] = (),
              effective: int | None = None) -> str:
    """A run folder whose metrics.jsonl evaluates at every step (step 0 = the start); ``effective``: the
    effective groups each step logs (None: none logged)."""
    folder.mkdir(parents=True)
    recs = []
    for i, a in enumerate(accs):
        r = {"step": i, "cum_rollouts": i * per_step, "cum_tokens": 5 * i * per_step, "eval/greedy_acc": a}
        if i:
            r.update(rollouts=per_step, update_skipped=float(i in skipped), nonfinite=0.0)
            if effective is not None:
                r["effective_groups"] = effective
        recs.append(r)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(folder)


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, dict[int, str]]:
    # grpo: start 0.2, end (mean of the last three) 0.4 in every seed -> target 0.2 + 0.8 * 0.2 = 0.36
    grpo = {0: [0.2, 0.25, 0.3, 0.35, 0.4, 0.4, 0.4], 1: [0.2, 0.3, 0.3, 0.4, 0.4, 0.4, 0.4],
            2: [0.2, 0.2, 0.3, 0.3, 0.4, 0.4, 0.4]}
    fast = {0: [0.2, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4], 1: [0.2, 0.38, 0.4, 0.4, 0.4, 0.4, 0.4],
            2: [0.2, 0.36, 0.4, 0.4, 0.4, 0.4, 0.4]}
    # two seeds of three never reach the target: the median is "never", and the runs are counted, not dropped
    stuck = {0: [0.2, 0.3, 0.4, 0.4, 0.4, 0.4, 0.4], 1: [0.2, 0.2, 0.2, 0.3, 0.3, 0.3, 0.3],
             2: [0.2, 0.25, 0.3, 0.3, 0.3, 0.35, 0.35]}
    return {a: {s: write_run(tmp_path / "runs" / f"{a}-s{s}", accs, skipped=(1,) if a == "stuck" else ())
                for s, accs in by_seed.items()}
            for a, by_seed in (("grpo", grpo), ("fast", fast), ("stuck", stuck))}


def test_rollouts_to_target_with_never_counted(runs: dict, tmp_path: Path) -> None:
    evaluation = {a: {str(s): {"greedy_acc": 0.5, "pass_at_8": 0.75} for s in by_seed} for a, by_seed in runs.items()}
    res = write_report.fn(runs, evaluation, str(tmp_path / "reports"))
    assert res["target"]["reference"] == "grpo" and res["target"]["target"] == pytest.approx(0.36)
    m = res["allocators"]
    assert m["grpo"]["reached"] == 3 and m["fast"]["reached"] == 3 and m["stuck"]["reached"] == 1
    # grpo reaches 0.36 between evaluations: at 320 (seed 0), 260 (seed 1), 360 (seed 2)
    assert m["grpo"]["rollouts_to_target"]["median"] == pytest.approx(320.0)
    assert m["fast"]["rollouts_to_target"]["median"] == pytest.approx(100 * 0.16 / 0.18)  # 80, 88.9, 100
    assert m["fast"]["rollouts_to_target"]["hi"] < m["grpo"]["rollouts_to_target"]["lo"]
    assert m["stuck"]["rollouts_to_target"]["median"] is None and m["stuck"]["rollouts_to_target"]["finite"] == 1
    assert m["stuck"]["updates"] == 5 and m["grpo"]["updates"] == 6 and m["grpo"]["rollouts"] == 600
    assert m["fast"]["pass_at_k"] == 0.75 and m["fast"]["final_greedy_acc"] == 0.5  # the evaluate stage's figures
    table = (tmp_path / "reports/comparison.md").read_text()
    assert "| stuck | 3 | 1/3 | never [" in table and "never reached (median)" in table
    assert "| fast | 3 | 3/3 | 89 [" in table and "(fewer, intervals disjoint)" in table
    assert "| grpo | 3 | 3/3 | 320 [" in table and "| reference |" in table and "pass_at_8" in table
    csv = (tmp_path / "reports/curves.csv").read_text().splitlines()
    assert csv[0] == "allocator,seed,step,cum_rollouts,cum_tokens,greedy_acc" and len(csv) == 1 + 9 * 7
    for png in ("accuracy_vs_rollouts.png", "accuracy_vs_tokens.png"):
        assert (tmp_path / "reports" / png).read_bytes()[:4] == b"\x89PNG"


def test_same_runs_same_files(runs: dict, tmp_path: Path) -> None:
    write_report.fn(runs, {}, str(tmp_path / "a"))
    write_report.fn(runs, {}, str(tmp_path / "b"))
    for name in ("comparison.md", "metrics.json", "curves.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_no_gain_is_said_and_no_grpo_uses_the_first(runs: dict, tmp_path: Path) -> None:
    flat = {s: write_run(tmp_path / "flat" / str(s), [0.3] * 5) for s in (0, 1)}
    res = write_report.fn({"dapo": flat, "fast": runs["fast"]}, {}, str(tmp_path / "r"))
    assert res["target"]["reference"] == "dapo" and res["target"]["gain"] == 0.0
    assert "did not gain over the budget" in (tmp_path / "r/comparison.md").read_text()


def test_rollouts_per_effective_group_is_reported_where_runs_log_groups(runs: dict, tmp_path: Path) -> None:
    # 100 rollouts a step: 4 effective groups (25 each) in one allocator's runs, 10 (10 each) in the other's
    four = {s: write_run(tmp_path / "four" / str(s), [0.2, 0.3, 0.4, 0.4], effective=4) for s in (0, 1)}
    ten = {s: write_run(tmp_path / "ten" / str(s), [0.2, 0.3, 0.4, 0.4], effective=10) for s in (0, 1)}
    res = write_report.fn({"grpo": four, "sara": ten, "stuck": runs["stuck"]}, {}, str(tmp_path / "r"))
    m = res["allocators"]
    assert m["grpo"]["rollouts_per_effective_group"] == pytest.approx(25.0)
    assert m["sara"]["rollouts_per_effective_group"] == pytest.approx(10.0)
    assert m["stuck"]["rollouts_per_effective_group"] is None  # its runs log no groups
    table = (tmp_path / "r/comparison.md").read_text()
    assert "| rollouts / eff. group |" in table and "| 25.0 |" in table and "| 10.0 |" in table
    assert table.splitlines()[-1].split(" | ")[-2] == "-"  # stuck: no groups logged, not "never"


def test_accuracy_is_compared_at_the_budget_every_run_reached(runs: dict, tmp_path: Path) -> None:
    """A run whose steps are larger ends past the budget (640 against 600 rollouts): its final accuracy was bought
    with more rollouts, so the report also gives each allocator's fitted accuracy at 600, the budget all reached."""
    big = {s: write_run(tmp_path / "big" / str(s), [0.2, 0.3, 0.3, 0.4, 0.5], per_step=160) for s in (0, 1)}
    res = write_report.fn({"grpo": runs["grpo"], "big": big}, {}, str(tmp_path / "r"))
    m = res["allocators"]
    assert m["grpo"]["greedy_acc_at_common_budget"] == pytest.approx(0.4)
    # big's isotonic fit runs 0.4 at 480 rollouts to 0.5 at 640: at 600, 0.4 + 0.1 x 120 / 160
    assert m["big"]["greedy_acc_at_common_budget"] == pytest.approx(0.475)
    table = (tmp_path / "r/comparison.md").read_text()
    assert "Runs spend 600 to 640 rollouts" in table and "| acc @ 600 |" in table and "| 0.475 |" in table


def test_the_report_never_writes_through_a_planted_link(runs: dict, tmp_path: Path) -> None:
    """A report folder holding links at the report's names (a shared results folder): each is replaced by the
    report's file, and what it pointed at is unchanged."""
    out, victim = tmp_path / "linked", tmp_path / "victim"
    victim.write_text("root's secret\n")
    out.mkdir()
    names = ("curves.csv", "accuracy_vs_rollouts.png", "accuracy_vs_tokens.png", "comparison.md", "metrics.json")
    for name in names:
        (out / name).symlink_to(victim)
    write_report.fn(runs, {}, str(out))
    write_report.fn(runs, {}, str(tmp_path / "plain"))
    assert victim.read_text() == "root's secret\n"
    for name in names:
        assert not (out / name).is_symlink() and (out / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_digests_are_never_written_through_a_planted_link(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    from rlvr_core.data.disk import DIGESTS, save_splits

    out, victim = tmp_path / "data", tmp_path / "victim"
    victim.write_text("root's secret\n")
    out.mkdir()
    (out / f"{DIGESTS}.tmp").symlink_to(victim)  # the fixed temporary name it used to write
    save_splits(DatasetDict({"train": Dataset.from_dict({"prompt": ["a", "b"]})}), out)
    assert victim.read_text() == "root's secret\n" and set(json.loads((out / DIGESTS).read_text())) == {"train"}
