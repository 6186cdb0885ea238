"""The README is a front door that stays true: its tables come from benchmark files, its commands exist."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from benchmarks.readme import sync, training_headline, write_headlines

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MARKED = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.S)
CODE_BLOCK = re.compile(r"```.*?```", re.S)
# a measured figure: a percentage, a count with thousands separators, a duration, an accuracy-like decimal
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?%|\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)? ?(?:ms|s|min|minutes|seconds)\b"
                    r"|0\.\d{2,})")


def prose() -> str:
    """The README without its generated sections, code blocks and inline code."""
    text = CODE_BLOCK.sub("", MARKED.sub("", README))
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


def test_every_image_and_link_exists() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_generated_tables_equal_what_the_benchmark_files_give(tmp_path: Path) -> None:
    """Every table between markers is what benchmarks/readme.py derives from the committed results."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    write_headlines(results)
    copy = tmp_path / "README.md"
    copy.write_text(README)
    names = sync(copy, results)
    assert {"training_summary", "training_costs", "allocation_headline"} <= set(names)
    assert copy.read_text() == README, "README tables are stale: run `python -m benchmarks.readme`"


def test_prose_quotes_no_figure_outside_generated_tables() -> None:
    """Measured figures live in the generated sections, so none can drift from the files that hold them."""
    assert FIGURE.findall(prose()) == []


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
