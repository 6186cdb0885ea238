"""How long the study's summary takes to rebuild every results file, against the study script it replaced.

    nice python -m benchmarks.summary_speed                       # 3 turns each, about 6 minutes on one core
    nice python -m benchmarks.summary_speed --repeats 1 --out DIR # a smoke run, written under DIR/summary_speed/

Three commands are timed in turns (baseline, cold, warm, baseline, cold, warm, ...) on the same machine, so that
each sees the same load; the medians and their ratios are reported, never a figure from another run:

- ``baseline``: ``python -m benchmarks.study --summarize-only`` of ``--baseline`` (default f56a072, the last commit
  with the 1,129-line benchmarks/study.py), on a copy of that commit's own benchmarks/results;
- ``cold``: the same command of this working tree with ``--redraw``, on a copy of its benchmarks/results: every
  file written again, every cell's figure drawn again;
- ``warm``: the same without ``--redraw``: a figure whose recorded inputs (benchmarks.study.tables.plot_key) did not
  change is kept, as after adding a run to one cell. Every other file is written again.

Each side runs in its own process with one torch/BLAS thread, from a private copy (``git archive``), so neither
writes into the repository. Writes summary_speed.{json,md} under benchmarks/results/summary_speed/ (``--out``: the
results root).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, output_dir

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "f56a072"  # the last commit before benchmarks/study/ became a package (#35)
SIDES = ("baseline", "cold", "warm")


def unpack(rev: str, dest: Path) -> Path:
    """The tree of commit ``rev`` under ``dest`` (code and committed results, as ``git archive`` gives them)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def current_tree(dest: Path) -> Path:
    """This working tree's files that git tracks or would track, copied under ``dest`` (uncommitted edits
    included; ignored build outputs left out)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def timed(tree: Path, *flags: str, in_place: bool = False) -> float:
    """Seconds of one ``--summarize-only`` of ``tree`` on a fresh copy of its results (the copy not timed), or
    with ``in_place`` on the tree's own results."""
    out = tree / "benchmarks" / "results"
    if not in_place:
        out = tree.parent / f"{tree.name}-out"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tree / "benchmarks" / "results", out)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.study", "--summarize-only", "--out", str(out), *flags],
                          cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tree.name}: the summary failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    return seconds


def measure(baseline: str, repeats: int, log: Any = print) -> dict[str, Any]:
    """Time the three sides in turns, ``repeats`` times each."""
    with tempfile.TemporaryDirectory(prefix="summary-speed-") as tmp:
        trees = {"baseline": unpack(baseline, Path(tmp) / "baseline"), "current": current_tree(Path(tmp) / "current")}
        # every figure drawn once with its key into the copy's own results, so that each "warm" turn starts from
        # keyed figures, as a summary does after the first one
        timed(trees["current"], in_place=True)
        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        for i in range(repeats):
            for side in SIDES:
                tree = trees["baseline" if side == "baseline" else "current"]
                seconds[side].append(timed(tree, *(("--redraw",) if side == "cold" else ())))
                log(f"turn {i + 1}/{repeats}: {side} {seconds[side][-1]:.1f} s")
    med = {side: statistics.median(v) for side, v in seconds.items()}
    return {"baseline_commit": baseline, "repeats": repeats, "seconds": seconds, "median_s": med,
            "speedup_cold": med["baseline"] / med["cold"], "speedup_warm": med["baseline"] / med["warm"],
            "machine": f"{platform.machine()} {platform.platform()}, {os.cpu_count()} cores",
            "load_average_at_end": list(os.getloadavg()), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime())}


def markdown(r: dict[str, Any]) -> str:
    lines = ["# The study's summary: seconds to rebuild every results file", "",
             f"Written by `python -m benchmarks.summary_speed`: medians of {r['repeats']} turns per side, the sides "
             f"run in turns on one machine ({r['machine']}; load average at the end "
             f"{r['load_average_at_end'][0]:.1f}). Baseline: the study script at commit {r['baseline_commit']}.", "",
             "| side | what it does | median seconds | every turn | baseline / side |", "|---|---|---|---|---|"]
    what = {"baseline": "the study script before the package", "cold": "the package, every figure drawn again",
            "warm": "the package, figures whose inputs did not change kept"}
    for side in SIDES:
        turns = ", ".join(f"{s:.1f}" for s in r["seconds"][side])
        ratio = r["median_s"]["baseline"] / r["median_s"][side]
        lines.append(f"| {side} | {what[side]} | {r['median_s'][side]:.1f} | {turns} | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.summary_speed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=BASELINE, help="the commit to compare with (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="turns per side (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results root (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    r = measure(args.baseline, args.repeats)
    folder = output_dir(args.out, "summary_speed")
    (folder / "summary_speed.json").write_text(json.dumps(r, indent=1) + "\n")
    (folder / "summary_speed.md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
