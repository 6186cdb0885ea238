"""Layers of rlvr_core and benchmarks/: no import climbs a floor, and no import circle (docs/design.md §2.1).

Every module of rlvr_core belongs to a unit: a top-level module (``rlvr_core/tasks.py``) or a package
(``rlvr_core/allocation/``). ``LAYERS`` puts the units on floors, ground floor first. A module may import
from its own floor and the floors below, never from a floor above. Imports are read with ``ast`` wherever
they are written: at module level and inside functions (a lazy import is still an arrow). Separately, the
imports must form no circle, neither between modules nor between units (two units of one floor may import
each other only one way).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "rlvr_core"

# Floors of rlvr_core, ground floor first: a unit imports only from its own floor and the floors below.
LAYERS: tuple[tuple[str, ...], ...] = (
    # ground: plain data, errors, registries, numerics and files, no knowledge of tasks or models
    ("rlvr_core", "rlvr_core.errors", "rlvr_core.types", "rlvr_core.registry", "rlvr_core.stats",
     "rlvr_core.beta_moments", "rlvr_core.safefs", "rlvr_core.runlock", "rlvr_core.rollout_log",
     "rlvr_core.checkpoint"),
    ("rlvr_core.data",),  # rows: generators, hub loaders, templates, row checks against a task's schema
    ("rlvr_core.models", "rlvr_core.rewards"),  # policies and the warm start; verifiers and the Scorer
    ("rlvr_core.rollout",),  # engines
    ("rlvr_core.allocation", "rlvr_core.grpo"),  # allocators and the allocation loop; the policy update
    ("rlvr_core.evaluation", "rlvr_core.tasks"),  # held-out evaluation; the task registry
    ("rlvr_core.config",),  # the params sections, checked against every registry
    ("rlvr_core.preflight",),  # a run's inputs, checked once
    ("rlvr_core.training",),  # the RL run
    ("rlvr_core.integrations", "rlvr_core.advise", "rlvr_core.cli"),  # entry points for users
)


def unit(module: str) -> str:
    """``rlvr_core.allocation.sara`` -> ``rlvr_core.allocation``; ``rlvr_core`` (the package's init) stays."""
    return ".".join(module.split(".")[:2])


def floor_of(layers: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    return {name: i for i, units in enumerate(layers) for name in units}


def package_sources(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[str, bool]]:
    """{module name: (source, is a package's __init__)} of every module under ``root/package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_init else parts)] = (path.read_text(encoding="utf-8"), is_init)
    return out


def imports_of(module: str, source: str, is_init: bool, known: Iterable[str],
               package: str = PACKAGE) -> list[tuple[int, str]]:
    """(line, imported module) of every import of a ``package`` module in ``source``, at any depth.

    ``from a.b import c`` imports ``a.b.c`` when that is a module, else ``a.b``; relative imports are
    resolved against ``module``.
    """
    known = set(known)
    here = module.split(".") if is_init else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for a in node.names:
                found.append((node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base))
    ours = [(line, name) for line, name in found if name == package or name.startswith(package + ".")]
    return list(dict.fromkeys(ours))  # ``from m import a, b`` is one arrow


def import_graph(sources: Mapping[str, tuple[str, bool]], package: str = PACKAGE) -> dict[str, list[tuple[int, str]]]:
    """{module: [(line, imported module), ...]} over ``sources`` (``package_sources``)."""
    return {m: imports_of(m, src, is_init, sources, package) for m, (src, is_init) in sources.items()}


def upward_imports(graph: Mapping[str, list[tuple[int, str]]], layers: tuple[tuple[str, ...], ...],
                   unit: Callable[[str], str] = unit) -> list[str]:
    """Every import from a higher floor, and every module whose unit is on no floor, in words."""
    floor = floor_of(layers)
    problems = sorted({f"{unit(m)} (of {m}) is on no floor of LAYERS" for m in graph if unit(m) not in floor})
    for m, targets in graph.items():
        for line, target in targets:
            src, dst = unit(m), unit(target)
            if src in floor and dst in floor and floor[dst] > floor[src]:
                problems.append(f"{m}:{line} imports {target}: floor {floor[dst]} ({dst}) is above "
                                f"floor {floor[src]} ({src})")
    return problems


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles of ``edges`` ({node: nodes it imports}): each strongly connected component of two
    or more nodes, sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(set(edges.get(start, ())))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(set(edges.get(nxt, ()))))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def module_edges(graph: Mapping[str, list[tuple[int, str]]]) -> dict[str, set[str]]:
    return {m: {t for _, t in targets if t != m} for m, targets in graph.items()}


def unit_edges(graph: Mapping[str, list[tuple[int, str]]], unit: Callable[[str], str] = unit) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(unit(m), set()).update(unit(t) for _, t in targets if unit(t) != unit(m))
    return out


# ----------------------------------------------------------------------------- the package


def test_no_import_in_rlvr_core_climbs_a_floor() -> None:
    graph = import_graph(package_sources())
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk found the package and its imports
    problems = upward_imports(graph, LAYERS)
    assert not problems, "imports from a higher floor (docs/design.md §2.1):\n" + "\n".join(problems)


def test_every_floor_names_a_unit_that_exists_once() -> None:
    units = {unit(m) for m in package_sources()}
    named = [u for floor in LAYERS for u in floor]
    assert len(named) == len(set(named)), "a unit is on two floors"
    assert set(named) == units, f"stale: {sorted(set(named) - units)}, unplaced: {sorted(units - set(named))}"


def test_rlvr_core_has_no_import_circle() -> None:
    graph = import_graph(package_sources())
    assert cycles(unit_edges(graph)) == [], "import circles between rlvr_core's packages and modules"
    assert cycles(module_edges(graph)) == [], "import circles between rlvr_core's modules"


# ----------------------------------------------------------------------------- the benchmarks

# Floors of benchmarks/, ground floor first. Every module of the training study's package (benchmarks/study/) is a
# unit of its own: the plan below the store, the statistics and the data, those below the driver and the tables,
# the tables the summary calls (floor, study_targets, warmstarts) below the summary, the command line on top.
BENCHMARK_LAYERS: tuple[tuple[str, ...], ...] = (
    ("benchmarks", "benchmarks.common", "benchmarks.study", "benchmarks.math_verifier", "benchmarks.record_trl_trace"),
    ("benchmarks.study.plan", "benchmarks.study.formats", "benchmarks.study.noise", "benchmarks.ablation",
     "benchmarks.advisor_speed",
     "benchmarks.leaderboard", "benchmarks.orchestration", "benchmarks.readme", "benchmarks.cpu_kernels",
     "benchmarks.gpu_check", "benchmarks.results_index", "benchmarks.sandbox", "benchmarks.trl_overhead",
     "benchmarks.summary_speed"),
    ("benchmarks.study.store", "benchmarks.study.data", "benchmarks.study.stats", "benchmarks.allocation",
     "benchmarks.training"),
    ("benchmarks.study.tables", "benchmarks.study.tuning", "benchmarks.study.execute", "benchmarks.floor",
     "benchmarks.study_targets", "benchmarks.record_policies", "benchmarks.advisor_validation"),
    ("benchmarks.warmstarts", "benchmarks.group_size", "benchmarks.grpo_tuning", "benchmarks.null_controls",
     "benchmarks.replication", "benchmarks.ar3po_anatomy",
     "benchmarks.large_set",
     "benchmarks.study.round_price", "benchmarks.study.replication",
     "benchmarks.study.backfill",
     "benchmarks.regimes", "benchmarks.group_value"),
    ("benchmarks.study.summarize", "benchmarks.study.heldout"),
    ("benchmarks.study.cli",),
    ("benchmarks.study.__main__",),
)


def benchmark_unit(module: str) -> str:
    """``benchmarks.floor`` stays; ``benchmarks.study.store`` is a unit of its own; ``benchmarks.study`` (the package's
    init) stays."""
    parts = module.split(".")
    return ".".join(parts[:3] if parts[:2] == ["benchmarks", "study"] else parts[:2])


def test_no_import_in_benchmarks_climbs_a_floor() -> None:
    graph = import_graph(package_sources(ROOT, "benchmarks"), "benchmarks")
    assert len(graph) > 25 and sum(map(len, graph.values())) > 40
    problems = upward_imports(graph, BENCHMARK_LAYERS, benchmark_unit)
    assert not problems, "imports from a higher floor of benchmarks/:\n" + "\n".join(problems)
    units = {benchmark_unit(m) for m in graph}
    named = [u for floor in BENCHMARK_LAYERS for u in floor]
    assert len(named) == len(set(named)) and set(named) == units, (sorted(set(named) ^ units))


def test_benchmarks_have_no_import_circle() -> None:
    graph = import_graph(package_sources(ROOT, "benchmarks"), "benchmarks")
    assert cycles(unit_edges(graph, benchmark_unit)) == [], "import circles between benchmarks' modules"
    assert cycles(module_edges(graph)) == [], "import circles between benchmarks' modules"


# ----------------------------------------------------------------------------- the checker itself

SYNTHETIC = {
    "rlvr_core": ("", True),
    "rlvr_core.errors": ("class ConfigError(ValueError):\n    pass\n", False),
    "rlvr_core.data": ("from . import rows  # noqa\n", True),
    "rlvr_core.data.rows": ("from ..errors import ConfigError\n\n\ndef check():\n"
                            "    from rlvr_core.training import train  # a lazy import climbs too\n", False),
    "rlvr_core.models": ("", True),
    "rlvr_core.models.a": ("import rlvr_core.rewards.b\n", False),
    "rlvr_core.rewards": ("", True),
    "rlvr_core.rewards.b": ("def f():\n    from rlvr_core.models import a\n", False),
    "rlvr_core.training": ("from rlvr_core.data.rows import check, f\nimport os\n", False),
    "rlvr_core.newpkg": ("from rlvr_core import errors\n", False),
}
SYNTHETIC_LAYERS = (("rlvr_core", "rlvr_core.errors"), ("rlvr_core.data",), ("rlvr_core.models", "rlvr_core.rewards"),
                    ("rlvr_core.training",))


def test_the_checker_resolves_imports_at_any_depth() -> None:
    graph = import_graph(SYNTHETIC)
    assert graph["rlvr_core.data"] == [(1, "rlvr_core.data.rows")]  # a relative import of a submodule
    assert graph["rlvr_core.data.rows"] == [(1, "rlvr_core.errors"), (5, "rlvr_core.training")]
    assert graph["rlvr_core.rewards.b"] == [(2, "rlvr_core.models.a")]
    assert graph["rlvr_core.training"] == [(1, "rlvr_core.data.rows")]  # os is not rlvr_core's
    assert graph["rlvr_core.newpkg"] == [(1, "rlvr_core.errors")]


def test_the_checker_catches_an_upward_import_and_an_unplaced_unit() -> None:
    problems = upward_imports(import_graph(SYNTHETIC), SYNTHETIC_LAYERS)
    assert problems == [
        "rlvr_core.newpkg (of rlvr_core.newpkg) is on no floor of LAYERS",
        "rlvr_core.data.rows:5 imports rlvr_core.training: floor 3 (rlvr_core.training) is above floor 1 "
        "(rlvr_core.data)",
    ]


def test_the_checker_catches_circles_between_modules_and_between_units() -> None:
    graph = import_graph(SYNTHETIC)
    assert cycles(module_edges(graph)) == [["rlvr_core.data.rows", "rlvr_core.training"],
                                          ["rlvr_core.models.a", "rlvr_core.rewards.b"]]
    # one floor, two units that import each other: a circle, though no import climbs
    assert cycles(unit_edges(graph)) == [["rlvr_core.data", "rlvr_core.training"],
                                        ["rlvr_core.models", "rlvr_core.rewards"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"d"}}) == []  # a chain; a self-import is no circle


def test_reading_params_and_the_stages_that_train_nothing_import_no_torch() -> None:
    """rlvr_core.config (every params section, WarmStartConfig included) and the prepare and report stages start
    without torch or transformers: each pipeline stage is a fresh process, and torch's import is seconds of it."""
    import subprocess
    import sys

    code = ("import sys, rlvr_core.config, flows.prepare, flows.report; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=360)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
