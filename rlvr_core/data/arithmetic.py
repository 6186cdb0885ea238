"""Synthetic integer arithmetic: ``a op b`` with op in + - *, answers written reversed.

Prompt: ``f"{a:04d}{op}{b:04d}="``, e.g. ``"0047+0083="``.
Completion (what the model writes after the prompt): the decimal digits of the
answer least significant first and nothing else, e.g. 130 -> ``"031"``; zero is
``"0"``. Reversed digits let a left-to-right model emit the carry chain in the
order it is computed.

Difficulty d (1..4) is the digit count of the larger operand ("1-digit" numbers
are 0..9, d-digit numbers for d >= 2 are 10**(d-1)..10**d-1):

- ``+``: a, b in 0..10**d-1 with max(a, b) d digits;
- ``-``: a d digits, 0 <= b <= a (the result is never negative);
- ``*``: a d digits, b in 1..9.

Each (d, op) cell is a finite, indexable problem space; ``make_arithmetic``
samples distinct problems from each cell without replacement, so the 245
one-digit problems are never over-drawn: a cell's quota is capped at its size and
the excess moves to the other cells (see ``rlvr_core.data.splits.apportion``).
"""

from __future__ import annotations

from math import isqrt
from numbers import Real
from typing import Any, Sequence

import numpy as np

from rlvr_core.data.splits import FieldType, apportion, build_dataset_dict, check_disjoint
from rlvr_core.errors import require

OPS: tuple[str, ...] = ("+", "-", "*")
DIGITS: tuple[int, ...] = (1, 2, 3, 4)
MAX_COMPLETION_CHARS = 12  # longest accepted answer (4-digit * 4-digit fits in 8)

SCHEMA: dict[str, FieldType] = {
    "id": str,
    "prompt": str,
    "difficulty": int,
    "op": str,
    "a": int,
    "b": int,
    "answer": str,
}

_ASCII_DIGITS = frozenset("0123456789")
_ASCII_SPACE = " \t\n\r\f\v"


def format_answer(value: int) -> str:
    """Canonical completion for ``value``: its decimal digits reversed (130 -> "031")."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"format_answer: need a non-negative int, got {value!r}")
    return str(int(value))[::-1]


def parse_answer(completion: str) -> int | None:
    """Inverse of ``format_answer``; ``None`` for anything not in the canonical format.

    Accepted: surrounding ASCII whitespace, then 1..12 ASCII digits (no sign, no
    inner spaces, no unicode digits), not ending in "0" unless it is "0" itself
    (a trailing 0 would be a leading zero of the answer). Never raises.
    """
    if not isinstance(completion, str) or len(completion) > 4 * MAX_COMPLETION_CHARS:
        return None
    text = completion.strip(_ASCII_SPACE)
    if not 0 < len(text) <= MAX_COMPLETION_CHARS or not _ASCII_DIGITS.issuperset(text):
        return None
    if len(text) > 1 and text[-1] == "0":
        return None
    return int(text[::-1])


def format_prompt(a: int, op: str, b: int) -> str:
    """``f"{a:04d}{op}{b:04d}="``."""
    return f"{a:04d}{op}{b:04d}="


def apply_op(a: int, op: str, b: int) -> int:
    """The exact result of ``a op b`` for op in + - *."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"op: must be one of {OPS}, got {op!r}")


def _bounds(d: int) -> tuple[int, int]:
    """[lo, hi) of the d-digit numbers (1-digit includes 0)."""
    return (0 if d == 1 else 10 ** (d - 1)), 10**d


def cell_size(d: int, op: str) -> int:
    """Number of distinct problems with difficulty ``d`` and operator ``op``."""
    lo, hi = _bounds(d)
    if op == "+":
        return hi * hi - lo * lo
    if op == "-":
        return hi * (hi + 1) // 2 - lo * (lo + 1) // 2
    if op == "*":
        return (hi - lo) * 9
    raise ValueError(f"op: must be one of {OPS}, got {op!r}")


def _decode(d: int, op: str, idx: int) -> tuple[int, int]:
    """Map index ``0 <= idx < cell_size(d, op)`` to its operand pair (a bijection)."""
    lo, hi = _bounds(d)
    if op == "+":
        span = (hi - lo) * hi  # a is d digits, b anything below hi
        if idx < span:
            return lo + idx // hi, idx % hi
        idx -= span  # a has fewer digits, so b must have d
        return idx // (hi - lo), lo + idx % (hi - lo)
    if op == "-":
        # problems with first operand < a number a*(a+1)/2; find a from the offset
        t = idx + lo * (lo + 1) // 2
        a = (isqrt(8 * t + 1) - 1) // 2
        while a * (a + 1) // 2 > t:
            a -= 1
        while (a + 1) * (a + 2) // 2 <= t:
            a += 1
        return a, t - a * (a + 1) // 2
    if op == "*":
        return lo + idx // 9, 1 + idx % 9
    raise ValueError(f"op: must be one of {OPS}, got {op!r}")


def make_row(split: str, index: int, a: int, op: str, b: int) -> dict[str, Any]:
    """One dataset row for ``a op b``."""
    return {
        "id": f"arith-{split}-{index:06d}",
        "prompt": format_prompt(a, op, b),
        "difficulty": len(str(max(a, b))),
        "op": op,
        "a": a,
        "b": b,
        "answer": str(apply_op(a, op, b)),
    }


