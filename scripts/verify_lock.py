"""Did this clone replicate the committed pipeline? Compare dvc.lock with the one committed in git.

    make run && make verify                       # or: python scripts/verify_lock.py [--against REV]

Prints one line per stage whose recorded outputs (hashes of models, checkpoints, metrics, reports) differ
from the committed dvc.lock, or whose inputs (code, data, params) differ, which makes it another experiment
rather than a replication; exits 1 when any does, 0 when every stage matches. Results only: timings and
MLflow ids live in files no stage tracks (.dvcignore), so two equal runs give equal hashes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import yaml


def _hashes(entries: list[Mapping[str, Any]] | None) -> dict[str, str]:
    """{path: md5} of a dvc.lock stage's deps or outs."""
    return {e["path"]: str(e.get("md5") or e.get("hash") or "") for e in entries or []}


def differences(committed: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, list[str]]:
    """{stage: [what differs]} between two parsed dvc.lock files; stages that match are left out."""
    old, new = committed.get("stages") or {}, current.get("stages") or {}
    found: dict[str, list[str]] = {}
    for stage in sorted(set(old) | set(new)):
        if stage not in new or stage not in old:
            found[stage] = ["not in the current dvc.lock" if stage not in new else "not in the committed dvc.lock"]
            continue
        what = []
        for key, kind in (("outs", "output"), ("deps", "input")):
            a, b = _hashes(old[stage].get(key)), _hashes(new[stage].get(key))
            what += [f"{kind} {p}: {a.get(p, 'absent')} committed, {b.get(p, 'absent')} now"
                     for p in sorted(set(a) | set(b)) if a.get(p) != b.get(p)]
        if (old[stage].get("params") or {}) != (new[stage].get("params") or {}):
            what.append("params differ")
        if what:
            found[stage] = what
    return found


def committed_lock(repo: Path, rev: str) -> Mapping[str, Any]:
    """dvc.lock as committed at ``rev``; SystemExit when there is none."""
    p = subprocess.run(["git", "show", f"{rev}:dvc.lock"], cwd=repo, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"verify: no dvc.lock committed at {rev} ({p.stderr.strip()}); nothing to compare with")
    return yaml.safe_load(p.stdout) or {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="HEAD", help="git revision whose dvc.lock is the reference")
    ap.add_argument("--repo", default=".", help="project root")
    a = ap.parse_args(argv)
    repo = Path(a.repo)
    if not (repo / "dvc.lock").is_file():
        raise SystemExit(f"verify: {repo / 'dvc.lock'} missing; run `make run` (dvc repro) first")
    found = differences(committed_lock(repo, a.against), yaml.safe_load((repo / "dvc.lock").read_text()) or {})
    for stage, what in found.items():
        print(f"{stage}: " + "; ".join(what))
    print(f"verify: {len(found)} stage(s) differ from dvc.lock at {a.against}" if found
          else f"verify: every stage matches dvc.lock at {a.against}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
