"""Decision logs for the runs made before every run kept one (docs/design.md §7.1), by reproducing them.

    python -m benchmarks.study --backfill-logs --regime pool --warm-start 3 [--cells P/V ...] [--limit N]

A run whose file has no ``decision_log`` is trained again from its recorded settings in a scratch store, under
this checkout's code, and its log is kept only if the rerun is the recorded run: every evaluation equal to the
recorded one at every field the recorded run holds (wall-clock seconds aside, ``execute.TIMED``). Then the log goes
beside the run file (``s<seed>.rollouts.parquet``) and the run file gains ``decision_log`` (file, sha256, and
``backfilled``: the commit and time of the rerun); nothing else in it changes. A rerun that differs, or a run
whose settings this checkout would not reproduce (allocator parameters, batch, lr, k, grid or policy), keeps no
log and is recorded with the reason in ``study/<regime>/backfill.json``, which also counts the runs reproduced, so
no run is tried twice. Runs are claimed as the study claims them, so several processes can share a regime, and
``--limit`` bounds one command's work: each command is resumable, and the next one goes on where it stopped.

    python -m benchmarks.study --backfill-beliefs --regime pool --warm-start 3 [--cells P/V ...] [--limit N]

A log written before the allocator's beliefs were recorded has no ``prior`` and ``p_eff`` columns. Where the run's
allocator holds them (it overrides ``Allocator._beliefs``), the run is reproduced the same way, and the new log
replaces the old one only if the rerun is the recorded run and the new log equals the old one at every row and column
the old one has. The run file's ``decision_log`` then records the replaced log's digest (``replaced``) and the rerun
(``backfilled``); outcomes go to ``study/<regime>/backfill_beliefs.json``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from benchmarks.study import data as D
from benchmarks.study.execute import _commit, _now, curve_difference, run_one, run_params
from benchmarks.study.plan import PARAMS_FILE, VARIANTS, matched_entry, split_rows
from benchmarks.study.store import BACKFILL_RECORD, BELIEFS_RECORD, RunStore, has_beliefs, holds_beliefs, log_of
from rlvr_core.safefs import folder_fd, open_in, write_atomic, write_text_atomic

Log = Callable[[str], Any]
RECORD = BACKFILL_RECORD
RULE = ("a run without a decision log is trained again from its recorded settings; its log is kept only if every "
        "evaluation and every ledger field it recorded equal the recorded run's, wall-clock aside")
BELIEFS_RULE = ("a run whose decision log lacks the prior and p_eff columns its allocator holds is trained again from "
                "its recorded settings; the new log replaces the old only if the rerun is the recorded run (as for a "
                "backfilled log) and the new log equals the old at every row and column the old has")
# the recorded settings a rerun must share before it trains (a run file field -> the rerun's TrainConfig field)
SETTINGS = ("batch_size", "lr", "k", "eval_size", "eval_every", "eval_every_rollouts")


def run_files(store: RunStore, regime: str, cells: Sequence[str] | None = None) -> list[Path]:
    """The run files of ``regime`` in path order; ``cells``: only the runs of these cells (run folders
    ``protocol/variant``), in their order."""
    if cells is None:
        return sorted((store.root / regime).glob("*/*/s*.json"))
    return [p for c in cells for p in sorted((store.root / regime / c).glob("s*.json"))]


def untried(store: RunStore, regime: str, cells: Sequence[str] | None, name: str,
            wanted: Callable[[Path, Mapping[str, Any]], bool]) -> list[Path]:
    """The run files of ``regime`` (``cells``: as ``run_files``) not yet tried in the record ``name`` whose run
    ``wanted(path, run)``, in path order."""
    tried = set(record(store, regime, name).get("runs", {}))
    return [p for p in run_files(store, regime, cells)
            if p.relative_to(store.root).as_posix() not in tried and wanted(p, json.loads(p.read_text()))]


def missing(store: RunStore, regime: str, cells: Sequence[str] | None = None) -> list[Path]:
    """The run files of ``regime`` (``cells``: as ``run_files``) without a decision log and not yet tried."""
    return untried(store, regime, cells, RECORD, lambda _p, r: "curve" in r and "decision_log" not in r)


def lacks_beliefs(store: RunStore, regime: str, cells: Sequence[str] | None = None) -> list[Path]:
    """The run files of ``regime`` (``cells``: as ``run_files``) whose decision log has no ``prior`` column though
    their allocator holds one, not yet tried, in path order."""
    return untried(store, regime, cells, BELIEFS_RECORD, lambda p, r: holds_beliefs(r.get("allocator", "")) and
                   (log := log_of(p, r)) is not None and not has_beliefs(log))


def record(store: RunStore, regime: str, name: str = RECORD) -> dict[str, Any]:
    return store.rerun_record(regime, name)


def note(store: RunStore, regime: str, rel: str, entry: Mapping[str, Any], name: str = RECORD,
         rule: str = RULE) -> None:
    """Add one run's outcome to ``study/<regime>/<name>`` under a file lock (processes share it). The lock is
    opened without following a link and never truncated, the record rewritten through a fresh temporary name
    (rlvr_core.safefs): a link planted as ``backfill.lock`` is refused (UnsafeRunFolder), one planted as the
    record is replaced."""
    p = store.root / regime / name
    with folder_fd(p.parent) as dfd:
        lock = open_in(dfd, p.with_suffix(".lock").name, os.O_RDWR | os.O_CREAT, p.parent)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rec = json.loads(p.read_text()) if p.exists() else {"runs": {}}
            rec["rule"] = rule
            rec["runs"][rel] = dict(entry)
            write_text_atomic(p, json.dumps(rec, indent=1, sort_keys=True) + "\n")
        finally:
            os.close(lock)


def same_run(rerun: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    """Where a rerun first differs from the recorded run: its curve, then its ledger, on the fields the recorded
    run holds (a field a later version added is not a difference; wall-clock fields, ``*_s`` and ``seconds``, are
    not compared); None: the same run."""
    if diff := curve_difference(rerun["curve"], recorded["curve"], recorded_only=True):
        return diff
    led, was = rerun.get("ledger", {}), recorded.get("ledger", {})
    if diff := sorted(k for k in was if not k.endswith("_s") and led.get(k) != was[k]):
        return "ledger: " + ", ".join(f"{k} {led.get(k)} != {was[k]}" for k in diff)
    return None


def settings_differ(store: RunStore, run: Mapping[str, Any], regime: str,
                    params_file: Path = PARAMS_FILE) -> str | None:
    """Why this checkout would not train ``run`` as recorded (None: it would), read before any training."""
    label, protocol = run["variant"], run["protocol"]
    if label not in VARIANTS:
        return f"variant {label!r} is no longer in the plan"
    batch = None
    if entry := matched_entry(protocol, label):
        if (m := store.matched(regime)) is None:
            return "no matched.json to size its batch"
        batch = int(m[entry])
    cfg = run_params(regime, label, run["seed"], quick=bool(run.get("quick")),
                     grid=tuple(run["grid"]) if run.get("grid") else None, protocol=protocol, params_file=params_file,
                     batch=batch).train
    for f in SETTINGS:  # an evaluation covers at most its split's rows (execute.train_run records that many)
        want = min(cfg.eval_size, split_rows(run.get("split", "test"))) if f == "eval_size" else getattr(cfg, f)
        if f in run and want != run[f]:
            return f"{f}: this checkout trains {want!r}, the run recorded {run[f]!r}"
    if (now := cfg.allocator_params.get(cfg.allocator, {})) != run.get("allocator_params", {}):
        return f"allocator_params: this checkout trains {now!r}, the run recorded {run.get('allocator_params')!r}"
    return None


def _scratch(store: RunStore, path: Path, work: Path) -> RunStore:
    return RunStore(work / "backfill" / path.relative_to(store.root).as_posix().replace("/", "_"))


def clear(path: Path, store: RunStore, work: Path) -> None:
    """Remove the scratch store of ``path``'s rerun."""
    shutil.rmtree(_scratch(store, path, work).out, ignore_errors=True)


