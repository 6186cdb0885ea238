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
