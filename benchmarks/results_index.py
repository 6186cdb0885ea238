"""benchmarks/results/INDEX.md: every folder and file of benchmarks/results/ -> the command that wrote it.

    python -m benchmarks.results_index            # rewrite the index
    python -m benchmarks.results_index --check    # exit 1 when the index is not current

Each benchmark writes into its own folder, named after its module (benchmarks/<module>.py writes
benchmarks/results/<module>/, through benchmarks.common.output_dir); superseded results are in archive/. Nothing but
this index sits at the top level. The writers are one table (WRITERS, first match wins); the index adds each
script's purpose, the first line of its docstring. tests/benchmarks/test_results_index.py checks that the committed
index is current, that every entry has a writer, and that each writer's script names the folder and files it is said
to write.
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
ARCHIVE = "archive"
SUMMARY = "rewritten by every python -m benchmarks.study summary"


@dataclass(frozen=True)
class Writer:
    """Entries matching ``pattern`` (a glob over paths relative to benchmarks/results/, "<folder>/<name>"; a
    folder ends in "/") are written by ``command``; ``module`` is the script (benchmarks/<module>.py) whose source
    names them, and the folder is the module's name (archive/ aside)."""

    pattern: str
    command: str
    module: str
    note: str = ""

    @property
    def folder(self) -> str:
        return self.pattern.split("/", 1)[0]


WRITERS: tuple[Writer, ...] = (
    Writer("study/*/", "python -m benchmarks.study --regime R --protocol P", "study",
           "the run files: study/<regime>/<protocol>/<slug(variant)>/s<seed>.json, beside each regime's target.json "
           "and preregistration.json"),
    Writer("study/training_round_price.*", "python -m benchmarks.study --round-price --regime R", "study"),
    Writer("study/*", "python -m benchmarks.study --summarize-only", "study",
           "training_<regime>_<protocol>.{csv,md,png}, training_protocols.json, training_study.md: rebuilt from the "
           "run files after every run too (--regime R --protocol P), with floor/, study_targets/ and warmstarts/"),
    Writer("study_targets/*", "python -m benchmarks.study_targets", "study_targets", SUMMARY),
    Writer("warmstarts/*", "python -m benchmarks.warmstarts", "warmstarts", SUMMARY),
    Writer("floor/*", "python -m benchmarks.floor", "floor", SUMMARY),
    Writer("group_size/*", "python -m benchmarks.group_size", "group_size", SUMMARY),
    Writer("grpo_tuning/*", "python -m benchmarks.grpo_tuning", "grpo_tuning", SUMMARY),
    Writer("null_controls/*", "python -m benchmarks.null_controls", "null_controls", SUMMARY),
    Writer("replication/*", "python -m benchmarks.replication", "replication", SUMMARY),
    Writer("ar3po_anatomy/*", "python -m benchmarks.ar3po_anatomy", "ar3po_anatomy", SUMMARY),
    Writer("large_set/*", "python -m benchmarks.large_set", "large_set", SUMMARY),
    Writer("readme/*", "python -m benchmarks.readme", "readme",
           "from warmstarts/training_warmstarts.json, study/training_protocols.json and "
           "allocation/allocation_targets.json; pasted into README.md and docs/results.md"),
    Writer("allocation/*", "python -m benchmarks.allocation", "allocation",
           "allocation.json: the figures of --json benchmarks/results/allocation/allocation.json, which floor/ and "
           "study_targets/ read"),
    Writer("ablation/*", "python -m benchmarks.ablation", "ablation"),
    Writer("advisor_speed/*", "python -m benchmarks.advisor_speed", "advisor_speed"),
    Writer("advisor_validation/*", "python -m benchmarks.advisor_validation", "advisor_validation",
           "the advisor states the json's error figures (rlvr_core.advise.core.VALIDATION_FILE)"),
    Writer("leaderboard/*", "python -m benchmarks.leaderboard", "leaderboard"),
    Writer("orchestration/*", "python -m benchmarks.orchestration", "orchestration"),
    Writer("cpu_kernels/*", "python -m benchmarks.cpu_kernels", "cpu_kernels"),
    Writer("regimes/regimes_steps_*", "", "", "a run file of `python -m benchmarks.study --regime steps --protocol "
           "reference` under a setting tried on uniform GRPO and dropped before any other allocator ran, moved here "
           "by hand for the record (docs/training-study.md)"),
    Writer("regimes/*", "python -m benchmarks.regimes", "regimes"),
    Writer("sandbox/*", "python -m benchmarks.sandbox", "sandbox"),
    Writer("gpu_check/*", "python -m benchmarks.gpu_check", "gpu_check",
           "run on a GPU machine (an H200 lent to a session) and copied back from it"),
    Writer("trl_overhead/*", "python -m benchmarks.trl_overhead", "trl_overhead"),
    Writer("group_value/*", "python -m benchmarks.group_value", "group_value",
           "runs/<regime>_<variant>_s<seed>.{parquet,json}: each probed run's groups, kept so that a run resumes"),
    Writer("summary_speed/*", "python -m benchmarks.summary_speed", "summary_speed",
           "the study's --summarize-only against the script it replaced, timed in turns on one machine"),
    Writer("archive/README.md", "", "", "written by hand: what replaced each archived result"),
    Writer("archive/training/", "python -m benchmarks.training", "training", "superseded by benchmarks.study"),
)


