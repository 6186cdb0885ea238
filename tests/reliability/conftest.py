"""Fixtures of the reliability tests: one tiny warm-started policy for the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.common import dataset


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``warm_start(make_arithmetic(400, 60, 0, digits=(1, 2, 3))["train"], steps=40)`` saved once."""
    from rlvr_core.models.warmstart import warm_start

    out = tmp_path_factory.mktemp("reliability") / "policy"
    warm_start(dataset()["train"], steps=40, seed=0, out_dir=out, log_every=20)
    return out
