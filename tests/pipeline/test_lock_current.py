"""The committed dvc.lock is current: no stage's code, params or input file differs from what it records (#41).

A lock older than the code it describes cannot be replicated: `make run` then `make verify` reports every stage
that depends on the change. `dvc status` on a copy of the project, with no stage run and no output present,
compares each dependency's hash with the lock's; an output of another stage (data, the warm start, the runs) is
absent there and reported as deleted, which says nothing about the lock, so only the other changes count.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, PY, copy_project, sh

pytestmark = pytest.mark.slow
REGENERATE = ("regenerate it from a clean `make run` on a fresh clone (then `make verify`) and commit dvc.lock; "
              "see docs/design.md, 'Replication'")


def stale_dependencies(status: dict) -> list[str]:
    """"stage: path (change)" for every dependency `dvc status --json` reports changed other than deleted."""
    found = []
    for stage, entries in sorted(status.items()):
        for entry in entries if isinstance(entries, list) else []:
            for path, change in (entry.get("changed deps") or {}).items() if isinstance(entry, dict) else ():
                if isinstance(change, dict):  # a params file: {key: change}
                    found += [f"{stage}: {path} {key} ({c})" for key, c in sorted(change.items())]
                elif change != "deleted":
                    found.append(f"{stage}: {path} ({change})")
            if isinstance(entry, str):  # "changed command", "always changed"
                found.append(f"{stage}: {entry}")
    return found


def test_the_reading_of_dvc_status() -> None:
    status = {"train@grpo-0": [{"changed deps": {"rlvr_core/allocation/sara.py": "modified",
                                                 "models/warmstart": "deleted",
                                                 "params.yaml": {"train.lr": "modified"}}},
                               {"changed outs": {"runs/grpo-s0": "deleted"}}],
              "report": [{"changed deps": {"runs/grpo-s0": "deleted"}}, "changed command"],
              "prepare": [{"changed deps": {"pipeline/untrusted.py": "new"}}]}
    assert stale_dependencies(status) == ["prepare: pipeline/untrusted.py (new)", "report: changed command",
                                          "train@grpo-0: rlvr_core/allocation/sara.py (modified)",
                                          "train@grpo-0: params.yaml train.lr (modified)"]
    assert stale_dependencies({"evaluate": [{"changed outs": {"reports/eval.json": "deleted"}}]}) == []


def test_the_committed_lock_records_todays_dependencies(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_project(repo)
    shutil.copy(PROJECT / "dvc.lock", repo / "dvc.lock")
    dvc = str(Path(PY).with_name("dvc"))
    sh(pipeline_env, repo, "git", "init", "-q")
    sh(pipeline_env, repo, dvc, "init", "-q")
    out = sh(pipeline_env, repo, dvc, "status", "--json", timeout=1800)
    stale = stale_dependencies(json.loads(out or "{}"))
    assert not stale, f"dvc.lock is stale ({len(stale)} changes); {REGENERATE}:\n" + "\n".join(stale[:40])
