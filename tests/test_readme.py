"""The README is a front door that stays true: its tables come from benchmark files, its commands exist."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from benchmarks import readme
from benchmarks.readme import (
    DOCS,
    MEASURED_DOCS,
    evidence_headline,
    relink,
    sync,
    sync_all,
    training_headline,
    write_headlines,
)
from benchmarks.study.plan import COMPARISONS, REGIMES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS_DOC = (ROOT / "docs" / "results.md").read_text()
MARKED = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.S)
CODE_BLOCK = re.compile(r"```.*?```", re.S)
# a measured figure: a percentage, a count with thousands separators, a duration, an accuracy-like decimal
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?%|\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)? ?(?:ms|s|min|minutes|seconds)\b"
                    r"|0\.\d{2,})")


def prose(doc: str = README) -> str:
    """A document (the README) without its generated sections, code blocks and inline code."""
    text = CODE_BLOCK.sub("", MARKED.sub("", doc))
    return re.sub(r"`[^`]*`", "", text)


def test_front_door_fits_the_first_40_lines() -> None:
    head = "\n".join(README.splitlines()[:40])
    assert "## The two commands" in head and "make test" in head and "make run" in head
    assert re.search(r"!\[[^\]]*\]\((benchmarks/results/[\w./-]+\.png)\)", head), "no plot in the first 40 lines"
    assert "```python" in head, "no library example in the first 40 lines"
    assert len(README.splitlines()) <= 250


def test_the_two_commands_are_two() -> None:
    section = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [ln.split("#")[0].strip() for ln in block.splitlines() if ln.split("#")[0].strip()]
    assert commands == ["make test", "make run"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_image_and_link_exists(doc: str) -> None:
    """Every relative link of the README and of docs/results.md resolves from the document's folder."""
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{doc}: {target}"


def test_generated_tables_equal_what_the_benchmark_files_give(tmp_path: Path) -> None:
    """Every table between markers, in the README and in docs/results.md, is what benchmarks/readme.py derives from
    the committed results."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    write_headlines(results)
    for doc in DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / doc).write_text((ROOT / doc).read_text())
    names = sync_all(results, root=tmp_path)
    assert names["README.md"] == ["evidence_headline", "value_headline"]
    assert {"training_summary", "training_costs", "training_targets", "allocation_headline"} <= \
        set(names["docs/results.md"])
    for doc in DOCS:
        assert (tmp_path / doc).read_text() == (ROOT / doc).read_text(), \
            f"{doc} tables are stale: run `python -m benchmarks.readme`"


@pytest.mark.parametrize("doc", MEASURED_DOCS)
def test_prose_quotes_no_figure_outside_generated_tables(doc: str) -> None:
    """Measured figures live in the generated sections, so none can drift from the files that hold them."""
    assert FIGURE.findall(prose((ROOT / doc).read_text())) == []


def test_evidence_opens_with_at_most_eight_rows_and_a_bulleted_legend() -> None:
    """The README's evidence section starts with the opening table: plain column names, at most eight rows, a legend
    in bullets (no sentence of the old length), and the full tables are in docs/results.md, not in the README."""
    section = README.split("## What the evidence says", 1)[1].split("\n## ", 1)[0]
    body = re.search(r"<!-- evidence_headline:start -->\n(.*?)<!-- evidence_headline:end -->", section, re.S).group(1)
    assert section.index("evidence_headline:start") < 400  # it opens the section
    rows = [ln for ln in body.splitlines() if ln.startswith("| ") and not ln.startswith("| regime |")]
    assert 1 <= len(rows) <= readme.FRONT_ROWS == 8
    assert body.splitlines()[0].startswith("| regime | allocator | baseline | protocol | fewer rollouts to target")
    legend = [ln for ln in body.splitlines() if ln.startswith("- ")]
    assert len(legend) >= 4 and all(len(ln) < 450 for ln in body.splitlines())
    for name in ("training_summary", "training_costs", "training_targets", "allocation_headline"):
        assert f"<!-- {name}:start -->" not in README and f"<!-- {name}:start -->" in RESULTS_DOC


def comparison(family: str, protocol: str, ours: str, baseline: str, saving: float | None = 0.25) -> dict:
    return {"family": family, "protocol": protocol, "ours": ours, "baseline": baseline, "warm_starts": 2,
            "pooled_saving": saving, "pooled_lo": -0.05, "pooled_hi": 0.4, "p_value_stratified": 0.02, "holds_in": 1}


def test_evidence_headline_rows_come_from_the_plan_fields_not_positions(monkeypatch) -> None:
    """Rows: the comparisons marked Comparison.front, in the regimes marked Regime.headline, in that order; the
    figures are the rows' own; a plan that could show more than FRONT_ROWS (eight) rows is refused."""
    front = [c for c in COMPARISONS if c.front]
    other = next(c for c in COMPARISONS if not c.front)
    shown_regimes = [g for g, r in REGIMES.items() if r.headline]
    hidden = next(g for g, r in REGIMES.items() if not r.headline)
    rows = [comparison(hidden, front[0].protocol, front[0].ours, front[0].baseline),
            comparison(shown_regimes[0], other.protocol, other.ours, other.baseline)]
    rows += [comparison(g, c.protocol, c.ours, c.baseline, saving=0.1 * i)
             for i, (g, c) in enumerate(((g, c) for g in reversed(shown_regimes) for c in front), 1)]
    table = evidence_headline(rows)
    lines = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| regime |")]
    assert [ln.split(" | ")[0][2:] for ln in lines] == [g for g in shown_regimes for _ in front]
    assert f"| {shown_regimes[-1]} | {front[0].ours} | {front[0].baseline} | {front[0].protocol} | 10% [-5%, 40%] " \
           "| 0.020 | 1 of 2 warm starts |" in table
    assert f"| {hidden} |" not in table and f"| {other.ours} | {other.baseline} | {other.protocol} |" not in table
    assert "never reaches" in evidence_headline([comparison(shown_regimes[0], front[0].protocol, front[0].ours,
                                                            front[0].baseline, saving=None)])
    monkeypatch.setattr(readme, "FRONT", tuple((c.protocol, c.ours, c.baseline) for c in COMPARISONS[:7]))
    with pytest.raises(ValueError, match="more than 8 rows"):
        evidence_headline(rows)


