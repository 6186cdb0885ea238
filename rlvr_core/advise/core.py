"""``advise``: from a run's log to a table of predicted savings and a recommendation (docs/advisor.md)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_core.advise.calibration import Calibration, predicted
from rlvr_core.advise.logs import Limits, load_log
from rlvr_core.advise.model import (
    FLOOR_CLASS,
    PhaseStats,
    SimRun,
    phase_stats,
    registered_allocators,
    simulate,
    token_model,
    whole_run_floor,
)
from rlvr_core.advise.recurrence import Recurrence, measure
from rlvr_core.advise.support import Support, check_support
from rlvr_core.rollout.simulated import ReplayLog

# written by `python -m benchmarks.advisor_validation`: how far the advisor's predictions were from measured runs
VALIDATION_FILE = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "advisor_validation"
                   / "advisor_validation.json")


def interval(x: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided 95% t-interval of the mean over replay seeds."""
    x = np.asarray(x, np.float64)
    m = float(x.mean())
    if len(x) < 2 or not np.all(np.isfinite(x)):
        return m, m, m
    from scipy import stats as sps

    half = float(sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


@dataclass
class AllocatorAdvice:
    """One allocator's predicted cost on the log; each figure is (mean, low, high) over replay seeds."""

    name: str
    rollouts_per_effective_group: tuple[float, float, float]
    tokens_per_effective_group: tuple[float, float, float] | None
    saving_vs_grpo: tuple[float, float, float] | None  # the proxy: 1 - rollouts per trained row / grpo's, by seed
    saving_vs_dapo: tuple[float, float, float] | None  # the same against dapo
    validated_error: float | None = None  # mean |predicted - measured| / measured on the training study, if known
    replayed_prompts: float = 0.0  # mean over seeds: prompts the replay drew from its prompt stream
    replayed_recurring_prompts: float = 0.0  # mean over seeds: of those, prompts drawn in 2+ steps
    rollouts_per_trained_row: tuple[float, float, float] | None = None  # the comparable unit (SimRun's)
    # the saving in rollouts to target against uniform GRPO, calibrated from saving_vs_grpo on the training study
    # (rlvr_core.advise.calibration), with its 95% prediction interval; None without a calibration
    predicted_saving_to_target: tuple[float, float, float] | None = None
    calibration_note: str = ""  # where the calibration says the proxy does not carry over, or is thin


@dataclass
class Advice:
    """Everything the advisor reports (``to_json`` is what advice.json holds)."""

    log: str
    rows: int
    steps: int
    k: int
    batch: int
    seeds: int
    sim_steps: int
    pool: int | None  # the recurring pool's size; None for a stream of fresh prompts (replay == "fresh")
    token_model: tuple[float, float] | None
    phases: list[PhaseStats]
    floor_ratio_to_k: float | None  # None where the log cannot support it (warnings)
    floor_class: str
    allocators: list[AllocatorAdvice]
    skipped: dict[str, str] = field(default_factory=dict)
    recommendation: str = ""
    validation: str = ""
    warnings: list[str] = field(default_factory=list)  # what the log cannot support (rlvr_core.advise.support)
    recurrence: Recurrence | None = None  # the log's prompts across its steps (rlvr_core.advise.recurrence)
    replay: str = "pool"  # "fresh": no replayed prompt recurs (a log whose prompts never recur); "pool": recurring
    replay_note: str = ""  # how the replay treats recurrence, in a sentence (the report prints it)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _paired_saving(runs: dict[str, list[SimRun]], name: str, ref: str) -> tuple[float, float, float] | None:
    """1 - rptr(name) / rptr(ref) in rollouts per trained row (the comparable unit, SimRun), paired by seed (the
    same replay draws), with its interval; None (n/a) where a seed of either trained no row (infinite cost)."""
    if ref not in runs:
        return None
    mine = {r.seed: r.rollouts_per_trained_row for r in runs[name]}
    theirs = {r.seed: r.rollouts_per_trained_row for r in runs[ref]}
    pairs = [(mine[s], theirs[s]) for s in mine if s in theirs]
    if not pairs or not all(math.isfinite(a) and math.isfinite(b) for a, b in pairs):
        return None
    return interval(np.asarray([1.0 - a / b for a, b in pairs]))


def summarise(runs: dict[str, list[SimRun]], with_tokens: bool, errors: dict[str, float]) -> list[AllocatorAdvice]:
    """The per-allocator table, in registry order."""
    out = []
    for name, rs in runs.items():
        rpeg = interval(np.asarray([r.rollouts_per_effective_group for r in rs]))
        tpeg = interval(np.asarray([r.tokens_per_effective_group for r in rs])) if with_tokens else None
        out.append(AllocatorAdvice(name, rpeg, tpeg, _paired_saving(runs, name, "grpo"),
                                   _paired_saving(runs, name, "dapo"), errors.get(name),
                                   float(np.mean([r.extra.get("prompts", 0.0) for r in rs])),
                                   float(np.mean([r.extra.get("recurring_prompts", 0.0) for r in rs])),
                                   interval(np.asarray([r.rollouts_per_trained_row for r in rs]))))
    return out


def load_validation(path: Path = VALIDATION_FILE) -> dict[str, Any] | None:
    """The committed validation of the advisor against the training study, or None where it was never run."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def validation_sentence(val: dict[str, Any] | None) -> str:
    """What the committed validation says about the advisor's error (cells using a contextual prior apart: the
    simulated pool has no prompt features, so the replay cannot see what they use)."""
    if not val or not val.get("rows"):
        return ("not validated against measured runs here (python -m benchmarks.advisor_validation writes "
                "benchmarks/results/advisor_validation/advisor_validation.json)")
    ctx = [r for r in val["rows"] if "context" in str(r["params"].get("prior", ""))]
    rest = [abs(r["error"]) for r in val["rows"] if r not in ctx]
    txt = (f"predictions were within {val['median_abs_error']:.0%} (median) of measured runs on {val['cells']} "
           f"cells of the training study (regimes {', '.join(val['regimes'])}, k = 8, the tiny policy)")
    if rest:
        txt += f", at most {max(rest):.0%} off for allocators without a contextual prior"
    if ctx:
        txt += (f"; for contextual priors the replay over-predicts by {np.mean([r['error'] for r in ctx]):.0%} on "
                "average (it sees no prompt features)")
    if val.get("target_median_abs_error") is not None:
        txt += (f"; predicted savings in rollouts to target were {val['target_median_abs_error']:.0%} off the "
                f"measured ones (median, each cell predicted by a calibration fitted to the others) on "
                f"{val['target_cells']} cells, their 95% intervals holding "
                f"{val['target_interval_coverage']:.0%} of them")
    return txt + "; see benchmarks/results/advisor_validation/advisor_validation.md"


def pct(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.0%} [{t[1]:.0%}, {t[2]:.0%}]"


def _floor_text(grpo: AllocatorAdvice, floor_ratio_to_k: float) -> str:
    rptr = grpo.rollouts_per_trained_row or grpo.rollouts_per_effective_group
    if not math.isfinite(floor_ratio_to_k) or not math.isfinite(rptr[0]):
        return "the floor is n/a"
    return f"the floor leaves at most {max(0.0, 1.0 - floor_ratio_to_k / rptr[0]):.0%} without prompt history"


def recommend(table: list[AllocatorAdvice], floor_ratio_to_k: float, seeds: int) -> str:
    """One line: the allocator with the largest predicted saving in rollouts to target, if the lower end of its
    interval is above zero, else uniform GRPO; with the floor's bound on what screening alone saves per trained
    row. Without a calibration, the largest proxy saving (rollouts per trained row), said to be uncalibrated."""
    by_name = {a.name: a for a in table}
    grpo = by_name.get("grpo")
    others = [a for a in table if a.name != "grpo" and a.saving_vs_grpo is not None]
    if grpo is None or len(table) < 2:
        return "no recommendation: uniform GRPO and at least one other allocator are needed for a comparison"
    if not math.isfinite((grpo.rollouts_per_trained_row or grpo.rollouts_per_effective_group)[0]):
        return ("no recommendation: uniform GRPO met no effective group in some replay seed, so there is no "
                "saving to measure against it")
    if not others:
        return "no recommendation: no other allocator trained a row in every replay seed"
    floor_txt = _floor_text(grpo, floor_ratio_to_k)
    calibrated = [a for a in others if a.predicted_saving_to_target is not None]
    if not calibrated:
        best = max(others, key=lambda a: a.saving_vs_grpo[0])
        return (f"stay with uniform GRPO: no calibration of the proxy to rollouts to target (largest proxy saving, "
                f"{best.name}: {pct(best.saving_vs_grpo)} in rollouts per trained row over {seeds} replay seeds, "
                f"which need not carry over); {floor_txt}")
    best = max(calibrated, key=lambda a: a.predicted_saving_to_target[0])
    p = best.predicted_saving_to_target
    proxy = f"proxy: saving {pct(best.saving_vs_grpo)} in rollouts per trained row over {seeds} replay seeds"
    if p[1] > 0:
        return (f"{best.name}: predicted {pct(p)} fewer rollouts to the target accuracy than uniform GRPO "
                f"(calibrated on the training study; {proxy}); {floor_txt}")
    return (f"stay with uniform GRPO: no allocator's predicted saving in rollouts to target has an interval above "
            f"zero (best, {best.name}: {pct(p)}; {proxy}); {floor_txt}")


MAX_INDEX_POOL = 10_000_000  # prompt ids above this are keys (hashes), not row indices


def default_pool(df: Any) -> int:
    """Prompts in the simulated pool: the log's largest prompt id + 1 where ids are row indices of a training
    split (as in rollouts.parquet), so that prompts recur about as often as they could in the logged run; the
    number of distinct prompts where ids are keys (hashed ids of RolloutLogCallback, ids of a CSV)."""
    ids = df["prompt_id"].to_numpy()
    distinct = len(np.unique(ids))
    top = int(ids.max()) + 1
    return int(max(top if top <= MAX_INDEX_POOL else distinct, distinct, 2))


def advise(path: str | os.PathLike, *, k: int = 8, batch: int = 32, seeds: int = 5, steps: int = 60,
           pool: int | None = None, allocators: list[str] | None = None, limits: Limits | None = None,
           reward_columns: list[str] | None = None) -> Advice:
    """Advise on the log at ``path``: phases, every registered allocator replayed with ``seeds`` seeds for
    ``steps`` steps at group size ``k`` and ``batch`` prompts, and a recommendation (module docstring). The log
    is read within ``limits`` (default ``Limits()``; a log past them is refused, ``load_log``; ``reward_columns``:
    a TRL completion log's reward columns). A log that cannot
    support the estimates (``rlvr_core.advise.support``) is not replayed: its advice holds the warnings, the
    phases with their population figures None, no allocator and no recommendation."""
    if k < 2 or batch < 1 or seeds < 1 or steps < 1 or (pool is not None and pool < 1):
        raise ValueError(f"need k >= 2, batch >= 1, seeds >= 1, steps >= 1, pool >= 1 (or None); got {k}, {batch}, "
                         f"{seeds}, {steps}, {pool}")
    df = load_log(path, limits, reward_columns)
    support = check_support(df)
    names, skipped = registered_allocators(k, batch)
    names = [n for n in names if allocators is None or n in allocators]
    rec = measure(df)
    mode, pool, note = replay_mode(rec, pool, df, steps, batch)
    tokens = token_model(df)
    val = load_validation()
    adv = Advice(str(path), len(df), len(np.unique(df["step"].to_numpy())), k, batch, seeds, steps, pool, tokens,
                 [], None, FLOOR_CLASS, [], skipped, validation=validation_sentence(val), warnings=support.warnings,
                 recurrence=rec, replay=mode, replay_note=note)
    if not support.supported:
        adv.phases = phase_stats(None, df, k)
        adv.recommendation = unsupported_recommendation(support)
        return adv
    with tempfile.TemporaryDirectory(prefix="rlvr-advise-") as tmp:
        norm = Path(tmp) / "log.parquet"
        df.to_parquet(norm, index=False)
        log = ReplayLog(norm)
        adv.phases = phase_stats(log, df, k)
        floor = whole_run_floor(log, k)
        runs = {n: [simulate(norm, n, k=k, batch=batch, seed=s, steps=steps, pool=pool, tokens=tokens)
                    for s in range(seeds)] for n in names}
    adv.floor_ratio_to_k = floor.ratio_to_k
    adv.allocators = summarise(runs, tokens is not None, (val or {}).get("per_allocator_error", {}))
    cal = Calibration.from_json((val or {}).get("calibration"))
    for a in adv.allocators:
        a.predicted_saving_to_target, a.calibration_note = predicted(cal, a.name, mode, a.saving_vs_grpo)
    adv.recommendation = recommend(adv.allocators, floor.ratio_to_k, seeds)
    return adv


def replay_mode(rec: Recurrence, pool: int | None, df: Any, steps: int, batch: int) -> tuple[str, int | None, str]:
    """(mode, pool, note): a forced ``pool`` (``--pool N``) and a log whose prompts recur replay a recurring pool
    (forced, else ``default_pool``); a log whose prompts never recur replays a stream of fresh prompts."""
    if pool is not None:
        return "pool", int(pool), (f"recurring pool of {int(pool)} prompts, forced by --pool (the log's prompts "
                                   f"{'recur' if rec.recurring else 'never recur'}): prompts recur in the replay as "
                                   "often as that pool makes them, and history-based allocators are credited for it")
    if rec.recurring:
        n = default_pool(df)
        return "pool", n, (f"recurring pool of {n} prompts, as the log's prompts recur ({rec.recurring} of "
                           f"{rec.prompts} logged at 2+ steps)")
    return "fresh", None, (f"a stream of fresh prompts, as no prompt of the log recurs: every replayed prompt is new "
                           f"and drawn in one step only, so no allocator is credited for prompt history; the replay "
                           f"draws {steps} x {batch} prompts or more (screening allocators draw more) where the log "
                           f"has {rec.prompts} distinct prompts: a replayed prompt's pass rate is a draw of its "
                           "logged step's population, so the log's prompts supply pass rates, never a second "
                           "appearance")


def unsupported_recommendation(support: Support) -> str:
    """The recommendation line of a log the advisor cannot advise on: none, and why."""
    return f"no recommendation: {'; '.join(support.short)}, so no allocator was replayed and no saving is given"
