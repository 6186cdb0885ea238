import pytest

from rlvr_core.data.splits import apportion, build_dataset_dict, check_disjoint, validate_rows
from rlvr_core.errors import ConfigError


def test_apportion_proportional_and_exact_sum():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]  # largest remainder, ties by cell order
    assert apportion(100, [3, 1]) == [75, 25]
    assert apportion(0, [1, 2]) == [0, 0]
    assert apportion(7, [0, 1]) == [0, 7]


def test_apportion_water_fills_capped_cells():
    q = apportion(1000, [1, 1, 1, 1], caps=[10, 10**6, 10**6, 10**6])
    assert q[0] == 10 and sum(q) == 1000
    assert max(q[1:]) - min(q[1:]) <= 1


def test_apportion_rejects_too_many_and_bad_weights():
    with pytest.raises(ConfigError, match="only 20 exist"):
        apportion(21, [1, 1], caps=[10, 10])
    with pytest.raises(ConfigError, match="weights"):
        apportion(5, [0, 0])
    with pytest.raises(ConfigError, match="weights"):
        apportion(5, [-1, 2])


def test_check_disjoint_names_the_problem():
    check_disjoint({"train": ["a", "b"], "test": ["c"]})
    with pytest.raises(ValueError, match="both 'train' and split 'test'"):
        check_disjoint({"train": ["a", "b"], "test": ["b"]})
    with pytest.raises(ValueError, match="twice"):
        check_disjoint({"train": ["a", "a"]})


def test_validate_rows_reports_row_and_field():
    schema = {"id": str, "n": int, "xs": ("list", int)}
    validate_rows([{"id": "r0", "n": 1, "xs": [1, 2]}], schema, "train")
    with pytest.raises(ValueError, match=r"train row 0 .*'n' must be int"):
        validate_rows([{"id": "r0", "n": "1", "xs": []}], schema, "train")
    with pytest.raises(ValueError, match=r"'xs' must be list\[int\]"):
        validate_rows([{"id": "r0", "n": 1, "xs": [1.5]}], schema, "train")
    with pytest.raises(ValueError, match="missing \\['xs'\\]"):
        validate_rows([{"id": "r0", "n": 1}], schema, "test")
    with pytest.raises(ValueError, match="duplicate row ids"):
        validate_rows([{"id": "r", "n": 1, "xs": []}] * 2, schema, "test")


def test_build_dataset_dict_keeps_columns_for_empty_split():
    schema = {"id": str, "n": int, "xs": ("list", int)}
    dd = build_dataset_dict({"train": [{"id": "a", "n": 3, "xs": [1]}], "test": []}, schema)
    assert dd["train"][0] == {"id": "a", "n": 3, "xs": [1]}
    assert dd["test"].num_rows == 0 and dd["test"].column_names == ["id", "n", "xs"]


def test_near_duplicate_prompts_count_as_overlap():
    """Only exact duplicates were caught: a trailing space, NBSP or CRLF made a held-out problem "new"."""
    from rlvr_core.data.splits import normalize_prompt
    from rlvr_core.data.validate import DataError, validate_splits
    from rlvr_core.tasks import get_task

    base = "Find $x$ if $2^x = 32$.\nShow your work."
    for variant in (base + " ", base.replace(" ", "\u00a0", 1), base.replace("\n", "\r\n"), "  " + base + "\t",
                    base.replace("Find", "Find\u200b")):
        assert normalize_prompt(variant) == normalize_prompt(base)
    assert normalize_prompt("Find $x$ if $2^x = 64$.") != normalize_prompt(base)
    # soft hyphen, combining grapheme joiner, tag characters, LRM, variation selector, Hangul filler: five
    # listed code points let them all through
    for hidden in ("\u00ad", "\u034f", "\U000e0001\U000e0041\U000e007f", "\u200e", "\ufe0f", "\u3164", "\u2066"):
        assert normalize_prompt(base.replace("$2^x", "$2" + hidden + "^x")) == normalize_prompt(base), repr(hidden)
    # what shows stays: accents (composed or not), other scripts, emoji
    assert normalize_prompt("caf\u00e9") == normalize_prompt("cafe\u0301") != normalize_prompt("cafe")
    assert normalize_prompt("\u0645\u0631\u062d\u0628\u0627 \U0001f600") == "\u0645\u0631\u062d\u0628\u0627 \U0001f600"
    train = [{"id": "a", "prompt": base, "answer": "5"}, {"id": "b", "prompt": "Compute 1+1.", "answer": "2"}]
    test = [{"id": "t", "prompt": base.replace("\n", "\r\n") + " ", "answer": "5"}]
    with pytest.raises(DataError, match=r"problem 'Find .*\\r\\n.* ' appears in both 'train' \(as 'Find .*\\n.*': "
                                        r"the same text up to whitespace, NBSP, CRLF or invisible characters\) and "
                                        r"split 'test'.*1 of 1"):
        validate_splits(train, test, get_task("math"))
    with pytest.raises(DataError, match=r"appears in both 'train'.* and split 'test'.*1 of 1"):
        validate_splits(train, [{"id": "t", "prompt": base.replace("Find", "Fi\u00adnd"), "answer": "5"}],
                        get_task("math"))


def test_hub_preparation_drops_near_duplicates_of_held_out_problems(tmp_path):
    """The train split's problems, held out again with a trailing space, an NBSP, CRLF, and one exactly."""
    import json
    from pathlib import Path

    from rlvr_core.config import PrepareConfig
    from rlvr_core.tasks import build_hub_splits

    math_file = Path(__file__).parents[1] / "fixtures" / "hub" / "math" / "test.jsonl"
    rows = [json.loads(line) for line in math_file.read_text().splitlines()]
    edits = [lambda p: p + " ", lambda p: p.replace(" ", "\u00a0", 1), lambda p: p.replace(" ", "\r\n", 1),
             lambda p: p]
    held = [{**r, "problem": edit(r["problem"])} for r, edit in zip(rows, edits)]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    cfg = PrepareConfig(task="math", path=str(math_file), eval_path=str(tmp_path / "held.jsonl"), eval_split="test")
    ds, extra = build_hub_splits(cfg)
    assert extra == {"dropped_overlap": 4, "dropped_near_duplicate": 3}
    assert sorted(ds["train"]["prompt"]) == sorted(r["problem"] for r in rows[4:])
