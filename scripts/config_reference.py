"""docs/configuration.md's reference tables, params.yaml's key comments and the defaults tables of the allocator
pages (docs/allocators/<name>.md), generated from the config and ``Params`` dataclasses.

    make docs                                   # or: python scripts/config_reference.py [--check]

Each params.yaml section is a dataclass (``rlvr_core.config.SECTIONS``) whose fields carry their help in the
field metadata (``field(default=..., metadata={"help": ...})``). Two files are written from them:

- docs/configuration.md keeps its hand-written text; what lies between ``<!-- config-reference:start -->``
  and ``<!-- config-reference:end -->`` is one table per section (key, default, the whole help) and the
  train keys a resumed run may change (``rlvr_core.preflight.RESUMABLE_KEYS``);
- params.yaml keeps its values, blank lines and whole-line comments; each key of a section gets the first
  sentence of its help as its comment. The file must parse to the same values after the rewrite;
- each registered allocator's page, docs/allocators/<slug>.md (``rlvr_core.registry.slug`` of its name), keeps
  its hand-written specification; what lies between ``<!-- allocator-defaults:start -->`` and
  ``<!-- allocator-defaults:end -->`` names its class and source module and lists its ``Params`` defaults.
  A registered allocator without a page is an error (write the page's text; the table is filled in here).

``--check`` writes nothing and exits 1 naming each file that differs from what the dataclasses give
(tests/test_config_reference.py runs the same comparison).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/config_reference.py` from a checkout
    sys.path.insert(0, str(ROOT))

from rlvr_core.allocation import ALLOCATORS  # noqa: E402
from rlvr_core.config import SECTIONS, read_yaml  # noqa: E402
from rlvr_core.registry import slug  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
PARAMS = ROOT / "params.yaml"
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
ALLOCATOR_DOCS = ROOT / "docs" / "allocators"
A_START, A_END = "<!-- allocator-defaults:start -->", "<!-- allocator-defaults:end -->"
COMMENT_COLUMN = 29  # params.yaml's comments start here (two spaces after a longer key line)
MAX_LINE = 120  # the project's line length (pyproject's ruff), for params.yaml too
# the first sentence ends at a full stop before a space or the end, not inside "e.g." or "i.e."
SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s|$)")
PLAIN = re.compile(r"[A-Za-z_][\w.+/-]*")
RESERVED = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", "~"}


def help_of(cls: type, f: dataclasses.Field) -> str:
    """The field's help text; ValueError naming ``Class.field`` when it has none."""
    text = f.metadata.get("help")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{cls.__name__}.{f.name}: no help; give the field metadata={{'help': '...'}}")
    return " ".join(text.split())


def summary(text: str) -> str:
    """The first sentence of a help text, without its full stop (params.yaml's comment)."""
    m = SENTENCE_END.search(text)
    return text[:m.start()] if m else text.rstrip(".")


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]


def yaml_value(v: Any) -> str:
    """``v`` as params.yaml writes it, in flow style (``read_yaml`` reads it back to the same value)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return re.sub(r"e([-+])0*(\d)", r"e\1\2", repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v if PLAIN.fullmatch(v) and v.lower() not in RESERVED else '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no params.yaml spelling for {type(v).__name__} {v!r}")


def section_table(section: str, cls: type) -> str:
    """One section's heading and table: key, default, meaning (the whole help)."""
    title = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "`")
    where = cls.__module__.replace(".", "/") + ".py"
    rows = [f"### `{section}`", "", f"`{cls.__name__}` (`{where}`): {title}", "",
            "| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        meaning = help_of(cls, f).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{yaml_value(default_of(f))}` | {meaning} |")
    return "\n".join(rows)


def resumable_keys() -> str:
    from rlvr_core.preflight import RESUMABLE_KEYS

    keys = ", ".join(f"`{k}`" for k in RESUMABLE_KEYS)
    return (f"A resumed run may change only these train keys: {keys} (`RESUMABLE_KEYS` in "
            "`rlvr_core/preflight.py`). Every other train key shapes the trajectory, and a change is refused.")


def reference() -> str:
    """The generated part of docs/configuration.md, markers included."""
    parts = [START, "<!-- generated by `make docs` (scripts/config_reference.py) from the fields' help: "
                    "edit the dataclasses, not this table -->", ""]
    for section, cls in SECTIONS.items():
        parts += [section_table(section, cls), ""]
    parts += [resumable_keys(), END]
    return "\n".join(parts)


