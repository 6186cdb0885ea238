"""The study's statistics: pure functions over runs held in memory, built on ``rlvr_core.stats``. No file reads.

- a cell: ``cell_rows`` (reach on every cost axis, medians with their intervals, accuracy at fixed budgets, the
  decomposition of rollouts to target), ``against_baseline`` (the rank test against the protocol's baseline);
- ours against a baseline: ``saving`` (1 - median ours / median baseline of fitted rollouts to target, bootstrap
  interval; a miss counts against its own side only: ours as never, the baseline's at its whole budget),
  ``saving_gap`` (the saving on one axis minus another's, runs paired), ``dominance`` (accuracy by update count);
- across warm starts: ``matched_cells``, ``compare``, ``pooled_costs``, ``family_saving`` (a ``Cells`` source
  gives each warm start's target and runs: benchmarks.study.store.RunStore).

A bootstrap draws all its resamples at once (``resample``: the same draws as one round at a time) and reduces
them as arrays, so a summary's thousands of resampled medians cost a few array operations each.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from benchmarks.study.plan import (
    BUDGETS,
    CONDITIONING,
    CONDITIONING_WINDOW,
    EVAL_GRID,
    FRACTIONS,
    REGIMES,
    base_regime,
)
from rlvr_core.stats import (
    accuracy_at,
    accuracy_se,
    area_under_curve,
    first_reach,
    fitted_reach,
    isotonic,
    median_ci,
    median_interval,
    rank_test,
)
from rlvr_core.stats import reach as _reach

BOOT = 5000  # bootstrap resamples of a saving


class Cells(Protocol):
    """Where the cross-warm-start statistics read cells: a RunStore, whose runs are in memory."""

    def cell(self, regime: str, protocol: str, label: str) -> list[dict[str, Any]]: ...

    def target_value(self, regime: str) -> float | None: ...

    def preregistration(self, regime: str) -> dict[str, Any] | None: ...


def reach(curve: Sequence[Mapping[str, float]], target: float, *, fit: bool = False) -> dict[str, float]:
    """x at which a run reaches ``target`` for each x axis (NaN if never), interpolated: the raw first crossing, or
    with ``fit`` the first crossing of the run's isotonic fit (the study's primary statistic)."""
    return _reach(curve, target, fit=fit)


def cell_rows(runs: Sequence[Mapping[str, Any]], target: float, *, start: float | None = None,
              gain: float | None = None, budget: float | None = None) -> dict[str, Any]:
    """A cell's statistics over its runs. Primary: ``fit_rollouts_to_target``, the first crossing of each run's
    isotonic fit (median and its order-statistic interval, with coverage); the raw first crossing
    (``rollouts_to_target``, bootstrap interval) stays beside it. With the target's ``start`` and ``gain``, the
    fitted reach at 60/70/80% of the gain; with ``budget``, the area under the accuracy-rollouts curve to it."""
    hits = [reach(r["curve"], target) for r in runs]
    fits = [reach(r["curve"], target, fit=True) for r in runs]
    rec = {"seeds": len(runs), "reached": int(sum(math.isfinite(h["cum_rollouts"]) for h in hits)),
           "reached_fit": int(sum(math.isfinite(h["cum_rollouts"]) for h in fits)),
           "rollouts_to_target": median_ci([h["cum_rollouts"] for h in hits]),
           "seconds_to_target": median_ci([h["seconds"] for h in hits]),
           "tokens_to_target": median_ci([h["cum_tokens"] for h in hits]),
           "trained_tokens_to_target": median_ci([h["cum_trained_tokens"] for h in hits]),
           "updates_to_target": median_ci([h["updates"] for h in hits]),
           **{f"fit_{ax}_to_target": median_interval([h[key] for h in fits]) for ax, key in
              (("rollouts", "cum_rollouts"), ("seconds", "seconds"), ("tokens", "cum_tokens"),
               ("updates", "updates"))},
           "final_accuracy": float(np.median([r["curve"][-1]["greedy_acc"] for r in runs])),
           "final_accuracy_iqr": [float(np.percentile([r["curve"][-1]["greedy_acc"] for r in runs], q))
                                  for q in (25, 75)],
           "start_accuracy": float(np.median([r["curve"][0]["greedy_acc"] for r in runs])),
           "eval_size": int(runs[0]["eval_size"]),
           "evaluations_per_run": float(np.median([len(r["curve"]) for r in runs])),
           "acc_at_budget": {str(b): median_or_none([accuracy_at(r["curve"], b) for r in runs]) for b in BUDGETS}}
    if start is not None and gain is not None:
        rec["fit_rollouts_to_fraction"] = {
            f"{f:g}": median_interval([fitted_reach([c["cum_rollouts"] for c in r["curve"]],
                                                    [c["greedy_acc"] for c in r["curve"]], start + f * gain)
                                       for r in runs]) for f in FRACTIONS}
    if budget is not None:
        rec["auc"] = {"upto": budget, **median_interval([area_under_curve(r["curve"], budget) for r in runs])}
    rec["final_accuracy_se"] = accuracy_se(rec["final_accuracy"], rec["eval_size"])
    led = [r["ledger"] for r in runs]
    rec["ledger"] = {k: float(np.median([x[k] for x in led])) for k in led[0] if isinstance(led[0][k], (int, float))}
    rec["decomposition"] = decomposition(runs, [h["cum_rollouts"] for h in fits])
    return rec


def median_or_none(values: Sequence[float | None]) -> float | None:
    """Median of ``values``; None when any is missing (a run that ended before the point)."""
    return None if not values or any(v is None for v in values) else float(np.median(values))


def decomposition(runs: Sequence[Mapping[str, Any]], fit_reach: Sequence[float]) -> dict[str, Any]:
    """Rollouts to target = (rollouts per effective group) x (effective groups to target), medians over runs.

    Rollouts per effective group is the run's whole ledger (rollouts / effective groups trained); effective groups
    to target is the fitted rollouts to target divided by it (None for a run that never reaches). Separates what
    allocation buys (the first factor) from what the update count and batch buy (the second)."""
    per, groups = [], []
    for r, x in zip(runs, fit_reach):
        lg = r["ledger"]
        eff = lg.get("effective_groups_per_step", 0.0) * lg.get("steps", 0)
        rpeg = lg["rollouts"] / eff if eff else math.inf
        per.append(rpeg)
        groups.append(x / rpeg if math.isfinite(x) and math.isfinite(rpeg) else math.inf)
    return {"rollouts_per_effective_group": median_interval(per),
            "effective_groups_to_target": median_interval(groups),
            "effective_groups_per_update": float(np.median([r["ledger"].get("effective_groups_per_step", 0.0)
                                                            for r in runs]))}


def against_baseline(ours: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]] | None, proto: str,
                     label: str, target: float, base_label: str) -> dict[str, Any]:
    """The one-sided rank test of a cell's fitted rollouts to target against its protocol's baseline cell (misses
    ranked last), stratified by warm start where the runs record one; {} for the baseline itself."""
    if label == base_label or not base:
        return {}

    def fit(rs: Sequence[Mapping[str, Any]]) -> list[float]:
        return [reach(r["curve"], target, fit=True)["cum_rollouts"] for r in rs]

    strata = all("warm_start" in r for r in [*ours, *base])
    test = rank_test(fit(ours), fit(base), strata_ours=[r["warm_start"] for r in ours] if strata else None,
                     strata_base=[r["warm_start"] for r in base] if strata else None)
    return {"baseline": base_label, "p_value": test["p_value"], "p_exact": test["exact"], "p_mc_se": test["p_mc_se"]}


def reach_x(run: Mapping[str, Any], target: float, axis: str, fit: bool = True) -> float:
    """Where on ``axis`` (cum_rollouts, cum_tokens, ...) a run's curve reaches ``target``: the fitted reach, or the
    first crossing with ``fit=False``; inf when it never does."""
    c = run["curve"]
    xs, ys = np.asarray([e[axis] for e in c], float), np.asarray([e["greedy_acc"] for e in c], float)
    return fitted_reach(xs, ys, target) if fit else first_reach(xs, ys, target)


def cost_of(run: Mapping[str, Any], target: float, axis: str, ours: bool, fit: bool = True) -> float:
    """A run's cost to the target on ``axis``: its reach. A miss costs one of ours inf (ranked last) and a
    baseline its whole budget, a lower bound on its true cost: a saving against a missing baseline is understated."""
    x = reach_x(run, target, axis, fit)
    if math.isfinite(x):
        return x
    return math.inf if ours else float(run["curve"][-1][axis])


def _sav(x: np.ndarray, y: np.ndarray) -> float:
    mx, my = float(np.median(x)), float(np.median(y))
    if not math.isfinite(mx):
        return -math.inf
    return 1.0 - mx / my if my > 0 else math.nan  # a baseline at its target from the start: no saving to read


def _savings(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``_sav`` of each row pair of ``x`` and ``y`` (resamples x runs): the same numbers, all rows at once."""
    mx, my = np.median(x, axis=1), np.median(y, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(mx), 1.0 - mx / my, -math.inf)


