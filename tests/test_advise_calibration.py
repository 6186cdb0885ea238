"""The calibration of the advisor's proxy to the saving in rollouts to target (rlvr_core.advise.calibration,
docs/advisor.md "Predicted saving to target"), and the advisor's use of it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import rlvr_core.advise.core as core
from rlvr_core.advise.calibration import Calibration, Point, family_key, fit, leave_one_out, note, predicted


def points(seed: int = 0, offset: float = 0.8) -> list[Point]:
    """Cells on measured = -0.1 + 0.5 x proxy with noise 0.05; family "off" sits ``offset`` above the line."""
    rng = np.random.default_rng(seed)
    out = []
    for fam, n in (("a", 8), ("b", 8), ("c", 2), ("off", 3)):
        for x in rng.uniform(-0.6, 0.4, n):
            out.append(Point(fam, float(x), -0.1 + 0.5 * x + (offset if fam == "off" else 0.0) + rng.normal(0, 0.05)))
    return out


def test_the_line_is_fitted_and_a_family_off_it_is_set_apart_with_its_offset():
    cal = fit(points())
    assert cal.intercept == pytest.approx(-0.1, abs=0.05) and cal.slope == pytest.approx(0.5, abs=0.08)
    assert cal.cells == 18 and 0.02 < cal.residual_sd < 0.1
    assert [f for f, v in cal.families.items() if not v["carries_over"]] == ["off"]
    assert cal.families["off"]["offset"] == pytest.approx(0.8, abs=0.1) and cal.families["off"]["cells"] == 3
    est, lo, hi = cal.predict("a", 0.2)
    assert est == pytest.approx(0.0, abs=0.05) and lo < est < hi and hi - lo < 0.4
    off = cal.predict("off", 0.2)
    assert off[0] == pytest.approx(0.8, abs=0.1) and off[2] - off[0] > hi - est  # a family's offset: wider
    assert cal.predict("unseen", 0.2)[0] == pytest.approx(est)  # not in the study: the pooled line
    wide = cal.predict("a", 0.2, proxy_half=0.2)  # the proxy's own interval widens the prediction
    assert wide[0] == est and wide[2] - wide[1] > hi - lo


def test_the_calibration_round_trips_through_json_and_refuses_too_few_cells():
    cal = fit(points())
    back = Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    assert back == cal
    assert Calibration.from_json(None) is None and Calibration.from_json({"slope": 1.0}) is None
    assert fit(points()[:3]) is None


def test_leave_one_out_predicts_each_cell_from_the_others():
    pts = points()
    loo = leave_one_out(pts)
    assert len(loo) == len(pts) and all(p is not None for p in loo)
    err = [p[0] - q.measured for p, q in zip(loo, pts) if q.family != "off"]
    assert np.median(np.abs(err)) < 0.1
    covered = [p[1] <= q.measured <= p[2] for p, q in zip(loo, pts)]
    assert np.mean(covered) >= 0.8


def test_notes_and_predictions_name_what_the_calibration_cannot_carry():
    cal = fit(points())
    assert note(cal, "off").startswith("proxy does not carry over: 3 study cells measured +8")
    assert note(cal, "c").startswith("2 study cells") and "too few to tell" in note(cal, "c")
    assert note(cal, "a") == "" and note(cal, "new").startswith("not in the training study")
    assert predicted(cal, "grpo", "fresh", (0.3, 0.2, 0.4)) == ((0.0, 0.0, 0.0), "the baseline")
    assert predicted(None, "a", "fresh", (0.3, 0.2, 0.4))[0] is None
    assert predicted(cal, "a", "fresh", (float("inf"),) * 3)[0] is None
    assert family_key("sara+dps", "pool") == "sara+dps on recurring prompts" and family_key("sara", "fresh") == "sara"
    assert predicted(cal, "a", "fresh", (0.2, 0.2, 0.2))[0] == pytest.approx(cal.predict("a", 0.2))


def fresh_log(path, steps: int = 6, prompts: int = 16, n: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(1, steps + 1):
        s = rng.binomial(n, rng.beta(0.5, 1.0, prompts))
        rows += [{"step": t, "prompt_id": t * prompts + j, "rollouts": n, "passes": int(s[j])} for j in range(prompts)]
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def with_calibration(monkeypatch, cal: Calibration) -> None:
    """The advisor reads ``cal`` as the committed validation's calibration."""
    monkeypatch.setattr(core, "load_validation", lambda path=core.VALIDATION_FILE: {"calibration": cal.to_json()})


