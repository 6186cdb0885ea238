"""Correct the ``eval_size`` recorded by the study's committed validation runs (issue 54, item 7).

    python scripts/fix_validation_eval_size.py [--root benchmarks/results/study] [--check]

Before benchmarks/study/execute.py capped a run's ``eval_size`` at its split's rows, every full-size run recorded the
test split's 2,000 while a validation run evaluated all 1,000 validation rows (rlvr_core.training draws
min(eval_size, rows) of them). This rewrites, in each run file whose ``split`` is ``validation`` and whose
``eval_size`` exceeds the split's rows, that one field to the rows evaluated, by replacing its text in place: every
other byte of the file stays as recorded. ``--check`` lists what it would change and exits 1 if anything would.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.study.plan import split_rows  # noqa: E402

FIELD = re.compile(r'"eval_size": (\d+)')


def corrected(text: str) -> str | None:
    """The run file's text with its eval_size at most its split's rows; None when it needs no change."""
    try:
        run = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(run, dict) or run.get("split") != "validation" or "eval_size" not in run:
        return None
    rows = split_rows("validation")
    if int(run["eval_size"]) <= rows:
        return None
    found = [m for m in FIELD.finditer(text) if int(m.group(1)) == run["eval_size"]]
    if len(found) != 1:
        raise ValueError(f"expected one eval_size field, found {len(found)}")
    m = found[0]
    new = text[:m.start(1)] + str(rows) + text[m.end(1):]
    assert json.loads(new) == {**run, "eval_size": rows}
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT / "benchmarks" / "results" / "study")
    ap.add_argument("--check", action="store_true", help="list the files it would change, change none")
    args = ap.parse_args(argv)
    changed = 0
    for path in sorted(args.root.rglob("*.json")):
        new = corrected(path.read_text())
        if new is None:
            continue
        changed += 1
        if not args.check:
            path.write_text(new)
    print(f"{'would correct' if args.check else 'corrected'} {changed} validation run file(s) under {args.root}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
