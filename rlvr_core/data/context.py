"""A row's context key: the features that prompts with similar pass rates share.

SARA's contextual prior (docs/allocators/sara.md) keeps one Beta prior per key,
fitted to the recent pass rates of the prompts with that key. Per task the key
is made of these row fields, in order:

- ``arithmetic``: ``difficulty`` (the digit count) and ``op``;
- ``countdown``: ``difficulty``;
- ``math``: ``source`` (gsm8k, math, ...), ``difficulty`` (the MATH level) and
  ``subject`` (MATH-500 rows carry it; the MATH ``type`` field is read when a row
  has it instead);
- any other task: ``difficulty``.

A field a row does not carry is left out of its key, so rows without any of the
fields share one key, and the contextual prior reduces to a (decayed) empirical
Bayes prior over the whole pool.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

CONTEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "arithmetic": ("difficulty", "op"),
    "arithmetic-steps": ("difficulty", "op"),
    "countdown": ("difficulty",),
    "math": ("source", "difficulty", "subject"),
}
DEFAULT_FIELDS: tuple[str, ...] = ("difficulty",)
# a field read under another name when the row lacks it (MATH's raw rows name the subject "type")
ALIASES: dict[str, tuple[str, ...]] = {"subject": ("type",)}


def context_key(row: Mapping[str, Any], task: str) -> str:
    """``"difficulty=3|op=*"``: the row's values of its task's context fields ("" when it has none)."""
    parts = []
    for name in CONTEXT_FIELDS.get(task, DEFAULT_FIELDS):
        for f in (name, *ALIASES.get(name, ())):
            value = row.get(f)
            if value is not None and value != "":
                parts.append(f"{name}={str(value).strip().lower()}")
                break
    return "|".join(parts)


def context_keys(rows: Sequence[Mapping[str, Any]], task: str) -> list[str]:
    """``context_key`` of every row, in order (what ``PromptSource(context=...)`` takes)."""
    return [context_key(r, task) for r in rows]