def test_the_advice_predicts_the_saving_to_target_beside_the_proxy_and_recommends_by_it(tmp_path, monkeypatch):
    from rlvr_core.advise.report import render, write

    # measured = 0.3 + 0.1 x proxy, tight; dapo's family sits far off the line, so its proxy does not carry over
    fams = {"sara": 0.0, "grpo": 0.0, "vigor": 0.0, "pods": 0.0, "dapo": 1.0}
    cal = fit([Point(f, x, 0.3 + 0.1 * x + off + 0.01 * ((i * 7) % 3 - 1)) for i, (f, off) in
               enumerate(fams.items()) for x in (-0.3, -0.1, 0.1, 0.3)])
    assert not cal.families["dapo"]["carries_over"]
    with_calibration(monkeypatch, cal)
    adv = core.advise(fresh_log(tmp_path / "log.parquet"), k=4, batch=8, seeds=2, steps=6,
                      allocators=["grpo", "sara", "dapo", "ar3po"])
    by = {a.name: a for a in adv.allocators}
    assert by["grpo"].predicted_saving_to_target == (0.0, 0.0, 0.0)
    for name in ("sara", "ar3po"):
        est = by[name].predicted_saving_to_target[0]
        assert est == pytest.approx(cal.predict(name, by[name].saving_vs_grpo[0])[0])
    assert by["ar3po"].calibration_note.startswith("not in the training study")
    assert by["dapo"].calibration_note.startswith("proxy does not carry over")
    assert by["dapo"].predicted_saving_to_target[0] > 0.3 + 0.1 * by["dapo"].saving_vs_grpo[0] + 0.9  # its offset
    best = max((a for a in adv.allocators if a.name != "grpo"), key=lambda a: a.predicted_saving_to_target[0])
    assert best.name == "dapo" and best.predicted_saving_to_target[1] > 0
    assert adv.recommendation.startswith("dapo: predicted ")
    write(adv, tmp_path / "out")
    js = json.loads((tmp_path / "out" / "advice.json").read_text())
    row = next(a for a in js["allocators"] if a["name"] == "sara")
    assert len(row["predicted_saving_to_target"]) == 3 and len(row["saving_vs_grpo"]) == 3
    md = render(adv)
    assert "| allocator | predicted saving to target vs grpo | proxy: saving per trained row vs grpo |" in md
    assert "| proxy does not carry over: 4 study cells measured +1" in md  # about +100%


def test_without_a_lower_bound_above_zero_the_advice_is_to_stay_with_uniform_grpo(tmp_path, monkeypatch):
    cal = fit([Point(f, x, -0.2 + 0.5 * x + 0.3 * ((i * 5) % 4 - 1.5)) for i, (f, x) in
               enumerate((f, x) for f in ("sara", "dapo", "vigor") for x in (-0.4, -0.2, 0.0, 0.2, 0.4))])
    with_calibration(monkeypatch, cal)
    adv = core.advise(fresh_log(tmp_path / "log.parquet"), k=4, batch=8, seeds=2, steps=6,
                      allocators=["grpo", "sara", "sara+dps"])
    assert all(a.predicted_saving_to_target[1] <= 0 for a in adv.allocators)
    assert adv.recommendation.startswith("stay with uniform GRPO: no allocator's predicted saving in rollouts to "
                                         "target has an interval above zero")


def test_the_committed_validation_holds_a_calibration_the_advisor_reads():
    val = core.load_validation()
    cal = Calibration.from_json(val.get("calibration"))
    assert cal is not None and cal.cells >= 10 and val["target_cells"] >= cal.cells
    assert val["target_median_abs_error"] is not None and 0 <= val["target_interval_coverage"] <= 1
    rows = [r for r in val["rows"] if r["protocol"] != "reference"]
    assert len(rows) == val["target_cells"]
    for r in rows:  # each cell: the proxy, the measured saving to target, its leave-one-out prediction and error
        assert r["target_error"] == pytest.approx(r["predicted_saving"][0] - r["measured_saving"]["value"])
