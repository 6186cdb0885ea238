"""docs/configuration.md and params.yaml's comments are what the config dataclasses' field help gives
(scripts/config_reference.py, `make docs`), so the reference cannot drift from the code."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from rlvr_core.allocation import ALLOCATORS
from rlvr_core.config import SECTIONS, read_yaml

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)  # type: ignore[union-attr]

DOC = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
PARAMS = (ROOT / "params.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_field_has_a_help(section: str) -> None:
    cls = SECTIONS[section]
    missing = [f.name for f in dataclasses.fields(cls)
               if not isinstance(f.metadata.get("help"), str) or not f.metadata["help"].strip()]
    assert not missing, f"{cls.__name__}: fields without metadata={{'help': ...}}: {missing}"


def test_the_committed_reference_is_the_generated_one() -> None:
    assert ref.render_doc(DOC) == DOC, "docs/configuration.md is stale: run `make docs`"


def test_params_yaml_comments_are_the_helps_first_sentences() -> None:
    assert ref.render_params(PARAMS) == PARAMS, "params.yaml's comments are stale: run `make docs`"
    train = PARAMS.split("\ntrain:\n", 1)[1]
    assert re.search(r"^  steps: 1000 +# Training steps$", train, re.M), "the comment is not the help's first sentence"


def test_a_stale_reference_is_caught_and_regenerated() -> None:
    """A table row edited by hand (a default the code does not have) differs from what the code gives."""
    row = re.search(r"^\| `max_rollouts` \| `12000` \|", DOC, re.M)
    assert row, "the train table lists max_rollouts with the code's default"
    stale = DOC.replace(row.group(0), "| `max_rollouts` | `null` |")
    assert ref.render_doc(stale) != stale and ref.render_doc(stale) == DOC
    stale_yaml = PARAMS.replace("# Training steps\n", "# a hand-written note\n", 1)
    assert stale_yaml != PARAMS and ref.render_params(stale_yaml) == PARAMS


@pytest.mark.parametrize("section", list(SECTIONS))
def test_the_default_column_reads_back_as_params_yaml_value(section: str) -> None:
    """Every documented default, read as params.yaml is read, is the file's value (the 7 that once drifted too)."""
    table = DOC.split(f"### `{section}`", 1)[1].split("\n### ", 1)[0]
    documented = dict(re.findall(r"^\| `(\w+)` \| `(.*?)` \|", table, re.M))
    values = read_yaml(PARAMS, "params.yaml")[section]
    assert sorted(documented) == sorted(values)
    for key, text in documented.items():
        got = read_yaml(text, key)
        want = values[key]
        assert got == want or (isinstance(want, list) and list(got) == want), (section, key, text, want)


def test_params_rewrite_keeps_values_and_refuses_unknown_keys() -> None:
    text = 'prepare:\n  ops: ["#", "-"]   # old\n  task: arithmetic\ntrain:\n  k: 8\n'
    new = ref.render_params(text)
    assert read_yaml(new, "x") == read_yaml(text, "x")
    assert '  ops: ["#", "-"]            # Arithmetic only: operators to draw from (`+`, `-`, `*`)\n' in new
    with pytest.raises(ValueError, match="train.kk is not a field of TrainConfig"):
        ref.render_params("train:\n  kk: 8\n")
    with pytest.raises(ValueError, match="needs one"):
        ref.render_doc("no markers here")


def test_summary_is_the_first_sentence() -> None:
    assert ref.summary("Keyword arguments. E.g. dtype, server_args.") == "Keyword arguments"
    one = "Upper half-width (e.g. 0.28; null: `clip_eps`)"
    assert ref.summary(one + ".") == one


@pytest.mark.parametrize("name", ALLOCATORS.names())
def test_every_allocator_has_a_page_with_its_current_defaults(name: str) -> None:
    """docs/allocators/<slug>.md exists, and its table is what the allocator's Params dataclass gives."""
    page = ref.allocator_page(name)
    assert page.is_file(), f"{name}: no page {page.relative_to(ROOT)}"
    text = page.read_text(encoding="utf-8")
    assert ref.render_allocator_page(name, text) == text, f"{page.name} is stale: run `make docs`"
    params = ALLOCATORS.get(name).Params
    table = dict(re.findall(r"^\| `(\w+)` \| `(.*?)` \|$", text, re.M))
    assert list(table) == [f.name for f in dataclasses.fields(params)]
    assert f"`{ALLOCATORS.get(name).__module__.replace('.', '/')}.py`" in text


def test_every_allocator_page_is_a_registered_allocator() -> None:
    pages = sorted(p.name for p in ref.ALLOCATOR_DOCS.glob("*.md"))
    assert pages == sorted(ref.allocator_page(n).name for n in ALLOCATORS.names())


def test_a_stale_allocator_table_is_caught() -> None:
    """A default edited by hand (pilot-commit's upper) is rewritten to the code's; a page without markers is refused."""
    text = ref.allocator_page("pilot-commit").read_text(encoding="utf-8")
    stale = text.replace("| `upper` | `0.25` |", "| `upper` | `0.75` |")
    assert stale != text and ref.render_allocator_page("pilot-commit", stale) == text
    with pytest.raises(ValueError, match="allocator-defaults"):
        ref.render_allocator_page("pilot-commit", "# pilot-commit\n")