def reproduce(store: RunStore, path: Path, data: Mapping[str, Any], *, work: Path,
              params_file: Path = PARAMS_FILE) -> tuple[dict[str, Any], Path | None]:
    """Train the run at ``path`` again in a scratch store: (outcome, the rerun's decision log). The
    outcome's ``result`` is "reproduced" (the scratch store is kept for the caller, who ``clear``s it), "differs"
    or "not rerun" (the scratch store is gone), with ``why``."""
    run = json.loads(path.read_text())
    regime = path.parts[-4]
    grid = tuple(run["grid"]) if run.get("grid") else None
    if why := settings_differ(store, run, regime, params_file):
        return {"result": "not rerun", "why": why}, None
    if run.get("policy_sha256") not in ({data["policy_sha256"]} | store.accepted_policies(regime)):
        return {"result": "not rerun", "why": f"policy {data['policy_sha256'][:12]} is not the run's "
                f"{str(run.get('policy_sha256'))[:12]}"}, None
    scratch = _scratch(store, path, work)
    clear(path, store, work)
    for frozen in (store.target_path(regime), store.matched_path(regime)):
        if frozen.exists():
            write_atomic(scratch.root / regime / frozen.name, frozen.read_bytes())
    t0 = time.perf_counter()
    rerun, _ = run_one(scratch, regime, run["protocol"], run["variant"], run["seed"], work=scratch.out / "work",
                       quick=bool(run.get("quick")), grid=grid,
                       split=run.get("split", "test"), data=dict(data), params_file=params_file)
    entry: dict[str, Any] = {"commit": _commit(), "at": _now(), "rerun_s": round(time.perf_counter() - t0, 1)}
    if diff := same_run(rerun, run):
        clear(path, store, work)
        return {**entry, "result": "differs", "why": diff}, None
    log = scratch.run_file(regime, run["protocol"], run["variant"], run["seed"], grid,
                           run.get("split", "test")).with_suffix(".rollouts.parquet")
    return {**entry, "result": "reproduced"}, log if log.exists() else None


