from collections import Counter
from fractions import Fraction

import pytest

import rlvr_core.data.countdown as cd
from rlvr_core.data.countdown import DECK, make_countdown, random_expression
from rlvr_core.errors import ConfigError
from rlvr_core.rewards.countdown import verify_countdown


def test_fields_types_and_solutions_verify():
    dd = make_countdown(400, 100, seed=5)
    assert dd["train"].num_rows == 400 and dd["test"].num_rows == 100
    deck = Counter(DECK)
    for split in ("train", "test"):
        for row in dd[split]:
            nums, target = row["numbers"], row["target"]
            assert row["id"].startswith(f"countdown-{split}-")
            assert row["difficulty"] == len(nums) in (3, 4)
            assert nums == sorted(nums) and all(isinstance(n, int) for n in nums)
            assert not Counter(nums) - deck  # dealt from the deck without replacement
            assert isinstance(target, int) and 1 <= target <= 999
            assert row["prompt"] == f"{','.join(map(str, nums))}>{target}="
            assert verify_countdown(row["answer"], row) == 1.0, row


def test_deterministic_by_seed():
    a, b, c = make_countdown(150, 30, seed=2), make_countdown(150, 30, seed=2), make_countdown(150, 30, seed=3)
    assert a["train"].to_dict() == b["train"].to_dict() and a["test"].to_dict() == b["test"].to_dict()
    assert list(a["train"]["prompt"]) != list(c["train"]["prompt"])


def test_splits_disjoint_and_mixed():
    dd = make_countdown(1500, 300, seed=0)
    keys = {s: [(tuple(r["numbers"]), r["target"]) for r in dd[s]] for s in ("train", "test")}
    for k in keys.values():
        assert len(set(k)) == len(k)
    assert not set(keys["train"]) & set(keys["test"])
    assert Counter(list(dd["test"]["difficulty"])) == {3: 150, 4: 150}
    assert Counter(list(dd["train"]["difficulty"])) == {3: 750, 4: 750}
    assert len(set(list(dd["train"]["target"]))) > 200  # targets spread, not a handful of values


def test_sizes_option():
    dd = make_countdown(50, 10, seed=0, sizes=(4,))
    assert set(list(dd["train"]["difficulty"])) == {4} and set(list(dd["test"]["difficulty"])) == {4}
    with pytest.raises(ConfigError, match="sizes"):
        make_countdown(5, 5, seed=0, sizes=(2,))
    with pytest.raises(ConfigError, match="n_test"):
        make_countdown(5, -1, seed=0)


def test_exhausted_space_raises_helpful_error(monkeypatch):
    monkeypatch.setattr(cd, "MAX_TARGET", 2)
    monkeypatch.setattr(cd, "MAX_MISSES", 2000)
    with pytest.raises(ConfigError, match="distinct 3-number problems.*fewer rows"):
        make_countdown(10_000, 0, seed=0, sizes=(3,))


def test_random_expression_value_matches_text():
    import random

    rng = random.Random(0)
    for _ in range(300):
        nums = rng.sample(DECK, 4)
        out = random_expression(nums, rng)
        if out is None:
            continue
        value, text = out
        # the verifier evaluates the text independently; integer results must agree
        if value.denominator == 1 and value > 0:
            assert verify_countdown(text, {"numbers": nums, "target": int(value)}) == 1.0, text
        assert isinstance(value, Fraction)


def test_a_large_draw_fills_both_splits_without_repeats():
    """10,000 problems, more than the distinct 3-number problems, come out whole and disjoint (no timing here:
    wall-clock limits belong in benchmarks, not in tests on a shared machine)."""
    dd = make_countdown(9000, 1000, seed=0)
    assert (dd["train"].num_rows, dd["test"].num_rows) == (9000, 1000)
    keys = [(tuple(r["numbers"]), r["target"]) for s in ("train", "test") for r in dd[s]]
    assert len(set(keys)) == len(keys)


def test_a_used_up_size_hands_its_rows_to_the_next(monkeypatch):
    monkeypatch.setattr(cd, "MAX_TARGET", 2)  # a few hundred distinct 3-number problems
    monkeypatch.setattr(cd, "MAX_MISSES", 3000)
    dd = make_countdown(800, 100, seed=0)
    assert (dd["train"].num_rows, dd["test"].num_rows) == (800, 100)
    got = {s: Counter(list(dd[s]["difficulty"])) for s in ("train", "test")}
    assert got["test"] == {3: 50, 4: 50}  # the test split is served first
    assert 0 < got["train"][3] < 400 and got["train"][3] + got["train"][4] == 800
    keys = [(tuple(r["numbers"]), r["target"]) for s in ("train", "test") for r in dd[s]]
    assert len(set(keys)) == len(keys)
