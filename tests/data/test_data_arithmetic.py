import time
from collections import Counter

import numpy as np
import pytest

from rlvr_core.data.arithmetic import (
    _decode,
    cell_size,
    format_answer,
    make_arithmetic,
    parse_answer,
)
from rlvr_core.errors import ConfigError
from rlvr_core.rewards.arithmetic import verify_arithmetic


def test_format_and_parse_answer_round_trip():
    assert format_answer(130) == "031"
    assert format_answer(0) == "0"
    assert format_answer(7) == "7"
    for v in [0, 1, 9, 10, 100, 130, 9801, 99980001]:
        assert parse_answer(format_answer(v)) == v
    assert parse_answer(" 031\n") == 130
    for bad in ["", "0310", "-31", "3 1", "31a", "１２", "١٢", "1" * 13, "+1"]:
        assert parse_answer(bad) is None, bad
    with pytest.raises(ValueError):
        format_answer(-1)


@pytest.mark.parametrize("op", ["+", "-", "*"])
@pytest.mark.parametrize("d", [1, 2])
def test_decode_is_a_bijection_onto_the_cell(d, op):
    size = cell_size(d, op)
    pairs = [_decode(d, op, i) for i in range(size)]
    assert len(set(pairs)) == size
    for a, b in pairs:
        assert len(str(max(a, b))) == d
        if op == "-":
            assert a >= b >= 0
        if op == "*":
            assert 1 <= b <= 9 and len(str(a)) == d


def test_cell_sizes_small_space():
    assert cell_size(1, "+") == 100 and cell_size(1, "-") == 55 and cell_size(1, "*") == 90
    assert cell_size(2, "+") == 100 * 100 - 10 * 10


@pytest.mark.parametrize("op", ["+", "-", "*"])
@pytest.mark.parametrize("d", [3, 4])
def test_decode_large_cells_in_range(d, op):
    size = cell_size(d, op)
    idx = [0, 1, size // 2, size - 2, size - 1] + list(np.random.default_rng(0).integers(0, size, 300))
    for i in idx:
        a, b = _decode(d, op, int(i))
        assert len(str(max(a, b))) == d and a < 10**d and b < 10**d
        if op == "-":
            assert a >= b >= 0


def test_fields_types_and_answers():
    dd = make_arithmetic(300, 100, seed=3)
    assert set(dd) == {"train", "test"}
    assert dd["train"].num_rows == 300 and dd["test"].num_rows == 100
    for split in ("train", "test"):
        for row in dd[split]:
            a, b, op = row["a"], row["b"], row["op"]
            assert row["id"].startswith(f"arith-{split}-")
            assert row["prompt"] == f"{a:04d}{op}{b:04d}="
            assert row["difficulty"] == len(str(max(a, b)))
            assert isinstance(row["difficulty"], int) and isinstance(row["answer"], str)
            expected = {"+": a + b, "-": a - b, "*": a * b}[op]
            assert int(row["answer"]) == expected and row["answer"] == str(expected)
            if op == "-":
                assert a >= b
            if op == "*":
                assert 1 <= b <= 9
            assert verify_arithmetic(format_answer(int(row["answer"])), row) == 1.0


def test_deterministic_by_seed():
    a = make_arithmetic(200, 50, seed=11)
    b = make_arithmetic(200, 50, seed=11)
    c = make_arithmetic(200, 50, seed=12)
    assert a["train"].to_dict() == b["train"].to_dict() and a["test"].to_dict() == b["test"].to_dict()
    assert list(a["train"]["prompt"]) != list(c["train"]["prompt"])


def test_splits_disjoint_unique_and_mixed():
    dd = make_arithmetic(2000, 500, seed=0)
    train, test = list(dd["train"]["prompt"]), list(dd["test"]["prompt"])
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert not set(train) & set(test)
    assert len(set(list(dd["train"]["id"]))) == 2000
    for split in ("train", "test"):
        cells = Counter(zip(list(dd[split]["difficulty"]), list(dd[split]["op"])))
        assert {d for d, _ in cells} == {1, 2, 3, 4}
        assert {o for _, o in cells} == {"+", "-", "*"}
    # rows are shuffled, not grouped by difficulty
    assert len(set(list(dd["train"]["difficulty"])[:40])) > 1


def test_one_digit_space_exhausted_without_duplicates():
    dd = make_arithmetic(200, 45, seed=1, digits=(1,))  # all 245 one-digit problems
    prompts = list(dd["train"]["prompt"]) + list(dd["test"]["prompt"])
    assert len(set(prompts)) == 245
    with pytest.raises(ConfigError, match=r"n_train \+ n_test.*hold only 245"):
        make_arithmetic(200, 46, seed=1, digits=(1,))


def test_small_cells_capped_and_rest_redistributed():
    dd = make_arithmetic(1800, 200, seed=0)  # equal weights ask 500 per digit; d=1 holds 245
    diff = Counter(list(dd["train"]["difficulty"]) + list(dd["test"]["difficulty"]))
    assert diff[1] == 245 and sum(diff.values()) == 2000


def test_digit_weights_and_ops():
    dd = make_arithmetic(400, 0, seed=0, digits=(2, 3), ops=("*",), digit_weights=(3, 1))
    diff = Counter(list(dd["train"]["difficulty"]))
    assert diff == {2: 300, 3: 100}
    assert set(list(dd["train"]["op"])) == {"*"}
    assert dd["test"].num_rows == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"digits": (0, 1)}, "digits"),
        ({"digits": (2, 2)}, "digits"),
        ({"ops": ("/",)}, "ops"),
        ({"digit_weights": (1, 1)}, "digit_weights"),
        ({"digit_weights": (0, 0, 0, 0)}, "digit_weights"),
        ({"n_train": -1}, "n_train"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"n_train": 10, "n_test": 10, "seed": 0}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        make_arithmetic(**args)


def test_generation_speed():
    t = time.perf_counter()
    dd = make_arithmetic(9000, 1000, seed=0)
    assert time.perf_counter() - t < 4.0  # ~1 s here; margin for a busy CI box
    assert dd["train"].num_rows == 9000
