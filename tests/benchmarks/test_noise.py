"""The A/A band and the reading rule beside it (issue 54, item 2): a headline saving is called one only when its
interval lies above zero and its estimate above the band of uniform GRPO against itself."""

from __future__ import annotations

import pytest

from benchmarks.study.noise import aa_bands, band, band_words, reads_as


def test_the_band_is_the_central_95_percent_of_the_re_splits_savings() -> None:
    xs = [i / 100 for i in range(-50, 50)]  # 100 splits, -50% to +49%
    b = band(xs)
    assert (b["lo"], b["hi"], b["splits"], b["coverage"]) == (pytest.approx(-0.48), pytest.approx(0.47), 100, 0.95)
    # a split whose median run never reached counts below every other: the low end reads "never"
    b = band([-float("inf")] * 5 + xs)
    assert b["lo"] is None and band_words(b) == f"[never, {round(100 * b['hi'])}%]"
    with pytest.raises(ValueError, match="at least one re-split"):
        band([])


@pytest.mark.parametrize(("saving", "lo", "hi", "word"), [
    (0.30, 0.10, 0.40, "saving"),          # interval above zero, estimate above the band
    (0.15, 0.05, 0.25, "not separated"),   # interval above zero, estimate inside the band
    (0.25, -0.02, 0.40, "not separated"),  # estimate above the band, interval reaches zero
    (-0.30, -0.45, -0.10, "loss"),
    (-0.10, -0.20, -0.02, "not separated"),
    (None, None, None, "loss"),            # the median run never reaches
])
def test_a_row_reads_as_a_saving_only_outside_the_band_with_its_interval_above_zero(saving, lo, hi, word) -> None:
    b = {"lo": -0.20, "hi": 0.17}
    assert reads_as({"pooled_saving": saving, "pooled_lo": lo, "pooled_hi": hi}, b) == word


def test_without_a_band_nothing_is_called_a_saving() -> None:
    assert reads_as({"pooled_saving": 0.5, "pooled_lo": 0.4, "pooled_hi": 0.6}, None) == "no A/A band"
    # an unbounded high end ("never" on both sides cannot happen; a high end that does) lets nothing out above it
    assert reads_as({"pooled_saving": 0.5, "pooled_lo": 0.4, "pooled_hi": 0.6}, {"lo": -0.2, "hi": None}) == \
        "not separated"


def test_each_family_s_band_comes_from_its_false_positive_record() -> None:
    rows = [{"family": "pool", "aa_false_positives": {"band": {"lo": -0.2, "hi": 0.17, "coverage": 0.95,
                                                               "splits": 200}, "runs": 30, "warm_starts": 3}},
            {"family": "hard", "aa_false_positives": None}]
    got = aa_bands(rows)
    assert got["hard"] is None and got["pool"]["runs_per_side"] == 15 and got["pool"]["hi"] == 0.17
