"""benchmarks/results/INDEX.md: every file and folder of benchmarks/results/ -> the command that wrote it.

    python -m benchmarks.results_index            # rewrite the index
    python -m benchmarks.results_index --check    # exit 1 when the index is not current

The writers are one table (WRITERS, first match wins); the index adds each script's purpose, the first line of
its docstring. tests/benchmarks/test_results_index.py checks that the committed index is current, that every
entry has a writer, and that each writer's script names the files it is said to write.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS

ROOT = Path(__file__).resolve().parent.parent
INDEX = "INDEX.md"


@dataclass(frozen=True)
class Writer:
    """Entries matching ``pattern`` (a glob over paths relative to benchmarks/results/; a folder ends in "/") are
    written by ``command``; ``module`` is the script (benchmarks/<module>.py) whose source names them."""

    pattern: str
    command: str
    module: str
    note: str = ""


WRITERS: tuple[Writer, ...] = (
    Writer("archive/README.md", "", "", "written by hand: what replaced each archived result"),
    Writer("archive/training/", "python -m benchmarks.training", "training", "superseded by benchmarks.study"),
    Writer("study/", "python -m benchmarks.study --regime R --protocol P", "study",
           "one run file per regime/protocol/variant/seed: study/<regime>/<protocol>/<slug(variant)>/s<seed>.json, "
           "beside each regime's target.json and preregistration.json"),
    Writer("regimes_steps_*", "", "", "a run file of `python -m benchmarks.study --regime steps --protocol reference` "
           "under a setting tried on uniform GRPO and dropped before any other allocator ran, moved here by hand "
           "for the record (docs/training-study.md)"),
    Writer("training_round_price.*", "python -m benchmarks.study --round-price --regime R", "study"),
    Writer("training_targets.*", "python -m benchmarks.study_targets", "study_targets",
           "rewritten by every python -m benchmarks.study summary"),
    Writer("training_candidates.md", "python -m benchmarks.study_targets", "study_targets",
           "rewritten by every python -m benchmarks.study summary"),
    Writer("training_warmstarts.*", "python -m benchmarks.warmstarts", "warmstarts",
           "rewritten by every python -m benchmarks.study summary"),
    Writer("training_headline.md", "python -m benchmarks.readme", "readme", "from training_protocols.json"),
    Writer("training_*", "python -m benchmarks.study --regime R --protocol P (or --summarize-only)", "study",
           "training_<regime>_<protocol>.{csv,md,png}, training_protocols.json, training_study.md"),
    Writer("allocation_floor.*", "python -m benchmarks.floor", "floor",
           "rewritten by every python -m benchmarks.study summary"),
    Writer("allocation_headline.md", "python -m benchmarks.readme", "readme", "from allocation_targets.json"),
    Writer("allocation*", "python -m benchmarks.allocation", "allocation"),
    Writer("ablation*", "python -m benchmarks.ablation", "ablation"),
    Writer("advisor_speed.*", "python -m benchmarks.advisor_speed", "advisor_speed"),
    Writer("advisor_validation.*", "python -m benchmarks.advisor_validation", "advisor_validation"),
    Writer("leaderboard.*", "python -m benchmarks.leaderboard", "leaderboard"),
    Writer("orchestration.*", "python -m benchmarks.orchestration", "orchestration"),
    Writer("regimes.*", "python -m benchmarks.regimes", "regimes"),
    Writer("sandbox.*", "python -m benchmarks.sandbox", "sandbox"),
    Writer("trl.*", "python -m benchmarks.trl_overhead", "trl_overhead"),
)


def entries(results: Path = RESULTS) -> list[str]:
    """What the index lists: each file (folders end in "/") but the index itself; a folder that a writer names
    (study/, archive/training/) is one entry, not its files."""
    folders = {w.pattern for w in WRITERS if w.pattern.endswith("/")}
    out: list[str] = []

    def walk(d: Path, prefix: str) -> None:
        for p in sorted(d.iterdir()):
            rel = f"{prefix}{p.name}" + ("/" if p.is_dir() else "")
            if p.is_dir() and rel not in folders:
                walk(p, rel)
            elif not p.name.startswith(".") and rel != INDEX:
                out.append(rel)

    walk(results, "")
    return out


def writer_of(entry: str) -> Writer | None:
    return next((w for w in WRITERS if fnmatch.fnmatchcase(entry, w.pattern)), None)


def purpose(module: str) -> str:
    """The first paragraph of benchmarks/<module>.py's docstring on one line (read from the source; nothing is
    imported)."""
    if not module:
        return ""
    doc = ast.get_docstring(ast.parse((ROOT / "benchmarks" / f"{module}.py").read_text(encoding="utf-8"))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split()).rstrip(".:")


def render(results: Path = RESULTS) -> str:
    """The index's text: one row per writer, its entries, its command and the script's purpose."""
    found = entries(results)
    orphans = [e for e in found if writer_of(e) is None]
    if orphans:
        raise ValueError(f"no writer in benchmarks/results_index.py WRITERS for {orphans}: add the command that "
                         "writes them")
    lines = ["# benchmarks/results/: what wrote each file", "",
             "Generated by `python -m benchmarks.results_index` (do not edit; tests/benchmarks/test_results_index.py "
             "checks it is current).",
             "A `--quick` or reduced run writes to a temporary folder instead (or `--out DIR`). Superseded results "
             "are in [archive/](archive/README.md).", "",
             "| files | written by | the script | note |", "|---|---|---|---|"]
    for w in WRITERS:
        mine = [e for e in found if writer_of(e) is w]
        if mine:
            files = ", ".join(f"[`{e}`]({e})" for e in mine)
            script = f"`benchmarks/{w.module}.py`: {purpose(w.module)}" if w.module else ""
            command = f"`{w.command}`" if w.command else ""
            lines.append(f"| {files} | {command} | {script} | {w.note} |")
    return "\n".join(lines) + "\n"


def write(results: Path = RESULTS) -> Path:
    """Rewrite ``results``/INDEX.md; its path."""
    path = results / INDEX
    path.write_text(render(results), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--check", action="store_true", help="exit 1 when the index is not current; write nothing")
    args = ap.parse_args(argv)
    text, path = render(args.results), args.results / INDEX
    if args.check:
        current = path.exists() and path.read_text(encoding="utf-8") == text
        print(f"{path}: {'current' if current else 'out of date: run python -m benchmarks.results_index'}")
        return 0 if current else 1
    write(args.results)
    print(f"{path}: {len(entries(args.results))} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
