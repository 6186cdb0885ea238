"""The screening floor next to the measured allocators: how far below a filter any allocator can go.

    python -m benchmarks.floor [--out DIR]        # a few seconds; no training, no simulation

For a population of pass rates the floor (rlvr_core/allocation/floor.py) is the fewest rollouts per
effective group that any allocator deciding from a prompt's own rewards can spend, even one that knows the
population exactly. Below it only information about a prompt before its first rollout helps: a recurring
prompt's history (sara[carry], sara+dps, greso, pilot-commit's eviction) or its features (the contextual prior).
AR3PO is outside the floor's class: its groups stop at the first correct response (smaller than k), and its
response reuse is signal that costs no rollout of the step.

Writes under benchmarks/results/floor/ (``--out DIR``: the results root, DIR/floor/; it reads
DIR/allocation/allocation.json and DIR/study/):
- allocation_floor.json  the static scenarios (k = 8 and 16) beside the allocation benchmark's measured
                         rollouts per effective group (allocation/allocation.json), and the floor of every logged step
                         of the committed replay log (the pass rates of a uniform GRPO run of the ``hard``
                         regime), with the largest saving over DAPO's filter it leaves
                         and, when the training study has run, the rollouts per effective group of its ``hard``
                         ``equal-batch`` cells, with the largest saving over its dapo cell the floor leaves
- allocation_floor.md    the same as tables
- allocation_floor.png   the static scenarios, and the replay floor against the logged step
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, output_dir, save_figure
from benchmarks.study.plan import flagged, labels
from benchmarks.study.store import RunStore
from rlvr_core.allocation.floor import Floor, screening_floor
from rlvr_core.rollout.simulated import REPLAY_FILE, SCENARIOS, ReplayLog

STATIC = ("early", "late", "ushape", "uniform")
# allocators of the allocation benchmark that carry a prompt's history across steps (the floor does not bind them:
# pilot-commit evicts prompts its pilot found solved, the Beta posteriors carry a prompt's passes), and those whose
# effective groups are smaller than k (ar3po stops a prompt at its first correct response): an effective group of
# theirs is not the floor's unit (a full group of k), so neither best column lists them. The plan's flags.
HISTORY = tuple(lab for lab in flagged("history") if lab in flagged("simulated"))
SMALL_GROUPS = tuple(lab for lab in flagged("small_groups") if lab in flagged("simulated"))
TARGET_OVER_K = 1.4  # the allocation issue's simulator target
K = 8  # the group size of the replay log's run and of the training study's regimes (params.yaml train.k)


def _row(fl: Floor) -> dict[str, Any]:
    return {"k": fl.k, "floor": fl.rollouts_per_effective_group, "floor_over_k": fl.ratio_to_k,
            "filter": fl.filter_rollouts_per_effective_group, "max_saving_over_filter": fl.max_saving_over_filter,
            "mixed_probability": fl.mixed_probability, "abandon_after_fails": fl.abandon_after_fails,
            "abandon_after_passes": fl.abandon_after_passes}


def static_rows(measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for sc in STATIC:
        for k in (8, 16):
            beta = SCENARIOS[sc].beta
            row = {"scenario": sc, "beta": list(beta), **_row(screening_floor(k, beta=beta))}
            cells = [r for r in measured if r["scenario"] == sc and r["k"] == k
                     and r["allocator"] not in ("oracle", *SMALL_GROUPS)]
            for key, pick in (("best_without_history", [r for r in cells if r["allocator"] not in HISTORY]),
                              ("best_with_history", [r for r in cells if r["allocator"] in HISTORY])):
                if pick:
                    b = min(pick, key=lambda r: r["rollouts_per_effective_group"])
                    row[key] = {"allocator": b["allocator"], "rollouts_per_effective_group":
                                b["rollouts_per_effective_group"], "over_floor":
                                b["rollouts_per_effective_group"] / row["floor"]}
            rows.append(row)
    return rows


def replay_rows(path: Path = REPLAY_FILE, k: int = K, seed: int = 0) -> list[dict[str, Any]]:
    """The floor of each logged step's pass rates, as the replay scenario holds them (seed ``seed``)."""
    log = ReplayLog(path)
    return [{"step": int(log.steps[i]), **_row(screening_floor(k, rates=log.rates(i, seed)))}
            for i in range(len(log))]


