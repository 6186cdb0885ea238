"""Can a log support the advisor's estimates? (docs/advisor.md, "Logs it cannot advise on")

The advisor estimates how pass rates spread over prompts from the spread of rewards *within* a logged group (the
binomial noise removed, ``fit_beta_moments``), and it counts savings in effective groups (groups with mixed
rewards). Two kinds of log cannot carry that:

- **one rollout per (step, prompt)** everywhere: a single reward shows the pass share but not the spread (a
  prompt that passes half the time and a mix of prompts that always or never pass look alike); the fit would fall
  back to a flat Beta(1, 1) and every figure derived from it would be that prior's, not the log's;
- **no pass or no fail at all**: no logged group had mixed rewards, so there is no effective group to save on;
  the fitted population would be the fit's clipping bound, not the log's.

For such a log the advisor reports what the log does show (rows, steps, pass share, logged group size), marks the
population figures n/a, replays no allocator and makes no recommendation, and says why (``Support.blocking``).
A log where only some steps hold one rollout per row is advised on, with a warning naming those steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

FIX_ONE_ROLLOUT = ("log every rollout of a group (at least 2 per prompt per step, as GRPO draws them), one row per "
                   "completion in a .csv/.jsonl or one row per (step, prompt) with its counts in a .parquet")


@dataclass
class Support:
    """What a log lets the advisor estimate: ``blocking`` reasons stop the replay (``short``: each in a few words,
    for the recommendation line); ``notes`` are warnings only."""

    blocking: list[str] = field(default_factory=list)
    short: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return not self.blocking

    @property
    def warnings(self) -> list[str]:
        return self.blocking + self.notes


def _one_rollout(df: Any) -> tuple[str, str] | None:
    n = df["rollouts"].to_numpy()
    if np.any(n >= 2):
        return None
    share = float(df["passes"].sum() / n.sum())
    short = "a log with one rollout per (step, prompt) cannot support the pass-rate estimate"
    long = (f"every one of the log's {len(df):,} (step, prompt) rows holds a single rollout: one reward per prompt "
            f"and step shows the pass share ({share:.3f}) but not how pass rates spread over prompts, so this log "
            "cannot support the pass-rate estimate (population, zero-variance share at k, screening floor) nor any "
            f"allocator's saving; {FIX_ONE_ROLLOUT}")
    return short, long


def _no_mixed(df: Any) -> tuple[str, str] | None:
    n, s = int(df["rollouts"].sum()), int(df["passes"].sum())
    if 0 < s < n:
        return None
    what = "failed" if s == 0 else "passed"
    short = f"there is no effective group to save on (every rollout {what})"
    long = (f"all {n:,} rollouts of the log {what}: no logged group had mixed rewards, so there is no effective "
            "group to save on and no pass-rate spread to estimate; advise on a run whose prompts the policy solves "
            "some of the time")
    return short, long


def _single_rollout_steps(df: Any) -> str | None:
    multi = df.groupby("step")["rollouts"].max()
    single = multi.index[multi.to_numpy() < 2].to_numpy()
    if not len(single) or len(single) == len(multi):
        return None
    shown = ", ".join(str(int(t)) for t in single[:5]) + (", ..." if len(single) > 5 else "")
    return (f"{len(single)} of {len(multi)} logged steps ({shown}) hold one rollout per (step, prompt) row: their "
            "pass-rate spread cannot be estimated, and the replay takes a flat Beta(1, 1) population for them")


def check_support(df: Any) -> Support:
    """What the per-(step, prompt) log ``df`` (``load_log``) lets the advisor estimate (module docstring)."""
    found = [r for r in (_one_rollout(df), _no_mixed(df)) if r]
    notes = [] if found else [r for r in (_single_rollout_steps(df),) if r]
    dropped = int(df.attrs.get("unscorable", 0))
    if dropped:
        notes.append(f"{dropped:,} completion(s) of the TRL log had every reward NaN (unscorable: TRL leaves them out "
                     "of their group's baseline) and were left out")
    return Support([long for _, long in found], [short for short, _ in found], notes)
