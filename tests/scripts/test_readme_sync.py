"""benchmarks/readme.py pastes each benchmark table between its README markers."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.readme import sync


def test_fills_empty_and_replaces_old_sections(tmp_path: Path) -> None:
    readme, results = tmp_path / "README.md", tmp_path / "results"
    results.mkdir()
    (results / "a.md").write_text("| x |\n|---|\n| 1 |\n")
    (results / "b.md").write_text("new b\n")
    readme.write_text("intro\n<!-- a:start -->\n<!-- a:end -->\nmid\n<!-- b:start -->\nold b\nlines\n<!-- b:end -->\n"
                      "<!-- c:start -->\n<!-- c:end -->\nend\n")
    assert sync(readme, results) == ["a", "b"]  # c has no results file: left as it is
    want = ("intro\n<!-- a:start -->\n| x |\n|---|\n| 1 |\n<!-- a:end -->\n"
            "mid\n<!-- b:start -->\nnew b\n<!-- b:end -->\n"
            "<!-- c:start -->\n<!-- c:end -->\nend\n")
    assert readme.read_text() == want
    sync(readme, results)
    assert readme.read_text() == want  # idempotent


def test_a_quick_run_table_is_not_pasted(tmp_path: Path) -> None:
    readme, results = tmp_path / "README.md", tmp_path / "results"
    results.mkdir()
    (results / "a.md").write_text("smoke table\n")
    (results / "a_targets.json").write_text(json.dumps({"run": {"quick": True}, "targets": {}}))
    (results / "b.md").write_text("full table\n")
    (results / "b_targets.json").write_text(json.dumps({"run": {"quick": False}, "targets": {}}))
    text = "<!-- a:start -->\nold a\n<!-- a:end -->\n<!-- b:start -->\n<!-- b:end -->\n"
    readme.write_text(text)
    assert sync(readme, results) == ["b"]
    assert readme.read_text() == ("<!-- a:start -->\nold a\n<!-- a:end -->\n"
                                  "<!-- b:start -->\nfull table\n<!-- b:end -->\n")
