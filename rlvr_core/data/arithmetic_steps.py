"""Arithmetic with worked answers: the completion writes its column-by-column working, then the answer.

The problems, prompts and rows are those of ``rlvr_core.data.arithmetic`` (``"0047+0083="``, answer
``"130"``); only the completion differs. It is one line per column, least significant first, separated
by ``,``, then ``>`` and the answer's digits reversed (``format_answer``)::

    0047+0083=   7+3=10,4+8+1=13>031          column sums with the carry in
    0083-0047=   13-7=6,8-4-1=3>63            a borrowed 10 is written before the top digit
    0047*0003=   7*3=21,4*3+2=14>141          partial products with the carry in

A column line is ``x op y``, then ``+c`` (``+``, ``*``) or ``-c`` (``-``) when a carry or borrow comes in,
then ``=`` and the column's value (a subtraction column that borrows writes ``1x``: x + 10). Missing
digits of the shorter operand are 0. Only the final answer is checked (``parse_final``: the text after
the last ``>``), as RLVR checks a chain of thought's final answer and not its steps.

The sloppy teacher (``sloppy_solution``) drops every carry and borrow, as the plain arithmetic task's
sloppy teacher does (``sloppy_value``), and wanders where it drops one: after the first
``WANDER_COLUMNS`` columns that lose an incoming carry it repeats the line, or writes the correct line as
a "correction" that it then ignores, or both, and it repeats the last line once or twice when it drops the
final carry (coins seeded by the row). Its answer is the carry-free
value, wrong exactly when the problem has a carry, so the warm-started policy's failing completions are
longer than its passing ones, as an LLM's abandoned chains of thought are. Every completion fits
``MAX_STEPS_CHARS`` characters.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from rlvr_core.data.arithmetic import OPS, apply_op, format_answer, parse_answer

#: Longest completion either teacher writes (one token a character); ``max_new_tokens`` must hold it.
MAX_STEPS_CHARS = 60
#: Longest completion the verifier reads; longer text scores 0 without being parsed.
MAX_READ_CHARS = 512
#: How many of the columns that lose a carry the sloppy teacher wanders on.
WANDER_COLUMNS = 3
ANSWER_MARK = ">"


def _digits(n: int, width: int) -> list[int]:
    """The ``width`` lowest decimal digits of ``n``, least significant first."""
    return [(n // 10**i) % 10 for i in range(width)]


def _width(a: int, op: str, b: int) -> int:
    return len(str(a)) if op == "*" else max(len(str(a)), len(str(b)))


def _column(x: int, op: str, y: int, c: int) -> tuple[str, int, int]:
    """One column with incoming carry/borrow ``c``: (its line, its digit, the outgoing carry/borrow)."""
    if op == "+":
        v = x + y + c
        return f"{x}+{y}{f'+{c}' if c else ''}={v}", v % 10, v // 10
    if op == "*":
        v = x * y + c
        return f"{x}*{y}{f'+{c}' if c else ''}={v}", v % 10, v // 10
    borrow = int(x - y - c < 0)
    v = x + 10 * borrow - y - c
    return f"{10 * borrow + x if borrow else x}-{y}{f'-{c}' if c else ''}={v}", v, borrow


def _columns(a: int, op: str, b: int) -> list[tuple[str, int, int, int]]:
    """Every column of ``a op b`` done right: (line, digit, carry in, carry out)."""
    if op not in OPS:
        raise ValueError(f"op: must be one of {OPS}, got {op!r}")
    width = _width(a, op, b)
    xs = _digits(a, width)
    ys = [b] * width if op == "*" else _digits(b, width)
    out, c = [], 0
    for x, y in zip(xs, ys):
        line, d, c_out = _column(x, op, y, c)
        out.append((line, d, c, c_out))
        c = c_out
    return out


def worked_solution(a: int, op: str, b: int) -> str:
    """The correct worked completion of ``a op b``: its column lines, ``>``, the answer reversed."""
    lines = [line for line, *_ in _columns(a, op, b)]
    return ",".join(lines) + ANSWER_MARK + format_answer(apply_op(a, op, b))


def sloppy_solution(a: int, op: str, b: int, rng: random.Random) -> str:
    """The sloppy teacher's completion: every carry/borrow dropped, wandering lines where one was lost
    (module docstring); equal to ``worked_solution`` when the problem has no carry or borrow."""
    width = _width(a, op, b)
    xs = _digits(a, width)
    ys = [b] * width if op == "*" else _digits(b, width)
    right = _columns(a, op, b)
    lines: list[tuple[str, bool]] = []  # (line, a wandering line: may be dropped to fit)
    digits: list[int] = []
    wandered = 0
    for i, (x, y, (good, _, c_in, c_out)) in enumerate(zip(xs, ys, right)):
        line, d, _ = _column(x, op, y, 0)
        lines.append((line, False))
        digits.append(d)
        if c_in and wandered < WANDER_COLUMNS:
            wandered += 1
            kind = rng.randrange(3)  # 0: repeat the line, 1: a correction it ignores, 2: both
            lines += [(line, True)] * (kind != 1) + [(good, True)] * (kind != 0)
        elif i == width - 1 and c_out:  # the final carry dropped: the last line once or twice again
            lines += [(line, True)] * (1 + rng.randrange(2))
    answer = ANSWER_MARK + format_answer(int("".join(str(d) for d in reversed(digits))))
    while len(",".join(t for t, _ in lines) + answer) > MAX_STEPS_CHARS:  # drop the last wandering line
        del lines[max(i for i, (_, extra) in enumerate(lines) if extra)]
    return ",".join(t for t, _ in lines) + answer


def parse_final(completion: str) -> int | None:
    """The final answer of a worked completion: the text after its last ``>`` read with ``parse_answer``
    (reversed digits); None when there is no ``>``, the answer is malformed or the text is over
    ``MAX_READ_CHARS``. The working before it is not checked. Never raises."""
    if not isinstance(completion, str) or len(completion) > MAX_READ_CHARS:
        return None
    head, mark, tail = completion.rpartition(ANSWER_MARK)
    if not mark:
        return None
    return parse_answer(tail)


def worked_targets(rows: Any, seed: int = 0) -> dict[str, list]:
    """The warm-start targets of ``rows`` (arithmetic rows: prompt, a, b, op, difficulty, id): prompts,
    clean (``worked_solution``), sloppy (``sloppy_solution`` with a coin seeded by ``seed`` and the row's
    id, so the same every run) and difficulty, as lists."""
    names = ("id", "prompt", "a", "op", "b", "difficulty")
    if hasattr(rows, "column_names"):
        missing = [c for c in names if c not in rows.column_names]
        cols = {c: list(rows[c]) for c in names if c in rows.column_names}
    else:
        rows = list(rows)
        missing = sorted({c for r in rows for c in names if c not in r})
        cols = {c: [r[c] for r in rows] for c in names if c not in missing}
    if missing:
        raise ValueError(f"train_rows: missing columns {missing}; expected rows from make_arithmetic")
    triples = [(int(a), op, int(b)) for a, op, b in zip(cols["a"], cols["op"], cols["b"])]
    return {
        "prompts": cols["prompt"],
        "clean": [worked_solution(a, op, b) for a, op, b in triples],
        "sloppy": [sloppy_solution(a, op, b, random.Random(f"steps-{seed}-{i}"))
                   for (a, op, b), i in zip(triples, cols["id"])],
        "difficulty": [int(d) for d in cols["difficulty"]],
    }


def max_clean_chars(digits: Sequence[int] = (1, 2, 3, 4)) -> int:
    """An upper bound on the correct worked completions of problems with these digit counts: w columns of
    at most 8 characters (``9+9+1=19``, ``19-9-1=9``, ``9*9+8=89``), w - 1 commas, ``>`` and w + 1 digits."""
    w = max(digits)
    return 8 * w + (w - 1) + 1 + (w + 1)


__all__ = ["ANSWER_MARK", "MAX_READ_CHARS", "MAX_STEPS_CHARS", "WANDER_COLUMNS", "max_clean_chars", "parse_final",
           "sloppy_solution", "worked_solution", "worked_targets"]