def test_links_of_a_table_pasted_into_docs_resolve_from_docs() -> None:
    body = "see [a](benchmarks/results/x.md), [b](docs/design.md#9) and [c](https://example.org/y)"
    assert relink(body, "docs") == "see [a](../benchmarks/results/x.md), [b](design.md#9) and [c](https://example.org/y)"
    assert relink(body, ".") == body


def test_sync_pastes_into_a_marked_section_of_any_document(tmp_path: Path) -> None:
    (tmp_path / "results" / "gen").mkdir(parents=True)
    (tmp_path / "results" / "gen" / "t.md").write_text("| a |\n|---|\n| [x](benchmarks/y.md) |\n")
    doc = tmp_path / "results.md"
    doc.write_text("# r\n<!-- t:start -->\nold\n<!-- t:end -->\n")
    assert sync(doc, tmp_path / "results", links_from="docs") == ["t"]
    assert doc.read_text() == "# r\n<!-- t:start -->\n| a |\n|---|\n| [x](../benchmarks/y.md) |\n<!-- t:end -->\n"


def test_figure_pattern_catches_typed_figures() -> None:
    assert FIGURE.findall("SARA used 22% fewer (9,939 vs 12,364), 0.694 in 9.5 s") == ["22%", "9,939", "12,364",
                                                                                       "0.694", "9.5 s"]


def test_headline_counts_runs_that_never_reached() -> None:
    cell = {"regime": "hard", "protocol": "equal-batch", "allocator": "dapo", "seeds": 5, "reached": 2,
            "reached_fit": 1, "target": 0.3,
            "rollouts_to_target": {"median": float("inf"), "lo": 100.0, "hi": float("inf")},
            "fit_rollouts_to_target": {"median": None, "lo": 150.0, "hi": None}, "p_value": 0.5,
            "acc_at_budget": {"30000": 0.28}, "final_accuracy": 0.31, "final_accuracy_se": 0.01}
    table = training_headline([cell, {**cell, "regime": "pool", "p_value": None}, {**cell, "regime": "easy"}])
    assert "| hard | equal-batch | dapo | 5 | 1/5 | never [150, never] | never [100, never] | 0.500 | 0.280 | " \
           "0.310 (0.010) |" in table
    assert "| pool | equal-batch | dapo |" in table and "| easy |" not in table  # easy: training_study.md


def test_readme_python_example_runs() -> None:
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "SimulatedEngine" in b)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["stats"].effective_groups == 32  # batch_size committed groups


@pytest.mark.parametrize("module,flags", sorted({
    (m, tuple(sorted(set(re.findall(r"\s(--[a-z][\w-]*)", line)))))
    for block in re.findall(r"```bash\n(.*?)```", README, re.S) + re.findall(r"`([^`\n]*python -m [^`\n]*)`", README)
    for line in block.splitlines()
    for m in re.findall(r"python -m ([\w.]+)", line)
}))
def test_readme_commands_name_modules_and_options_that_exist(module: str, flags: tuple[str, ...]) -> None:
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    package = ROOT.joinpath(*module.split("."))
    assert path.is_file() or (package / "__main__.py").is_file(), f"README runs {module}, which does not exist"
    source = path.read_text() if path.is_file() else "\n".join(f.read_text() for f in sorted(package.glob("*.py")))
    for flag in flags:
        assert f'"{flag}"' in source, f"README passes {flag} to {module}, which does not define it"


def test_the_value_table_lists_every_value_priced_allocator_against_uniform_grpo() -> None:
    """The README's second table (issue 37): the comparisons marked Comparison.value, the value-based baselines and
    ours, each against uniform GRPO at equal rollouts, in the opening table's columns; the committed README holds
    one row per such comparison that ran."""
    value = [c for c in COMPARISONS if c.value]
    assert {c.ours for c in value} >= {"knapsack-rl", "vip", "mopps", "cures", "valor"}
    assert all(c.baseline == "grpo" and c.protocol == "equal-rollouts" for c in value)
    rows = [comparison("pool", c.protocol, c.ours, c.baseline) for c in value]
    rows.append(comparison("pool", "equal-batch", "sara", "dapo"))  # not a value comparison: not shown
    table = readme.value_headline(rows)
    lines = [ln for ln in table.splitlines() if ln.startswith("| pool |")]
    assert [ln.split(" | ")[1] for ln in lines] == [c.ours for c in value]
    assert table.splitlines()[0].startswith("| regime | allocator | baseline | protocol | fewer rollouts to target")
    assert readme.value_headline([]) == ""
    body = re.search(r"<!-- value_headline:start -->\n(.*?)<!-- value_headline:end -->", README, re.S).group(1)
    for lab in ("knapsack-rl", "vip", "mopps", "cures", "valor"):
        assert f"| pool | {lab} | grpo | equal-rollouts |" in body
