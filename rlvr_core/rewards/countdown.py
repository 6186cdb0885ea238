"""Verifier for the Countdown task (``rlvr_core.data.countdown``).

Answer format: the whole completion (surrounding ASCII whitespace stripped) is
one arithmetic expression, e.g. ``"(7*50+25)/3"`` for the prompt
``"3,7,25,50>125="``. It may contain only ASCII digits, ``+ - * /``,
parentheses and spaces; every number of ``example["numbers"]`` must appear
exactly once as an integer literal (no unary minus, no ``**``, ``//``, names or
calls). Division is exact rational arithmetic, so ``25/(3+7)*50`` is fine.

``verify_countdown(completion, example) -> 1.0 | 0.0`` is 1.0 iff the
expression's exact value equals ``example["target"]``. Model text is never
executed: cheap checks (length <= 200, character whitelist, parenthesis depth
<= 32) run before ``ast.parse``; the tree is checked node by node against a
whitelist and evaluated with ``fractions.Fraction``; any intermediate above
1e12 in magnitude, a division by zero or any error scores 0.0. It never raises.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter
from fractions import Fraction
from typing import Mapping

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_ABS = 10**12
_ALLOWED = frozenset("0123456789+-*/() ")
_ASCII_SPACE = " \t\n\r\f\v"
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


class _Reject(Exception):
    """The expression is not a valid answer."""


def _literals(node: ast.AST, limit: int) -> list[int]:
    """Integer literals of a whitelisted tree, in order; rejects any other node (iterative)."""
    found: list[int] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            stack.append(n.right)
            stack.append(n.left)
        elif isinstance(n, ast.Constant) and type(n.value) is int and 0 <= n.value <= MAX_ABS:
            found.append(n.value)
            if len(found) > limit:
                raise _Reject
        else:
            raise _Reject
    return found


def _evaluate(node: ast.AST) -> Fraction:
    """Exact value of a tree already checked by ``_literals`` (depth <= number of literals)."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    left = _evaluate(node.left)
    right = _evaluate(node.right)
    if isinstance(node.op, ast.Div) and right == 0:
        raise _Reject
    value = _BINOPS[type(node.op)](left, right)
    if abs(value) > MAX_ABS or value.denominator > MAX_ABS:
        raise _Reject
    return value


def _check_depth(text: str) -> bool:
    """Parentheses balanced and nested at most MAX_DEPTH deep."""
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def verify_countdown(completion: str, example: Mapping) -> float:
    """1.0 iff ``completion`` uses each of ``example["numbers"]`` once and equals ``example["target"]``."""
    try:
        if not isinstance(completion, str) or len(completion) > MAX_CHARS:
            return 0.0
        text = completion.strip(_ASCII_SPACE)
        if not text or not _ALLOWED.issuperset(text) or not _check_depth(text):
            return 0.0
        numbers = [operator.index(n) for n in example["numbers"]]
        target = operator.index(example["target"])
        tree = ast.parse(text, mode="eval")
        if not isinstance(tree, ast.Expression):
            return 0.0
        if Counter(_literals(tree.body, len(numbers))) != Counter(numbers):
            return 0.0
        return 1.0 if _evaluate(tree.body) == target else 0.0
    except Exception:  # noqa: BLE001 - _Reject, SyntaxError, RecursionError, MemoryError, bad example: score 0
        return 0.0