def render_doc(text: str) -> str:
    """``text`` (docs/configuration.md) with its generated part replaced; ValueError without the markers."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"docs/configuration.md needs one {START} ... {END} pair, in that order")
    head, rest = text.split(START, 1)
    return head + reference() + rest.split(END, 1)[1]


def allocator_page(name: str) -> Path:
    """The page of the allocator registered as ``name``: docs/allocators/<slug>.md."""
    return ALLOCATOR_DOCS / f"{slug(name)}.md"


def allocator_defaults(name: str) -> str:
    """The generated part of ``name``'s page, markers included: its class, module and ``Params`` defaults."""
    cls = ALLOCATORS.get(name)
    params = cls.Params
    where = cls.__module__.replace(".", "/") + ".py"
    rows = [A_START, "<!-- generated by `make docs` (scripts/config_reference.py) from the Params dataclass: "
                     "edit the code, not this table -->", "",
            f"Registered as `{name}`: `{cls.__name__}` in `{where}`, parameters `{params.__name__}` "
            f"(`{params.__module__.replace('.', '/')}.py`). `k`, `batch_size` and `seed` come from the train "
            f"section; the others from `train.allocator_params.{name}` in params.yaml, which may override "
            "these defaults (`null`: the text above says what stands in).",
            "", "| key | default |", "|---|---|"]
    for f in dataclasses.fields(params):
        value = default_of(f)
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        rows.append(f"| `{f.name}` | `{yaml_value(value)}` |")
    return "\n".join(rows + [A_END])


def render_allocator_page(name: str, text: str) -> str:
    """``text`` (``name``'s page) with its defaults table replaced; ValueError without the markers."""
    if text.count(A_START) != 1 or text.count(A_END) != 1 or text.index(A_START) > text.index(A_END):
        raise ValueError(f"{allocator_page(name).relative_to(ROOT).as_posix()} needs one {A_START} ... {A_END} "
                         "pair, in that order")
    head, rest = text.split(A_START, 1)
    return head + allocator_defaults(name) + rest.split(A_END, 1)[1]


def outputs() -> list[tuple[Path, Any]]:
    """(file, render) for every generated file: render maps its text to what the dataclasses give."""
    pages = [(allocator_page(n), lambda text, n=n: render_allocator_page(n, text)) for n in ALLOCATORS.names()]
    return [(DOC, render_doc), (PARAMS, render_params), *pages]


def _split_comment(rest: str) -> str:
    """The value part of ``rest`` (what follows ``key:``), without a trailing comment outside quotes."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].rstrip()
    return rest.rstrip()


def render_params(text: str) -> str:
    """params.yaml's ``text`` with each section key's comment set to its help's first sentence."""
    out, section = [], None
    for line in text.splitlines():
        if m := re.fullmatch(r"([A-Za-z_]\w*):\s*(#.*)?", line):
            section = m.group(1)
        elif section in SECTIONS and (m := re.fullmatch(r"  ([A-Za-z_]\w*):(.*)", line)):
            fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
            if m.group(1) not in fields:
                raise ValueError(f"params.yaml: {section}.{m.group(1)} is not a field of {SECTIONS[section].__name__}")
            code = f"  {m.group(1)}:{_split_comment(m.group(2))}"
            note = summary(help_of(SECTIONS[section], fields[m.group(1)]))
            line = f"{code.ljust(COMMENT_COLUMN - 2)}  # {note}"
            if len(line) > MAX_LINE:
                raise ValueError(f"params.yaml: {section}.{m.group(1)}'s comment makes a line of {len(line)} "
                                 f"characters (at most {MAX_LINE}); shorten the first sentence of its help")
        out.append(line)
    new = "\n".join(out) + ("\n" if text.endswith("\n") else "")
    if read_yaml(new, "params.yaml (rewritten)") != read_yaml(text, "params.yaml"):
        raise ValueError("params.yaml: rewriting the comments changed a value; the file was left as it is")
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    args = ap.parse_args(argv)
    stale = []
    for path, render in outputs():
        if not path.is_file():
            print(f"{path.relative_to(ROOT).as_posix()}: no page for a registered allocator; write its text "
                  f"with a {A_START} ... {A_END} pair", file=sys.stderr)
            return 1
        old = path.read_text(encoding="utf-8")
        new = render(old)
        if new != old:
            stale.append(path.relative_to(ROOT).as_posix())
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"stale (run `make docs`): {', '.join(stale)}", file=sys.stderr)
        return 1
    print(("updated: " + ", ".join(stale)) if stale else
          "docs/configuration.md, params.yaml and docs/allocators/*.md are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
