"""Synthetic Countdown: combine every given number once with + - * / to hit a target.

Prompt: ``f"{','.join(map(str, numbers))}>{target}="`` with the numbers sorted
ascending, e.g. ``"3,7,25,50>125="``.
Completion: an arithmetic expression and nothing else (surrounding whitespace
ignored) that uses every given number exactly once, e.g. ``"(7*50+25)/3"`` or
``"25/(3+7)*50"`` for the prompt above. Allowed: the given integers, binary
``+ - * /``, parentheses and spaces (no unary minus, no other characters).
Division is exact (rational); intermediates may be fractions, the final value
must equal the target. The verifier is
``rlvr_core.rewards.countdown.verify_countdown``.

Numbers are dealt from the Countdown deck (1..10 twice each, plus 25, 50, 75,
100) without replacement; the target is the value of a random expression tree
over all dealt numbers, kept when it is an integer in 1..999. The recorded
``answer`` is that expression with minimal parentheses. A problem is identified
by (sorted numbers, target); splits hold distinct problems and never share one.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any, Sequence

from rlvr_core.data.splits import FieldType, apportion, build_dataset_dict, check_disjoint
from rlvr_core.errors import ConfigError, require

DECK: tuple[int, ...] = tuple(sorted(list(range(1, 11)) * 2 + [25, 50, 75, 100]))
SIZES: tuple[int, ...] = (3, 4)
MAX_TARGET = 999
OPS: tuple[str, ...] = ("+", "-", "*", "/")
MAX_MISSES = 20_000  # consecutive draws without a new problem before giving up
# the longest recorded answer: the digits of the largest numbers, an operator between each two, and
# at most one pair of parentheses per operator but the outermost (16 characters: "100/(75-(50-25))")
MAX_ANSWER_CHARS = (sum(len(str(n)) for n in DECK[-max(SIZES):]) + (max(SIZES) - 1)
                    + 2 * (max(SIZES) - 2))
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_LEAF_PREC = 3

SCHEMA: dict[str, FieldType] = {
    "id": str,
    "prompt": str,
    "difficulty": int,
    "numbers": ("list", int),
    "target": int,
    "answer": str,
}


def format_prompt(numbers: Sequence[int], target: int) -> str:
    """``"3,7,25,50>125="`` (numbers in the order given)."""
    return f"{','.join(map(str, numbers))}>{target}="


Term = tuple[Fraction, str, int]  # (value, text, precedence)


def _combine(left: Term, op: str, right: Term) -> Term | None:
    """Apply ``op``; return (value, text with minimal parentheses, precedence) or None on x/0."""
    lv, ls, lp = left
    rv, rs, rp = right
    if op == "+":
        v = lv + rv
    elif op == "-":
        v = lv - rv
    elif op == "*":
        v = lv * rv
    else:
        if rv == 0:
            return None
        v = lv / rv
    p = _PREC[op]
    if lp < p:
        ls = f"({ls})"
    if rp < p or (rp == p and op in "-/"):  # a-(b+c), a/(b*c) keep their parentheses
        rs = f"({rs})"
    return v, f"{ls}{op}{rs}", p


def random_expression(numbers: Sequence[int], rng: random.Random) -> tuple[Fraction, str] | None:
    """Value and text of a random expression using each of ``numbers`` once.

    Repeatedly merges two random sub-expressions with a random operator, which
    reaches every binary tree shape. Returns None if a division by zero occurs.
    """
    items: list[tuple[Fraction, str, int]] = [(Fraction(n), str(n), _LEAF_PREC) for n in numbers]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        left, right = items[i], items[j]
        for k in sorted((i, j), reverse=True):
            items.pop(k)
        merged = _combine(left, rng.choice(OPS), right)
        if merged is None:
            return None
        items.append(merged)
    return items[0][0], items[0][1]


def _draw_problems(size: int, count: int, rng: random.Random, seen: set[tuple[tuple[int, ...], int]],
                   *, may_run_out: bool = False) -> list[tuple[list[int], int, str]]:
    """``count`` new distinct (sorted numbers, target, solution) problems of ``size`` numbers.

    When the space of such problems is used up (``MAX_MISSES`` draws in a row give nothing new) it
    returns the fewer problems found if ``may_run_out``, and raises ConfigError otherwise.
    """
    out: list[tuple[list[int], int, str]] = []
    misses = 0  # draws since the last new problem: a long streak means the space is used up
    while len(out) < count:
        misses += 1
        if misses > MAX_MISSES and may_run_out:
            return out
        if misses > MAX_MISSES:
            raise ConfigError(
                f"n_train + n_test: found only {len(out)} of {count} distinct {size}-number problems "
                f"({MAX_MISSES} draws in a row gave nothing new; 3 numbers give about 7,600 problems, "
                "4 numbers far more): ask for fewer rows or include size 4"
            )
        numbers = rng.sample(DECK, size)
        expr = random_expression(numbers, rng)
        if expr is None:
            continue
        value, text = expr
        if value.denominator != 1 or not 1 <= value <= MAX_TARGET:
            continue
        key = (tuple(sorted(numbers)), int(value))
        if key in seen:
            continue
        seen.add(key)
        misses = 0
        out.append((sorted(numbers), int(value), text))
    return out


def make_row(split: str, index: int, numbers: list[int], target: int, answer: str) -> dict[str, Any]:
    """One dataset row."""
    return {
        "id": f"countdown-{split}-{index:06d}",
        "prompt": format_prompt(numbers, target),
        "difficulty": len(numbers),
        "numbers": list(numbers),
        "target": target,
        "answer": answer,
    }


def make_countdown(n_train: int, n_test: int, seed: int, *, sizes: Sequence[int] = SIZES) -> Any:
    """Build disjoint train/test splits of distinct Countdown problems.

    Rows are spread equally over ``sizes`` (3 and/or 4 numbers); the test split
    takes a proportional slice of each size, so both splits mix difficulties.
    A size whose distinct problems run out (3 numbers give about 7,600) hands
    the rows it could not give to the next size (the CPU default's 20,500 rows:
    all 3-number problems, the rest 4-number ones); the last size raises.
    Row order within a split is shuffled. Same arguments, same dataset.

    Returns:
        ``datasets.DatasetDict`` with "train" (n_train rows) and "test" (n_test rows),
        columns id, prompt, difficulty, numbers, target, answer.
    Raises:
        ConfigError: bad arguments, or more distinct problems asked than can be found.
    """
    require(isinstance(n_train, int) and n_train >= 0, "n_train", f"must be an int >= 0, got {n_train!r}")
    require(isinstance(n_test, int) and n_test >= 0, "n_test", f"must be an int >= 0, got {n_test!r}")
    sizes = tuple(sizes)
    require(len(sizes) > 0 and all(s in SIZES for s in sizes), "sizes",
            f"must be a non-empty subset of {SIZES}, got {sizes}")
    require(len(set(sizes)) == len(sizes), "sizes", f"must not repeat, got {sizes}")

    total = n_train + n_test
    quotas = apportion(total, [1.0] * len(sizes))
    test_quotas = apportion(n_test, [float(q) for q in quotas], quotas) if n_test and total else [0] * len(sizes)
    rng = random.Random(seed)
    seen: set[tuple[tuple[int, ...], int]] = set()
    train: list[tuple[list[int], int, str]] = []
    test: list[tuple[list[int], int, str]] = []
    short_train = short_test = 0  # rows a used-up size could not give, asked of the next size instead
    for i, (size, q, q_test) in enumerate(zip(sizes, quotas, test_quotas)):
        q_train, q_test = q - q_test + short_train, q_test + short_test
        problems = _draw_problems(size, q_train + q_test, rng, seen, may_run_out=i + 1 < len(sizes))
        test.extend(problems[:q_test])
        train.extend(problems[q_test:])
        short_test = q_test - len(problems[:q_test])
        short_train = q_train - len(problems[q_test:])

    split_rows = {}
    for name, problems in (("train", train), ("test", test)):
        rng.shuffle(problems)
        split_rows[name] = [make_row(name, i, *p) for i, p in enumerate(problems)]
    check_disjoint({name: [r["prompt"] for r in rows] for name, rows in split_rows.items()})
    return build_dataset_dict(split_rows, SCHEMA)