def _check_arguments(
    n_train: Any, n_test: Any, digits: Sequence[int], ops: Sequence[str], digit_weights: Sequence[float] | None
) -> tuple[tuple[int, ...], tuple[str, ...], Sequence[float]]:
    """Validate ``make_arithmetic``'s sizes and mix; return digits, ops and weights (default equal)."""
    require(isinstance(n_train, int) and n_train >= 0, "n_train", f"must be an int >= 0, got {n_train!r}")
    require(isinstance(n_test, int) and n_test >= 0, "n_test", f"must be an int >= 0, got {n_test!r}")
    digits = tuple(digits)
    ops = tuple(ops)
    require(len(digits) > 0 and all(d in DIGITS for d in digits), "digits",
            f"must be a non-empty subset of {DIGITS}, got {digits}")
    require(len(set(digits)) == len(digits), "digits", f"must not repeat, got {digits}")
    require(len(ops) > 0 and all(o in OPS for o in ops), "ops", f"must be a non-empty subset of {OPS}, got {ops}")
    require(len(set(ops)) == len(ops), "ops", f"must not repeat, got {ops}")
    if digit_weights is None:
        digit_weights = [1.0] * len(digits)
    require(
        len(digit_weights) == len(digits),
        "digit_weights",
        f"need one weight per entry of digits {digits}, got {list(digit_weights)}",
    )
    return digits, ops, digit_weights


def _cell_quotas(
    n_train: int, n_test: int, digits: tuple[int, ...], ops: tuple[str, ...], digit_weights: Sequence[float]
) -> tuple[list[tuple[int, str]], list[int], list[int], list[int]]:
    """The (digit count, op) cells, their sizes, and how many problems (all, test) each one gives.

    Raises ConfigError for bad weights or when the weighted cells hold fewer than
    ``n_train + n_test`` distinct problems.
    """
    cells = [(d, op) for d in digits for op in ops]
    weights = [float(w) / len(ops) for w in digit_weights for _ in ops]
    caps = [cell_size(d, op) for d, op in cells]
    require(
        all(isinstance(w, Real) and not isinstance(w, bool) and w >= 0 for w in digit_weights)
        and any(w > 0 for w in digit_weights),
        "digit_weights",
        f"must be non-negative numbers with at least one > 0, got {list(digit_weights)}",
    )
    total = n_train + n_test
    capacity = sum(c for c, w in zip(caps, weights) if w > 0)
    require(
        total <= capacity,
        "n_train + n_test",
        f"asked for {total} distinct problems but digits={digits}, ops={ops}, digit_weights={list(digit_weights)} "
        f"hold only {capacity} (1-digit problems are scarce: add more digits or ask for fewer rows)",
    )
    quotas = apportion(total, weights, caps)
    test_quotas = apportion(n_test, [float(q) for q in quotas], quotas) if n_test and total else [0] * len(cells)
    return cells, caps, quotas, test_quotas


_Problem = tuple[int, str, int]


def _draw_problems(
    cells: Sequence[tuple[int, str]], caps: Sequence[int], quotas: Sequence[int], test_quotas: Sequence[int],
    rng: np.random.Generator,
) -> tuple[list[_Problem], list[_Problem]]:
    """Draw each cell's quota without replacement; its first ``test_quota`` problems go to test.

    Returns (train, test) as lists of ``(a, op, b)``.
    """
    train: list[_Problem] = []
    test: list[_Problem] = []
    for (d, op), size, q, q_test in zip(cells, caps, quotas, test_quotas):
        if q == 0:
            continue
        picks = rng.choice(size, size=q, replace=False)
        problems = [(*_decode(d, op, int(i)), op) for i in picks]
        test.extend((a, o, b) for a, b, o in problems[:q_test])
        train.extend((a, o, b) for a, b, o in problems[q_test:])
    return train, test


def make_arithmetic(
    n_train: int,
    n_test: int,
    seed: int,
    *,
    digits: Sequence[int] = DIGITS,
    ops: Sequence[str] = OPS,
    digit_weights: Sequence[float] | None = None,
) -> Any:
    """Build disjoint train/test splits of distinct arithmetic problems.

    Rows are spread over the (digit count, op) cells by ``digit_weights`` (one
    per entry of ``digits``, default equal) and equally over ``ops``; a cell too
    small for its share is taken whole and the rest goes to the other cells.
    Within a cell problems are drawn without replacement; the test split takes a
    proportional slice of every cell, so both splits mix all difficulties. Row
    order within a split is shuffled. Same arguments, same dataset.

    Returns:
        ``datasets.DatasetDict`` with "train" (n_train rows) and "test" (n_test rows),
        columns id, prompt, difficulty, op, a, b, answer.
    Raises:
        ConfigError: bad arguments, or more problems asked than the mix holds.
    """
    digits, ops, digit_weights = _check_arguments(n_train, n_test, digits, ops, digit_weights)
    cells, caps, quotas, test_quotas = _cell_quotas(n_train, n_test, digits, ops, digit_weights)
    rng = np.random.default_rng(seed)
    train, test = _draw_problems(cells, caps, quotas, test_quotas, rng)

    split_rows = {}
    for name, problems in (("train", train), ("test", test)):
        order = rng.permutation(len(problems))
        split_rows[name] = [make_row(name, i, *problems[j]) for i, j in enumerate(order)]
    check_disjoint({name: [r["prompt"] for r in rows] for name, rows in split_rows.items()})
    return build_dataset_dict(split_rows, SCHEMA)