def study_rows(store: RunStore, floor_over_k: float, regime: str = "hard") -> list[dict[str, Any]]:
    """Rollouts per effective group of the training study's equal-batch cells (median over seeds), beside
    the saving over its dapo cell and, in every row alike, the largest saving over that cell that the
    replay floor leaves an allocator without prompt information."""
    rows = []
    for lab in labels("equal-batch", regime):
        if runs := store.cell(regime, "equal-batch", lab):
            per = [r["ledger"]["rollouts"] / max(r["ledger"]["effective_groups_per_step"] * r["ledger"]["steps"], 1)
                   for r in runs]
            rows.append({"regime": regime, "allocator": lab, "seeds": len(runs),
                         "rollouts_per_effective_group": float(np.median(per))})
    dapo = next((r["rollouts_per_effective_group"] for r in rows if r["allocator"] == "dapo"), None)
    for r in rows:
        r["over_k"] = r["rollouts_per_effective_group"] / K
        r["saving_over_dapo"] = None if dapo is None else 1 - r["rollouts_per_effective_group"] / dapo
        r["ceiling_without_prompt_information"] = None if dapo is None else 1 - floor_over_k * K / dapo
    return rows


def summary(replay: list[dict[str, Any]]) -> dict[str, Any]:
    def q(key: str) -> dict[str, float]:
        v = np.array([r[key] for r in replay])
        return {"mean": float(v.mean()), "median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())}

    return {"steps": len(replay), "floor_over_k": q("floor_over_k"), "filter_over_k": {
        k: v / K for k, v in q("filter").items()}, "max_saving_over_filter": q("max_saving_over_filter")}


def markdown(static: list[dict[str, Any]], replay_sum: dict[str, Any], study: list[dict[str, Any]]) -> str:
    lines = [
        "Screening floor (rlvr_core/allocation/floor.py): the fewest rollouts per effective group any allocator",
        "deciding from a prompt's own rewards can spend, knowing the population exactly; the best rule abandons a",
        "prompt after the given number of identical rewards. Measured: benchmarks/results/allocation/allocation.json",
        f"(mean over seeds). Allocators with a prompt's history across steps ({', '.join(HISTORY)}) can go below",
        "the floor, because the simulated pool of 4,096 prompts recurs; no prompt recurred in the real runs.",
        "ar3po is left out of both columns: it stops a prompt at its first correct response, so its effective",
        "groups are smaller than k and not the floor's unit, and its response reuse (a completion from an earlier",
        "step) is signal that costs no rollout, outside the floor's class.",
        "",
        "| scenario | k | floor / k | filter / k | most a no-history allocator saves over the filter "
        "| abandon after (fails, passes) | best without history | best with history |",
        "|---|---|---|---|---|---|---|---|",
    ]
    def cell(r: dict[str, Any], key: str) -> str:
        b = r.get(key)
        return "-" if not b else f"{b['allocator']} {b['rollouts_per_effective_group'] / r['k']:.2f}x"

    for r in static:
        lines.append(f"| {r['scenario']} | {r['k']} | {r['floor_over_k']:.2f}x | {r['filter'] / r['k']:.2f}x "
                     f"| {r['max_saving_over_filter']:.0%} | ({r['abandon_after_fails']}, {r['abandon_after_passes']}) "
                     f"| {cell(r, 'best_without_history')} | {cell(r, 'best_with_history')} |")
    s = replay_sum
    lines += ["", f"Replay log (benchmarks/replay/, the pass rates of a uniform GRPO run of the `hard` regime), "
              f"{s['steps']} logged steps, k = 8: floor {s['floor_over_k']['mean']:.2f}x of k (mean over the steps, "
              f"each weighing the same as in a run; median {s['floor_over_k']['median']:.2f}x, "
              f"{s['floor_over_k']['min']:.2f}-{s['floor_over_k']['max']:.2f}x), the filter "
              f"{s['filter_over_k']['mean']:.2f}x; the most an allocator without prompt information can save "
              f"over DAPO's filter per effective group: {s['max_saving_over_filter']['median']:.0%} (median over "
              f"steps; {s['max_saving_over_filter']['min']:.0%}-{s['max_saving_over_filter']['max']:.0%})."]
    if study:
        ceiling = study[0]["ceiling_without_prompt_information"]
        lines += ["", "Training study, `hard`, `equal-batch` (benchmarks/results/study/): rollouts per effective "
                  "group, median over seeds. Every update holds B effective groups, so at the same number of "
                  "updates to target a saving in rollouts to target is this saving per effective group. "
                  + ("" if ceiling is None else
                     f"Against this dapo cell the replay floor ({s['floor_over_k']['mean']:.2f}x of k) leaves an "
                     f"allocator without prompt information at most {ceiling:.0%}; only a prompt's history or "
                     "features can go further. The floor is that of uniform GRPO's populations, which the other "
                     "allocators' runs only approximate."), "",
                  "| allocator | seeds | rollouts / eff. group | / k | saving over dapo |", "|---|---|---|---|---|"]
        for r in study:
            sv = "-" if r["saving_over_dapo"] is None else f"{r['saving_over_dapo']:.0%}"
            lines.append(f"| {r['allocator']} | {r['seeds']} | {r['rollouts_per_effective_group']:.2f} "
                         f"| {r['over_k']:.2f}x | {sv} |")
    return "\n".join(lines) + "\n"


def plot(static: list[dict[str, Any]], replay: list[dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(12, 4.2))
    rows = [r for r in static if r["k"] == 8]
    x = np.arange(len(rows))
    series = [("filter", [r["filter"] / 8 for r in rows]), ("floor", [r["floor_over_k"] for r in rows]),
              ("best without history", [r.get("best_without_history", {}).get("rollouts_per_effective_group",
                                                                               np.nan) / 8 for r in rows]),
              ("best with history", [r.get("best_with_history", {}).get("rollouts_per_effective_group", np.nan) / 8
                                     for r in rows])]
    w = 0.2
    for i, (lab, ys) in enumerate(series):
        a0.bar(x + (i - 1.5) * w, ys, w, label=lab)
    a0.axhline(TARGET_OVER_K, color="k", ls="--", lw=1, label=f"target {TARGET_OVER_K}x")
    a0.set_xticks(x, [r["scenario"] for r in rows])
    a0.set_ylabel("rollouts per effective group / k")
    a0.set_title("simulated scenarios, k = 8 (lower is better)")
    a0.legend(fontsize=8)
    steps = [r["step"] for r in replay]
    a1.plot(steps, [r["filter"] / r["k"] for r in replay], label="filter (k per prompt, mixed groups kept)")
    a1.plot(steps, [r["floor_over_k"] for r in replay], label="floor (no prompt information)")
    a1.axhline(TARGET_OVER_K, color="k", ls="--", lw=1, label=f"{TARGET_OVER_K}x")
    a1.set_xlabel("logged training step (uniform GRPO, regime hard)")
    a1.set_ylabel("rollouts per effective group / k")
    a1.set_title("replay log, k = 8")
    a1.legend(fontsize=8)
    save_figure(fig, path)


def write(results: Path, replay: Path = REPLAY_FILE, store: RunStore | None = None) -> dict[str, Any]:
    """allocation_floor.{json,md,png} in the results root ``results``'s floor/, from its allocation/allocation.json
    and the training study's runs in ``store`` (default: ``results``'s); the result written."""
    measured_path = results / "allocation" / "allocation.json"
    measured = json.loads(measured_path.read_text()) if measured_path.exists() else []
    static, steps = static_rows(measured), replay_rows(replay)
    rsum = summary(steps)
    study = study_rows(store or RunStore(results), rsum["floor_over_k"]["mean"])
    result = {"static": static, "replay": {"source": replay.name, "k": K, "summary": rsum, "steps": steps},
              "study_equal_batch": study, "history_allocators": list(HISTORY),
              "small_group_allocators": list(SMALL_GROUPS)}
    dest = output_dir(results, "floor")
    (dest / "allocation_floor.json").write_text(json.dumps(result, indent=1) + "\n")
    (dest / "allocation_floor.md").write_text(markdown(static, rsum, study))
    plot(static, steps, dest / "allocation_floor.png")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, help="results root (writes its floor/, reads its "
                    "allocation/allocation.json and study/)")
    ap.add_argument("--replay", type=Path, default=REPLAY_FILE, help="rollout log of the replay part")
    args = ap.parse_args(argv)
    if not (measured := args.out / "allocation" / "allocation.json").exists():
        print(f"note: {measured} is missing; the floor is written without measured allocators")
    write(args.out, replay=args.replay)
    print((args.out / "floor" / "allocation_floor.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
