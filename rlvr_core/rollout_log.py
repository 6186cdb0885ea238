"""The per-step, per-prompt rollout log of a training run: ``rollouts.parquet`` in the run folder.

One row per (step, prompt) that received rollouts in that step, every round of the step summed:

- ``step``      the training step (1-based, as in metrics.jsonl)
- ``prompt_id`` the prompt's index in the training split
- ``rollouts``  rollouts generated for it in the step (committed, abandoned or skipped alike, so the
  column sums to the run's ``cum_rollouts``)
- ``passes``    rollouts whose reward is > 0 (binary verifiers: the passes)
- ``reward_sum`` the sum of their rewards (what the allocators count as passes)
- ``tokens``    generated tokens
- the row's feature columns, where the training rows have them (``FEATURE_COLUMNS``: arithmetic
  ``difficulty`` (digits) and ``op``; hub rows ``difficulty`` (MATH level), ``subject``, ``source``)

and what the allocator decided for it, so that the log is the run's decision log (``DECISION_COLUMNS``; a
training run fills them through ``decide``, docs/design.md §7.1):

- ``first_round``, ``last_round`` the step's allocation rounds (0-based) in which it first and last got rollouts;
  ``last_round`` is the round its fate was decided in, its prefix then being (``rollouts``, ``passes``)
- ``trained_rows`` its rows in the step's training batch that carry a signal: its group is mixed (0: not
  trained, or in the batch with a group of one reward, whose advantages are all 0); they sum to the step's
  ``trained_sequences`` (a step without a mixed group makes no update: ``update_skipped``)
- ``reused_rows`` of those, completions an allocator reused from an earlier step (AR3PO's buffer)
- ``status``    ``committed`` (in the training batch), ``dropped`` (its group was mixed but left out: a surplus)
  or ``abandoned`` (sampled, not mixed, left out)
- ``prior``     the allocator's mean pass rate for the prompt before the step's rollouts (the mean of its Beta
  prior or posterior, or its history's estimate: ``Allocator.step_beliefs``); NaN where it holds none (GRPO,
  DAPO, a prompt without history under knapsack-rl)
- ``p_eff``     the probability, at its decision, that its full group ends mixed (SARA and sara+dps); NaN elsewhere

A prompt drawn into a step but given no rollout has no row (every row holds at least one rollout, as the
advisor and the replay read them); the step's ``skipped_prompts`` in metrics.jsonl counts them. How many times a
prompt was trained before a step is the count of its earlier ``committed`` rows; a prompt trained on reused rows
alone (``reused_rows == trained_rows``) has a row only if it also got rollouts that step.

The simulated engine's ``replay`` scenario reads such a file (``rlvr_core.rollout.simulated``).

Consistency with checkpoints: the rows live in memory, a step's rows join the log once its metrics are
written (``end_step``), and the file is rewritten atomically and fsynced (file, then folder) before each
checkpoint and when the run stops, finished or not (``flush``). A run that resumes from the checkpoint of
step s keeps the file's rows of steps <= s and drops the later ones (they are generated again), so the file
never holds a step twice or misses one that metrics.jsonl holds once the run has finished.

A file that cannot be read on resume (truncated, damaged) does not stop the run: its rows cannot be
recovered (a parquet file cut short has lost its footer, which locates every column), so it is set aside as
``rollouts.parquet.damaged`` (``.damaged.1``, ... when taken), a RuntimeWarning says so, and the log goes on
from step s + 1. The steps whose rows were lost (1..s) are recorded in the file itself: ``read_log(path)``
returns them as ``.attrs["lost_steps"]`` (kept by every later flush), so no reader takes the gap for steps
without rollouts. A file that is missing at the resume (it is no DVC output: a worker's ``dvc pull`` does not
bring it) is the same loss: its steps are recorded as lost, with a RuntimeWarning. So is a readable file that
lacks steps the run's metrics.jsonl gives rollouts (an older copy of it): those steps join ``lost_steps``.
Where the caller passes ``logged`` (the steps that metrics.jsonl gives rollouts, as training does), only those
of 1..s count as lost; without it, all of 1..s. ``lost_steps`` is thus every step up to the checkpoint that had
rollouts and whose rows the file lacks.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr_core.safefs import set_aside, write_atomic
from rlvr_core.types import Rollouts, TrainBatch

FILENAME = "rollouts.parquet"
COLUMNS: tuple[str, ...] = ("step", "prompt_id", "rollouts", "passes", "reward_sum", "tokens")
DECISION_COLUMNS: tuple[str, ...] = ("first_round", "last_round", "trained_rows", "reused_rows", "status", "prior",
                                     "p_eff")
STATUSES: tuple[str, ...] = ("committed", "dropped", "abandoned")
FEATURE_COLUMNS: tuple[str, ...] = ("difficulty", "digits", "op", "level", "subject", "source")


def feature_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The feature columns every row has with a scalar (int or str) value, in FEATURE_COLUMNS order."""
    out: dict[str, list[Any]] = {}
    for name in FEATURE_COLUMNS:
        vals = [r.get(name) for r in rows] if rows else []
        if vals and all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in vals):
            out[name] = vals
    return out


