"""Issue 13 section 6: data that is wrong but used to pass, and dataset files that used to fail with a raw
error. Files are written in a temp dir exactly as the prepare stage writes them (``save_to_disk``)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from rlvr_core.data import disk
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
    with pytest.raises(DataError, match=rf"^{_arrow(path)}: not a valid arrow file, it is truncated or corrupt "
                                        r"\(OSError: Expected to be able to read \d+ bytes for message body"):
        load_split(str(path), "train")
    _arrow(path).unlink()
    with pytest.raises(DataError, match=r"data-00000-of-00001\.arrow: missing \(listed in .*state\.json\)"):
        load_split(str(path), "train")


def test_non_utf8_text_in_the_arrow_file_names_the_row(arith: datasets.DatasetDict, tmp_path: Path) -> None:
    path = _saved(arith, tmp_path / "d")
    prompt = arith["train"][7]["prompt"].encode()
    raw = _arrow(path).read_bytes()
    _arrow(path).write_bytes(raw.replace(prompt, b"\xff" + prompt[1:]))
    with pytest.raises(DataError, match=rf"^{_arrow(path)}: not a valid arrow file, it is truncated or corrupt "
                                        r"\(record batch 0, rows 0 to 59: ArrowInvalid: In column 1: Invalid: Invalid "
                                        r"UTF8 sequence at string index 7\)"):
        load_split(str(path), "train")  # checked before it is read: the row is named by its batch and index


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


# ----------------------------------------------------------------------------- corrupt arrow files, digests or not


def _flip_40_bytes_in_the_second_half(arrow: Path) -> None:
    """40 bytes XORed at places drawn (seeded) from the file's second half: with these, load_saved_split
    died with SIGSEGV (rc 139 in a shell, -11 here) on a folder without digests.json."""
    raw = bytearray(arrow.read_bytes())
    for i in random.Random(0).sample(range(len(raw) // 2, len(raw)), 40):
        raw[i] ^= 0xFF
    arrow.write_bytes(bytes(raw))


def test_a_corrupt_arrow_file_without_digests_is_a_data_error_not_a_crash(arith: datasets.DatasetDict,
                                                                          tmp_path: Path) -> None:
    """A folder written by ``save_to_disk`` itself (a user's own data: no digests.json): the file is checked in a
    child process first, so a corrupt one is a DataError naming it, in a process that goes on."""
    path = _saved(arith, tmp_path / "d")
    assert not (path / "digests.json").exists()
    assert _read_in_a_child(path).returncode == 0
    _flip_40_bytes_in_the_second_half(_arrow(path))
    bad = _read_in_a_child(path)
    assert bad.returncode == 1, (bad.returncode, bad.stdout, bad.stderr[-2000:])
    assert f"DataError: {_arrow(path)}: not a valid arrow file, it is truncated or corrupt (" in bad.stderr
    with pytest.raises(DataError, match=rf"^{re.escape(str(_arrow(path)))}: not a valid arrow file"):
        load_split(str(path), "train")  # in this process too: refused before it maps the file
    assert len(load_split(str(path), "test")) == 12  # the intact split still reads


def test_a_digest_rewritten_to_match_a_corrupt_file_does_not_let_it_through(arith: datasets.DatasetDict,
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "d"
    save_splits(arith, path)
    _flip_40_bytes_in_the_second_half(_arrow(path))
    digests = json.loads((path / "digests.json").read_text())
    digests["train"][_arrow(path).name] = hashlib.sha256(_arrow(path).read_bytes()).hexdigest()
    (path / "digests.json").write_text(json.dumps(digests))
    bad = _read_in_a_child(path)
    assert bad.returncode == 1, (bad.returncode, bad.stderr[-2000:])
    assert f"DataError: {_arrow(path)}: not a valid arrow file" in bad.stderr


def test_a_crash_while_checking_is_a_data_error_and_a_passed_file_is_checked_once(
        arith: datasets.DatasetDict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _saved(arith, tmp_path / "d")
    arrow = _arrow(path)
    runs: list[list[str]] = []
    real_run = disk.subprocess.run

    def counted(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
        runs.append(cmd)
        return real_run(cmd, **kw)

    monkeypatch.setattr(disk.subprocess, "run", counted)
    disk.check_arrow_files([arrow])
    disk.check_arrow_files([arrow])
    assert len(load_split(str(path), "train")) == 60
    assert len(runs) == 1  # passed once: the same file, unchanged, is not read again
    os.utime(arrow, ns=(arrow.stat().st_atime_ns, arrow.stat().st_mtime_ns + 1))
    disk.check_arrow_files([arrow])
    assert len(runs) == 2  # changed since: checked again
    monkeypatch.setattr(disk, "_CHECK", "import os, signal\nprint('checking', 0, flush=True)\n"
                                        "os.kill(os.getpid(), signal.SIGSEGV)\n")
    test_arrow = _arrow(path, "test")
    with pytest.raises(DataError, match=rf"^{re.escape(str(test_arrow))}: the process checking it as an arrow file "
                                        r"was killed by SIGSEGV; the file is corrupt"):
        disk.check_arrow_files([test_arrow])