def resample(rng: np.random.Generator, sizes: Sequence[int], boot: int) -> list[np.ndarray]:
    """Bootstrap indices: what ``boot`` rounds of ``rng.integers(0, n, n)`` for each n of ``sizes`` in turn draw, as
    one (boot, n) array per size. Where every size is equal the rounds are one call (the same stream of draws)."""
    if len(set(sizes)) == 1:
        x = rng.integers(0, sizes[0], size=(boot, len(sizes), sizes[0]))
        return [x[:, j] for j in range(len(sizes))]
    out = [np.empty((boot, n), dtype=np.int64) for n in sizes]
    for i in range(boot):
        for j, n in enumerate(sizes):
            out[j][i] = rng.integers(0, n, n)
    return out


def finite_or_none(v: float) -> float | None:
    """A finite float, else None (a saving against ours that never reached is -inf)."""
    return float(v) if math.isfinite(v) else None


def percentile_interval(boots: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval of sorted bootstrap draws: their 2.5% and 97.5% order statistics."""
    n = len(boots)
    return float(boots[int(0.025 * (n - 1))]), float(boots[int(math.ceil(0.975 * (n - 1)))])


def saving(ours: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], target: float, *,
           axis: str = "cum_rollouts", seed: int = 0) -> dict[str, Any]:
    """1 - median(ours) / median(base) of the fitted reach with a bootstrap interval, the raw first crossing's
    saving beside it and the rank test's p-value; see the module docstring for unreached runs."""
    a = np.asarray([cost_of(r, target, axis, True) for r in ours], float)
    b = np.asarray([cost_of(r, target, axis, False) for r in base], float)
    if not len(a) or not len(b):
        return {"value": None, "lo": None, "hi": None}
    ia, ib = resample(np.random.default_rng(seed), (len(a), len(b)), BOOT)
    boots = np.sort(_savings(a[ia], b[ib]))
    lo, hi = percentile_interval(boots)
    raw_a = np.asarray([cost_of(r, target, axis, True, fit=False) for r in ours], float)
    raw_b = np.asarray([cost_of(r, target, axis, False, fit=False) for r in base], float)
    test = rank_test([reach_x(r, target, axis) for r in ours], [reach_x(r, target, axis) for r in base])
    return {"value": finite_or_none(_sav(a, b)), "lo": finite_or_none(lo), "hi": finite_or_none(hi),
            "value_raw": finite_or_none(_sav(raw_a, raw_b)),
            "p_value": test["p_value"], "p_mc_se": test["p_mc_se"], "ours_seeds": len(a), "base_seeds": len(b),
            "ours_reached": int(np.isfinite(a).sum()),
            "base_reached": int(sum(math.isfinite(reach_x(r, target, axis)) for r in base))}


def accuracy_by_updates(runs: Sequence[Mapping[str, Any]], grid: np.ndarray) -> np.ndarray:
    """Median over seeds of the accuracy interpolated at ``grid`` update counts."""
    ys = [np.interp(grid, [c["updates"] for c in r["curve"]], [c["greedy_acc"] for c in r["curve"]]) for r in runs]
    return np.median(np.vstack(ys), axis=0)


def dominance(ours: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]],
              skip: float = 0.1, points: int = 50) -> dict[str, Any]:
    """Where ours' median accuracy is >= base's against updates, after the first ``skip`` of the run."""
    if not ours or not base:
        return {"value": None}
    end = min(min(r["curve"][-1]["updates"] for r in ours), min(r["curve"][-1]["updates"] for r in base))
    grid = np.linspace(skip * end, end, points)
    d = accuracy_by_updates(ours, grid) - accuracy_by_updates(base, grid)
    return {"value": float(np.mean(d >= 0)), "min_difference": float(d.min()), "mean_difference": float(d.mean()),
            "updates": [float(grid[0]), float(grid[-1])], "ours_seeds": len(ours), "base_seeds": len(base)}


