"""params.yaml and --set values that parse but would mislead or crash are refused with a ConfigError that
says where: ints past Python's digit limit, duplicate keys, YAML 1.1 octals, non-finite nested values."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from rlvr_core.allocation.posterior import PriorConfig
from rlvr_core.config import TrainConfig, load_params, parse_set
from rlvr_core.errors import ConfigError

PARAMS = """\
prepare: {task: arithmetic, n_train: 300, n_test: 40, seed: 0}
train:
  allocator: sara
  allocators: [sara]
  k: 4
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("number", ["1" * 5001, "-" + "7" * 4301, "0x" + "f" * 5000, "9" * 310])
def test_a_huge_int_is_a_config_error_not_a_traceback(tmp_path: Path, number: str) -> None:
    """A 5,001-digit int hit Python's 4,300-digit limit: a raw ValueError out of load_params and --set."""
    path = _write(tmp_path, PARAMS + f"  seed: {number}\n")
    with pytest.raises(ConfigError, match=r"params\.yaml: the number at line 6, column 9 \(train\.seed\) "
                                          r"(is [\d,]+ digits long"
                                          r"|is past a float's range)") as err:
        load_params(path)
    assert len(str(err.value)) < 300
    with pytest.raises(ConfigError, match=r"train\.seed \(from --set .*\): the number at line 1, column 1"):
        parse_set([f"seed={number}"], path)


def test_ints_within_range_still_read(tmp_path: Path) -> None:
    assert load_params(_write(tmp_path, PARAMS + "  seed: 1_234\n")).train.seed == 1234
    assert parse_set(["seed=" + "9" * 300, "k=16"], "params.yaml") == {"seed": int("9" * 300), "k": 16}


def test_other_values_yaml_cannot_build_are_config_errors(tmp_path: Path) -> None:
    """PyYAML raises ValueError on a bad explicit tag (and did on a date with month 13, now refused as a date)."""
    for value in ("!!int 12x", "!!float x"):
        with pytest.raises(ConfigError, match=r"params\.yaml: not valid YAML"):
            load_params(_write(tmp_path, PARAMS + f"  seed: {value}\n"))
    with pytest.raises(ConfigError, match=r"params\.yaml: the value at line 6, column 9 \(train\.seed\) reads as a "
                                          r"date"):
        load_params(_write(tmp_path, PARAMS + "  seed: 2001-13-01\n"))


def test_a_duplicate_key_is_refused_with_both_lines(tmp_path: Path) -> None:
    """``lr`` twice: the last one used to win silently."""
    path = _write(tmp_path, PARAMS + "  lr: 1.0e-5\n  seed: 3\n  lr: 0.5\n")
    with pytest.raises(ConfigError, match=r"params\.yaml: the key 'lr' is given twice, at line 6, column 3 and "
                                          r"line 8, column 3 .*give it once"):
        load_params(path)
    with pytest.raises(ConfigError, match=r"the key 'seed' is given twice"):
        load_params(_write(tmp_path, "prepare: {task: arithmetic, seed: 1, seed: 2}\ntrain: {}\n"))
    with pytest.raises(ConfigError, match=r"the key 'train' is given twice"):
        load_params(_write(tmp_path, PARAMS + "train: {}\n"))


@pytest.mark.parametrize("text, at", [
    ("train: {<<: {lr: 0.0005}, <<: {lr: 0.00001}}\n", "line 2, column 9"),
    ("evaluate: &e {k: 4}\ntrain:\n  <<: *e\n  lr: 0.00001\n", "line 4, column 3"),
    ("train: {<<: [{lr: 0.0005}, {lr: 0.00001}]}\n", "line 2, column 9"),
])
def test_a_merge_key_is_refused_where_it_is(tmp_path: Path, text: str, at: str) -> None:
    """Two merge keys (<<) in one mapping passed the duplicate-key check and the last one's lr won silently."""
    with pytest.raises(ConfigError, match=rf"params\.yaml: the merge key << at {at} is not read in params files"):
        load_params(_write(tmp_path, PARAMS.split("\n")[0] + "\n" + text))
    with pytest.raises(ConfigError, match=r"train\.allocator_params \(from --set .*\): the merge key << at line 1"):
        parse_set(["allocator_params={sara: {prior: {<<: {a0: 1.0}, a0: 2.0}}}"], "params.yaml")
    # an alias of a whole value still reads, and so does a quoted "<<"
    assert parse_set(["allocator_params={sara: &s {tau_low: 0.4}, vigor: {}}", "k={'<<': 1}"], "p") == {
        "allocator_params": {"sara": {"tau_low": 0.4}, "vigor": {}}, "k": {"<<": 1}}


