"""What more than one benchmark needs: where results go, figures and run-file names.

The benchmarked variants (``Variant``, ``VARIANTS``), one table for the allocation benchmark and the training study
alike, are the study's plan: benchmarks/study/plan.py.

Each benchmark stays a script (``python -m benchmarks.<name>``) and imports what it shares from here:

- ``RESULTS``, ``results_dir``, ``default_out``: the results root a run writes under (benchmarks/results/ holds
  full-protocol runs only; a smoke or reduced run goes to a temporary folder unless ``--out`` names one)
- ``output_dir``: a benchmark's own folder under a results root, named after its module (benchmarks/results/
  INDEX.md lists each folder with the command that writes it)
- ``slug`` (rlvr_core.registry's): the name of a variant's run folder (benchmarks.study.store)
- ``save_figure``: a matplotlib figure written the one way every benchmark writes them
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlvr_core.registry import slug

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = ["RESULTS", "default_out", "output_dir", "results_dir", "save_figure", "slug"]


def results_dir(out: Path | None, full: bool, name: str) -> Path:
    """The results root a benchmark run writes under (into its ``output_dir``), created: ``out`` when given, else
    benchmarks/results/ for a run of the full protocol, else a fresh temporary folder (printed).

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


def default_out(out: Path | None, quick: bool, name: str, full: Path = RESULTS) -> Path:
    """``out`` when given, else a fresh temporary folder for --quick (a quick run never overwrites
    benchmarks/results), else ``full`` (the benchmark's folder of committed results). Not created."""
    if out is not None:
        return out
    return Path(tempfile.mkdtemp(prefix=f"{name}-quick-")) if quick else full


def output_dir(root: Path, generator: str) -> Path:
    """The folder of one benchmark's files under the results root ``root``, created: ``root/generator``, where
    ``generator`` is the writing module's name (benchmarks/<generator>.py, or the package benchmarks/<generator>/).
    ``--out`` names the root, so a run with ``--out DIR`` writes DIR/<generator>/ and reads another benchmark's
    files from DIR/<that module>/."""
    here = Path(__file__).resolve().parent
    if not generator.isidentifier() or not ((here / f"{generator}.py").is_file()
                                            or (here / generator / "__init__.py").is_file()):
        raise ValueError(f"output_dir: {generator!r} names no benchmark module (benchmarks/{generator}.py)")
    path = root / generator
    path.mkdir(parents=True, exist_ok=True)
    return path


FIGURE_KEY = "rlvr-alloc inputs"  # the PNG text chunk naming what a figure was drawn from (figure_key)


def save_figure(fig: Any, path: Path, dpi: int = 110, key: str | None = None) -> None:
    """Lay out, write and close a matplotlib figure; ``key`` (a digest of what it was drawn from) is written into
    the PNG so that ``figure_key`` can tell an up-to-date figure from a stale one without drawing it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi, **({"metadata": {FIGURE_KEY: key}} if key else {}))
    plt.close(fig)


def figure_key(path: Path) -> str | None:
    """The key ``save_figure`` wrote into the PNG at ``path`` (None: no file, no key, or not a readable PNG)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return im.text.get(FIGURE_KEY)
    except (OSError, UnidentifiedImageError):
        return None
