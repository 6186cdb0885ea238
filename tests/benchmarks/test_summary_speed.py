"""The summary's speed benchmark (benchmarks/summary_speed.py): the sides run in turns, medians and ratios."""

from __future__ import annotations

from pathlib import Path

from benchmarks import summary_speed


def test_the_sides_run_in_turns_and_the_ratios_are_of_their_medians(monkeypatch, tmp_path: Path) -> None:
    calls: list[tuple[str, tuple[str, ...], bool]] = []
    seconds = {"baseline": [10.0, 12.0, 11.0], "cold": [5.0, 6.0, 4.0], "warm": [2.0, 1.0, 3.0]}

    def fake_timed(tree: Path, *flags: str, in_place: bool = False) -> float:
        calls.append((tree.name, flags, in_place))
        if in_place:
            return 99.0
        side = "baseline" if tree.name == "baseline" else "cold" if flags == ("--redraw",) else "warm"
        return seconds[side][sum(1 for c in calls if not c[2] and c[0] == tree.name
                                 and (c[1] == flags)) - 1]

    monkeypatch.setattr(summary_speed, "unpack", lambda rev, dest: dest)
    monkeypatch.setattr(summary_speed, "current_tree", lambda dest: dest)
    monkeypatch.setattr(summary_speed, "timed", fake_timed)
    r = summary_speed.measure("abc1234", 3, log=lambda m: None)
    assert calls[0] == ("current", (), True)  # the figures keyed once, in place, before any timed turn
    assert [(c[0], c[1]) for c in calls[1:4]] == [("baseline", ()), ("current", ("--redraw",)), ("current", ())]
    assert r["median_s"] == {"baseline": 11.0, "cold": 5.0, "warm": 2.0}
    assert r["speedup_cold"] == 11.0 / 5.0 and r["speedup_warm"] == 5.5
    md = summary_speed.markdown(r)
    assert "| warm | the package, figures whose inputs did not change kept | 2.0 | 2.0, 1.0, 3.0 | 5.50x |" in md
