"""Paste the benchmark tables into README.md between their markers.

The README holds ``<!-- <name>:start -->`` / ``<!-- <name>:end -->`` pairs; each
is replaced by benchmarks/results/<name>.md as the benchmark wrote it.
Usage: python -m benchmarks.readme
"""

from __future__ import annotations

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
        body = src.read_text().strip()
        # the body between the markers may be empty (a fresh section) or a previous table
        text = re.sub(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)",
                      lambda m: m.group(1) + body + "\n" + m.group(2), text, flags=re.S)
        done.append(name)
    readme.write_text(text)
    return done


if __name__ == "__main__":
    print("synced:", ", ".join(sync()) or "nothing")