def attach_log(path: Path, log: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Copy a rerun's decision log beside the run file (atomically, replacing a link planted there, never
    writing through it: rlvr_core.safefs); the run file's ``decision_log`` field for it."""
    dest = path.with_suffix(".rollouts.parquet")
    data = log.read_bytes()
    write_atomic(dest, data)
    return {"file": dest.name, "sha256": hashlib.sha256(data).hexdigest(),
            "backfilled": {"commit": entry["commit"], "at": entry["at"]}}


def write_run(path: Path, run: Mapping[str, Any]) -> None:
    """Rewrite a run file atomically (a killed process leaves the old file or the new one), through a fresh
    temporary name (rlvr_core.safefs: a link planted at ``path`` is replaced, never written through)."""
    write_text_atomic(path, json.dumps(run) + "\n")


def backfill_one(store: RunStore, path: Path, data: Mapping[str, Any], *, work: Path,
                 params_file: Path = PARAMS_FILE) -> dict[str, Any]:
    """Reproduce one run in a scratch store and attach its decision log if the rerun is the recorded run."""
    entry, log = reproduce(store, path, data, work=work, params_file=params_file)
    if entry["result"] != "reproduced":
        return entry
    if log is None:
        clear(path, store, work)
        return {**entry, "result": "not rerun", "why": "the rerun wrote no decision log"}
    run = json.loads(path.read_text())
    run["decision_log"] = attach_log(path, log, entry)
    write_run(path, run)
    clear(path, store, work)
    return {**entry, "evaluations": len(run["curve"])}


def log_difference(new: Path, old: Path) -> str | None:
    """Where the log ``new`` first differs from ``old`` at old's rows and columns (None: nowhere)."""
    import pandas as pd

    a, b = pd.read_parquet(new), pd.read_parquet(old)
    if missing_cols := [c for c in b.columns if c not in a.columns]:
        return f"the rerun's log has no column {missing_cols[0]!r}"
    if len(a) != len(b):
        return f"the rerun's log has {len(a)} rows, the recorded one {len(b)}"
    for c in b.columns:
        if not a[c].reset_index(drop=True).equals(b[c].reset_index(drop=True)):
            return f"column {c!r} differs"
    return None


def replace_log(store: RunStore, path: Path, data: Mapping[str, Any], *, work: Path,
                params_file: Path = PARAMS_FILE) -> dict[str, Any]:
    """Reproduce one run; its new log (with the beliefs columns) replaces the old one if the rerun is the recorded
    run and the new log equals the old at every row and column the old one has."""
    entry, log = reproduce(store, path, data, work=work, params_file=params_file)
    if entry["result"] != "reproduced":
        return entry
    run = json.loads(path.read_text())
    old = log_of(path, run)
    why = "the rerun wrote no decision log" if log is None else \
        "the run file names no decision log beside it" if old is None else log_difference(log, old)
    if why is None and not has_beliefs(log):
        why = "the rerun's log has no prior or p_eff column"
    if why is not None:
        clear(path, store, work)
        return {**entry, "result": "differs", "why": why}
    replaced = run["decision_log"]["sha256"]
    run["decision_log"] = {**attach_log(path, log, entry), "replaced": replaced}
    write_run(path, run)
    clear(path, store, work)
    return {**entry, "evaluations": len(run["curve"]), "replaced": replaced}


