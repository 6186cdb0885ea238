"""Reading params files: a YAML loader that refuses what people do not mean, and ``--set`` values.

params.yaml is read with ``read_yaml``: aliases that would expand past ``MAX_YAML_NODES`` nodes are
refused while composing, before anything is built, and exponent floats as people type them (``5e-5``,
``1E-4``) are numbers, as in YAML 1.2. Ints past a float's range (``MAX_INT_DIGITS``) are refused with the
line and key they are on, and so are the YAML 1.1 readings people do not mean: ``010`` as octal 8, ``1:30`` as
90 and ``1:30.0`` as 90.0 (base 60), a key given twice, and merge keys (``<<``: two of them in one mapping
kept the last one's values silently). So are hexadecimal and binary ints (``0x10``, ``0b101``), a plain ``0o17``
(YAML 1.2's octal, a string in YAML 1.1), and what JSON cannot hold, since params values are JSON (a run's
``params.json``, checkpoints, comparisons at resume): the tags ``!!set``, ``!!binary``, ``!!omap``, ``!!pairs`` and
``!!timestamp`` (so an unquoted date, ``2024-01-01``), and a key that is not a string (``1:``, ``null:``,
``yes:``). ``--set`` refuses a key given twice. Messages show values through
``short_repr``; a file that is not YAML is refused with the line and column of the fault and never a word
of its text (it may be no params file at all).
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from rlvr_core.errors import ConfigError, short_repr  # short_repr: on the ground floor, imported here

# the most nodes a params file or a --set value may expand to (aliases counted each time they are used);
# params.yaml has a few hundred
MAX_YAML_NODES = 20_000
# the most digits of an int in a params file: past 309 digits an int no longer fits a float
MAX_INT_DIGITS = 309



# ----------------------------------------------------------------------------- reading YAML


class _Refused(yaml.YAMLError):
    """A params file that parses but is refused; the message says where and why."""


class _ExpandsTooFar(_Refused):
    pass


def _at(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def _key_paths(root: yaml.Node) -> dict[int, str]:
    """{id(node): "train.lr"} for the values of a composed document (the first path an aliased node has;
    items of lists as "key[i]"), walked without recursion."""
    paths: dict[int, str] = {}
    todo: list[tuple[yaml.Node, str]] = [(root, "")]
    while todo:
        node, path = todo.pop()
        if id(node) in paths:
            continue
        paths[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            todo.extend((v, f"{path}.{k.value}" if path else str(k.value)) for k, v in node.value
                        if isinstance(k, yaml.ScalarNode))
        elif isinstance(node, yaml.SequenceNode):
            todo.extend((v, f"{path}[{i}]") for i, v in enumerate(node.value))
    return paths


class ParamsLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs and reads ``5e-5`` / ``1E-4`` / ``1e5`` as floats."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._paths: dict[int, str] = {}

    def compose_document(self) -> Any:
        node = super().compose_document()
        _count_nodes(node, {})
        self._paths = _key_paths(node)
        return node

    def _where(self, node: yaml.Node) -> str:
        """ "line 6, column 9 (train.seed)": where a value is, with its key when it has one."""
        path = self._paths.get(id(node))
        return f"{_at(node)} ({path})" if path else _at(node)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An int, refused when it is past a float's range (Python refuses 4,301+ digit ints with a
        ValueError, and no params number can be that large)."""
        digits = str(node.value).replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise _Refused(f"the number at {self._where(node)} is {len(digits):,} digits long; a params number "
                           f"must fit a float (at most {MAX_INT_DIGITS} digits)")
        value = super().construct_yaml_int(node)
        if ":" in digits:
            raise _Refused(_base_60(node.value, self._where(node), value))
        if digits[:2] in ("0x", "0b"):
            base = "hexadecimal" if digits[:2] == "0x" else "binary"
            raise _Refused(f"{node.value} at {self._where(node)} is a {base} int ({value}); params numbers are "
                           f"decimal: write {value}, or quote the value if a string was meant")
        if len(digits) > 1 and digits[0] == "0":
            meant = int(str(node.value).replace("_", ""), 10)
            raise _Refused(f"{node.value} at {self._where(node)} reads as {value} (YAML 1.1 reads a leading 0 as "
                           f"octal); write {meant}, or {value} if octal was meant")
        if abs(value) >= 2 ** 1024:
            raise _Refused(f"the number at {self._where(node)} is past a float's range (about 1.8e308)")
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        """A float, refused when YAML 1.1 reads it in base 60 (``1:30.0`` is 90.0)."""
        value = super().construct_yaml_float(node)
        if ":" in str(node.value):
            raise _Refused(_base_60(node.value, self._where(node), value))
        return value


    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        """A string, refused when it is a plain ``0o17``: YAML 1.2's octal, which YAML 1.1 reads as a string."""
        value = super().construct_yaml_str(node)
        if node.style is None and re.fullmatch(r"[-+]?0o[0-7_]+", value):
            meant = int(value.replace("_", ""), 8)
            raise _Refused(f"{value} at {self._where(node)} reads as the string {value!r} (YAML 1.1 has no 0o "
                           f"octal); write {meant}, or quote the value if a string was meant")
        return value

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """Any value, refused when its tag builds what JSON cannot hold (a set, bytes, a date, pairs)."""
        if node.tag in _NOT_JSON:
            what = _NOT_JSON[node.tag]
            how = ("quote the value if a string was meant" if node.tag == "tag:yaml.org,2002:timestamp"
                   else "write a list or a mapping")
            raise _Refused(f"the value at {self._where(node)} reads as {what} (tag !!{node.tag.rsplit(':', 1)[1]}), "
                           f"which a params value cannot be (they are JSON: strings, numbers, booleans, null, lists "
                           f"and mappings); {how}")
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping, refused when it gives a key twice (YAML would keep the last one silently) or a key that is
        not a string (JSON would turn ``1:`` into ``"1"``, so a value would not read back as it was given)."""
        seen: dict[Any, yaml.Node] = {}
        inside = self._paths.get(id(node))
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(f"the merge key << at {_at(key_node)} is not read in params files (two of them in "
                               "one mapping kept the last one's values silently); write the keys out (an alias of a "
                               "whole value, *name, still reads)")
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(f"the key at {_at(key_node)}{f' (in {inside})' if inside else ''} is a "
                               f"{'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}; params keys "
                               "are strings")
            key = self.construct_object(key_node)
            if not isinstance(key, str):
                what = "null" if key is None else {bool: "a boolean", int: "an int"}.get(type(key), "a float")
                raise _Refused(f"the key {short_repr(key_node.value, 80)} at {_at(key_node)}"
                               f"{f' (in {inside})' if inside else ''} reads as {what}; params keys are strings "
                               f"(JSON would make it {short_repr(json.dumps(key), 80)}): quote it")
            if key in seen:
                raise _Refused(f"the key {short_repr(key, 80)} is given twice, at {_at(seen[key])} and "
                               f"{_at(key_node)} (YAML would keep the last one silently); give it once")
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


# the tags SafeLoader builds that JSON cannot hold (every other tag it has is null, bool, int, float, str, seq
# or map; a tag it has no constructor for is refused as not valid YAML)
_NOT_JSON = {"tag:yaml.org,2002:set": "a set", "tag:yaml.org,2002:binary": "bytes",
             "tag:yaml.org,2002:timestamp": "a date", "tag:yaml.org,2002:omap": "a list of pairs",
             "tag:yaml.org,2002:pairs": "a list of pairs"}


def _base_60(text: str, where: str, value: float) -> str:
    return (f"{text} at {where} reads as {value} (YAML 1.1 reads a colon as base 60); write {value} or quote "
            "the value")


ParamsLoader.add_constructor("tag:yaml.org,2002:int", ParamsLoader.construct_yaml_int)
ParamsLoader.add_constructor("tag:yaml.org,2002:float", ParamsLoader.construct_yaml_float)
ParamsLoader.add_constructor("tag:yaml.org,2002:str", ParamsLoader.construct_yaml_str)


# YAML 1.1 (PyYAML) wants a dot and a signed exponent (5.0e-5); people type 5e-5, 1E-4, 1e5
ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _count_nodes(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes ``node`` expands to (an alias counts its target again); raises once past MAX_YAML_NODES."""
    if id(node) in memo:
        n = memo[id(node)]
    else:
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(_count_nodes(c, memo) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(_count_nodes(k, memo) + _count_nodes(v, memo) for k, v in node.value)
        memo[id(node)] = n
    if n > MAX_YAML_NODES:
        m = node.start_mark
        raise _ExpandsTooFar(f"the value at line {m.line + 1}, column {m.column + 1} expands to more than "
                             f"{MAX_YAML_NODES:,} nodes through aliases (an alias bomb?); write the values out")
    return n


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _token_or_hidden(m: re.Match[str]) -> str:
    """A quoted part of PyYAML's message: kept when it names a token ('<block end>', ':'), else hidden."""
    inner = m.group(0)[1:-1]
    return m.group(0) if re.fullmatch(r"<[a-z ]+>|[^\w\s]", inner) else "'…'"


def _why(e: BaseException) -> str:
    """What is wrong and where, without a word of the text: PyYAML's own message quotes the offending line
    (and a file that is no params file, a credentials file, would have it shown in a flow run's log)."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        problem = re.sub(_QUOTED, _token_or_hidden, " ".join(str(e.problem or e.context or "a syntax error").split()))
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{problem[:200]}{at}"
    return f"a value YAML cannot read ({e.__class__.__name__})"


def read_yaml(text: str, where: str) -> Any:
    """Parse ``text`` with ``ParamsLoader``; ConfigError naming ``where`` on bad or oversized YAML."""
    try:
        return yaml.load(text, Loader=ParamsLoader)  # a SafeLoader subclass
    except _Refused as e:
        raise ConfigError(f"{where}: {e}") from None
    except (yaml.YAMLError, ValueError, OverflowError) as e:  # ValueError: e.g. a date 2001-13-01, !!int 12x
        raise ConfigError(f"{where}: not valid YAML ({_why(e)})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a params value") from None


def parse_set(items: typing.Sequence[str], params_file: str | Path, section: str = "train") -> dict[str, Any]:
    """``--set key=value`` items -> {key: value}, values read as params.yaml reads them.

    Errors name ``params_file`` and ``section.key`` and say the value came from --set.
    """
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {short_repr(item)}: use key=value, e.g. --set lr=5e-5")
        key, value = (s.strip() for s in item.split("=", 1))
        if not key:
            raise ConfigError(f"--set {short_repr(item)}: the key is empty; use key=value, e.g. --set lr=5e-5")
        if key in given:
            raise ConfigError(f"{params_file}: {section}.{key} is set twice, by --set {short_repr(given[key])} and "
                              f"--set {short_repr(item)} (the last one would win silently); set it once")
        given[key] = item
        out[key] = read_yaml(value, f"{params_file}: {section}.{key} (from --set {short_repr(item)})")
    return out

