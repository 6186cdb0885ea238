"""Where a benchmark writes its files: benchmarks/results/ holds full-protocol runs only."""

from __future__ import annotations

import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_dir(out: Path | None, full: bool, name: str) -> Path:
    """The folder a benchmark run writes to, created: ``out`` when given, else benchmarks/results/
    for a run of the full protocol, else a fresh temporary folder (printed).

    A smoke or reduced run (``--quick``, fewer seeds or steps, a subset of variants) thus never
    replaces the committed results unless ``--out`` names that folder on purpose.
    """
    if out is None:
        if full:
            out = RESULTS
        else:
            out = Path(tempfile.mkdtemp(prefix=f"rlvr-{name}-"))
            print(f"{name}: not the full protocol, writing to {out} (pass --out DIR to choose)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    return out
