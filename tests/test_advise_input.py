"""The advisor on logs it cannot read well (issue #41): impossible token counts are refused naming file, row and
column; a parquet, a CSV and a JSONL of the same rows read alike (duplicate (step, prompt) rows summed); a log with
one rollout per group, or with no mixed group at all, is warned about instead of advised on; the output goes
outside the DVC pipeline's dependencies by default (docs/advisor.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlvr_core.advise import LogError, load_log
from rlvr_core.advise.logs import MAX_TOKENS_PER_COMPLETION

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--k", "4", "--batch", "8", "--seeds", "2", "--steps", "4"]


def completions(steps: int = 4, prompts: int = 8, n: int = 4, seed: int = 0) -> pd.DataFrame:
    """Per-completion rows, pass rates ~ Beta(0.5, 1), tokens longer for a fail."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(1, steps + 1):
        p = rng.beta(0.5, 1.0, prompts)
        for j in range(prompts):
            for x in (rng.random(n) < p[j]).astype(float):
                rows.append({"step": t, "prompt_id": j, "reward": x, "tokens": int(10 + 20 * (1 - x))})
    return pd.DataFrame(rows)


def write_jsonl(df: pd.DataFrame, path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in df.to_dict("records")))
    return path


@pytest.mark.parametrize("value,what", [
    (1e30, "more than 10,000,000 tokens per completion"),
    (MAX_TOKENS_PER_COMPLETION + 1, "more than 10,000,000 tokens per completion"),
    (-3, "negative token count"),
    (2.5, "not a whole number"),
    (float("inf"), "not a finite number"),
])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_impossible_token_counts_in_a_text_log_are_refused_with_file_row_and_column(tmp_path, suffix, value, what):
    df = completions(steps=2, prompts=2)
    df["tokens"] = df["tokens"].astype(object)
    df.loc[5, "tokens"] = value
    path = tmp_path / f"log{suffix}"
    if suffix == ".csv":
        df.to_csv(path, index=False)
        where = r"row 6 \(line 7\)"
    else:
        lines = [json.dumps(r).replace("Infinity", "1e999") + "\n" for r in df.to_dict("records")]
        path.write_text("".join(lines[:2]) + "\n\n" + "".join(lines[2:]))  # two blank lines: row 6 is line 8
        where = r"row 6 \(line 8\)"
    with pytest.raises(LogError, match=rf"log\{suffix}: {where}, column 'tokens': {what}"):
        load_log(path)


def _with_huge_integer(tmp_path: Path, suffix: str, column: str) -> tuple[Path, pd.DataFrame]:
    df = completions(steps=2, prompts=2)
    df[column] = df[column].astype(object)
    df.loc[3, column] = 10**4000  # pd.to_numeric raised OverflowError: int too large to convert to float
    path = tmp_path / f"log{suffix}"
    if suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        write_jsonl(df, path)
    return path, df


@pytest.mark.parametrize("column", ["tokens", "reward", "step"])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_an_integer_past_a_float_is_refused_naming_row_and_column(tmp_path: Path, suffix: str, column: str) -> None:
    path, _ = _with_huge_integer(tmp_path, suffix, column)
    with pytest.raises(LogError, match=rf"log\{suffix}: row 4.*column '{column}': not a finite number"):
        load_log(path)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_prompt_id_past_a_float_is_a_label_like_any_other(tmp_path: Path, suffix: str) -> None:
    path, df = _with_huge_integer(tmp_path, suffix, "prompt_id")
    got = load_log(path)  # the ids are factorized as text: one prompt more than the two the other rows name
    assert int(got["rollouts"].sum()) == len(df) and got.groupby("step")["prompt_id"].nunique().max() == 3


