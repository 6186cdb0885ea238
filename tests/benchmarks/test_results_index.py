"""benchmarks/results/INDEX.md is current, names a writer for every file, each writer names the folder and files it
writes, and every file sits in its writer's folder (nothing at the top level but the index)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import results_index as I
from benchmarks.common import RESULTS
from benchmarks.study.plan import PROTOCOLS


def test_the_committed_index_is_current() -> None:
    committed = (RESULTS / I.INDEX).read_text(encoding="utf-8")
    assert committed == I.render(), "benchmarks/results/INDEX.md is out of date: run python -m benchmarks.results_index"


def test_nothing_but_the_index_sits_at_the_top_level_and_each_folder_is_a_benchmark() -> None:
    top = sorted(p.name for p in RESULTS.iterdir() if not p.name.startswith("."))
    files = [name for name in top if not (RESULTS / name).is_dir()]
    assert files == [I.INDEX], f"files at the top of benchmarks/results/: move them into their writer's folder: {files}"
    folders = [name for name in top if name != I.INDEX]
    assert I.ARCHIVE in folders and "study" in folders and "allocation" in folders
    for name in folders:
        assert name == I.ARCHIVE or I.script(name).is_file(), \
            f"benchmarks/results/{name}/ is named after no benchmark module"


def _cell_file(name: str, source: str) -> bool:
    """A per-(regime, protocol) file of the study: training_<regime>_<protocol>.{csv,md,png}, named by an f-string."""
    m = re.fullmatch(r"training_([\w-]+)_([\w-]+)\.(csv|md|png)", name)
    return bool(m) and m.group(2) in PROTOCOLS and 'f"training_{regime}_{proto}"' in source \
        and (RESULTS / "study" / m.group(1)).is_dir()


def test_every_writer_writes_something_and_its_script_names_its_folder_and_files() -> None:
    found = I.entries()
    assert len(found) > 40 and "study/hard/" in found and "archive/training/" in found
    for w in I.WRITERS:
        mine = [e for e in found if I.writer_of(e) is w]
        assert mine, f"{w.pattern}: no file of benchmarks/results/ is its"
        if not w.module:
            continue
        assert w.command.startswith(f"python -m benchmarks.{w.module}"), w
        source = I.source(w.module)
        if w.folder != I.ARCHIVE:
            assert w.folder == w.module, f"{w.pattern}: a benchmark's folder is named after its module"
            assert re.search(rf'output_dir\((?:[^()]|\([^()]*\))*, "{w.folder}"\)', source), \
                f"benchmarks/{w.module}.py never writes through output_dir(..., {w.folder!r})"
        for e in mine:
            name = e.split("/", 1)[1].rstrip("/")
            if e.endswith("/"):  # a folder of run files (study/<regime>/) or an archived benchmark's
                continue
            assert name.split(".")[0] in source or _cell_file(name, source), \
                f"benchmarks/{w.module}.py never names {name!r}, which the index says it writes"


def test_index_rows_link_every_entry_once_under_its_folder() -> None:
    text = I.render()
    rows = [line for line in text.splitlines() if line.startswith("| [`")]
    links = [target for row in rows for target in re.findall(r"\[`[^`]+`\]\(([^)]+)\)", row.split(" | ", 3)[3])]
    assert sorted(links) == sorted(I.entries())
    row = next(line for line in rows if "(study/training_protocols.json)" in line)
    assert row.startswith("| [`study/`](study/) | `python -m benchmarks.study --summarize-only`")
    assert "[`training_protocols.json`](study/training_protocols.json)" in row
    folders = [row.split("`")[1] for row in rows]
    assert all(a == b or b not in folders[:i] for i, (a, b) in enumerate(zip(folders, folders[1:]))), \
        "the rows of one folder are not together"


def test_a_file_without_a_writer_is_refused_and_check_reports_staleness(tmp_path: Path, capsys) -> None:
    (tmp_path / "allocation").mkdir()
    (tmp_path / "allocation" / "allocation.csv").write_text("x\n")
    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "README.md").write_text("x\n")
    assert I.main(["--results", str(tmp_path)]) == 0
    assert I.main(["--results", str(tmp_path), "--check"]) == 0
    (tmp_path / "ablation").mkdir()
    (tmp_path / "ablation" / "ablation.md").write_text("x\n")
    assert I.main(["--results", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().out
    (tmp_path / "mystery").mkdir()
    (tmp_path / "mystery" / "x.bin").write_text("x\n")
    with pytest.raises(ValueError, match=r"no writer .* for \['mystery/x.bin'\]"):
        I.render(tmp_path)


def test_a_file_at_the_top_level_is_refused(tmp_path: Path) -> None:
    (tmp_path / "allocation.csv").write_text("x\n")  # where the allocation benchmark wrote before its folder
    with pytest.raises(ValueError, match=r"for \['allocation.csv'\]: move each into the folder"):
        I.render(tmp_path)