def saving_gap(ours: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]], target: float, *,
               axis: str, than: str = "cum_rollouts", seed: int = 0) -> dict[str, Any]:
    """The saving on ``axis`` minus the saving on ``than`` (e.g. tokens minus rollouts), with a 95% bootstrap
    interval that resamples each side's runs once for both axes (a run's two costs stay paired)."""
    a = np.asarray([[cost_of(r, target, x, True) for x in (axis, than)] for r in ours], float)
    b = np.asarray([[cost_of(r, target, x, False) for x in (axis, than)] for r in base], float)
    if not len(a) or not len(b):
        return {"value": None, "lo": None, "hi": None}

    def gap(x: np.ndarray, y: np.ndarray) -> float:
        d = _sav(x[:, 0], y[:, 0]) - _sav(x[:, 1], y[:, 1])
        return d if math.isfinite(d) else math.nan

    ia, ib = resample(np.random.default_rng(seed), (len(a), len(b)), BOOT)
    ra, rb = a[ia], b[ib]  # (resamples, runs, axes)
    with np.errstate(invalid="ignore"):
        boots = _savings(ra[:, :, 0], rb[:, :, 0]) - _savings(ra[:, :, 1], rb[:, :, 1])
    boots = np.sort(boots[np.isfinite(boots)])
    value = gap(a, b)
    if not len(boots) or not math.isfinite(value):
        return {"value": None, "lo": None, "hi": None}
    lo, hi = percentile_interval(boots)
    return {"value": value, "lo": lo, "hi": hi, "resamples_used": int(len(boots))}


