"""Hub dataset loaders: math benchmarks (GSM8K, MATH, MATH-500, AIME 2024) normalised to one row
schema, and LiveCodeBench's stdin/stdout code problems (``load_livecodebench``, its own schema below).

Every loader returns a ``datasets.Dataset`` with the columns

    id: str          unique within the dataset
    prompt: str      the problem text (templates.py wraps it for the model)
    difficulty: int  the source's level (MATH: "Level 3" -> 3), 0 where there is none
    answer: str      reference answer (GSM8K: after "####", commas removed;
                     MATH: content of the last \\boxed{...}/\\fbox{...})
    source: str      "gsm8k", "math", "math500" or "aime2024"

Sources and the fields read from them:

- GSM8K ``openai/gsm8k`` config ``main``: ``question``, ``answer`` ("... #### 72");
  splits train/test.
- MATH ``DigitalLearningGmbH/MATH-lighteval`` (also ``EleutherAI/hendrycks_math``,
  one config per subject, see ``MATH_SUBJECTS``): ``problem``, ``level``
  ("Level 1".."Level 5", sometimes "Level ?"), ``type``, ``solution`` with the
  answer in ``\\boxed{}``; splits train/test.
- MATH-500 ``HuggingFaceH4/MATH-500``: ``problem``, ``solution``, ``answer``,
  ``subject``, ``level`` (int), ``unique_id``; split test.
- AIME 2024 ``HuggingFaceH4/aime_2024``: ``id`` (int), ``problem``, ``solution``,
  ``answer`` (str), ``url``, ``year``; split train. ``Maxwell-Jia/AIME_2024`` is
  read too: ``ID`` ("2024-I-1"), ``Problem``, ``Solution``, ``Answer`` (int).

LiveCodeBench ``livecodebench/code_generation_lite``: one JSON Lines file per release, ``test.jsonl``
(the problems of release v1), ``test2.jsonl`` (those release v2 added), ... ; the split names the file
(``split: test2`` reads ``test2.jsonl``), so releases are disjoint splits. Fields read:
``question_id``, ``question_content``, ``platform``, ``difficulty`` ("easy", "medium", "hard"),
``contest_date``, ``public_test_cases`` (a JSON string of ``[{"input", "output", "testtype"}]``) and
``private_test_cases`` (the same, either plain JSON or base64 of zlib of a pickled JSON string, which
is unpickled with every class refused, so it can only give back a string). Its rows have the columns

    id: str                  "livecodebench-<question_id>"
    prompt: str              ``question_content``
    difficulty: int          easy 1, medium 2, hard 3 (0: other)
    public_test_cases: str   JSON list of {"input", "output", "testtype"}
    private_test_cases: str  the same, decoded (may be "[]")
    testtype: str            "stdin" when every test is a stdin/stdout test, else "functional"
    platform, contest_date: str
    source: str              "livecodebench"

``path_or_name`` is a hub name (the default), a local directory (a checkout of the
hub repository or a folder of split files such as ``test.jsonl``) or a single
local ``.json``/``.jsonl``/``.parquet``/``.csv`` file in the source's format.
Every loader also takes ``limit`` (first N rows) and ``cache_dir`` (the
``datasets`` cache, default ``~/.cache/huggingface/datasets``). Local JSON files
(a ``.json``/``.jsonl`` file, or those of a local directory) are read once
before ``datasets`` reads them (``check_json_numbers``): a number no column
holds, an int past 64 bits or a float past a float's range, is a DataError
naming the file, line and field. Arrow files are checked whole before this process reads a row of
them (``rlvr_core.data.disk.check_arrow_files``): a local directory's ``.arrow`` files, and the files of
the ``datasets`` cache that an earlier load left and this one would map; a corrupt one is a DataError
naming it, not a crash.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import pickle
import re
import zlib
from typing import Any, Callable, Iterable, Mapping, Sequence

from rlvr_core.data.disk import check_arrow_files
from rlvr_core.data.validate import DataError
from rlvr_core.registry import Registry

COLUMNS: tuple[str, ...] = ("id", "prompt", "difficulty", "answer", "source")

GSM8K_NAME = "openai/gsm8k"
MATH_NAME = "DigitalLearningGmbH/MATH-lighteval"
MATH500_NAME = "HuggingFaceH4/MATH-500"
AIME2024_NAME = "HuggingFaceH4/aime_2024"
LIVECODEBENCH_NAME = "livecodebench/code_generation_lite"
MATH_SUBJECTS: tuple[str, ...] = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_LEVEL = re.compile(r"(\d+)")

Loader = Callable[..., Any]
DATASETS: Registry[Loader] = Registry("dataset")


# --------------------------------------------------------------------------- answers


def _braced(text: str, start: int) -> str | None:
    """Content of the balanced ``{...}`` opening at ``text[start]``; None if never closed.

    Escaped braces ``\\{`` and ``\\}`` are literal and do not count.
    """
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Handles nested braces (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``), the
    brace-less form ``\\boxed 5`` (the next token, up to whitespace or ``$``), and
    skips an unclosed last box in favour of an earlier complete one; math-mode
    dollars around the whole content (``\fbox{$x$}``) are dropped. None if there
    is no box.
    """
    if not isinstance(text, str):
        return None
    positions = sorted(
        (m.start(), m.end()) for cmd in _BOX_COMMANDS for m in re.finditer(re.escape(cmd) + r"(?![A-Za-z])", text)
    )
    for _, end in reversed(positions):
        j = end
        while j < len(text) and text[j] in " \t\n":
            j += 1
        if j < len(text) and text[j] == "{":
            inner = _braced(text, j)
            if inner is not None:
                inner = inner.strip()
                if len(inner) > 1 and inner[0] == "$" and inner[-1] == "$":  # \fbox{$x$}
                    inner = inner.strip("$").strip()
                if inner:
                    return inner
            continue
        if j > end:  # "\boxed 5": one token after the space
            token = re.match(r"[^\s$]+", text[j:])
            if token:
                return token.group(0).rstrip(".")
    return None