@pytest.mark.parametrize("reader, value", [
    *[(r, v) for r in ("jsonl", "csv", "verl", "trl") for v in (2**53 + 2, 2**63, 2**64 + 1, 10**300, 1e300)],
    ("parquet", 2**53 + 2), ("parquet", 2**63),  # a parquet column holds 64-bit integers
])
def test_a_step_that_int64_would_wrap_is_refused_naming_row_and_column(tmp_path: Path, reader: str, value) -> None:
    """A step from 2**63 to about 1e308 used to wrap silently to -2**63 (from 2**53, float64 rounds two steps into
    one): every reader refuses it, naming the row (and line) and the column."""
    rows = completions(steps=2, prompts=2, n=2).to_dict("records")
    rows[2]["step"] = value
    if reader == "parquet":
        df = pd.DataFrame(rows).groupby(["step", "prompt_id"], as_index=False).agg(
            rollouts=("reward", "size"), passes=("reward", "sum"))
        df["step"] = df["step"].astype(np.uint64)
        path = tmp_path / "log.parquet"
        df.to_parquet(path)
        row = int(np.flatnonzero(df["step"].to_numpy() == np.uint64(value))[0]) + 1
        where = rf"row {row}, column 'step'"
    elif reader == "csv":
        path = tmp_path / "log.csv"
        path.write_text("step,prompt_id,reward\n" + "".join(f"{r['step']},{r['prompt_id']},{r['reward']}\n"
                                                           for r in rows))
        where = r"row 3 \(line 4\), column 'step'"
    else:
        if reader == "verl":
            rows = [{"input": f"q{r['prompt_id']}", "output": "o", "score": r["reward"], "step": r["step"]}
                    for r in rows]
        elif reader == "trl":
            rows = [{"step": r["step"], "prompt": f"q{r['prompt_id']}", "completion": "c", "correct": r["reward"]}
                    for r in rows]
        path = tmp_path / "log.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        where = r"row 3 \(line 3\), column 'step'"
    with pytest.raises(LogError, match=rf"log\.{path.suffix[1:]}: {where}: a whole number past 2\*\*53"):
        load_log(path)


def test_a_prompt_id_past_2_53_is_a_label_not_rounded_into_another(tmp_path: Path) -> None:
    """64-bit hashed prompt keys: 2**63 + 1 and 2**63 + 2 are two prompts (float64 would make them one, int64
    would wrap them)."""
    rows = [{"step": t, "prompt_id": 2**63 + j, "reward": float(i)} for t in (1, 2) for j in (1, 2) for i in (0, 1)]
    got = load_log(write_jsonl(pd.DataFrame(rows), tmp_path / "log.jsonl"))
    assert len(got) == 4 and (got["rollouts"] == 2).all() and (got["prompt_id"] >= 0).all()


@pytest.mark.parametrize("reader", ["verl", "jsonl"])
def test_a_key_given_twice_in_one_object_is_refused_naming_row_and_key(tmp_path: Path, reader: str) -> None:
    """json keeps the last of two equal keys silently; which value the writer meant is unknown, so it is refused."""
    if reader == "verl":
        rec = [{"input": f"q{j}", "output": "o", "score": float(i), "step": t} for t in (1, 2) for j in (0, 1)
               for i in (0, 1)]
        lines = [json.dumps(r) for r in rec]
        lines[4] = lines[4][:-1] + ', "score": 0.0}'
        path = tmp_path / "rollouts"
        path.mkdir()
        (path / "1.jsonl").write_text("\n".join(lines) + "\n")
        where = r"1\.jsonl: row 5 \(line 5\): key 'score' given twice"
    else:
        lines = [json.dumps(r) for r in completions(steps=2, prompts=2, n=2).to_dict("records")]
        lines[1] = lines[1][:-1] + ', "step": 7}'
        path = tmp_path / "log.jsonl"
        path.write_text("\n\n".join(lines) + "\n")  # blank lines between: row 2 is line 3
        where = r"log\.jsonl: row 2 \(line 3\): key 'step' given twice"
    with pytest.raises(LogError, match=where):
        load_log(path)