NO_POLICY = {"result": "not rerun", "why": "the run recorded no policy digest, so no policy can be shown to be its"}


def rerun_each(store: RunStore, regime: str, paths: Sequence[Path], one: Callable[[Path, bool], dict[str, Any]],
               *, done: str | Callable[[Mapping[str, Any]], bool], record: str = RECORD, rule: str = RULE,
               limit: int | None = None, log: Log = print) -> dict[str, int]:
    """Rerun up to ``limit`` of ``paths`` (all when None) with ``one(path, quick)``, skipping a run whose file has
    gained ``done`` (a field, or a test of the run file) or that another process has claimed; a run without a policy
    digest is not rerun (``NO_POLICY``, before ``one`` loads the regime's data or builds its policy). Each outcome is
    noted in ``record``. Returns the outcomes counted."""
    counts: dict[str, int] = {}
    finished = done if callable(done) else (lambda r: done in r)
    for path in paths:
        if limit is not None and sum(counts.values()) >= limit:
            break
        run = json.loads(path.read_text())
        if finished(run) or not store.claim(path):
            continue  # another process took it
        try:
            rel = path.relative_to(store.root).as_posix()
            # no digest, no policy to rerun from (reproduce would refuse it too): say so before loading any data
            entry = one(path, bool(run.get("quick"))) if run.get("policy_sha256") else NO_POLICY
            note(store, regime, rel, entry, record, rule)
        finally:
            store.release(path)
        counts[entry["result"]] = counts.get(entry["result"], 0) + 1
        log(f"[{regime}] {rel}: {entry['result']}" + (f" ({entry['why']})" if "why" in entry else
                                                         f" in {entry.get('rerun_s', 0):.0f} s"))
    return counts


def per_run(store: RunStore, regime: str, work: Path, params_file: Path,
            fill: Callable[..., dict[str, Any]]) -> Callable[[Path, bool], dict[str, Any]]:
    """``rerun_each``'s ``one``: ``fill(store, path, data, ...)`` with the regime's data and policy, loaded once per
    quick flag, on the first run that needs them."""
    data: dict[bool, dict[str, Any]] = {}

    def one(path: Path, quick: bool) -> dict[str, Any]:
        if quick not in data:
            data[quick] = D.load_data(regime, work, quick, params_file)
        return fill(store, path, data[quick], work=work, params_file=params_file)

    return one


def backfill_logs(store: RunStore, regime: str, *, work: Path, limit: int | None = None,
                  cells: Sequence[str] | None = None, params_file: Path = PARAMS_FILE,
                  log: Log = print) -> dict[str, int]:
    """Backfill up to ``limit`` runs of ``regime`` (all when None; ``cells``: of these cells only, as
    ``missing``); returns the outcomes counted."""
    todo = missing(store, regime, cells)
    log(f"[{regime}] {len(todo)} run(s) without a decision log")
    counts = rerun_each(store, regime, todo, per_run(store, regime, work, params_file, backfill_one),
                        done="decision_log", limit=limit, log=log)
    log(f"[{regime}] backfill: {counts or 'nothing to do'}; {len(missing(store, regime, cells))} left")
    return counts


def backfill_beliefs(store: RunStore, regime: str, *, work: Path, limit: int | None = None,
                     cells: Sequence[str] | None = None, params_file: Path = PARAMS_FILE,
                     log: Log = print) -> dict[str, int]:
    """Give up to ``limit`` runs of ``regime`` whose log lacks their allocator's beliefs (``lacks_beliefs``; all when
    None) a log with them; returns the outcomes counted."""
    todo = lacks_beliefs(store, regime, cells)
    log(f"[{regime}] {len(todo)} run(s) whose decision log lacks its allocator's prior and p_eff")
    counts = rerun_each(store, regime, todo, per_run(store, regime, work, params_file, replace_log),
                        done=lambda r: "replaced" in r.get("decision_log", {}), record=BELIEFS_RECORD,
                        rule=BELIEFS_RULE, limit=limit, log=log)
    log(f"[{regime}] beliefs: {counts or 'nothing to do'}; {len(lacks_beliefs(store, regime, cells))} left")
    return counts