def test_a_key_set_twice_on_the_command_line_is_refused() -> None:
    """``--set lr=1e-4 --set lr=2e-4`` kept the last value silently."""
    with pytest.raises(ConfigError, match=r"^params\.yaml: train\.lr is set twice, by --set 'lr=1e-4' and "
                                          r"--set 'lr = 2e-4' \(the last one would win silently\); set it once$"):
        parse_set(["lr=1e-4", "k=4", "lr = 2e-4"], "params.yaml")
    assert parse_set(["lr=1e-4", "k=4"], "params.yaml") == {"lr": 1e-4, "k": 4}


@pytest.mark.parametrize("typed, reads, meant", [("010", 8, 10), ("0_17", 15, 17), ("+012", 10, 12)])
def test_a_leading_zero_is_not_read_as_octal(tmp_path: Path, typed: str, reads: int, meant: int) -> None:
    """``seed: 010`` was seed 8 (YAML 1.1 octal)."""
    with pytest.raises(ConfigError, match=rf"{typed.replace('+', '[+]')} at line 6, column 9 \(train\.seed\) "
                                          rf"reads as {reads} "
                                          rf"\(YAML 1\.1 reads a leading 0 as octal\); write {meant}, or {reads}"):
        load_params(_write(tmp_path, PARAMS + f"  seed: {typed}\n"))
    with pytest.raises(ConfigError, match=rf"train\.seed \(from --set .*\): {typed.replace('+', '[+]')} at line 1"):
        parse_set([f"seed={typed}"], "params.yaml")
    with pytest.raises(ConfigError, match=r"1:30 at line 1, column 1 reads as 90 \(YAML 1\.1 reads a colon"):
        parse_set(["seed=1:30"], "params.yaml")
    assert parse_set(["seed=0", "lr=0.010", "k='010'", "top_p='0x10'"], "p") == {
        "seed": 0, "lr": 0.01, "k": "010", "top_p": "0x10"}


@pytest.mark.parametrize("typed, reads", [("1:30.0", "90.0"), ("-1:30.5", "-90.5"), ("1:30", "90")])
def test_a_base_60_number_is_refused_naming_its_key(tmp_path: Path, typed: str, reads: str) -> None:
    """``verifier_timeout_s: 1:30.0`` was 90.0 seconds (YAML 1.1 floats in base 60)."""
    path = _write(tmp_path, PARAMS + f"  verifier_timeout_s: {typed}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: {typed} at line 6, column 23 \(train\.verifier_timeout_s\) "
                                          rf"reads as {reads} \(YAML 1\.1 reads a colon as base 60\); write {reads} "
                                          "or quote the value$"):
        load_params(path)
    with pytest.raises(ConfigError, match=r"train\.verifier_timeout_s: got '1:30\.0'; need a number or null"):
        load_params(_write(tmp_path, PARAMS + "  verifier_timeout_s: '1:30.0'\n"))
    assert load_params(_write(tmp_path, PARAMS + "  verifier_timeout_s: 90.0\n")).train.verifier_timeout_s == 90.0


@pytest.mark.parametrize("value, path, shown", [
    ("{sara: {prior: {kind: uniform, a0: 1e999}}}", r"allocator_params\.sara\.prior\.a0", "inf"),
    ("{sara: {prior: {kind: carry, decay: .nan}}}", r"allocator_params\.sara\.prior\.decay", "nan"),
    ("{dapo: {max_gen_batches: 4, extra: [1, -.inf]}}", r"allocator_params\.dapo\.extra\[1\]", "-inf"),
])
def test_a_non_finite_number_anywhere_in_the_params_tree_is_refused(tmp_path: Path, value: str, path: str,
                                                                     shown: str) -> None:
    """inf inside allocator_params passed load_params, TrainConfig and preflight, then crashed mid-step
    (ValueError: cannot convert float NaN to integer)."""
    params = _write(tmp_path, PARAMS + f"  allocator_params: {value}\n")
    with pytest.raises(ConfigError, match=rf"params\.yaml: train\.{path}: got {shown}; need a finite number"):
        load_params(params)
    overrides = {"train": parse_set([f"allocator_params={value}"], params)}
    with pytest.raises(ConfigError, match=rf"train\.{path}: got {shown}; need a finite number \(the value of "
                                          r"train\.allocator_params came from --set"):
        load_params(_write(tmp_path, PARAMS), overrides)


def test_numbers_past_a_float_are_refused_where_python_builds_the_config() -> None:
    """Ints too large for a float raised OverflowError out of the finiteness check; the prior took inf."""
    with pytest.raises(ConfigError, match=r"^lr: got 1000.*; need a finite number"):
        TrainConfig(lr=10**400)
    with pytest.raises(ConfigError, match=r"allocator_params\.sara\.prior\.b0: got 1000.*; need a finite number"):
        TrainConfig(allocator_params={"sara": {"prior": {"b0": 10**400}}})
    for bad in ({"a0": math.inf}, {"b0": 10**400}, {"max_evidence": math.inf}, {"decay": math.nan}):
        with pytest.raises(ConfigError, match=r"prior\.(a0/b0|max_evidence|decay): got"):
            PriorConfig(**bad)
    assert TrainConfig(allocator_params={"sara": {"prior": {"a0": 2.0}}}).allocator_params["sara"]["prior"]["a0"] == 2