def preregistered(store: Cells, regime: str) -> bool | None:
    """Whether the regime's pre-registration met its criteria (None: none recorded)."""
    p = store.preregistration(regime)
    return None if p is None else bool(p.get("meets"))


def _settings(runs: Sequence[Mapping[str, Any]]) -> set[str]:
    return {json.dumps(r.get("allocator_params") or {}, sort_keys=True) for r in runs}


def matched_cells(store: Cells, regimes: Sequence[str], protocol: str, ours: str,
                  base: str) -> tuple[list[tuple[str, float, list[dict], list[dict]]], list[str]]:
    """(regime, target, our runs, baseline runs) of each warm start in ``regimes`` that ran both cells with the
    allocator settings of the last of them, and the warm starts left out for other settings: a label whose protocol
    changed (VIGOR's runs on the step-grid regimes predate ``fill``) is another allocator there."""
    found = [(r, store.target_value(r), store.cell(r, protocol, ours), store.cell(r, protocol, base))
             for r in regimes]
    found = [c for c in found if c[2] and c[3]]
    if not found:
        return [], []
    latest = (_settings(found[-1][2]), _settings(found[-1][3]))
    keep = [c for c in found if (_settings(c[2]), _settings(c[3])) == latest]
    return keep, [c[0] for c in found if c not in keep]


