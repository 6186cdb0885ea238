"""Hub math loaders on local fixtures in each source's exact format, and prompt templates."""

from __future__ import annotations

import glob
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from rlvr_core.data.hub import (
    COLUMNS,
    DATASETS,
    gsm8k_answer,
    last_boxed,
    load_aime2024,
    load_gsm8k,
    load_hub_dataset,
    load_math,
    load_math500,
    parse_level,
)
from rlvr_core.data.templates import INSTRUCTIONS, chat_messages, plain_prompt, render_prompt, render_prompts
from rlvr_core.data.validate import DataError
from rlvr_core.registry import UnknownNameError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hub"


@pytest.fixture()
def cache(tmp_path: Path) -> str:
    return str(tmp_path / "hf_cache")


def _check_schema(ds) -> None:
    assert tuple(ds.column_names) == COLUMNS
    ids = ds["id"]
    assert len(set(ids)) == len(ids)
    assert all(isinstance(a, str) and a for a in ds["answer"])
    assert all(isinstance(p, str) and p for p in ds["prompt"])


# ---------------------------------------------------------------- answer extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"$\boxed{16}$ is wrong; $\boxed{5}$", "5"),
        (r"roots $\boxed{\{1, 2\}}$", r"\{1, 2\}"),
        (r"answer is $\boxed 5$.", "5"),
        (r"is $\fbox{$\frac{4}{3}$}$", r"\frac{4}{3}"),
        (r"$\boxed{f(x) = {(x-1)}^{2}}$", "f(x) = {(x-1)}^{2}"),
        (r"\boxed{\text{(A)}} then \boxed{x^{2", r"\text{(A)}"),  # unclosed last box skipped
        (r"\boxed{}", None),
        ("no box here", None),
        (r"\boxedfoo{3}", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_gsm8k_answer_and_level() -> None:
    assert gsm8k_answer("1,200+170=<<1200+170=1370>>1,370\n#### 1,370") == "1370"
    assert gsm8k_answer("x\n#### $30,000.") == "30000"
    assert gsm8k_answer("no marker") is None
    assert [parse_level(x) for x in ("Level 3", "Level ?", 4, None)] == [3, 0, 4, 0]


# ---------------------------------------------------------------- loaders


def test_gsm8k_from_hub_layout_directory(cache: str) -> None:
    test = load_gsm8k(str(FIX / "gsm8k"), "test", cache_dir=cache)
    train = load_gsm8k(str(FIX / "gsm8k"), "train", cache_dir=cache)
    _check_schema(test)
    assert test["answer"] == ["26", "1370", "30000"]
    assert train["answer"] == ["7", "35"]
    assert set(test["id"]).isdisjoint(train["id"])
    assert test["difficulty"] == [0, 0, 0]
    assert test["source"] == ["gsm8k"] * 3
    assert test[0]["prompt"].startswith("A baker makes 12 loaves")


def test_math_file_with_tricky_boxes(cache: str) -> None:
    ds = load_math(str(FIX / "math" / "test.jsonl"), "test", cache_dir=cache)
    _check_schema(ds)
    assert ds["answer"] == [r"\frac{1}{2}", "5", r"\{1, 2\}", "5", r"\frac{4}{3}", "f(x) = {(x-1)}^{2}"]
    assert ds["difficulty"] == [1, 2, 3, 0, 4, 5]


def test_math_several_configs_concatenated(tmp_path: Path, cache: str) -> None:
    # EleutherAI/hendrycks_math style: one config (subject) per folder, described by a dataset card
    rows = [json.loads(line) for line in (FIX / "math" / "test.jsonl").read_text().splitlines()]
    card = ["---", "configs:"]
    for subject, part in (("algebra", rows[:2]), ("geometry", rows[2:3])):
        (tmp_path / subject).mkdir()
        (tmp_path / subject / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        card += [f"- config_name: {subject}", "  data_files:", "  - split: test", f"    path: {subject}/test.jsonl"]
    (tmp_path / "README.md").write_text("\n".join(card + ["---", ""]))
    ds = load_math(str(tmp_path), "test", config=["algebra", "geometry"], cache_dir=cache)
    assert len(ds) == 3 and len(set(ds["id"])) == 3
    assert ds["answer"] == [r"\frac{1}{2}", "5", r"\{1, 2\}"]


def test_math500_directory(cache: str) -> None:
    ds = load_math500(str(FIX / "math500"), cache_dir=cache)
    _check_schema(ds)
    assert ds["id"] == ["test/prealgebra/101.json", "test/geometry/202.json", "test/algebra/303.json"]
    assert ds["answer"] == [r"\frac{1}{4}", r"9\pi", "3"]
    assert ds["difficulty"] == [1, 2, 1]


def test_aime_both_formats_and_parquet(tmp_path: Path, cache: str) -> None:
    import pandas as pd

    h4 = load_aime2024(str(FIX / "aime2024_h4" / "train.jsonl"), cache_dir=cache)
    _check_schema(h4)
    assert h4["id"] == ["aime2024-60", "aime2024-61"]
    assert h4["answer"] == ["001", "204"]
    # Maxwell-Jia/AIME_2024 ships a parquet file with capitalised columns and an int Answer
    parquet = tmp_path / "aime_2024_problems.parquet"
    pd.read_json(FIX / "aime2024_maxwell" / "aime_2024_problems.jsonl", lines=True).to_parquet(parquet)
    mj = load_aime2024(str(parquet), cache_dir=cache)
    _check_schema(mj)
    assert mj["id"] == ["aime2024-2024-I-1", "aime2024-2024-II-4"]
    assert mj["answer"] == ["30", "400"]
    assert mj[0]["prompt"].startswith("Find the number of positive divisors")


def test_registry_entry_and_limit(cache: str) -> None:
    assert {"gsm8k", "math", "math500", "aime2024"} <= set(DATASETS.names())
    ds = load_hub_dataset("math", "test", str(FIX / "math" / "test.jsonl"), limit=2, cache_dir=cache)
    assert len(ds) == 2 and ds["answer"] == [r"\frac{1}{2}", "5"]
    with pytest.raises(UnknownNameError, match="valid names"):
        load_hub_dataset("gsm9k")


def test_wrong_format_errors_name_the_field(tmp_path: Path, cache: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "solution": "no answer field"}) + "\n")
    with pytest.raises(ValueError, match=r"gsm8k row 0: missing field 'answer'"):
        load_gsm8k(str(bad), cache_dir=cache)
    nobox = tmp_path / "nobox.jsonl"
    nobox.write_text(json.dumps({"problem": "p", "level": "Level 1", "type": "Algebra", "solution": "it is 3"}) + "\n")
    with pytest.raises(ValueError, match=r"math row 0.*no \\boxed"):
        load_math(str(nobox), cache_dir=cache)
    dup = tmp_path / "dup.jsonl"
    row = {"problem": "p", "solution": "s", "answer": "1", "subject": "A", "level": 1, "unique_id": "same"}
    dup.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="share id 'same'"):
        load_math500(str(dup), cache_dir=cache)
    with pytest.raises(ValueError, match="unsupported file type"):
        (tmp_path / "x.txt").write_text("hi")
        load_math500(str(tmp_path / "x.txt"), cache_dir=cache)