def entries(results: Path = RESULTS) -> list[str]:
    """What the index lists: each file of a top-level folder, and each folder inside one as one entry (ending in
    "/"; study/<regime>/, archive/training/), not its files. A file at the top level (the index aside) is listed
    too, so that ``render`` refuses it: every file belongs in its writer's folder."""
    out: list[str] = []
    for top in sorted(results.iterdir()):
        if top.name.startswith(".") or top.name == INDEX:
            continue
        if not top.is_dir():
            out.append(top.name)
            continue
        out += [f"{top.name}/{p.name}" + ("/" if p.is_dir() else "") for p in sorted(top.iterdir())
                if not p.name.startswith(".")]
    return out


def writer_of(entry: str) -> Writer | None:
    return next((w for w in WRITERS if fnmatch.fnmatchcase(entry, w.pattern)), None)


def script(module: str) -> Path:
    """The source of a benchmark: benchmarks/<module>.py, or a package's benchmarks/<module>/__init__.py."""
    path = ROOT / "benchmarks" / f"{module}.py"
    return path if path.is_file() else ROOT / "benchmarks" / module / "__init__.py"


def source(module: str) -> str:
    """The source text of a benchmark: its module, or every module of its package."""
    path = script(module)
    files = [path] if path.name != "__init__.py" else sorted(path.parent.glob("*.py"))
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def script_name(module: str) -> str:
    """How the index names a benchmark's script: ``benchmarks/<module>.py`` or the package ``benchmarks/<module>/``."""
    return f"benchmarks/{module}.py" if script(module).name != "__init__.py" else f"benchmarks/{module}/"


def purpose(module: str) -> str:
    """The first paragraph of the benchmark's docstring on one line (read from the source; nothing is imported)."""
    if not module:
        return ""
    doc = ast.get_docstring(ast.parse(script(module).read_text(encoding="utf-8"))) or ""
    return " ".join(doc.strip().split("\n\n")[0].split()).rstrip(".:")


def render(results: Path = RESULTS) -> str:
    """The index's text: one row per writer (rows of one folder together), its folder, command, the script's purpose
    and its entries."""
    found = entries(results)
    orphans = [e for e in found if writer_of(e) is None]
    if orphans:
        raise ValueError(f"no writer in benchmarks/results_index.py WRITERS for {orphans}: move each into the folder "
                         "of the benchmark that writes it (benchmarks/results/<module>/) or add its writer")
    lines = ["# benchmarks/results/: what wrote each file", "",
             "Generated by `python -m benchmarks.results_index` (do not edit; tests/benchmarks/test_results_index.py "
             "checks it is current).",
             "Each benchmark writes into the folder named after its module (`benchmarks/<module>.py` -> `<module>/`); "
             "`--out DIR` names another root (DIR/<module>/), and a `--quick` or reduced run writes to a temporary "
             "one. Superseded results are in [archive/](archive/README.md).", "",
             "| folder | written by | the script | files | note |", "|---|---|---|---|---|"]
    for w in WRITERS:
        mine = [e for e in found if writer_of(e) is w]
        if mine:
            files = ", ".join(f"[`{e.split('/', 1)[1]}`]({e})" for e in mine)
            script = f"`{script_name(w.module)}`: {purpose(w.module)}" if w.module else ""
            command = f"`{w.command}`" if w.command else ""
            lines.append(f"| [`{w.folder}/`]({w.folder}/) | {command} | {script} | {files} | {w.note} |")
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