class RolloutLog:
    """Collects a run's rollouts per (step, prompt) and keeps ``run_dir/rollouts.parquet`` in step with its
    checkpoints (module docstring).

    Args:
        path: the parquet file
        rows: the training rows (their feature columns are copied into the log)
        upto: the step the run starts after (0: a fresh run, the file is removed; s: a resumed run, the
            file's rows of steps > s are dropped; an unreadable or missing file: its steps are lost, module
            docstring)
        logged: the steps <= ``upto`` that had rollouts (metrics.jsonl's ``rollouts`` > 0), when known: the
            steps an unreadable or missing file lost, and those of them a readable file holds no row of
    ``lost``: the steps whose rows were lost with a damaged, missing or older file (this resume's or an earlier
    one's).
    """

    def __init__(self, path: str | os.PathLike, rows: Sequence[Mapping[str, Any]], upto: int = 0,
                 logged: Sequence[int] | None = None) -> None:
        self.path = Path(path)
        self.features = feature_columns(rows)
        self._frames: list[Any] = []
        # (step, prompt) -> [rollouts, passes, reward_sum, tokens], of finished steps and of the running one
        self._done: dict[tuple[int, int], np.ndarray] = {}
        self._running: dict[tuple[int, int], np.ndarray] = {}
        self.lost: list[int] = []
        if upto > 0 and self.path.exists():
            self._resume(upto, logged)
        elif upto > 0:
            self.lost = _had_rollouts(upto, logged)
            if self.lost:
                warnings.warn(f"rollout log {self.path}: missing at the resume from step {upto} (it is no DVC "
                              f"output: `dvc pull` does not bring it); the log goes on from step {upto + 1}: "
                              f"{self._lost_text(self.lost)}", RuntimeWarning, stacklevel=2)
        else:
            self.path.unlink(missing_ok=True)

    def _lost_text(self, steps: Sequence[int]) -> str:
        if not steps:
            return "no step up to it had rollouts, so no row is lost"
        return (f"the rows of {_steps_text(steps)} are lost (their totals are in metrics.jsonl and the checkpoint), "
                f"which {self.path.name} records as lost_steps")

    def _resume(self, upto: int, logged: Sequence[int] | None) -> None:
        """Keep the file's rows of steps <= ``upto``; an unreadable file is set aside and its steps marked lost,
        and so are the ``logged`` steps it holds no row of."""
        try:
            old = read_log(self.path)
        except ValueError as e:
            aside = set_aside(self.path)
            self.lost = _had_rollouts(upto, logged)
            warnings.warn(f"{e}; it is set aside as {aside} and the log goes on from step {upto + 1}: "
                          f"{self._lost_text(self.lost)}", RuntimeWarning, stacklevel=3)
            return
        earlier = old.attrs.get("lost_steps", [])
        earlier = {int(s) for s in earlier if isinstance(s, int) and 0 < s <= upto} if isinstance(earlier, list) \
            else set()
        kept = old[old["step"] <= upto]
        gone = sorted({int(s) for s in logged or () if 0 < s <= upto} - set(kept["step"].tolist()) - earlier)
        if gone:
            warnings.warn(f"rollout log {self.path}: holds no row of {_steps_text(gone)}, which metrics.jsonl gives "
                          f"rollouts (an older copy of the file?); {self._lost_text(gone)}", RuntimeWarning,
                          stacklevel=3)
        self.lost = sorted(earlier | set(gone))
        self._frames.append(kept)

    def _row(self, step: int, prompt: int, round_index: int) -> np.ndarray:
        """The running sums of (``step``, ``prompt``): rollouts, passes, reward_sum, tokens, first_round,
        last_round, trained_rows, reused_rows, status (an index into STATUSES; -1: no decision recorded), prior,
        p_eff (NaN: none)."""
        key = (int(step), int(prompt))
        if key not in self._running:
            self._running[key] = np.array([0, 0, 0, 0, round_index, round_index, 0, 0, -1, np.nan, np.nan],
                                          np.float64)
        return self._running[key]

    def add(self, step: int, rollouts: Rollouts, round_index: int = 0) -> None:
        """Count one scored round (the step's ``round_index``-th) of ``step`` (kept aside until ``end_step(step)``)."""
        if not len(rollouts):
            return
        pid, inv = np.unique(rollouts.prompt_id, return_inverse=True)
        sums = np.zeros((len(pid), 4))
        np.add.at(sums, inv, np.column_stack([np.ones(len(rollouts)), rollouts.reward > 0, rollouts.reward,
                                              rollouts.tokens]))
        for q, s in zip(pid.tolist(), sums):
            row = self._row(step, q, round_index)
            row[:4] += s
            row[5] = round_index

    def decide(self, step: int, batch: TrainBatch, beliefs: Mapping[int, tuple[float, float]] | None = None) -> None:
        """Record the allocator's decisions of ``step`` from its training batch: each sampled prompt's trained
        and reused rows and its status, and from ``beliefs`` (``Allocator.step_beliefs``: prompt -> (prior,
        p_eff)) what the allocator believed of it (module docstring)."""
        ro = batch.rollouts
        if len(ro):
            reused = np.asarray([isinstance(p, Mapping) and bool(p.get("reused")) for p in ro.payload], bool) \
                if ro.payload is not None else np.zeros(len(ro), bool)
            signal = batch.effective[batch.group_id]  # rows of a mixed group: a zero-variance group teaches nothing
            for q in np.unique(ro.prompt_id).tolist():
                row = self._running.get((int(step), int(q)))
                if row is not None:  # trained on reused rows alone: no rollout this step, no row
                    mine = ro.prompt_id == q
                    row[6], row[7], row[8] = (mine & signal).sum(), (mine & signal & reused).sum(), 0
        for (st, q), row in self._running.items():
            if st == step and row[8] < 0:
                row[8] = STATUSES.index("dropped" if 0 < row[1] < row[0] else "abandoned")
            if st == step and beliefs and q in beliefs:
                row[9], row[10] = beliefs[q]

    def end_step(self, step: int) -> None:
        """``step`` finished (its metrics are written): its rows join the log; rows of an unfinished step,
        left by a step that raised, are dropped."""
        self._done.update({k: v for k, v in self._running.items() if k[0] == step})
        self._running = {}

    def frame(self) -> Any:
        """Every row of the finished steps as a DataFrame, ordered by step and prompt (``.attrs["lost_steps"]``:
        the steps a damaged file lost, when any)."""
        df = self._rows()
        df.attrs = {"lost_steps": list(self.lost)} if self.lost else {}
        return df

    def _rows(self) -> Any:
        """The rows of ``frame``: the kept rows of the file and the finished steps' since."""
        import pandas as pd

        new = None
        if self._done:
            keys = sorted(self._done)
            vals = np.vstack([self._done[k] for k in keys])
            ids = np.asarray([k[1] for k in keys], np.int64)
            new = pd.DataFrame({"step": np.asarray([k[0] for k in keys], np.int64), "prompt_id": ids,
                                "rollouts": vals[:, 0].astype(np.int64), "passes": vals[:, 1].astype(np.int64),
                                "reward_sum": vals[:, 2], "tokens": vals[:, 3].astype(np.int64)})
            if (vals[:, 8] >= 0).any():  # a run that decides (training): the decision columns
                for j, name in enumerate(DECISION_COLUMNS[:4], start=4):
                    new[name] = vals[:, j].astype(np.int64)
                new["status"] = [STATUSES[int(c)] if c >= 0 else None for c in vals[:, 8]]
                new["prior"], new["p_eff"] = vals[:, 9], vals[:, 10]
            for name, col in self.features.items():
                new[name] = [col[i] for i in ids.tolist()]
        parts = [f for f in self._frames if len(f)] + ([new] if new is not None else [])
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype="int64" if c != "reward_sum" else "float64") for c in COLUMNS})
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)
        return df.sort_values(["step", "prompt_id"], kind="stable").reset_index(drop=True)

    def flush(self) -> None:
        """Rewrite the file atomically and durably (fsynced) with the rows of the finished steps (none and no
        file: nothing written)."""
        df = self.frame()
        if not len(df) and not self.path.exists() and not self.lost:
            return
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        write_atomic(self.path, buf.getvalue(), fsync=True)  # never through a planted link (rlvr_core.safefs)