def gsm8k_answer(solution: str) -> str | None:
    """The final answer of a GSM8K solution: text after the last ``####``, commas removed."""
    if not isinstance(solution, str) or "####" not in solution:
        return None
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "").strip()
    return answer.rstrip(".") or None


def parse_level(level: Any) -> int:
    """``"Level 3"`` -> 3, ``4`` -> 4, unknown (``"Level ?"``, None) -> 0."""
    if isinstance(level, bool) or level is None:
        return 0
    if isinstance(level, int):
        return level
    m = _LEVEL.search(str(level))
    return int(m.group(1)) if m else 0


# --------------------------------------------------------------------------- loading


class _Unfit(str):
    """The text of a JSON number no column holds, kept while ``check_json_numbers`` reads a file."""


def _json_int(text: str) -> Any:
    # int() only on what can fit: Python refuses 4,301+ digit ints, and a column holds 64 bits
    return _Unfit(text) if len(text.lstrip("-")) > 19 or not -(2**63) <= int(text) < 2**63 else int(text)


def _json_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _Unfit(text)


def _first_unfit(value: Any) -> tuple[str, str] | None:
    """(key path, number text) of the first ``_Unfit`` in a decoded JSON value, walked without recursion."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, _Unfit):
            return path, str(v)
        if isinstance(v, dict):
            todo.extend((f"{path}.{k}" if path else str(k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            todo.extend((f"{path}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def _unfit_message(path: str, where: str, field: str, text: str) -> str:
    shown = text if len(text) <= 24 else f"{text[:12]}...{text[-4:]}, {len(text):,} characters"
    what = "a float past a float's range" if any(c in text for c in ".eE") else "an int past 64 bits"
    return (f"{path}: {where}: field {field or '(the row)'!r} is {what} ({shown}); no column holds it: write it "
            "as a string or remove it")


def check_json_numbers(path: str) -> None:
    """DataError naming ``path``, the line (the row of a file that is one JSON document) and the field of the
    first number in a local .json / .jsonl file that no column holds: an int past 64 bits (``datasets`` raised
    OverflowError or ValueError on a 4,000-digit int, or read it as "inf") or a float past a float's range
    (1e999). A file that is not JSON is left to ``datasets`` to refuse."""
    decoder = json.JSONDecoder(parse_int=_json_int, parse_float=_json_float)
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = decoder.decode(line)
            except json.JSONDecodeError:  # not JSON Lines: one document (a list of rows), read whole below
                break
            if (found := _first_unfit(row)) is not None:
                raise DataError(_unfit_message(path, f"line {n}", *found))
        else:
            return
    with open(path, encoding="utf-8", errors="replace") as f:
        try:
            found = _first_unfit(decoder.decode(f.read()))
        except json.JSONDecodeError:
            return
    if found is not None:
        m = re.match(r"\[(\d+)\]\.?", found[0])
        where, field = (f"row {m.group(1)}", found[0][m.end():]) if m else ("the document", found[0])
        raise DataError(_unfit_message(path, where, field, found[1]))


def _load_raw(path_or_name: str, split: str, config: str | None, cache_dir: str | None = None) -> Any:
    """``datasets.load_dataset`` for a hub name, a local directory or a local file (local JSON files checked
    with ``check_json_numbers`` first, a local directory's ``.arrow`` files with ``check_arrow_files``), through
    ``_load_dataset`` (which checks the arrow files of the cache it would map)."""
    kw: dict[str, Any] = {"split": split, "cache_dir": cache_dir}

    if os.path.isfile(path_or_name):
        ext = os.path.splitext(path_or_name)[1].lower()
        if ext not in _FILE_BUILDERS:
            raise ValueError(
                f"path_or_name {path_or_name!r}: unsupported file type {ext!r}; use one of {sorted(_FILE_BUILDERS)}"
            )
        if _FILE_BUILDERS[ext] == "json":
            check_json_numbers(path_or_name)
        return _load_dataset(_FILE_BUILDERS[ext], data_files={split: path_or_name}, **kw)
    if os.path.isdir(path_or_name):
        for folder, subfolders, files in os.walk(path_or_name):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))  # .git, .cache
            for name in sorted(files):
                if os.path.splitext(name)[1].lower() in (".json", ".jsonl"):
                    check_json_numbers(os.path.join(folder, name))
                elif name.lower().endswith(".arrow"):
                    check_arrow_files([os.path.join(folder, name)])
        has_card = os.path.isfile(os.path.join(path_or_name, "README.md"))
        if config and has_card:
            return _load_dataset(path_or_name, config, **kw)
        return _load_dataset(path_or_name, **kw)
    return _load_dataset(path_or_name, config, **kw)


def _load_dataset(*args: Any, split: str, **kw: Any) -> Any:
    """``datasets.load_dataset(*args, split=split, **kw)`` as it runs (builder, prepare, the split), with the arrow
    files an earlier run left in the builder's cache folder checked (``check_arrow_files``) before they are mapped:
    ``load_dataset`` reads a cached split without looking at its bytes."""
    import datasets

    builder = datasets.load_dataset_builder(*args, **kw)
    if os.path.isdir(builder.cache_dir):
        check_arrow_files(sorted(os.path.join(builder.cache_dir, f) for f in os.listdir(builder.cache_dir)
                                 if f.endswith(".arrow")))
    builder.download_and_prepare()
    return builder.as_dataset(split=split)


def _field(row: Mapping[str, Any], names: Sequence[str], source: str, index: int) -> Any:
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    raise ValueError(
        f"{source} row {index}: missing field {' / '.join(repr(n) for n in names)} "
        f"(row has {sorted(row)}); is this a {source} dataset in its hub format?"
    )


def _to_dataset(rows: Iterable[Mapping[str, Any]], source: str) -> Any:
    import datasets

    rows = list(rows)
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row["id"] in seen:
            raise ValueError(f"{source}: rows {seen[row['id']]} and {i} share id {row['id']!r}; ids must be unique")
        seen[row["id"]] = i
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "prompt": datasets.Value("string"),
            "difficulty": datasets.Value("int64"),
            "answer": datasets.Value("string"),
            "source": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in COLUMNS}, features=features)


def _limited(raw: Any, limit: int | None) -> Any:
    if limit is None:
        return raw
    if limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return raw.select(range(min(limit, len(raw))))


@DATASETS.register("gsm8k")
def load_gsm8k(path_or_name: str = GSM8K_NAME, split: str = "test", *, config: str = "main",
               limit: int | None = None, cache_dir: str | None = None
) -> Any:
    """GSM8K as normalised rows; ``answer`` is the number after ``####`` without commas."""
    raw = _limited(_load_raw(path_or_name, split, config, cache_dir), limit)
    rows = []
    for i, row in enumerate(raw):
        question = _field(row, ("question",), "gsm8k", i)
        answer = gsm8k_answer(_field(row, ("answer",), "gsm8k", i))
        if answer is None:
            raise ValueError(f"gsm8k row {i}: 'answer' has no '#### <final answer>' line")
        rows.append({"id": f"gsm8k-{split}-{i:05d}", "prompt": question, "difficulty": 0, "answer": answer,
                     "source": "gsm8k"})
    return _to_dataset(rows, "gsm8k")


@DATASETS.register("math")
def load_math(
    path_or_name: str = MATH_NAME,
    split: str = "test",
    *,
    config: str | Sequence[str] | None = None,
    limit: int | None = None,
    cache_dir: str | None = None,
) -> Any:
    """MATH (Hendrycks) as normalised rows; ``answer`` is the last ``\\boxed{}`` of ``solution``.

    ``config``: one config name, or several (``MATH_SUBJECTS`` for
    ``EleutherAI/hendrycks_math``) loaded and concatenated in order; ``limit``
    applies per config.
    """
    configs: list[str | None] = [config] if config is None or isinstance(config, str) else list(config)
    if not configs:
        raise ValueError("config: an empty list of MATH configs loads nothing")
    rows = []
    for cfg in configs:
        raw = _limited(_load_raw(path_or_name, split, cfg, cache_dir), limit)
        tag = f"{cfg}-" if len(configs) > 1 else ""
        for i, row in enumerate(raw):
            solution = _field(row, ("solution",), "math", i)
            answer = last_boxed(solution)
            if answer is None:
                raise ValueError(f"math row {i} ({cfg or 'default'}): 'solution' has no \\boxed{{...}} answer")
            rows.append(
                {
                    "id": f"math-{split}-{tag}{i:05d}",
                    "prompt": _field(row, ("problem",), "math", i),
                    "difficulty": parse_level(row.get("level")),
                    "answer": answer,
                    "source": "math",
                }
            )
    return _to_dataset(rows, "math")


@DATASETS.register("math500")
def load_math500(path_or_name: str = MATH500_NAME, split: str = "test", *, limit: int | None = None,
                 cache_dir: str | None = None
) -> Any:
    """MATH-500 as normalised rows; ``id`` is the source's ``unique_id``."""
    raw = _limited(_load_raw(path_or_name, split, None, cache_dir), limit)
    rows = []
    for i, row in enumerate(raw):
        answer = row.get("answer")
        if answer is None or not str(answer).strip():
            answer = last_boxed(_field(row, ("solution",), "math500", i))
            if answer is None:
                raise ValueError(f"math500 row {i}: no 'answer' and no \\boxed{{...}} in 'solution'")
        rows.append(
            {
                "id": str(_field(row, ("unique_id",), "math500", i)),
                "prompt": _field(row, ("problem",), "math500", i),
                "difficulty": parse_level(row.get("level")),
                "answer": str(answer).strip(),
                "source": "math500",
            }
        )
    return _to_dataset(rows, "math500")


@DATASETS.register("aime2024")
def load_aime2024(path_or_name: str = AIME2024_NAME, split: str = "train", *, limit: int | None = None,
                  cache_dir: str | None = None
) -> Any:
    """AIME 2024 as normalised rows (HuggingFaceH4 lower-case or Maxwell-Jia capitalised fields)."""
    raw = _limited(_load_raw(path_or_name, split, None, cache_dir), limit)
    rows = []
    for i, row in enumerate(raw):
        answer = row.get("answer", row.get("Answer"))
        if answer is None or not str(answer).strip():
            answer = last_boxed(str(row.get("solution", row.get("Solution", ""))))
            if answer is None:
                raise ValueError(f"aime2024 row {i}: no 'answer'/'Answer' and no \\boxed{{...}} in the solution")
        ident = row.get("id", row.get("ID"))
        rows.append(
            {
                "id": f"aime2024-{ident if ident is not None else i}",
                "prompt": _field(row, ("problem", "Problem"), "aime2024", i),
                "difficulty": 0,
                "answer": str(answer).strip(),
                "source": "aime2024",
            }
        )
    return _to_dataset(rows, "aime2024")


# --------------------------------------------------------------------------- LiveCodeBench

CODE_COLUMNS: tuple[str, ...] = ("id", "prompt", "difficulty", "public_test_cases", "private_test_cases", "testtype",
                                 "platform", "contest_date", "source")
_LCB_DIFFICULTY = {"easy": 1, "medium": 2, "hard": 3}


# the most bytes a compressed test-case field may expand to (LiveCodeBench's largest private tests are far
# smaller; zlib expands up to ~1,000x, so a 1.4 MB field could otherwise take a gigabyte and more)
MAX_TEST_CASES_BYTES = 256 << 20


class _StringsOnly(pickle.Unpickler):
    """An unpickler that refuses every class and function: only plain values (a str) come back."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: test cases are a pickled string, not objects")


def _inflate(data: bytes, field: str) -> bytes:
    """zlib-decompress ``data``, stopping at ``MAX_TEST_CASES_BYTES`` of output: DataError naming ``field`` past
    it (a 1.36 MB zlib bomb took the process to 3.1 GB), zlib.error for a truncated stream."""
    d = zlib.decompressobj()
    out = d.decompress(data, MAX_TEST_CASES_BYTES + 1)
    if len(out) > MAX_TEST_CASES_BYTES:
        raise DataError(f"{field}: the compressed test cases expand past {MAX_TEST_CASES_BYTES:,} bytes "
                        f"({len(data):,} bytes compressed: a zlib bomb?); refused without decompressing further")
    if not d.eof:
        raise zlib.error("incomplete or truncated stream")
    return out


def decode_test_cases(raw: Any, field: str = "private_test_cases") -> list[dict[str, Any]]:
    """LiveCodeBench test cases -> a list of {"input", "output", "testtype"} mappings.

    ``raw`` is a JSON string (or an already decoded list), or base64 of zlib of a pickled JSON
    string (LiveCodeBench's compressed private tests). Raises ValueError naming ``field``.
    """
    if isinstance(raw, list):
        return raw
    if raw is None or raw == "":
        return []
    if not isinstance(raw, str):
        raise ValueError(f"{field}: expected a JSON string of test cases, got {type(raw).__name__}")
    try:
        tests = json.loads(raw)
    except json.JSONDecodeError:
        try:
            text = _StringsOnly(io.BytesIO(_inflate(base64.b64decode(raw, validate=True), field))).load()
            tests = json.loads(text) if isinstance(text, str) else None
        except DataError:
            raise
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, TypeError) as e:
            raise ValueError(f"{field}: neither JSON nor base64/zlib/pickled JSON ({e.__class__.__name__}: "
                             f"{str(e)[:200]})") from None
    if not isinstance(tests, list) or not all(isinstance(t, Mapping) for t in tests):
        raise ValueError(f"{field}: expected a list of {{'input', 'output', 'testtype'}} mappings")
    return tests


def _load_lcb_raw(path_or_name: str, split: str, cache_dir: str | None) -> Any:
    """The release file ``<split>.jsonl`` of a hub name or local folder, or a local file as given."""
    if os.path.isdir(path_or_name) and os.path.isfile(os.path.join(path_or_name, f"{split}.jsonl")):
        path_or_name = os.path.join(path_or_name, f"{split}.jsonl")
    if os.path.exists(path_or_name):
        return _load_raw(path_or_name, split, None, cache_dir)
    return _load_dataset("json", data_files={split: f"hf://datasets/{path_or_name}/{split}.jsonl"}, split=split,
                         cache_dir=cache_dir)


@DATASETS.register("livecodebench")
def load_livecodebench(path_or_name: str = LIVECODEBENCH_NAME, split: str = "test", *, limit: int | None = None,
                       cache_dir: str | None = None) -> Any:
    """LiveCodeBench code generation problems (``split``: the release file, test, test2, ...) as rows
    with the code columns above; both test lists are kept as JSON strings, the private ones decoded."""
    import datasets

    raw = _limited(_load_lcb_raw(path_or_name, split, cache_dir), limit)
    rows = []
    for i, row in enumerate(raw):
        public = decode_test_cases(_field(row, ("public_test_cases",), "livecodebench", i), "public_test_cases")
        try:
            private = decode_test_cases(row.get("private_test_cases"))
        except ValueError as e:  # a DataError (a zlib bomb) stays one
            raise type(e)(f"livecodebench row {i}: {e}") from None
        kinds = {str(t.get("testtype", "stdin")) for t in public + private}
        rows.append({
            "id": f"livecodebench-{_field(row, ('question_id',), 'livecodebench', i)}",
            "prompt": _field(row, ("question_content",), "livecodebench", i),
            "difficulty": _LCB_DIFFICULTY.get(str(row.get("difficulty", "")).lower(), 0),
            "public_test_cases": json.dumps(public),
            "private_test_cases": json.dumps(private),
            "testtype": "stdin" if kinds <= {"stdin"} else "functional",
            "platform": str(row.get("platform") or ""),
            "contest_date": str(row.get("contest_date") or ""),
            "source": "livecodebench",
        })
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row["id"] in seen:
            raise ValueError(f"livecodebench: rows {seen[row['id']]} and {i} share id {row['id']!r}")
        seen[row["id"]] = i
    features = datasets.Features({c: datasets.Value("int64" if c == "difficulty" else "string") for c in CODE_COLUMNS})
    return datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in CODE_COLUMNS}, features=features)


def load_hub_dataset(name: str, split: str | None = None, path_or_name: str | None = None, **kwargs: Any) -> Any:
    """Load the registered dataset ``name`` ("gsm8k", "math", "math500", "aime2024", "livecodebench").

    ``split`` None uses the loader's default (test; train for aime2024);
    ``path_or_name`` None uses the hub name; other keyword arguments go to the loader.
    """
    loader = DATASETS.get(name)
    if split is not None:
        kwargs["split"] = split
    if path_or_name is not None:
        kwargs["path_or_name"] = path_or_name
    return loader(**kwargs)