AIME_ROWS = [{"ID": "2024-I-1", "Problem": "p", "Solution": "s", "Answer": 30},
             {"ID": "2024-I-2", "Problem": "q", "Solution": "s", "Answer": 5}]


@pytest.mark.parametrize("number, what", [
    ("9" * 4000, r"an int past 64 bits \(999999999999\.\.\.9999, 4,000 characters\)"),
    ("-9223372036854775809", r"an int past 64 bits \(-9223372036854775809\)"),
    ("1e999", r"a float past a float's range \(1e999\)"),
])
def test_a_number_no_column_holds_is_refused_naming_file_line_and_field(tmp_path: Path, cache: str, number: str,
                                                                        what: str) -> None:
    """A 4,000-digit int in a JSON Lines row raised OverflowError or ValueError ("Value is too big!") out of
    ``datasets``, or became the answer "inf"."""
    from rlvr_core.data.validate import DataError

    lines = [json.dumps(r) for r in AIME_ROWS]
    lines[1] = lines[1].replace('"Answer": 5', f'"Answer": {number}')
    path = tmp_path / "aime.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"^{path}: line 2: field 'Answer' is {what}; no column holds it: write it "
                                        "as a string or remove it$"):
        load_hub_dataset("aime2024", path_or_name=str(path), cache_dir=cache)
    # a file that is one JSON document names the row; a nested field its key path; a folder each file
    doc = tmp_path / "doc" / "train.json"
    doc.parent.mkdir()
    doc.write_text(json.dumps([AIME_ROWS[0], {**AIME_ROWS[1], "meta": {"n": [1, 2]}}], indent=2)
                   .replace('"n": [\n        1', f'"n": [\n        {number}'))
    with pytest.raises(DataError, match=rf"^{doc}: row 1: field 'meta\.n\[0\]' is {what}"):
        load_aime2024(str(doc), cache_dir=cache)
    with pytest.raises(DataError, match=rf"^{doc}: row 1: field 'meta\.n\[0\]'"):
        load_aime2024(str(doc.parent), cache_dir=cache)


