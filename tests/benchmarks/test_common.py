"""One variant table for every benchmark (the study's plan), and the study's folder names from one rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import allocation, floor, study_targets
from benchmarks.common import RESULTS, output_dir, slug
from benchmarks.study import execute, plan, round_price
from benchmarks.study.plan import PROTOCOLS, VARIANTS
from benchmarks.study.store import RunStore
from rlvr_core.allocation import ALLOCATORS


def test_every_variant_names_a_registered_allocator_and_valid_params() -> None:
    for label, v in VARIANTS.items():
        assert v.label == label and v.allocator in ALLOCATORS, label
        assert label.split("[")[0] == v.allocator, label  # a label is its allocator, then [what differs]
        ALLOCATORS.get(v.allocator).Params(**v.params)  # unknown or impossible parameters raise


def test_the_benchmarks_share_the_table() -> None:
    assert all(VARIANTS[v.label] is v for v in allocation.VARIANTS)
    assert execute.VARIANTS is VARIANTS
    labels = {lab for p in PROTOCOLS.values() for lab in p.order} | set(round_price.ROUND_VARIANTS)
    labels |= {lab for p in PROTOCOLS for r in plan.REGIMES for lab in plan.labels(p, r)}
    assert labels <= set(VARIANTS), labels - set(VARIANTS)
    assert all(set(v.runs) <= set(PROTOCOLS) for v in VARIANTS.values())
    assert not hasattr(study_targets, "_fname")


def test_the_tables_the_summary_calls_read_only_the_study_s_lower_floors() -> None:
    """floor, study_targets and warmstarts sit below benchmarks.study.summarize, which calls them: they may read
    the plan, the store, the statistics and the number formats, never the summary or the driver
    (tests/test_layers.py: no circle)."""
    for mod in (floor, study_targets):
        source = open(mod.__file__, encoding="utf-8").read()
        used = {a or b for a, b in re.findall(r"^\s*from benchmarks\.study(?:\.(\w+) import| import (\w+))", source,
                                               re.M)}
        assert used <= {"plan", "store", "stats", "formats"}, (mod.__name__, used)


def test_the_slug_keeps_every_committed_study_folder_readable() -> None:
    folders = {p.name for p in (RESULTS / "study").glob("*/*/*") if p.is_dir()}
    assert "saraplusdps_context" in folders
    names = {re.sub(r"(-b\d+-lr[\d.e-]+)?(-val)?$", "", f) for f in folders}
    by_slug = {slug(label): label for label in VARIANTS}
    assert len(by_slug) == len(VARIANTS)  # the rule keeps labels apart
    assert names <= set(by_slug), names - set(by_slug)
    store = RunStore(RESULTS)
    path = store.cell_dir("pool", "equal-batch", "sara+dps[context]")
    assert path == RESULTS / "study" / "pool" / "equal-batch" / "saraplusdps_context" and path.is_dir()
    assert store.run_file("pool", "equal-batch", "sara+dps[context]", 0).parent == path


def test_output_dir_is_the_module_s_folder_under_the_root_and_refuses_other_names(tmp_path: Path) -> None:
    want = tmp_path / "root" / "floor"
    assert output_dir(tmp_path / "root", "floor") == want and want.is_dir()
    assert output_dir(tmp_path / "root", "floor") == want  # an existing folder is kept
    for bad in ("training_study", "floor/x", "../floor", ""):
        with pytest.raises(ValueError, match="names no benchmark module"):
            output_dir(tmp_path, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