@pytest.mark.parametrize("typed, message", [
    ("0x10", r"0x10 at line 6, column 9 \(train\.seed\) is a hexadecimal int \(16\); params numbers are decimal: "
             r"write 16"),
    ("-0x1_0", r"-0x1_0 at line 6, column 9 \(train\.seed\) is a hexadecimal int \(-16\)"),
    ("0b101", r"0b101 at line 6, column 9 \(train\.seed\) is a binary int \(5\); params numbers are decimal: write 5"),
    ("0o17", r"0o17 at line 6, column 9 \(train\.seed\) reads as the string '0o17' \(YAML 1\.1 has no 0o octal\); "
             r"write 15"),
])
def test_hex_binary_and_0o_numbers_are_refused_naming_their_key(tmp_path: Path, typed: str, message: str) -> None:
    """``seed: 0x10`` was seed 16 and ``0b101`` 5 (YAML 1.1 ints); ``0o17`` (YAML 1.2 octal) is YAML 1.1's string."""
    path = _write(tmp_path, PARAMS + f"  seed: {typed}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: {message}"):
        load_params(path)
    with pytest.raises(ConfigError, match=rf"train\.seed \(from --set .*\): {typed} at line 1, column 1"):
        parse_set([f"seed={typed}"], "params.yaml")
    with pytest.raises(ConfigError, match=rf"{typed} at line 6, column 32 \(train\.allocator_params\.sara\.n\)"):
        load_params(_write(tmp_path, PARAMS + f"  allocator_params: {{sara: {{n: {typed}}}}}\n"))
    assert parse_set([f"k='{typed}'"], "p") == {"k": typed}  # quoted: a string, as written


@pytest.mark.parametrize("value, reads, tag", [
    ("!!set {a, b}", "a set", "set"),
    ("!!binary aGVsbG8=", "bytes", "binary"),
    ("2024-01-01", "a date", "timestamp"),
    ("2024-01-01T10:00:00Z", "a date", "timestamp"),
    ("!!omap [{a: 1}, {b: 2}]", "a list of pairs", "omap"),
    ("!!pairs [{a: 1}]", "a list of pairs", "pairs"),
])
def test_a_value_json_cannot_hold_is_refused_naming_its_key_path(tmp_path: Path, value: str, reads: str,
                                                                tag: str) -> None:
    """``!!set`` in allocator_params passed load_params and failed later in JSON (a run's params.json, the
    checkpoint); a date, bytes and pairs the same."""
    path = _write(tmp_path, PARAMS + f"  allocator_params: {{sara: {{prior: {{kind: uniform, x: {value}}}}}}}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: the value at line 6, column \d+ "
                                          rf"\(train\.allocator_params\.sara\.prior\.x\) reads as {reads} "
                                          rf"\(tag !!{tag}\), which a params value cannot be"):
        load_params(path)
    with pytest.raises(ConfigError, match=rf"train\.allocator_params \(from --set .*\): the value at line 1, "
                                          rf"column \d+ \(sara\.x\) reads as {reads}"):
        parse_set([f"allocator_params={{sara: {{x: {value}}}}}"], path)
    quoted = parse_set([f"allocator_params={{sara: {{x: '{value}'}}}}"], path)
    assert quoted == {"allocator_params": {"sara": {"x": value}}}


@pytest.mark.parametrize("key, reads", [("1", "an int"), ("1.5", "a float"), ("null", "null"), ("~", "null"),
                                        ("yes", "a boolean"), ("true", "a boolean")])
def test_a_key_that_is_not_a_string_is_refused(tmp_path: Path, key: str, reads: str) -> None:
    """``{1: 0.5}`` in allocator_params became ``{"1": 0.5}`` in JSON: not the value it was at resume."""
    path = _write(tmp_path, PARAMS + f"  allocator_params: {{sara: {{{key}: 0.5}}}}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: the key '{re.escape(key)}' at line 6, column \d+ "
                                          rf"\(in train\.allocator_params\.sara\) reads as {reads}; params keys are "
                                          r"strings \(JSON would make it"):
        load_params(path)
    with pytest.raises(ConfigError, match=r"the key at line 1, column 9 \(in sara\) is a list; params keys are"):
        parse_set(["allocator_params={sara: {[1, 2]: 3}}"], path)
    quoted = parse_set([f"allocator_params={{sara: {{'{key}': 0.5}}}}"], path)
    assert quoted == {"allocator_params": {"sara": {key: 0.5}}}