def compare(store: Cells, regimes: Sequence[str], protocol: str, ours: str, base: str,
            axis: str = "cum_rollouts") -> dict[str, Any] | None:
    """One comparison across the warm starts in ``regimes`` that ran both cells (``cells``), on cost ``axis``; None
    where none did."""
    per, ratios, fa, fb, sa, sb = [], [], [], [], [], []
    kept, left_out = matched_cells(store, regimes, protocol, ours, base)
    for regime, t, a, b in kept:
        s = saving(a, b, t, axis=axis)
        per.append({"regime": regime, "warm_start": base_regime(regime)[1] or 0,
                    "preregistration_met": preregistered(store, regime), "target": t, **s})
        base_median = float(np.median([cost_of(r, t, axis, False) for r in b]))
        ratios += [cost_of(r, t, axis, True) / base_median if base_median > 0 else math.nan for r in a]
        fa += [reach_x(r, t, axis) for r in a]
        fb += [reach_x(r, t, axis) for r in b]
        sa += [regime] * len(a)
        sb += [regime] * len(b)
    if not per:
        return None
    test = rank_test(fa, fb, strata_ours=sa, strata_base=sb)
    pooled = float(np.median(ratios))
    return {"protocol": protocol, "ours": ours, "baseline": base, "axis": axis, "warm_starts": len(per),
            "ours_runs": len(fa), "base_runs": len(fb), "per_warm_start": per, "left_out_other_settings": left_out,
            "pooled_saving": None if not math.isfinite(pooled) else 1.0 - pooled,
            "p_value_stratified": test["p_value"], "p_value_stratified_se": test["p_mc_se"], "p_method": test["method"],
            "holds_in": sum(1 for p in per if p["value"] is not None and p["value"] > 0)}