def test_json_files_with_numbers_that_fit_still_load(tmp_path: Path, cache: str) -> None:
    path = tmp_path / "aime.jsonl"
    path.write_text("".join(json.dumps({**r, "Answer": v}) + "\n"
                            for r, v in zip(AIME_ROWS, (2**63 - 1, -(2**63)))))
    assert load_aime2024(str(path), cache_dir=cache)["answer"] == [str(2**63 - 1), str(-(2**63))]
    floats = tmp_path / "floats.jsonl"
    floats.write_text("".join(json.dumps({**r, "Answer": v}) + "\n" for r, v in zip(AIME_ROWS, (1.5e308, 0.5))))
    assert load_aime2024(str(floats), cache_dir=cache)["answer"] == ["1.5e+308", "0.5"]
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps(AIME_ROWS, indent=2))
    assert load_aime2024(str(doc), cache_dir=cache)["answer"] == ["30", "5"]


# ---------------------------------------------------------------- templates


def _chat_tokenizer(template: str | None):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    if template is not None:
        fast.chat_template = template
    return fast


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_plain_template() -> None:
    text = plain_prompt("  What is 2+2? ")
    assert text == f"Question: What is 2+2?\n{INSTRUCTIONS['math']}\nAnswer:"
    assert "\\boxed{}" in text
    assert render_prompt("What is 2+2?", None) == text
    assert render_prompt("What is 2+2?", _chat_tokenizer(None)) == text  # no chat template -> plain
    assert "```python" in plain_prompt("Read n, print n+1.", task="code")
    with pytest.raises(ValueError, match="non-empty"):
        plain_prompt("  ")
    with pytest.raises(ValueError, match="no default instruction"):
        plain_prompt("x", task="poetry")


def test_chat_template_applied() -> None:
    tok = _chat_tokenizer(CHAT_TEMPLATE)
    text = render_prompt("What is 2+2?", tok, system="Be brief.")
    assert text == (
        "<|system|>Be brief.<|end|>"
        f"<|user|>What is 2+2?\n\n{INSTRUCTIONS['math']}<|end|>"
        "<|assistant|>"
    )
    assert chat_messages("q")[0]["role"] == "user"
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    out = render_prompts(rows, tok)
    assert len(out) == 2 and out[1].startswith("<|user|>b\n\n")
    with pytest.raises(ValueError, match="no 'prompt' field"):
        render_prompts([{"question": "a"}])


# --------------------------------------------------------------------------- LiveCodeBench


def test_livecodebench_release_files_in_the_hub_format(cache: str) -> None:
    from rlvr_core.data.hub import load_livecodebench
    from rlvr_core.rewards.code import parse_tests

    v1 = load_livecodebench(str(FIX / "livecodebench"), "test", cache_dir=cache)  # the folder: <split>.jsonl
    assert v1.num_rows == 4 and v1[0]["id"] == "livecodebench-abc901_a"
    assert v1[0]["prompt"] == "You are given two integers A and B. Print A+B."
    assert [r["difficulty"] for r in v1] == [1, 1, 2, 1]
    assert [r["testtype"] for r in v1] == ["stdin", "stdin", "stdin", "functional"]
    # private tests: compressed (rows 0, 2) and plain JSON (row 1) both come back as JSON lists
    assert json.loads(v1[0]["private_test_cases"]) == [{"input": "10 -4\n", "output": "6\n", "testtype": "stdin"},
                                                       {"input": "0 0\n", "output": "0\n", "testtype": "stdin"}]
    assert [t.input for t in parse_tests(v1[1])] == ["abc\n", "x\n"]
    v2 = load_livecodebench(str(FIX / "livecodebench" / "test2.jsonl"), "test2", limit=2, cache_dir=cache)
    assert [r["id"] for r in v2] == ["livecodebench-abc911_a", "livecodebench-1911A"]
    assert v2[1]["private_test_cases"] == "[]"


