"""The advisor's size caps (rlvr_core.advise.logs.Limits, docs/advisor.md "Size limits"; issue #40): a log past
its row, decoded-byte or line cap is refused before its data is decoded, with its size, the cap and the flag
that raises it; running out of memory is said as such, not as an unreadable file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr_core.advise import Limits, LogError, LogTooLarge, load_log
from rlvr_core.advise.logs import DEFAULT_MAX_ROWS, parse_size
from rlvr_core.advise.report import main

ROOT = Path(__file__).resolve().parents[1]


def constant_parquet(path: Path, rows: int, group: int = 1_000_000) -> Path:
    """A per-(step, prompt) log of ``rows`` identical rows: a few KB on disk per million rows (each column is one
    run of one dictionary value), ``rows`` x 4 x 8 bytes once decoded."""
    n = min(rows, group)
    table = pa.table({"step": pa.array(np.ones(n, np.int64)), "prompt_id": pa.array(np.zeros(n, np.int64)),
                      "rollouts": pa.array(np.full(n, 8, np.int64)), "passes": pa.array(np.full(n, 3, np.int64))})
    with pq.ParquetWriter(path, table.schema, compression="zstd") as w:
        for start in range(0, rows, n):
            w.write_table(table.slice(0, min(n, rows - start)), row_group_size=n)
    return path


def small_log(steps: int = 3, prompts: int = 5, n: int = 4) -> pd.DataFrame:
    """Per-completion rows: ``steps x prompts x n`` of them, half passing."""
    return pd.DataFrame([{"step": t, "prompt_id": f"q{t}-{j}", "reward": float(i % 2), "tokens": 10}
                         for t in range(1, steps + 1) for j in range(prompts) for i in range(n)])


@pytest.fixture(scope="module")
def thirty_million(tmp_path_factory) -> Path:
    """The issue's file: ~0.5 MB on disk, 30M rows (before the caps: 3 minutes and 6.4 GB RSS to an answer)."""
    return constant_parquet(tmp_path_factory.mktemp("big") / "thirty.parquet", 30_000_000)


@pytest.fixture
def no_data_pages(monkeypatch):
    """Fail the test if any parquet data is decoded (the refusal must come from the footer alone)."""
    def refuse(*a, **kw):
        raise AssertionError("parquet data was decoded before the cap was checked")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", refuse)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", refuse)
    monkeypatch.setattr(pq.ParquetFile, "read", refuse)
    monkeypatch.setattr(pq, "read_table", refuse)


def test_a_parquet_that_expands_past_the_row_cap_is_refused_from_its_footer(tmp_path, no_data_pages):
    path = constant_parquet(tmp_path / "big.parquet", 2_000_000)
    assert path.stat().st_size < 200_000  # small on disk, 64 MB of int64 once decoded
    t = time.perf_counter()
    with pytest.raises(LogTooLarge) as e:
        load_log(path, Limits(max_rows=1_000_000))
    assert time.perf_counter() - t < 5
    msg = str(e.value)
    assert msg.startswith(f"{path}: 2,000,000 rows, 61.0 MiB decoded, from ")
    assert "past the advisor's cap of 1,000,000 rows; raise the cap with --max-rows 2000000" in msg


def test_the_default_cap_refuses_a_half_megabyte_parquet_of_thirty_million_rows(thirty_million, no_data_pages):
    path = thirty_million
    assert path.stat().st_size < 1_000_000
    t = time.perf_counter()
    with pytest.raises(LogTooLarge, match=rf"30,000,000 rows, .* past the advisor's cap of {DEFAULT_MAX_ROWS:,} "
                       r"rows; raise the cap with --max-rows 30000000"):
        load_log(path)
    assert time.perf_counter() - t < 5


def test_a_parquet_whose_strings_decode_past_the_byte_cap_is_refused(tmp_path, no_data_pages):
    """A 1 GB prompt_id in small: a 40 MB string compresses to a few KB; its decoded size is in the footer."""
    log = pd.DataFrame({"step": [1, 2], "prompt_id": ["a" * (40 * 2**20)] * 2, "rollouts": [8, 8], "passes": [1, 2]})
    log.to_parquet(tmp_path / "wide.parquet", compression="zstd")
    assert (tmp_path / "wide.parquet").stat().st_size < 2**20
    with pytest.raises(LogTooLarge, match=r"wide\.parquet: 2 rows, 40\.0 MiB decoded, .* past the advisor's cap of "
                       r"10\.0 MiB decoded; raise the cap with --max-bytes 40\.1MiB"):
        load_log(tmp_path / "wide.parquet", Limits(max_bytes=10 * 2**20))