@pytest.mark.parametrize("tokens,what", [
    ([80, -1, 30], r"row 2, column 'tokens': negative token count \(value -1"),
    ([80.0, 1e30, 30.0], r"row 2, column 'tokens': more than 10,000,000 tokens per completion \(value 1e\+30"),
    ([80, 2**62, 30], r"row 2, column 'tokens': more than 10,000,000 tokens per completion"),
    ([80.0, 40.5, 30.0], r"row 2, column 'tokens': not a whole number"),
])
def test_impossible_token_counts_in_a_parquet_log_are_refused(tmp_path, tokens, what):
    log = pd.DataFrame({"step": [1, 1, 2], "prompt_id": [3, 7, 3], "rollouts": [8, 8, 4], "passes": [0, 8, 2],
                        "tokens": tokens})
    log.to_parquet(tmp_path / "r.parquet")
    with pytest.raises(LogError, match=r"r\.parquet: " + what):
        load_log(tmp_path / "r.parquet")


def test_the_token_cap_is_per_rollout_of_a_parquet_row(tmp_path):
    cap = MAX_TOKENS_PER_COMPLETION
    log = pd.DataFrame({"step": [1, 2], "prompt_id": [0, 0], "rollouts": [8, 1], "passes": [4, 1],
                        "tokens": [8 * cap, cap]})
    log.to_parquet(tmp_path / "r.parquet")
    assert load_log(tmp_path / "r.parquet")["tokens"].tolist() == [8 * cap, cap]
    log.loc[0, "tokens"] = 8 * cap + 1
    log.to_parquet(tmp_path / "r.parquet")
    with pytest.raises(LogError, match=r"row 1, column 'tokens': more than 10,000,000 tokens per completion"):
        load_log(tmp_path / "r.parquet")


def same_rows_three_ways(tmp_path: Path) -> list[Path]:
    """One run's completions as a CSV, a JSONL and a parquet whose groups are split into two rows each (as a log
    concatenated from two ranks holds them), the parquet's rows shuffled."""
    df = completions(steps=4, prompts=8)
    for d in ("csv", "jsonl", "parquet"):  # a folder each, so that each log's advice/ is its own
        (tmp_path / d).mkdir()
    csv = tmp_path / "csv" / "log.csv"
    df.to_csv(csv, index=False)
    jsonl = write_jsonl(df, tmp_path / "jsonl" / "log.jsonl")
    half = np.arange(len(df)) % 4 < 2  # each group of 4 completions: 2 in one row, 2 in another
    parts = [d.assign(passes=(d["reward"] > 0).astype(int), rollouts=1).groupby(["step", "prompt_id"],
             as_index=False).agg(rollouts=("rollouts", "sum"), passes=("passes", "sum"),
                                 reward_sum=("reward", "sum"), tokens=("tokens", "sum")) for d in (df[half], df[~half])]
    rows = pd.concat(parts).sample(frac=1.0, random_state=0)
    assert rows.duplicated(["step", "prompt_id"]).sum() == 32
    pq = tmp_path / "parquet" / "log.parquet"
    rows.to_parquet(pq, index=False)
    return [csv, jsonl, pq]


def test_a_parquet_a_csv_and_a_jsonl_of_the_same_rows_give_the_same_advice(tmp_path):
    from rlvr_core.advise.report import main

    logs = same_rows_three_ways(tmp_path)
    frames = [load_log(p) for p in logs]
    for f in frames[1:]:
        pd.testing.assert_frame_equal(f, frames[0])
    assert len(frames[0]) == 32 and (frames[0]["rollouts"] == 4).all()  # duplicates summed: 4 rollouts a group
    advice = []
    for p in logs:
        assert main([str(p), *FAST, "--out", str(p.parent / "out")]) == 0
        data = json.loads((p.parent / "out" / "advice.json").read_text())
        assert data.pop("log") == str(p)
        advice.append(data)
    assert advice[1] == advice[0] and advice[2] == advice[0]