def test_livecodebench_test_cases_never_unpickle_objects() -> None:
    import base64
    import pickle
    import zlib

    from rlvr_core.data.hub import decode_test_cases

    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()
    assert decode_test_cases(packed) == tests == decode_test_cases(json.dumps(tests))
    hostile = base64.b64encode(zlib.compress(pickle.dumps(Path("/etc/passwd")))).decode()  # a class: refused
    with pytest.raises(ValueError, match=r"private_test_cases: neither JSON nor .*refused pathlib"):
        decode_test_cases(hostile)
    with pytest.raises(ValueError, match="neither JSON"):
        decode_test_cases("not json, not base64!")


def test_a_zlib_bomb_in_the_test_cases_is_refused_with_bounded_memory(cache: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1.36 MB private_test_cases field took the process to 3.1 GB: it was decompressed without a cap.
    Here the cap is 1 MiB and the bomb expands to 64 MiB (from 64 KB)."""
    import base64
    import pickle
    import tracemalloc
    import zlib

    from rlvr_core.data import hub
    from rlvr_core.data.validate import DataError

    monkeypatch.setattr(hub, "MAX_TEST_CASES_BYTES", 1 << 20, raising=False)
    payload = pickle.dumps(json.dumps([{"input": "1" * (64 << 20), "output": "", "testtype": "stdin"}]))
    bomb = base64.b64encode(zlib.compress(payload, 9)).decode()
    del payload
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"^private_test_cases: the compressed test cases expand past 1,048,576"):
            hub.decode_test_cases(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    rows = [json.loads(line) for line in (FIX / "livecodebench" / "test.jsonl").read_text().splitlines()]
    rows[1]["private_test_cases"] = bomb
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"livecodebench row 1: private_test_cases: the compressed test cases expand"):
        hub.load_livecodebench(str(tmp_path), "test", cache_dir=cache)
    small = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]  # under the cap: read as before
    assert hub.decode_test_cases(base64.b64encode(zlib.compress(pickle.dumps(json.dumps(small)))).decode()) == small
    truncated = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(small)))[:-6]).decode()
    with pytest.raises(ValueError, match=r"neither JSON nor base64/zlib/pickled JSON \(error: incomplete"):
        hub.decode_test_cases(truncated)


# ---------------------------------------------------------------- corrupt arrow files


def _flip_40_bytes_in_the_second_half(arrow: Path) -> None:
    raw = bytearray(arrow.read_bytes())
    for i in random.Random(0).sample(range(len(raw) // 2, len(raw)), 40):
        raw[i] ^= 0xFF
    arrow.write_bytes(bytes(raw))


def test_a_corrupt_arrow_file_of_the_datasets_cache_is_a_data_error(cache: str) -> None:
    """The split is mapped from the ``datasets`` cache: a corrupt cache file is named before a row is read."""
    first = load_gsm8k(str(FIX / "gsm8k"), "test", cache_dir=cache)
    cached = [Path(f) for f in glob.glob(f"{cache}/**/*test*.arrow", recursive=True)]
    assert len(cached) == 1 and first["answer"] == ["26", "1370", "30000"]
    _flip_40_bytes_in_the_second_half(cached[0])
    with pytest.raises(DataError, match=rf"^{re.escape(str(cached[0]))}: not a valid arrow file"):
        load_gsm8k(str(FIX / "gsm8k"), "test", cache_dir=cache)


def test_a_corrupt_arrow_file_in_a_local_directory_is_a_data_error(tmp_path: Path, cache: str) -> None:
    import datasets

    folder = tmp_path / "gsm8k"
    rows = [json.loads(line) for line in (FIX / "gsm8k" / "main" / "test.jsonl").read_text().splitlines()]
    datasets.Dataset.from_list(rows * 20).save_to_disk(str(tmp_path / "saved"))
    folder.mkdir()
    arrow = folder / "test.arrow"
    shutil.copy(next((tmp_path / "saved").glob("*.arrow")), arrow)
    assert load_gsm8k(str(folder), "test", cache_dir=cache)["answer"][:3] == ["26", "1370", "30000"]
    _flip_40_bytes_in_the_second_half(arrow)
    with pytest.raises(DataError, match=rf"^{re.escape(str(arrow))}: not a valid arrow file"):
        load_gsm8k(str(folder), "test", cache_dir=str(tmp_path / "cache2"))