def _had_rollouts(upto: int, logged: Sequence[int] | None) -> list[int]:
    """The steps 1..``upto`` that had rollouts: the ``logged`` ones among them, all of them when not known."""
    return list(range(1, upto + 1)) if logged is None else sorted({int(s) for s in logged if 0 < s <= upto})


def _steps_text(steps: Sequence[int]) -> str:
    """``steps 1-4`` for a run of steps, ``steps 2, 5, 9`` else (the first 8 and a count past them)."""
    steps = sorted(steps)
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps[-1] - steps[0] == len(steps) - 1:
        return f"steps {steps[0]}-{steps[-1]}"
    more = f" ... ({len(steps)} steps)" if len(steps) > 8 else ""
    return "steps " + ", ".join(map(str, steps[:8])) + more


def read_log(path: str | os.PathLike) -> Any:
    """A rollout log as a DataFrame; ValueError naming the file when it cannot be read or lacks a column."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"rollout log {path}: no such file")
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - any reader failure means the file is not a usable log
        raise ValueError(f"rollout log {path}: not a readable parquet file ({e.__class__.__name__}: {e})") from e
    missing = [c for c in ("step", "prompt_id", "rollouts", "passes") if c not in df.columns]
    if missing:
        raise ValueError(f"rollout log {path}: missing column(s) {missing}; has {list(df.columns)}")
    return df
