"""benchmarks/readme.py pastes each benchmark table between its README markers."""

from __future__ import annotations

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
    want = ("intro\n<!-- a:start -->\n| x |\n|---|\n| 1 |\n<!-- a:end -->\nmid\n<!-- b:start -->\nnew b\n<!-- b:end -->\n"
            "<!-- c:start -->\n<!-- c:end -->\nend\n")
    assert readme.read_text() == want
    sync(readme, results)
    assert readme.read_text() == want  # idempotent