def strict_json(path: Path) -> dict:
    """advice.json, refusing NaN and Infinity (not JSON: a strict reader such as jq or JavaScript rejects them)."""
    def refuse(name):
        raise AssertionError(f"{path} holds {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def advise_cli(path: Path, capsys) -> tuple[str, str, dict]:
    from rlvr_core.advise.report import main

    assert main([str(path), *FAST, "--out", str(path.parent / "out")]) == 0
    out, err = capsys.readouterr()
    return out, err, strict_json(path.parent / "out" / "advice.json")


def test_a_log_with_one_rollout_per_group_is_warned_about_not_advised_on(tmp_path, capsys):
    """The issue's 3M-row CSV in small: 40 steps x 100 fresh prompts, one completion each. Before: a flat Beta(1, 1)
    population whatever the log (the true one here is Beta(0.5, 1)), figures from it, and a recommendation."""
    df = completions(steps=40, prompts=100, n=1)
    df["prompt_id"] = df["step"] * 1000 + df["prompt_id"]
    df.to_csv(tmp_path / "one.csv", index=False)
    out, err, data = advise_cli(tmp_path / "one.csv", capsys)
    warning = "every one of the log's 4,000 (step, prompt) rows holds a single rollout"
    assert f"**Warning.** {warning}" in out and "cannot support the pass-rate estimate" in out
    assert warning in err  # on stderr too
    assert len(data["warnings"]) == 1 and data["warnings"][0].startswith(warning)
    assert data["recommendation"].startswith("no recommendation: a log with one rollout per (step, prompt) cannot "
                                             "support the pass-rate estimate")
    assert data["allocators"] == [] and data["floor_ratio_to_k"] is None
    for p in data["phases"]:  # what the log shows is kept; what it cannot support is n/a
        assert p["logged_group_size"] == 1 and 0.2 < p["pass_share"] < 0.5
        assert p["beta"] is p["zero_variance_at_k"] is p["floor_ratio_to_k"] is p["zero_variance_logged"] is None
    assert "%" not in out.split("## Every registered allocator", 1)[1]  # no saving printed
    assert "fewer rollouts" not in out and "floor leaves" not in out
    assert (tmp_path / "out" / "advice.png").stat().st_size > 1000


@pytest.mark.parametrize("reward,what", [(0.0, "failed"), (1.0, "passed")])
def test_an_all_fail_or_all_pass_log_says_there_is_no_effective_group_and_prints_no_saving(tmp_path, capsys, reward,
                                                                                           what):
    completions(steps=6, prompts=16).assign(reward=reward).to_csv(tmp_path / "flat.csv", index=False)
    out, err, data = advise_cli(tmp_path / "flat.csv", capsys)
    assert f"**Warning.** all 384 rollouts of the log {what}: no logged group had mixed rewards, so there is no " \
           "effective group to save on" in out
    assert data["recommendation"] == (f"no recommendation: there is no effective group to save on (every rollout "
                                      f"{what}), so no allocator was replayed and no saving is given")
    assert data["allocators"] == [] and len(data["warnings"]) == 1 and "no effective group" in err
    assert "%" not in out.split("## Every registered allocator", 1)[1] and "floor leaves" not in out
    assert [p["zero_variance_logged"] for p in data["phases"]] == [1.0, 1.0, 1.0]  # as logged
    assert all(p["floor_ratio_to_k"] is None for p in data["phases"])


def test_a_log_with_some_single_rollout_steps_is_advised_on_with_a_warning(tmp_path, capsys):
    df = completions(steps=6, prompts=16)
    df = df[(df["step"] > 2) | ~df.duplicated(["step", "prompt_id"])]  # steps 1 and 2: one completion a prompt
    df.to_csv(tmp_path / "mixed.csv", index=False)
    out, err, data = advise_cli(tmp_path / "mixed.csv", capsys)
    assert data["warnings"] == ["2 of 6 logged steps (1, 2) hold one rollout per (step, prompt) row: their pass-rate "
                                "spread cannot be estimated, and the replay takes a flat Beta(1, 1) population for "
                                "them"]
    assert f"**Warning.** {data['warnings'][0]}." in out and data["allocators"]
    assert not data["recommendation"].startswith("no recommendation")


def test_a_complete_log_has_no_warning(tmp_path, capsys):
    completions(steps=6, prompts=16).to_csv(tmp_path / "log.csv", index=False)
    out, err, data = advise_cli(tmp_path / "log.csv", capsys)
    assert data["warnings"] == [] and "**Warning.**" not in out and "warning" not in err


def test_a_seed_without_an_effective_group_makes_savings_and_the_recommendation_n_a():
    """Before: the seeds without an effective group were dropped from the saving ("sara+dps 45%" beside an n/a
    cost) and GRPO's infinite cost gave "the floor leaves at most 100%"."""
    from rlvr_core.advise.core import recommend, summarise
    from rlvr_core.advise.model import SimRun

    runs = {"grpo": [SimRun("grpo", 0, 800.0, 0.0, 2.0, 6), SimRun("grpo", 1, 800.0, 0.0, 0.0, 6)],
            "sara+dps": [SimRun("sara+dps", 0, 400.0, 0.0, 2.0, 6), SimRun("sara+dps", 1, 400.0, 0.0, 1.0, 6)]}
    table = summarise(runs, False, {})
    by = {a.name: a for a in table}
    assert by["sara+dps"].saving_vs_grpo is None and by["grpo"].saving_vs_grpo is None
    line = recommend(table, 300.0, 2)
    assert line.startswith("no recommendation: uniform GRPO met no effective group in some replay seed")
    assert "%" not in line


def test_the_default_output_goes_under_the_current_directory_not_beside_the_log(tmp_path, monkeypatch, capsys):
    """Before: runs/grpo-s0/advice/, inside `runs`, a dependency of the evaluate and report stages (dvc.yaml)."""
    from rlvr_core.advise.report import main

    run = tmp_path / "project" / "runs" / "grpo-s0"
    run.mkdir(parents=True)
    completions(steps=4, prompts=8).to_csv(run / "rollouts.csv", index=False)
    before = sorted(p.name for p in run.iterdir())
    monkeypatch.chdir(tmp_path / "project")
    assert main(["runs/grpo-s0/rollouts.csv", *FAST]) == 0
    out = tmp_path / "project" / "advice" / "grpo-s0-rollouts"
    assert sorted(p.name for p in out.iterdir()) == ["advice.json", "advice.md", "advice.png"]
    assert sorted(p.name for p in run.iterdir()) == before
    assert f"written: {Path('advice') / 'grpo-s0-rollouts' / 'advice.md'}" in capsys.readouterr().out
    for doc in ("README.md", "docs/advisor.md"):  # the docs say where it writes
        assert "advice/grpo-s0-rollouts/" in (ROOT / doc).read_text(), doc


def test_dvc_ignores_an_advice_folder_inside_a_run_folder(tmp_path):
    """An --out into a run folder (or an older advisor's default) stays out of the hash of `runs`."""
    shutil.copy(ROOT / ".dvcignore", tmp_path / ".dvcignore")
    dvc = str(Path(sys.executable).with_name("dvc"))
    subprocess.run([dvc, "init", "-q", "--no-scm"], cwd=tmp_path, check=True, timeout=360)
    r = subprocess.run([dvc, "check-ignore", "runs/grpo-s0/advice/advice.json", "runs/grpo-s0/rollouts.parquet"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=360)
    assert r.stdout.split() == ["runs/grpo-s0/advice/advice.json"], r.stdout + r.stderr


def test_advice_json_is_strict_json_when_a_figure_is_infinite(tmp_path):
    """An allocator that found no effective group costs infinitely many rollouts per group: n/a in the report,
    null in advice.json (before: Infinity, which strict JSON readers refuse)."""
    from rlvr_core.advise.core import Advice, AllocatorAdvice
    from rlvr_core.advise.report import render, write

    inf = float("inf")
    adv = Advice("log.csv", 10, 2, 4, 8, 2, 4, 10, None, [], 1.5, "class",
                 [AllocatorAdvice("grpo", (inf, inf, inf), None, None, None),
                  AllocatorAdvice("sara", (8.0, 7.0, 9.0), None, None, None)], recommendation="no recommendation")
    write(adv, tmp_path)
    data = strict_json(tmp_path / "advice.json")
    assert data["allocators"][0]["rollouts_per_effective_group"] == [None, None, None]
    assert "| grpo | n/a | n/a |" in render(adv)