def pooled_costs(store: Cells, regimes: Sequence[str], protocol: str, ours: str, base: str, axes: Sequence[str], *,
                 boot: int = 2000, seed: int = 0) -> dict[str, dict[str, float | None]]:
    """The pooled saving of ``ours`` against ``base`` on each axis with a 95% bootstrap interval that resamples the
    runs of each side within each warm start, the same draw for every axis (a run's costs stay together); and for
    each axis but the first, its pooled saving minus the first axis's ({axis: {value, lo, hi, gap, gap_lo,
    gap_hi}})."""
    costs = [(np.asarray([[cost_of(r, t, x, True) for x in axes] for r in a], float),
              np.asarray([[cost_of(r, t, x, False) for x in axes] for r in b], float))
             for _, t, a, b in matched_cells(store, regimes, protocol, ours, base)[0]]  # per warm start: (runs, axes)
    if not costs:
        return {}

    def pooled(draw: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        ratios = np.concatenate([a / np.median(b, axis=0) for a, b in draw])
        return 1.0 - np.median(ratios, axis=0)

    idx = resample(np.random.default_rng(seed), [len(x) for pair in costs for x in pair], boot)
    draws = [(a[ia], b[ib]) for (a, b), ia, ib in zip(costs, idx[::2], idx[1::2])]  # (resamples, runs, axes)
    with np.errstate(divide="ignore", invalid="ignore"):  # a baseline at its target from the start: no saving
        ratios = np.concatenate([a / np.median(b, axis=1)[:, None, :] for a, b in draws], axis=1)
        boots = 1.0 - np.median(ratios, axis=1)
        value = pooled(costs)

    def ci(x: np.ndarray) -> tuple[float | None, float | None]:
        lo, hi = percentile_interval(np.sort(x))
        return finite_or_none(lo), finite_or_none(hi)

    res: dict[str, dict[str, float | None]] = {}
    for j, x in enumerate(axes):
        lo, hi = ci(boots[:, j])
        res[x] = {"value": finite_or_none(value[j]), "lo": lo, "hi": hi}
        if j:
            glo, ghi = ci(boots[:, j] - boots[:, 0])
            res[x].update(gap=finite_or_none(value[j] - value[0]), gap_lo=glo, gap_hi=ghi)
    return res


def family_saving(store: Cells, regimes: Sequence[str], protocol: str, ours: str, base: str,
                  axis: str = "cum_rollouts") -> dict[str, Any] | None:
    """A target's saving over the warm starts in ``regimes`` that ran both cells, in study_targets' row form: the
    pooled saving of fitted cost ``axis`` (rollouts by default) with its bootstrap interval (pooled_costs), the rank
    test stratified by warm start, the runs and reaches summed over the warm starts; None where no warm start ran
    both."""
    row = compare(store, regimes, protocol, ours, base, axis=axis)
    if row is None:
        return None
    pooled = pooled_costs(store, regimes, protocol, ours, base, (axis,))[axis]
    per = row["per_warm_start"]
    return {"value": pooled["value"], "lo": pooled["lo"], "hi": pooled["hi"], "p_value": row["p_value_stratified"],
            "p_mc_se": row["p_value_stratified_se"], "p_method": row["p_method"],
            "ours_seeds": row["ours_runs"], "base_seeds": row["base_runs"],
            "ours_reached": sum(p["ours_reached"] for p in per), "base_reached": sum(p["base_reached"] for p in per),
            "warm_starts": row["warm_starts"], "holds_in": row["holds_in"], "regimes": [p["regime"] for p in per]}


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values, in the order given (None: untested, not counted in the
    family): the i-th smallest of m is multiplied by m - i + 1, capped at 1 and never below the one before it."""
    return [p for p, _ in holm_with_se(ps, [0.0] * len(ps))]


def holm_with_se(ps: Sequence[float | None], ses: Sequence[float | None]
                 ) -> list[tuple[float | None, float | None]]:
    """``holm`` with each p's Monte Carlo standard error carried through (None or 0: an exact p): an adjusted p is
    (m - i + 1) x the p it comes from (its own, or the larger one before it that it may not fall below), and its SE
    is that p's SE times the same factor (0 where the cap at 1 decides). Returns (adjusted p, its SE) per entry."""
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    out: list[tuple[float | None, float | None]] = [(None, None)] * len(ps)
    running, running_se = 0.0, 0.0
    for rank, i in enumerate(order):
        factor = len(order) - rank
        scaled = factor * float(ps[i])
        if min(1.0, scaled) > running:
            running, running_se = (1.0, 0.0) if scaled >= 1.0 else (scaled, factor * float(ses[i] or 0.0))
        out[i] = (running, running_se)
    return out


BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # accuracy at these fractions of a regime's rollout budget


def _budget_stats(curve: Sequence[Mapping[str, float]], budget: float, axis: str = "cum_rollouts"
                  ) -> list[float | None]:
    """A run's isotonic accuracy at each BUDGET_FRACTIONS of ``budget`` on ``axis``, then its area under the curve
    to it."""
    return [accuracy_at(curve, f * budget, axis) for f in BUDGET_FRACTIONS] + [area_under_curve(curve, budget, axis)]


def stratified_t_interval(values: Sequence[float], strata: Sequence[Any], level: float = 0.95
                          ) -> tuple[float | None, float | None]:
    """A ``level`` interval for the mean of ``values`` (paired differences spread over warm starts): a t interval
    whose variance pools the spread within each stratum (each stratum's own mean taken out), with N - strata
    degrees of freedom. (None, None) with fewer than one degree of freedom. Checked on the A/A runs
    (benchmarks/null_controls.py): their re-splits exclude zero at about the stated rate, where a percentile
    bootstrap over five pairs per warm start excluded it two to three times as often."""
    from scipy import stats as st

    x, s = np.asarray(values, float), np.asarray(strata)
    keys = list(dict.fromkeys(s.tolist()))
    df = len(x) - len(keys)
    if df < 1:
        return None, None
    within = sum(float(((x[s == k] - x[s == k].mean()) ** 2).sum()) for k in keys)
    half = float(st.t.ppf(0.5 + level / 2, df)) * math.sqrt(within / df / len(x))
    return float(x.mean()) - half, float(x.mean()) + half


def paired_budget(store: Cells, regimes: Sequence[str], protocol: str, ours: str, base: str, *,
                  axis: str = "cum_rollouts", seed_offset: int = 0) -> dict[str, Any] | None:
    """Statistics that survive a flat curve: accuracy at fixed fractions of the regime's budget and the area under
    the curve to it, each as ours - base over the (warm start, seed) pairs both cells ran, with the mean difference
    and its 95% interval (``stratified_t_interval``, warm starts as strata). None where no pair exists. On another
    ``axis`` (``updates``) the budget of a warm start is the least any run of its two cells reached on it, so that
    every run is read over the same range. Ours' seed s pairs with base's seed s - ``seed_offset`` (the A/A's runs
    take seeds 5-9 against the reference runs' 0-4)."""
    names = [f"{f:g}" for f in BUDGET_FRACTIONS] + ["auc"]
    rows, strata = [], []
    for regime, _t, a, b in matched_cells(store, regimes, protocol, ours, base)[0]:
        budget = REGIMES[base_regime(regime, REGIMES)[0]].budget if axis == "cum_rollouts" else \
            min(r["curve"][-1][axis] for r in (*a, *b))
        by_seed = {r["seed"] + seed_offset: r for r in b}
        for r in a:
            if r["seed"] in by_seed:
                x, y = _budget_stats(r["curve"], budget, axis), _budget_stats(by_seed[r["seed"]]["curve"], budget, axis)
                rows.append([math.nan if u is None or v is None else u - v for u, v in zip(x, y)])
                strata.append(regime)
    if not rows:
        return None
    d, strata_arr = np.asarray(rows, float), np.asarray(strata)
    out: dict[str, Any] = {"pairs": len(rows), "warm_starts": len(dict.fromkeys(strata))}
    for j, name in enumerate(names):
        col = d[:, j]
        ok = np.isfinite(col)
        if not ok.any():
            out[name] = {"mean": None, "lo": None, "hi": None, "pairs": 0}
            continue
        lo, hi = stratified_t_interval(col[ok], strata_arr[ok])
        out[name] = {"mean": float(col[ok].mean()), "lo": lo, "hi": hi, "pairs": int(ok.sum())}
    return out


def conditioning(refs: Sequence[Mapping[str, Any]], target: float) -> dict[str, Any]:
    """How well a warm start's target is conditioned, on its uniform GRPO reference runs (plan.CONDITIONING):

    - slope: the least-squares slope, in points per 1,000 rollouts, through every reference run's raw evaluations
      within CONDITIONING_WINDOW evaluations of the runs' rollout grid (EVAL_GRID where they record none) either
      side of the runs' median fitted reach (a line through the raw points, so an isotonic fit's steps do not
      steepen it; 0 when the median run never reaches: the curve does not rise to the target);
    - headroom: the median over runs of the isotonic fit's accuracy at the end minus the target, in points;
    - evaluations before the target: the median over runs of the evaluations before the fitted reach (a run that
      never reaches: all of them).

    Returns the three figures, whether each meets its criterion, and ``conditioned`` (all three)."""
    reaches, heads, before, points = [], [], [], []
    for r in refs:
        fit = isotonic([c["greedy_acc"] for c in r["curve"]])
        x = reach(r["curve"], target, fit=True)["cum_rollouts"]
        reaches.append(x if math.isfinite(x) else math.inf)
        heads.append(float(fit[-1] - target) * 100)
        before.append(int(sum(1 for c in r["curve"][1:] if not c["cum_rollouts"] >= x)))
        points += [(c["cum_rollouts"], c["greedy_acc"]) for c in r["curve"]]
    m = float(np.median(reaches)) if reaches else math.inf
    slope = 0.0
    if math.isfinite(m):
        grid = next((r["eval_every_rollouts"] for r in refs if r.get("eval_every_rollouts")), EVAL_GRID)
        near = np.asarray([p for p in points if abs(p[0] - m) <= CONDITIONING_WINDOW * grid], float)
        if len(near) >= 2 and np.ptp(near[:, 0]) > 0:
            slope = float(np.polyfit(near[:, 0], near[:, 1], 1)[0] * 1000 * 100)
    fig = {"slope_points_per_1k": slope, "headroom_points": median_or_none(heads),
           "evals_before_target": median_or_none(before)}
    meets = {"slope": slope >= CONDITIONING["min_slope_points_per_1k"],
             "headroom": fig["headroom_points"] is not None
             and fig["headroom_points"] >= CONDITIONING["min_headroom_points"],
             "evals": fig["evals_before_target"] is not None
             and fig["evals_before_target"] >= CONDITIONING["min_evals_before_target"]}
    return {"criteria": dict(CONDITIONING), "median_fit_reach": None if not math.isfinite(m) else m, **fig,
            "meets": meets, "conditioned": all(meets.values())}
