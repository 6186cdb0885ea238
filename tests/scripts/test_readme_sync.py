"""benchmarks/readme.py pastes each benchmark table between its README markers, from its generator's folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.readme import sync


def test_fills_empty_and_replaces_old_sections(tmp_path: Path) -> None:
    readme, results = tmp_path / "README.md", tmp_path / "results"
    (results / "one").mkdir(parents=True)
    (results / "two").mkdir()
    (results / "one" / "a.md").write_text("| x |\n|---|\n| 1 |\n")
    (results / "two" / "b.md").write_text("new b\n")
    (results / "c.md").write_text("a file at the top of the root is no generator's: not pasted\n")
    readme.write_text("intro\n<!-- a:start -->\n<!-- a:end -->\nmid\n<!-- b:start -->\nold b\nlines\n<!-- b:end -->\n"
                      "<!-- c:start -->\n<!-- c:end -->\nend\n")
    assert sync(readme, results) == ["a", "b"]  # c has no file in a generator folder: left as it is
    want = ("intro\n<!-- a:start -->\n| x |\n|---|\n| 1 |\n<!-- a:end -->\n"
            "mid\n<!-- b:start -->\nnew b\n<!-- b:end -->\n"
            "<!-- c:start -->\n<!-- c:end -->\nend\n")
    assert readme.read_text() == want
    sync(readme, results)
    assert readme.read_text() == want  # idempotent


def test_a_quick_run_table_is_not_pasted(tmp_path: Path) -> None:
    readme, results = tmp_path / "README.md", tmp_path / "results"
    (results / "gen").mkdir(parents=True)
    (results / "gen" / "a.md").write_text("smoke table\n")
    (results / "gen" / "a_targets.json").write_text(json.dumps({"run": {"quick": True}, "targets": {}}))
    (results / "gen" / "b.md").write_text("full table\n")
    (results / "gen" / "b_targets.json").write_text(json.dumps({"run": {"quick": False}, "targets": {}}))
    text = "<!-- a:start -->\nold a\n<!-- a:end -->\n<!-- b:start -->\n<!-- b:end -->\n"
    readme.write_text(text)
    assert sync(readme, results) == ["b"]
    assert readme.read_text() == ("<!-- a:start -->\nold a\n<!-- a:end -->\n"
                                  "<!-- b:start -->\nfull table\n<!-- b:end -->\n")


def test_a_table_two_generator_folders_hold_is_refused(tmp_path: Path) -> None:
    readme, results = tmp_path / "README.md", tmp_path / "results"
    for gen in ("one", "two"):
        (results / gen).mkdir(parents=True)
        (results / gen / "a.md").write_text(f"{gen}\n")
    readme.write_text("<!-- a:start -->\n<!-- a:end -->\n")
    with pytest.raises(ValueError, match=r"more than one a\.md .*one/a\.md.*two/a\.md"):
        sync(readme, results)
    assert readme.read_text() == "<!-- a:start -->\n<!-- a:end -->\n"
