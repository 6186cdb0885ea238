"""docs/design.md: every "docs/design.md §n.m" pointer in the code names one of its sections, the files it
names exist, its §4 indexes every allocator page (docs/allocators/) and the links of these pages resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
CODE_DIRS = ("rlvr_core", "flows", "tasks", "pipeline", "benchmarks", "tests", "scripts")
POINTER = re.compile(r"docs/design\.md ((?:§\d+(?:\.\d+)*(?:, )?)+)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", re.M)
FILE = re.compile(r"`((?:rlvr_core|flows|tasks|pipeline|benchmarks|tests|scripts|docs)/[\w/.-]+\.(?:py|md))`")


def sections(text: str) -> list[str]:
    return HEADING.findall(text)


def pointers() -> list[tuple[str, int, str]]:
    """(file, line, section) for every design.md pointer in the project's Python files."""
    out = []
    for d in CODE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in POINTER.finditer(line):
                    out.extend((str(path.relative_to(ROOT)), i, s) for s in SECTION.findall(m.group(1)))
    return out


def test_sections_are_numbered_once_and_in_order() -> None:
    nums = sections(DESIGN.read_text(encoding="utf-8"))
    assert len(nums) >= 20 and len(set(nums)) == len(nums), nums
    keys = [tuple(int(x) for x in n.split(".")) for n in nums]
    assert keys == sorted(keys), nums
    for n in nums:  # a subsection sits under its section
        if "." in n:
            assert n.rsplit(".", 1)[0] in nums, n


def test_every_pointer_names_an_existing_section() -> None:
    found = pointers()
    assert found, "no docs/design.md pointers found: the pattern or the docstrings changed"
    have = set(sections(DESIGN.read_text(encoding="utf-8")))
    missing = [f"{f}:{line}: §{s}" for f, line, s in found if s not in have]
    assert not missing, "pointers to sections docs/design.md does not have:\n" + "\n".join(missing)


def test_pointer_pattern_reads_lists_and_rejects_unknown_sections() -> None:
    doc = "docs/design" + ".md"  # split so that this file holds no pointer itself
    line = f"The protocol ({doc} §3.1, §2.5) and ({doc} §9.9)."
    got = [s for m in POINTER.finditer(line) for s in SECTION.findall(m.group(1))]
    assert got == ["3.1", "2.5", "9.9"]
    assert "9.9" not in set(sections(DESIGN.read_text(encoding="utf-8")))


def test_no_pointer_to_the_old_design_reference_is_left() -> None:
    stale = [f"{p.relative_to(ROOT)}:{i}" for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bDESIGN \d", line)]
    assert not stale, stale


def test_files_the_design_names_exist() -> None:
    named = sorted(set(FILE.findall(DESIGN.read_text(encoding="utf-8"))))
    assert len(named) >= 20, named
    missing = [n for n in named if not (ROOT / n).is_file()]
    assert not missing, f"docs/design.md names files that do not exist: {missing}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_design_section_4_indexes_every_allocator_page() -> None:
    from rlvr_core.allocation import ALLOCATORS
    from rlvr_core.registry import slug

    text = DESIGN.read_text(encoding="utf-8")
    index = text.split("\n## 4. Allocators\n", 1)[1].split("\n### ", 1)[0]
    linked = set(LINK.findall(index))
    missing = [n for n in ALLOCATORS.names() if f"allocators/{slug(n)}.md" not in linked]
    assert not missing, f"docs/design.md §4's index links no page for: {missing}"


PAGES = ["design.md", *sorted(f"allocators/{p.name}" for p in (ROOT / "docs" / "allocators").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page: str) -> None:
    """Every relative link of docs/design.md and the allocator pages names a file, and its #anchor a heading."""
    path = ROOT / "docs" / page
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, frag = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.is_file():
            broken.append(target)
        elif frag and dest.suffix == ".md":
            heads = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), re.M)
            if frag not in {anchor(h) for h in heads}:
                broken.append(target)
    assert not broken, f"docs/{page}: broken links {broken}"
