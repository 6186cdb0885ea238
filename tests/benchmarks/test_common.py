"""benchmarks/common.py: one variant table for every benchmark, and the study's folder names from one rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import allocation, floor, study, study_targets
from benchmarks.common import MATCHED, PROTOCOLS, RESULTS, VARIANTS, output_dir, slug, study_cell_dir
from rlvr_core.allocation import ALLOCATORS


def test_every_variant_names_a_registered_allocator_and_valid_params() -> None:
    for label, v in VARIANTS.items():
        assert v.label == label and v.allocator in ALLOCATORS, label
        assert label.split("[")[0] == v.allocator, label  # a label is its allocator, then [what differs]
        ALLOCATORS.get(v.allocator).Params(**v.params)  # unknown or impossible parameters raise


def test_the_benchmarks_share_the_table() -> None:
    assert all(VARIANTS[v.label] is v for v in allocation.VARIANTS)
    assert study.VARIANTS is VARIANTS and study.PROTOCOLS is PROTOCOLS
    labels = {lab for labs in PROTOCOLS.values() for lab in labs} | set(MATCHED) | set(study.ROUND_VARIANTS)
    assert labels <= set(VARIANTS), labels - set(VARIANTS)
    assert not hasattr(study, "_fname") and not hasattr(study_targets, "_fname")


def test_floor_and_study_do_not_import_each_other() -> None:
    for mod, other in ((floor, "study"), (study_targets, "study")):
        source = open(mod.__file__, encoding="utf-8").read()
        assert not re.search(rf"^\s*from benchmarks(\.{other}| import .*\b{other}\b)", source, re.M), mod.__name__


def test_the_slug_keeps_every_committed_study_folder_readable() -> None:
    folders = {p.name for p in (RESULTS / "study").glob("*/*/*") if p.is_dir()}
    assert "saraplusdps_context" in folders
    names = {re.sub(r"(-b\d+-lr[\d.e-]+)?(-val)?$", "", f) for f in folders}
    by_slug = {slug(label): label for label in VARIANTS}
    assert len(by_slug) == len(VARIANTS)  # the rule keeps labels apart
    assert names <= set(by_slug), names - set(by_slug)
    path = study_cell_dir(RESULTS, "pool", "equal-batch", "sara+dps[context]")
    assert path == RESULTS / "study" / "pool" / "equal-batch" / "saraplusdps_context" and path.is_dir()
    assert study.run_file(RESULTS, "pool", "equal-batch", "sara+dps[context]", 0).parent == path


def test_output_dir_is_the_module_s_folder_under_the_root_and_refuses_other_names(tmp_path: Path) -> None:
    want = tmp_path / "root" / "floor"
    assert output_dir(tmp_path / "root", "floor") == want and want.is_dir()
    assert output_dir(tmp_path / "root", "floor") == want  # an existing folder is kept
    for bad in ("training_study", "floor/x", "../floor", ""):
        with pytest.raises(ValueError, match="names no benchmark module"):
            output_dir(tmp_path, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