def test_only_the_advisors_columns_count_and_are_read(tmp_path):
    log = pd.DataFrame({"step": [1, 1, 2], "prompt_id": ["b", "a", "b"], "rollouts": [8, 8, 4], "passes": [0, 8, 2],
                        "completion": ["x" * 2**20, "y" * 2**20, "z" * 2**20]})
    log.to_parquet(tmp_path / "r.parquet")
    got = load_log(tmp_path / "r.parquet", Limits(max_bytes=2**20))  # 3 MiB of completions, unread
    assert list(got.columns) == ["step", "prompt_id", "rollouts", "passes"]
    assert got[["step", "prompt_id"]].values.tolist() == [[1, 0], [1, 1], [2, 0]]  # strings numbered as they come
    log.assign(prompt_id=["7", "3", "7"]).to_parquet(tmp_path / "n.parquet")
    assert load_log(tmp_path / "n.parquet")["prompt_id"].tolist() == [3, 7, 7]  # numeric strings are kept


def test_a_footer_that_understates_is_caught_while_reading(tmp_path, monkeypatch):
    from rlvr_core.advise import logs

    path = constant_parquet(tmp_path / "lies.parquet", 300_000, group=100_000)
    monkeypatch.setattr(logs, "_parquet_decoded_bytes", lambda meta, cols: 0)
    with pytest.raises(LogTooLarge, match=r"its footer understates its size: 200,000 rows, 6\.\d MiB decoded by row "
                       r"group 2 of 3"):
        load_log(path, Limits(max_bytes=4 * 2**20))


def test_out_of_memory_is_not_called_an_unreadable_file(tmp_path, monkeypatch):
    path = constant_parquet(tmp_path / "r.parquet", 10)

    def oom(*a, **kw):
        raise pa.lib.ArrowMemoryError("malloc of size 8589934592 failed")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", oom)
    with pytest.raises(LogTooLarge) as e:
        load_log(path)
    assert "ran out of memory while reading the log (10 rows, " in str(e.value)
    assert "ArrowMemoryError" in str(e.value) and "not a readable" not in str(e.value)


def test_a_csv_past_the_row_cap_is_refused_and_one_within_it_is_read(tmp_path):
    small_log().to_csv(tmp_path / "log.csv", index=False)  # 60 rows
    with pytest.raises(LogTooLarge, match=r"log\.csv: more than 50 rows \(60 lines after the header\), past the "
                       r"advisor's cap of 50 rows; raise the cap with --max-rows N"):
        load_log(tmp_path / "log.csv", Limits(max_rows=50))
    assert load_log(tmp_path / "log.csv", Limits(max_rows=60))["rollouts"].sum() == 60


def test_a_text_log_past_the_byte_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    small_log().to_csv(tmp_path / "log.csv", index=False)
    size = (tmp_path / "log.csv").stat().st_size
    monkeypatch.setattr(pd, "read_csv", lambda *a, **kw: pytest.fail("the CSV was parsed"))
    assert size > 500
    with pytest.raises(LogTooLarge, match=rf"log\.csv: {size} B, past the advisor's cap of 500 B decoded; raise the "
                       rf"cap with --max-bytes {size} "):
        load_log(tmp_path / "log.csv", Limits(max_bytes=500))


def test_a_jsonl_past_the_row_cap_is_refused(tmp_path):
    with open(tmp_path / "log.jsonl", "w") as f:
        for rec in small_log().to_dict("records"):
            f.write(json.dumps(rec) + "\n")
    with pytest.raises(LogTooLarge, match=r"log\.jsonl: more than 59 rows, past the advisor's cap of 59 rows"):
        load_log(tmp_path / "log.jsonl", Limits(max_rows=59))
    assert len(load_log(tmp_path / "log.jsonl", Limits(max_rows=60))) == 15


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_line_past_the_line_cap_is_refused_without_reading_it_whole(tmp_path, suffix):
    df = small_log(steps=2, prompts=1, n=2)
    df.loc[2, "prompt_id"] = "p" * (2 * 2**20)  # the third data row: a 2 MiB prompt_id
    path = tmp_path / f"log{suffix}"
    if suffix == ".csv":
        df.to_csv(path, index=False)
        line = 4
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in df.to_dict("records")))
        line = 3
    with pytest.raises(LogTooLarge, match=rf"log\{suffix}: line {line} is (2\.0 MiB|more than 1\.0 MiB) long, past "
                       r"the advisor's cap of 1\.0 MiB per line; raise the cap with --max-line-bytes SIZE"):
        load_log(path)
    assert len(load_log(path, Limits(max_line_bytes=4 * 2**20))) == 3


