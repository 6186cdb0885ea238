"""benchmarks/results/INDEX.md is current, names a writer for every file, and each writer names its files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import results_index as I
from benchmarks.common import RESULTS


def test_the_committed_index_is_current() -> None:
    committed = (RESULTS / I.INDEX).read_text(encoding="utf-8")
    assert committed == I.render(), "benchmarks/results/INDEX.md is out of date: run python -m benchmarks.results_index"


def test_every_writer_writes_something_and_its_script_names_what_it_writes() -> None:
    found = I.entries()
    assert len(found) > 40 and "study/" in found and "archive/training/" in found
    for w in I.WRITERS:
        assert any(I.writer_of(e) is w for e in found), f"{w.pattern}: no file of benchmarks/results/ is its"
        if not w.module:
            continue
        assert w.command.startswith(f"python -m benchmarks.{w.module}"), w
        stem = re.split(r"[*.]", w.pattern)[0].rstrip("/")
        source = (I.ROOT / "benchmarks" / f"{w.module}.py").read_text(encoding="utf-8")
        assert stem in source, f"benchmarks/{w.module}.py never names {stem!r}, which the index says it writes"


def test_index_rows_link_every_entry_once() -> None:
    text = I.render()
    links = re.findall(r"\[`([^`]+)`\]\(\1\)", text)
    assert sorted(links) == sorted(I.entries())
    assert "| [`training_protocols.json`](training_protocols.json)" not in text  # grouped under its writer's row
    row = next(line for line in text.splitlines() if "`training_protocols.json`" in line)
    assert "python -m benchmarks.study --regime R --protocol P" in row


def test_a_file_without_a_writer_is_refused_and_check_reports_staleness(tmp_path: Path, capsys) -> None:
    (tmp_path / "allocation.csv").write_text("x\n")
    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "README.md").write_text("x\n")
    assert I.main(["--results", str(tmp_path)]) == 0
    assert I.main(["--results", str(tmp_path), "--check"]) == 0
    (tmp_path / "ablation.md").write_text("x\n")
    assert I.main(["--results", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().out
    (tmp_path / "mystery.bin").write_text("x\n")
    with pytest.raises(ValueError, match="no writer .* for \\['mystery.bin'\\]"):
        I.render(tmp_path)
