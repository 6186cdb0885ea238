"""Allocator modules are named after the names they register, and one rule (rlvr_core.registry.slug) spells a
name where '+', '[' and ']' are not allowed."""

from __future__ import annotations

import pytest

from rlvr_core.allocation import ALLOCATORS
from rlvr_core.registry import slug


@pytest.mark.parametrize("name", ALLOCATORS.names())
def test_an_allocator_lives_in_the_module_of_its_name(name: str) -> None:
    family = name.split("+")[0]  # a family's variants (sara+dps) live with the family (sara.py)
    module = ALLOCATORS.get(name).__module__
    assert module == f"rlvr_core.allocation.{family.replace('-', '_')}", (name, module)


def test_slug_rule() -> None:
    assert slug("sara+dps") == "saraplusdps"
    assert slug("sara[carry]") == "sara_carry"
    assert slug("sara+dps[context+floor]") == "saraplusdps_contextplusfloor"
    assert slug("pilot-commit") == "pilot-commit" and slug("grpo") == "grpo"


def test_every_registered_name_has_a_distinct_slug() -> None:
    slugs = [slug(n) for n in ALLOCATORS.names()]
    assert len(set(slugs)) == len(slugs)


@pytest.mark.parametrize("bad", ["", "a/b", "sara dps", "..", "x\n", None])
def test_slug_refuses_what_it_cannot_make_safe(bad) -> None:
    with pytest.raises(ValueError, match="cannot be made a file or deployment name"):
        slug(bad)
