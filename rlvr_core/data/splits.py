"""Helpers shared by the synthetic task generators (arithmetic, Countdown).

- ``apportion``: split an integer count across cells by weight, respecting
  per-cell capacities (largest remainder + water filling), deterministic.
- ``validate_rows``: check every row has the schema's fields with the right
  Python types and that ids are unique; errors name the split, row and field.
- ``check_disjoint``: no problem key repeated inside a split or shared across
  splits; ``normalize_prompt`` is the form prompts are compared in (whitespace,
  NBSP, CRLF and invisible characters do not make two problems different).
- ``build_dataset_dict``: rows -> ``datasets.DatasetDict`` with explicit features.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from rlvr_core.errors import ConfigError

# Python type expected for each schema field; ``list[int]`` is spelled ("list", int).
FieldType = type | tuple[str, type]


def apportion(total: int, weights: Sequence[float], caps: Sequence[int] | None = None) -> list[int]:
    """Split ``total`` into integer quotas proportional to ``weights``, each <= its cap.

    Cells whose proportional share exceeds their capacity are filled to capacity
    and the excess is re-spread over the remaining cells by weight (water filling);
    rounding uses largest remainders, ties broken by cell order, so the result is
    deterministic. Cells with weight 0 get 0.

    Args:
        total: number of items to place (>= 0).
        weights: (C,) non-negative weights, at least one positive.
        caps: (C,) capacities; ``None`` means unbounded.
    Returns:
        (C,) list of ints summing to ``total``.
    Raises:
        ConfigError: if ``total`` exceeds the combined capacity of the
        positively weighted cells.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or np.any(w < 0) or not np.any(w > 0) or not np.all(np.isfinite(w)):
        raise ConfigError("weights: need a non-empty list of non-negative finite numbers with one > 0, "
                          f"got {list(weights)}")
    if total < 0:
        raise ConfigError(f"total: must be >= 0, got {total}")
    no_cap = np.iinfo(np.int64).max // 4
    cap = np.full(len(w), no_cap, dtype=np.int64) if caps is None else np.asarray(caps, dtype=np.int64)
    if cap.shape != w.shape:
        raise ConfigError(f"caps: need {len(w)} capacities, got {len(cap)}")
    cap = np.where(w > 0, cap, 0)
    if total > int(cap.sum()):
        raise ConfigError(f"total: asked for {total} items but only {int(cap.sum())} exist in the requested mix")
    quota = np.zeros(len(w), dtype=np.int64)
    remaining = total
    open_ = (w > 0) & (cap > 0)
    while remaining > 0:
        share = np.where(open_, w, 0.0)
        share = share / share.sum() * remaining
        full = open_ & (share >= cap - quota)
        if np.any(full):  # these cells saturate: fill them and re-spread the rest
            remaining -= int((cap - quota)[full].sum())
            quota[full] = cap[full]
            open_ &= ~full
            continue
        base = np.floor(share).astype(np.int64)
        quota += base
        left = remaining - int(base.sum())
        frac = np.where(open_, share - base, -1.0)
        order = np.argsort(-frac, kind="stable")[:left]  # largest remainders, cell order on ties
        quota[order] += 1
        remaining = 0
    return [int(q) for q in quota]


def validate_rows(rows: Sequence[Mapping[str, Any]], schema: Mapping[str, FieldType], split: str) -> None:
    """Check each row has exactly the schema's fields with the right types, ids unique.

    Raises:
        ValueError naming the split, row index, field and the expected type.
    """
    fields = set(schema)
    for i, row in enumerate(rows):
        got = set(row)
        if got != fields:
            missing, extra = sorted(fields - got), sorted(got - fields)
            raise ValueError(f"{split} row {i}: fields differ from schema (missing {missing}, unexpected {extra})")
        for name, typ in schema.items():
            value = row[name]
            if isinstance(typ, tuple):  # ("list", element type)
                elem = typ[1]
                ok = isinstance(value, list) and all(isinstance(v, elem) and not isinstance(v, bool) for v in value)
                want = f"list[{elem.__name__}]"
            else:
                ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
                want = typ.__name__
            if not ok:
                raise ValueError(f"{split} row {i} ({row.get('id')!r}): field {name!r} must be {want}, got {value!r}")
    dup = [k for k, c in Counter(r["id"] for r in rows).items() if c > 1]
    if dup:
        raise ValueError(f"{split}: duplicate row ids {dup[:5]}")


# Unicode's default-ignorable code points (DerivedCoreProperties.txt) that are not format characters (Cf):
# the combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free variation selectors,
# variation selectors and the unassigned ones of the ignorable blocks. With every Cf character (soft hyphen,
# zero-width space and joiners, bidi marks, BOM, tag characters) they are what shows nothing. Cf also holds a
# few marks that show (U+0600 ARABIC NUMBER SIGN): removing them can only make two prompts compare equal.
_IGNORABLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2065\u3164\ufe00-\ufe0f\uffa0"
                        "\ufff0-\ufff8\U000e0000-\U000e0fff]")


def strip_invisible(text: str) -> str:
    """``text`` without the code points that show nothing: every format character (category Cf) and the
    other default-ignorable code points (``_IGNORABLE``)."""
    if text.isascii():
        return text
    text = _IGNORABLE.sub("", text)
    return "".join(c for c in text if c.isascii() or unicodedata.category(c) != "Cf")


def normalize_prompt(text: str) -> str:
    """The form prompts are compared in for overlap between splits: invisible characters removed
    (``strip_invisible``: a soft hyphen, zero-width space or tag character makes no new problem), NFKC (a
    no-break space and other compatibility characters become their plain form), each run of whitespace
    (CRLF, tabs, a trailing space) one space, and no whitespace at either end."""
    return " ".join(strip_invisible(unicodedata.normalize("NFKC", strip_invisible(text))).split())


def check_disjoint(splits: Mapping[str, Sequence[Hashable]]) -> None:
    """Raise ValueError if a problem key repeats inside a split or appears in two splits.

    Args:
        splits: split name -> (N_split,) problem keys (e.g. prompts).
    """
    seen: dict[Hashable, str] = {}
    for name, keys in splits.items():
        for k in keys:
            if k in seen:
                where = "twice in" if seen[k] == name else f"in both {seen[k]!r} and"
                raise ValueError(f"problem {k!r} appears {where} split {name!r}; splits must be disjoint")
            seen[k] = name


def _features(schema: Mapping[str, FieldType]) -> Any:
    import datasets

    def one(typ: FieldType) -> Any:
        if isinstance(typ, tuple):
            return datasets.List(one(typ[1]))
        return {str: datasets.Value("string"), int: datasets.Value("int64"), float: datasets.Value("float64")}[typ]

    return datasets.Features({name: one(typ) for name, typ in schema.items()})


def build_dataset_dict(
    split_rows: Mapping[str, Sequence[Mapping[str, Any]]], schema: Mapping[str, FieldType]
) -> Any:
    """Validate rows and return a ``datasets.DatasetDict`` with one Dataset per split.

    Columns and their arrow types follow ``schema`` (str -> string, int -> int64,
    ("list", int) -> list of int64), so empty splits still carry the columns.
    """
    import datasets

    features = _features(schema)
    out = {}
    for name, rows in split_rows.items():
        validate_rows(rows, schema, name)
        columns = {field: [row[field] for row in rows] for field in schema}
        out[name] = datasets.Dataset.from_dict(columns, features=features)
    return datasets.DatasetDict(out)