def test_parse_size_and_limits_refuse_nonsense():
    assert parse_size("4GiB") == 4 * 2**30 and parse_size("500MB") == 500 * 10**6 and parse_size("1.5k") == 1500
    assert parse_size(" 123 ") == 123
    for bad in ("", "GiB", "-1", "4 parsecs", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(ValueError, match="max_rows must be at least 1"):
        Limits(max_rows=0)
    assert issubclass(LogTooLarge, LogError)


def test_cli_refuses_in_one_line_and_its_flags_raise_the_caps(tmp_path, capsys):
    big = constant_parquet(tmp_path / "big.parquet", 2_000_000)
    assert main([str(big), "--max-rows", "1000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"rlvr-alloc advise: error: {big}: 2,000,000 rows, ")
    assert "raise the cap with --max-rows 2000000" in err
    small_log(steps=4, prompts=16).to_csv(tmp_path / "log.csv", index=False)  # 256 rows
    fast = ["--k", "4", "--batch", "8", "--seeds", "2", "--steps", "4", "--out", str(tmp_path / "out")]
    assert main([str(tmp_path / "log.csv"), "--max-rows", "255", *fast]) == 2
    assert "more than 255 rows" in capsys.readouterr().err
    assert main([str(tmp_path / "log.csv"), "--max-bytes", "100"]) == 2
    assert "--max-bytes" in capsys.readouterr().err
    assert main([str(tmp_path / "log.csv"), "--max-rows", "256", "--max-bytes", "1MiB", *fast]) == 0
    assert (tmp_path / "out" / "advice.json").is_file()
    assert main([str(tmp_path / "log.csv"), "--max-columns", "3"]) == 2  # step, prompt_id, reward, tokens
    err = capsys.readouterr().err
    assert "4 columns, past the advisor's cap of 3 columns; raise the cap with --max-columns N" in err
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "log.csv"), "--max-bytes", "lots"])
    assert e.value.code == 2 and "not a size: 'lots'" in capsys.readouterr().err


def test_rlvr_alloc_refuses_the_default_cap_in_seconds_with_no_traceback(thirty_million):
    path = thirty_million
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rlvr_core.cli", "advise", str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=360)
    assert time.perf_counter() - t < 30
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert "30,000,000 rows" in r.stderr and "--max-rows 30000000" in r.stderr


def verl_lines(path: Path, rows: int, extra) -> Path:
    """A verl rollout dump of ``rows`` samples over two steps; ``extra(i)``: the keys row i adds."""
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"input": f"q{i % 7}", "output": "answer", "score": float(i % 2), "step": 1 + i % 2,
                                **extra(i)}) + "\n")
    return path


def peak_mib(fn) -> tuple[object, float]:
    """``fn()``'s outcome (its value or the exception it raised) and the peak of Python's allocations during it."""
    tracemalloc.start()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the caller asserts on it
        out = e
    finally:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return out, peak


def test_a_jsonl_whose_every_line_adds_a_key_is_refused_at_the_column_cap(tmp_path):
    """Each new key used to be back-filled into every earlier row: a 1.3 MB dump took more than 8 GB. Now the
    1,001st distinct key is refused, naming its row and line, the cap and the flag, in bounded memory."""
    path = verl_lines(tmp_path / "1.jsonl", 3000, lambda i: {f"k{i}": 1})
    err, peak = peak_mib(lambda: load_log(path))
    assert isinstance(err, LogTooLarge), err
    assert re.search(r"1\.jsonl: row 997 \(line 997\) brings its distinct keys past 1,000 \(key 'k996'\), past the "
                     r"advisor's cap of 1,000 columns; raise the cap with --max-columns N", str(err)), err
    assert peak < 20, peak  # before: 3,000 x 3,000 back-filled cells, over 100 MiB
    assert len(load_log(path, Limits(max_columns=3005))) == 14  # raised, it is read (7 prompts x 2 steps)


