"""Structure of rlvr_core and benchmarks/: no function or method runs over 60 lines (``def`` to its last line,
docstring included)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def long_functions(source: str, where: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(``where:Class.method``, length) of every function, method or nested function longer than ``limit`` lines."""
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    found.append((f"{where}:{prefix}{child.name}", length))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return found


def test_no_function_in_rlvr_core_is_over_60_lines() -> None:
    paths = sorted((ROOT / "rlvr_core").rglob("*.py"))
    assert len(paths) > 10  # the walk found the package
    offenders = [
        hit
        for path in paths
        for hit in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not offenders, f"functions over {MAX_LINES} lines (split them into named parts): " + ", ".join(
        f"{name} ({n} lines)" for name, n in offenders
    )


def test_no_function_in_benchmarks_is_over_60_lines() -> None:
    paths = sorted((ROOT / "benchmarks").rglob("*.py"))
    assert len(paths) > 20 and any(p.parent.name == "study" for p in paths)  # the walk found the package
    offenders = [hit for path in paths
                 for hit in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not offenders, f"functions over {MAX_LINES} lines (split them into named parts): " + ", ".join(
        f"{name} ({n} lines)" for name, n in offenders
    )


def test_the_walk_finds_long_functions_methods_and_nested_ones() -> None:
    def body(indent: int, n: int = 60) -> str:
        return "".join(" " * indent + f"x{i} = {i}\n" for i in range(n))

    source = (
        "def short():\n" + body(4, 3)
        + "def long_one():\n" + body(4)  # 61 lines
        + "class C:\n    def method(self):\n" + body(8)  # 61
        + "    async def fine(self):\n" + body(8, 59)  # 60: at the limit
        + "def outer():\n    def inner():\n" + body(8) + "    return inner\n"  # inner 61, outer 63
    )  # fmt: skip
    found = dict(long_functions(source, "m.py"))
    assert found == {"m.py:long_one": 61, "m.py:C.method": 61, "m.py:outer": 63, "m.py:outer.inner": 61}
    assert long_functions(source, "m.py", limit=62) == [("m.py:outer", 63)]
