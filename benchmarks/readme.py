"""Paste the benchmark tables into README.md between their markers.

The README holds ``<!-- <name>:start -->`` / ``<!-- <name>:end -->`` pairs; each
is replaced by benchmarks/results/<name>.md as the benchmark wrote it. A table whose
<name>_targets.json records a quick (smoke) run is not pasted.
Usage: python -m benchmarks.readme
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sync(readme: Path = ROOT / "README.md", results: Path = ROOT / "benchmarks" / "results") -> list[str]:
    text = readme.read_text()
    done = []
    for name in re.findall(r"<!-- ([\w-]+):start -->", text):
        src = results / f"{name}.md"
        if not src.is_file():
            print(f"skip {name}: {src} not written yet", file=sys.stderr)
            continue
        if _quick_run(results / f"{name}_targets.json"):
            print(f"skip {name}: {src} comes from a --quick run; rerun the full benchmark", file=sys.stderr)
            continue
        body = src.read_text().strip()
        # the body between the markers may be empty (a fresh section) or a previous table
        text = re.sub(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)",
                      lambda m: m.group(1) + body + "\n" + m.group(2), text, flags=re.S)
        done.append(name)
    readme.write_text(text)
    return done


def _quick_run(meta: Path) -> bool:
    """Whether a benchmark's <name>_targets.json says its run was a --quick one."""
    if not meta.is_file():
        return False
    return bool(json.loads(meta.read_text()).get("run", {}).get("quick", False))


if __name__ == "__main__":
    print("synced:", ", ".join(sync()) or "nothing")