def test_keys_the_advisor_does_not_read_are_not_built(tmp_path):
    """A dump within the column cap whose every line adds a text key (verl's reward extra infos): those keys are
    counted, never kept, so memory stays linear in the rows."""
    path = verl_lines(tmp_path / "1.jsonl", 4000, lambda i: {f"pred{i}": "x"})
    got, peak = peak_mib(lambda: load_log(path, Limits(max_columns=5000)))
    assert not isinstance(got, Exception), got
    assert got["rollouts"].sum() == 4000
    assert peak < 20, peak  # before: 4,000 x 4,000 cells back-filled and framed, over 150 MiB


def test_a_table_of_too_many_cells_is_refused_before_it_is_built(tmp_path):
    """A TRL log's every numeric column is a reward column by default, so its columns are built: rows x columns
    cells (8 bytes each) count against the decoded-byte cap."""
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"step": 1 + i % 2, "prompt": "q", "completion": "c", f"r{i % 50}": 0.0})
                            + "\n" for i in range(2000)))  # 50 reward columns, one set a row
    with pytest.raises(LogTooLarge, match=r"log\.jsonl: 2,000 rows x 53 columns read \(828\.1 KiB once built\), "
                       r"past the advisor's cap of 500\.0 KiB decoded; raise the cap with --max-bytes 828\.2KiB"):
        load_log(path, Limits(max_bytes=500 * 2**10))
    assert len(load_log(path, Limits(max_bytes=2**20))) == 2


BOMB_READER = """
import json, sys, tracemalloc
import pandas, pyarrow as pa, pyarrow.compute, pyarrow.parquet  # imported before the count starts
from rlvr_core.advise import Limits, LogTooLarge, load_log
tracemalloc.start()
try:
    load_log(sys.argv[1], Limits(max_bytes=16 * 2**20))
    out = {"error": None}
except LogTooLarge as e:
    out = {"error": str(e)}
out.update(python=tracemalloc.get_traced_memory()[1], arrow=pa.default_memory_pool().max_memory())
print(json.dumps(out))
"""


@pytest.mark.parametrize("conversation", [False, True])
def test_a_dictionary_encoded_parquet_bomb_is_refused_before_it_is_expanded(tmp_path, conversation):
    """TRL's completions_<step>.parquet whose completion repeats one long string: the footer counts it once (its
    dictionary), the rows decode to 3,000 copies. It is refused naming the cap, without expanding it, in a short
    message."""
    big = "x" * (64 * 2**10)
    n = 3000
    completion = [[{"role": "assistant", "content": big}]] * n if conversation else [big] * n
    table = pa.table({"step": np.arange(n) // 1500, "prompt": [f"q{i % 10}" for i in range(n)],
                      "completion": completion, "correct": np.ones(n)})
    path = tmp_path / "completions_00001.parquet"
    pq.write_table(table, path, use_dictionary=True, compression="zstd", dictionary_pagesize_limit=2**22)
    assert path.stat().st_size < 20_000  # 3,000 x 64 KiB = 188 MiB decoded
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", BOMB_READER, str(path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["error"], out  # before: read whole (188 MiB of Arrow memory), no refusal
    assert "decode to 187." in out["error"] and "by row 3,000 of 3,000" in out["error"]
    assert "past the advisor's cap of 16.0 MiB decoded; raise the cap with --max-bytes SIZE" in out["error"]
    assert len(out["error"]) < 1000 and "x" * 300 not in out["error"]
    assert out["arrow"] < 4 * 2**20 and out["python"] < 4 * 2**20, out  # before: 188 MiB of Arrow memory


def test_an_error_never_quotes_a_whole_value(tmp_path):
    rec = {"step": 1, "prompt": "q", "completion": "c", "correct": "y" * 2**19}
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({**rec, "step": 2, "correct": 1.0}) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(LogError, match=r"row 2 \(line 2\), column 'correct': not a number \(value 'yyy") as e:
        load_log(path, reward_columns=["correct"])
    assert len(str(e.value)) < 1000 and "(524,290 characters)" in str(e.value)
    path.write_text(json.dumps({"step": 1, "z" * 2**19: 1}) + "\n")
    with pytest.raises(LogError, match=r"missing column\(s\) \['prompt_id', 'reward'\]") as e:
        load_log(path)
    assert len(str(e.value)) < 1000
