"""Issue 13 section 6: data that is wrong but used to pass, and dataset files that used to fail with a raw
error. Files are written in a temp dir exactly as the prepare stage writes them (``save_to_disk``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from rlvr_core.data.arithmetic import make_arithmetic
from rlvr_core.data.countdown import make_countdown
from rlvr_core.data.disk import save_splits
from rlvr_core.data.validate import DataError, check_consistent, validate_rows, validate_splits
from rlvr_core.tasks import get_task
from tasks.data import load_split

PROJECT = Path(__file__).resolve().parents[2]

datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def arith() -> datasets.DatasetDict:
    return make_arithmetic(60, 12, 0, digits=(1, 2, 3))


def _saved(ds: datasets.DatasetDict, path: Path) -> Path:
    ds.save_to_disk(str(path))
    return path


def _load_both(path: Path) -> None:
    tr, te = load_split(str(path), "train"), load_split(str(path), "test")
    validate_splits(tr, te, get_task("arithmetic"), source=str(path))


def _arrow(path: Path, split: str = "train") -> Path:
    return next((path / split).glob("*.arrow"))


# ----------------------------------------------------------------------------- rows that contradict themselves


def test_a_flipped_prompt_digit_in_the_arrow_file_is_refused(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(arith, tmp_path / "data")
    _load_both(path)  # intact: accepted
    row = arith["train"][4]
    prompt = row["prompt"].encode()
    flipped = prompt[:3] + (b"9" if prompt[3:4] != b"9" else b"8") + prompt[4:]
    raw = _arrow(path).read_bytes()
    assert raw.count(prompt) == 1
    _arrow(path).write_bytes(raw.replace(prompt, flipped))
    with pytest.raises(DataError, match=rf"{path}: train row 4 \('{row['id']}'\): field 'prompt' "
                                        rf"'{re.escape(flipped.decode())}' does not match its fields a={row['a']}"):
        _load_both(path)


def test_arithmetic_prompt_and_answer_must_agree_without_the_operand_fields() -> None:
    assert check_consistent({"prompt": "0377+0012=", "answer": "389"}, get_task("arithmetic")) is None
    assert "is not the value of the prompt '0379+0012=' (391)" in check_consistent(
        {"prompt": "0379+0012=", "answer": "389"}, get_task("arithmetic"))
    row = {"id": "r", "prompt": "0377+0012=", "a": 377, "op": "+", "b": 12, "difficulty": 3, "answer": "389"}
    assert check_consistent(row, get_task("arithmetic")) is None
    assert "'difficulty' 2" in check_consistent({**row, "difficulty": 2}, get_task("arithmetic"))
    assert "op='-'" in check_consistent({**row, "op": "-"}, get_task("arithmetic"))
    assert "not an arithmetic problem" in check_consistent({**row, "op": "/"}, get_task("arithmetic"))


def test_countdown_rows_agree_with_their_numbers_target_and_answer() -> None:
    ds = make_countdown(20, 5, 0)
    rows = list(ds["train"])
    validate_rows(rows, get_task("countdown"), "train")
    bad_prompt = [dict(r) for r in rows]
    bad_prompt[2]["prompt"] = bad_prompt[2]["prompt"].replace(">", ">1", 1)
    with pytest.raises(DataError, match=r"train row 2 .*field 'prompt' .* does not match its fields numbers="):
        validate_rows(bad_prompt, get_task("countdown"), "train")
    bad_answer = [dict(r) for r in rows]
    bad_answer[3]["answer"] = "+".join(map(str, bad_answer[3]["numbers"][:-1]))  # leaves a number out
    with pytest.raises(DataError, match=r"train row 3 .*field 'answer' .* does not use every number"):
        validate_rows(bad_answer, get_task("countdown"), "train")


@pytest.mark.parametrize("answer", ["--5", "-5", "+5", "05", "5 ", "\u0665", "1e3", "", "1" * 13])
def test_malformed_arithmetic_answers_are_refused(answer: str) -> None:
    row = {"id": "r0", "prompt": "1+1?", "answer": answer}
    with pytest.raises(DataError, match=r"train row 0 \('r0'\): field 'answer' must be a decimal integer"):
        validate_rows([row], get_task("arithmetic"), "train")


@pytest.mark.parametrize("answer", ["0", "5", "130", "99980001"])
def test_canonical_answers_pass(answer: str) -> None:
    validate_rows([{"id": "r0", "prompt": "1+1?", "answer": answer}], get_task("arithmetic"), "train")


# ----------------------------------------------------------------------------- unreadable dataset folders


def test_an_empty_split_is_named(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(datasets.DatasetDict({"train": arith["train"], "test": arith["test"].select([])}), tmp_path / "d")
    assert len(load_split(str(path), "train")) == 60
    with pytest.raises(DataError, match=rf"^{path / 'test'}: the 'test' split has 0 rows"):
        load_split(str(path), "test")


def test_a_missing_split_is_named(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(datasets.DatasetDict({"train": arith["train"]}), tmp_path / "d")
    with pytest.raises(DataError,
                       match=rf"^{path / 'dataset_dict.json'}: no 'test' split \(the dataset has \['train'\]\)"):
        load_split(str(path), "test")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'nowhere'}: no dataset"):
        load_split(str(tmp_path / "nowhere"), "train")


def test_a_truncated_arrow_file_is_named(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(arith, tmp_path / "d")
    raw = _arrow(path).read_bytes()
    _arrow(path).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=rf"^{_arrow(path)}: cannot be read as an arrow table, the file is truncated"):
        load_split(str(path), "train")
    _arrow(path).unlink()
    with pytest.raises(DataError, match=r"data-00000-of-00001\.arrow: missing \(listed in .*state\.json\)"):
        load_split(str(path), "train")


def test_non_utf8_text_in_the_arrow_file_names_the_row(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(arith, tmp_path / "d")
    prompt = arith["train"][7]["prompt"].encode()
    raw = _arrow(path).read_bytes()
    _arrow(path).write_bytes(raw.replace(prompt, b"\xff" + prompt[1:]))
    with pytest.raises(DataError, match=rf"^{_arrow(path)}: row 7 \(row 7 of the 'train' split\) cannot be read "
                                        r"\(UnicodeDecodeError"):
        load_split(str(path), "train")


@pytest.mark.parametrize("name", ["dataset_dict.json", "train/state.json", "train/dataset_info.json"])
@pytest.mark.parametrize("damage, message", [
    (lambda raw: b"\xfe" + raw, r"not UTF-8 text \(byte 0: b'\\xfe'\)"),
    (lambda raw: raw[: len(raw) // 2], r"not valid JSON \(.* at line \d+, column \d+\)"),
    (lambda raw: b"{bad", r"not valid JSON \(Expecting property name enclosed in double quotes at line 1, column 2\)"),
])
def test_bad_json_files_are_named(arith: datasets.DatasetDict, tmp_path: Path, name: str, damage: object,
                                  message: str) -> None:
    path = _saved(arith, tmp_path / "d")
    f = path / name
    f.write_bytes(damage(f.read_bytes()))  # type: ignore[operator]
    with pytest.raises(DataError, match=rf"^{f}: {message}"):
        load_split(str(path), "train")


def test_wrong_json_shapes_are_named(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(arith, tmp_path / "d")
    (path / "dataset_dict.json").write_text(json.dumps({"splits": "train"}))
    with pytest.raises(DataError, match=r"dataset_dict\.json: field 'splits' must be a list"):
        load_split(str(path), "train")
    shutil.rmtree(path)
    path = _saved(arith, tmp_path / "d")
    (path / "train/state.json").write_text(json.dumps({"_data_files": [{"name": 3}]}))
    with pytest.raises(DataError, match=r"train/state\.json: field '_data_files' must list the arrow files"):
        load_split(str(path), "train")


# ----------------------------------------------------------------------------- content digests

_READ = ("import sys\nfrom rlvr_core.data.disk import load_saved_split\n"
         "rows = load_saved_split(sys.argv[1], 'train')\nprint('read', len(rows), rows[4]['prompt'])\n")


def _read_in_a_child(path: Path) -> subprocess.CompletedProcess:
    """load_saved_split in a subprocess: a bit-flipped arrow file crashed the reading process with SIGSEGV."""
    return subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True, timeout=360,
                          cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)})


@pytest.mark.parametrize("where", ["a prompt", "the schema", "the middle"])
def test_a_bit_flipped_arrow_file_is_named_before_it_is_read(arith: datasets.DatasetDict, tmp_path: Path,
                                                             where: str) -> None:
    """The prepare stage's writer records each arrow file's sha256; a flipped byte is a DataError naming the file
    (rc 1), not a SIGSEGV (rc 139) or rows that silently changed."""
    path = tmp_path / "d"
    save_splits(arith, path)
    assert json.loads((path / "digests.json").read_text())["train"].keys() == {_arrow(path).name}
    ok = _read_in_a_child(path)
    assert ok.returncode == 0 and ok.stdout.startswith("read 60 "), ok.stderr[-2000:]
    raw = bytearray(_arrow(path).read_bytes())
    at = {"a prompt": raw.find(arith["train"][4]["prompt"].encode()), "the schema": raw.find(b"prompt"),
          "the middle": len(raw) // 2}[where]
    assert at >= 0
    raw[at] ^= 0x01
    _arrow(path).write_bytes(bytes(raw))
    bad = _read_in_a_child(path)
    assert bad.returncode == 1, (bad.returncode, bad.stdout, bad.stderr[-2000:])
    assert f"DataError: {_arrow(path)}: its content does not match the sha256 recorded in {path / 'digests.json'}" \
        in bad.stderr
    (path / "digests.json").write_text(json.dumps({"test": {}}))  # the digest file itself damaged: named too
    with pytest.raises(DataError, match=r"digests\.json: no digests for the 'train' split"):
        load_split(str(path), "train")
