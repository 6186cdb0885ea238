"""The advisor on logs it cannot read well (issue #41): impossible token counts are refused naming file, row and
column; a parquet, a CSV and a JSONL of the same rows read alike (duplicate (step, prompt) rows summed); a log with
one rollout per group, or with no mixed group at all, is warned about instead of advised on; the output goes
outside the DVC pipeline's dependencies by default (docs/advisor.md)."""

from __future__ import annotations

import json
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
        path.write_text("".join(json.dumps(r).replace("Infinity", "1e999") + "\n" for r in df.to_dict("records")))
        where = "row 6"
    with pytest.raises(LogError, match=rf"log\{suffix}: {where}, column 'tokens': {what}"):
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
