"""The study's files on disk: one ``RunStore`` owns their layout, and nothing else builds a run path.

Under the results root ``out`` (benchmarks/results by default)::

    study/<regime>/target.json                  the frozen target (set once from the reference runs)
    study/<regime>/matched.json                 the frozen prompt batches of the matched-updates protocols
    study/<regime>/preregistration.json         the regime's criteria on its reference runs, written once
    study/<regime>/tuned/choice.json            each tuned allocator's grid point, chosen on the validation split
    study/<regime>/group-size/choice.json       the best uniform k, chosen on the validation split
    study/<regime>/<protocol>/<slug>[-b<B>-lr<lr>][-val]/s<seed>.json   one run (a .lock beside it while it trains)

Every file of the study is written without following a link (``rlvr_core.safefs``: a fresh temporary name made
with O_EXCL | O_NOFOLLOW, renamed over the target; locks opened with O_NOFOLLOW): a results folder is shared or
checked out, and a link planted as ``backfill.lock`` or ``s0.json`` would otherwise be written through.

A cell is the test-split runs of one (regime, protocol, variant), with the runs of another protocol it shares
(``plan.Protocol.shares``: equal-rollouts' grpo is the reference runs). ``runs`` reads every run file once, in path
order (a bootstrap resamples by index, so the order is part of a result); the frozen files are read once each and
kept, since a frozen file never changes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from benchmarks.study.plan import WS_SEP, base_regime, grid_tag, replication_candidates, shared_sources, step_grid
from rlvr_core.registry import slug
from rlvr_core.safefs import folder_fd, open_in, write_text_atomic

Run = dict[str, Any]
# the decision log's columns of what the allocator believed of a prompt (docs/design.md §7.1)
BELIEFS = ("prior", "p_eff")
BACKFILL_RECORD = "backfill.json"  # study/<regime>/: each decision-log backfill's outcome (benchmarks/study/backfill)
BELIEFS_RECORD = "backfill_beliefs.json"  # the same for the prior and p_eff columns


def holds_beliefs(allocator: str) -> bool:
    """Whether the allocator registered as ``allocator`` reports a prior or p_eff (overrides ``_beliefs``)."""
    from rlvr_core.allocation import ALLOCATORS
    from rlvr_core.allocation.base import Allocator

    return allocator in ALLOCATORS and ALLOCATORS.get(allocator)._beliefs is not Allocator._beliefs


def log_of(path: Path, run: Mapping[str, Any]) -> Path | None:
    """The decision log the run file at ``path`` names, when it names the one beside it and that one exists (a
    run file is input: a name elsewhere is no log of its)."""
    log = path.with_suffix(".rollouts.parquet")
    named = run.get("decision_log")
    return log if isinstance(named, Mapping) and named.get("file") == log.name and log.is_file() else None


def has_beliefs(log: Path) -> bool:
    """Whether the decision log ``log`` has the ``prior`` and ``p_eff`` columns (its schema alone is read)."""
    import pyarrow.parquet as pq

    return set(BELIEFS) <= set(pq.read_schema(log).names)


class RunStore:
    """The run files, frozen files and run claims of one results root's study/."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.root = self.out / "study"
        self._runs: list[Run] | None = None
        self._paths: list[Path] = []
        self._index: dict[tuple[str, str, str], list[int]] = {}
        self._frozen: dict[Path, dict[str, Any]] = {}

    # ----- layout ---------------------------------------------------------------------------------------
    def cell_dir(self, regime: str, protocol_dir: str, label: str) -> Path:
        """The folder of one variant's run files: study/<regime>/<protocol_dir>/<slug(label)>."""
        return self.root / regime / protocol_dir / slug(label)

    def run_file(self, regime: str, protocol: str, label: str, seed: int, grid: tuple[int, float] | None = None,
                 split: str = "test") -> Path:
        """The result file of one run (equal-rollouts' grpo runs are the reference runs: their folder)."""
        proto_dir = "reference" if (protocol == "equal-rollouts" and label == "grpo") else protocol
        cell = self.cell_dir(regime, proto_dir, label)
        return cell.with_name(f"{cell.name}{grid_tag(grid)}{'-val' if split == 'validation' else ''}") / f"s{seed}.json"

    def target_path(self, regime: str) -> Path:
        return self.root / regime / "target.json"

    def policy_path(self, regime: str) -> Path:
        """The frozen record of a rebuilt policy shown to train as the one the target was frozen from."""
        return self.root / regime / "policy.json"

    def policy_record(self, regime: str) -> dict[str, Any] | None:
        """``policy.json`` of ``regime`` (None when no rebuilt policy was verified)."""
        return self._frozen_file(self.policy_path(regime))

    def accepted_policies(self, regime: str) -> set[str]:
        """The policy digests new runs of ``regime`` may start from: the target's, and a rebuilt one whose
        reference rerun reproduced the recorded curve (``policy.json``, written by execute.verify_policy)."""
        t, p = self.target(regime) or {}, self.policy_record(regime) or {}
        rebuilt = p.get("policy_sha256") if p.get("recorded_policy_sha256") == t.get("policy_sha256") else None
        return {d for d in (t.get("policy_sha256"), rebuilt) if d}

    def matched_path(self, regime: str) -> Path:
        return self.root / regime / "matched.json"

    def preregistration_path(self, regime: str) -> Path:
        return self.root / regime / "preregistration.json"

    def choice_path(self, regime: str, protocol: str = "tuned") -> Path:
        """The choices made on the validation split: tuned's grid points, group-size's best k."""
        return self.root / regime / protocol / "choice.json"

    # ----- frozen files ---------------------------------------------------------------------------------
    def _frozen_file(self, path: Path) -> dict[str, Any] | None:
        if path not in self._frozen:
            if not path.exists():
                return None
            self._frozen[path] = json.loads(path.read_text())
        return self._frozen[path]

    def target(self, regime: str) -> dict[str, Any] | None:
        """The frozen target of ``regime`` (None before it is frozen)."""
        return self._frozen_file(self.target_path(regime))

    def target_value(self, regime: str) -> float | None:
        t = self.target(regime)
        return None if t is None else t["target"]

    def matched(self, regime: str) -> dict[str, Any] | None:
        return self._frozen_file(self.matched_path(regime))

    def preregistration(self, regime: str) -> dict[str, Any] | None:
        return self._frozen_file(self.preregistration_path(regime))

    def choice(self, regime: str, protocol: str = "tuned") -> dict[str, Any]:
        """The choices recorded so far (tuned: {label: choice}; group-size: the best k); re-read each time (tuned's
        choices are added one allocator at a time)."""
        p = self.choice_path(regime, protocol)
        return json.loads(p.read_text()) if p.exists() else {}

    def freeze(self, path: Path, value: dict[str, Any], **dumps: Any) -> dict[str, Any]:
        """Write a frozen file (target, matched sizes, pre-registration, choice) and keep it (never through a
        link planted at ``path``: rlvr_core.safefs)."""
        write_text_atomic(path, json.dumps(value, **({"indent": 1} | dumps)) + "\n")
        self._frozen[path] = value
        return value

    # ----- runs -----------------------------------------------------------------------------------------
    def runs(self) -> list[Run]:
        """Every run file under study/, read once, in path order."""
        if self._runs is None:
            paths = self._paths = sorted(self.root.glob("*/*/*/s*.json"))
            self._runs = [json.loads(p.read_text()) for p in paths]
            for i, (p, r) in enumerate(zip(paths, self._runs)):  # the folders name the regime and protocol
                if r.get("split", "test") == "test":
                    self._index.setdefault((p.parts[-4], p.parts[-3], r["variant"]), []).append(i)
        return self._runs

    def paths(self) -> list[Path]:
        """The run files of ``runs``, in its order."""
        self.runs()
        return list(self._paths)

    def log_coverage(self, regime: str) -> dict[str, int]:
        """How far ``regime``'s runs have decision logs, from ``runs``: ``runs`` (run files with a curve),
        ``logged``, ``to_backfill`` (no log, not yet tried), ``not_reproduced`` (no log, tried: the rerun differed or
        was refused), ``holds`` (logged runs whose allocator holds beliefs), ``beliefs`` (of those, logs with
        ``prior`` and ``p_eff``) and ``to_fill`` (the rest, not yet tried)."""
        tried, tried_beliefs = (set(self.rerun_record(regime, name).get("runs", {}))
                                for name in (BACKFILL_RECORD, BELIEFS_RECORD))
        out = dict.fromkeys(("runs", "logged", "to_backfill", "not_reproduced", "holds", "beliefs", "to_fill"), 0)
        for p, r in zip(self.paths(), self.runs()):
            if p.parts[-4] != regime or "curve" not in r:
                continue
            out["runs"] += 1
            rel = p.relative_to(self.root).as_posix()
            if "decision_log" not in r:
                out["not_reproduced" if rel in tried else "to_backfill"] += 1
                continue
            out["logged"] += 1
            if holds_beliefs(r.get("allocator", "")) and (log := log_of(p, r)):
                out["holds"] += 1
                full = has_beliefs(log)
                out["beliefs"] += full
                out["to_fill"] += not full and rel not in tried_beliefs
        return out

    def rerun_record(self, regime: str, name: str) -> dict[str, Any]:
        """``study/<regime>/<name>``, a record of reruns (``BACKFILL_RECORD``, ``BELIEFS_RECORD``, the large set's):
        its ``runs`` map each run tried to its outcome; {} before the first."""
        p = self.root / regime / name
        return json.loads(p.read_text()) if p.exists() else {}

    def own(self, regime: str, protocol: str, label: str) -> list[int]:
        """Indices (into ``runs``) of the test-split runs trained under ``protocol`` itself."""
        self.runs()
        return self._index.get((regime, protocol, label), [])

    def cell(self, regime: str, protocol: str, label: str) -> list[Run]:
        """The test-split runs of one cell, its shared runs included, in path order."""
        idx = list(self.own(regime, protocol, label))
        for src, labs in shared_sources(protocol):
            if labs is None or label in labs:
                idx += self.own(regime, src, label)
        runs = self.runs()
        return [runs[i] for i in sorted(idx)]

    def decision_logs(self, regime: str, protocol: str, label: str) -> dict[int, Path] | None:
        """seed -> decision log of one cell's runs, in its folder (None unless the cell has runs and every one of
        them has a log)."""
        runs = self.cell(regime, protocol, label)
        logs = {int(r["seed"]): self.cell_dir(regime, protocol, label) / r["decision_log"]["file"]
                for r in runs if "decision_log" in r}
        return logs if runs and len(logs) == len(runs) else None

    def folders(self, regime: str, protocol_dir: str) -> list[list[Run]]:
        """The run files of each variant folder under study/<regime>/<protocol_dir>/, in folder-name order, read
        now."""
        base = self.root / regime / protocol_dir
        return [[json.loads(p.read_text()) for p in sorted(folder.glob("s*.json"))]
                for folder in sorted(base.glob("*"))]

    def reference_runs(self, regime: str) -> list[Run]:
        """Every finished reference (uniform GRPO) run file of ``regime`` in seed-file order, read now (a study
        in progress adds them)."""
        return [json.loads(p.read_text()) for p in sorted(self.cell_dir(regime, "reference", "grpo").glob("s*.json"))]

    def grid_runs(self, regime: str, label: str, grid: tuple[int, float]) -> list[Run]:
        """The validation runs of one tuned grid point, read now."""
        cell = self.run_file(regime, "tuned", label, 0, grid, "validation").parent
        return [json.loads(p.read_text()) for p in sorted(cell.glob("s*.json"))]

    def validation_runs(self, regime: str, protocol: str, label: str) -> list[Run]:
        """The validation runs of one (protocol, variant) off the tuned grid, read now."""
        cell = self.run_file(regime, protocol, label, 0, None, "validation").parent
        return [json.loads(p.read_text()) for p in sorted(cell.glob("s*.json"))]

    def validation_locks(self, regime: str, label: str) -> list[Path]:
        """The claims on ``label``'s tuned validation runs held by study processes."""
        return list((self.root / regime / "tuned").glob(f"{slug(label)}-b*-val/s*.lock"))

    # ----- regimes --------------------------------------------------------------------------------------
    def regimes(self) -> list[str]:
        """The regimes with a folder under study/, step-grid ones first."""
        names = [p.name for p in self.root.glob("*") if p.is_dir()] if self.root.exists() else []
        return sorted(names, key=lambda n: (not step_grid(n), n))

    def warm_starts(self, base: str) -> list[str]:
        """The warm-start variants ``<base>-ws<J>`` with a folder, by J."""
        names = [p.name for p in self.root.glob(f"{base}{WS_SEP}*") if p.is_dir()] if self.root.exists() else []
        return sorted((n for n in names if n[len(base) + len(WS_SEP):].isdigit()), key=lambda n: base_regime(n)[1])

    def family(self, base: str) -> list[str]:
        """``base`` and its warm-start variants that have a frozen target, base first, then by warm-start seed; the
        confirmatory replication's candidates (plan.replication_candidates) are not of it: they are read by
        benchmarks/study/replication.py alone."""
        fresh = replication_candidates()
        return [r for r in (base, *self.warm_starts(base))
                if self.target(r) is not None and base_regime(r)[1] not in fresh]

    # ----- claims ---------------------------------------------------------------------------------------
    @staticmethod
    def claim(path: Path) -> bool:
        """Claim a run for this process (a lock file holding its pid); a lock whose process is gone is taken
        over. The lock is made and read through its folder's descriptor without following a link
        (UnsafeRunFolder names a link planted as the lock, or a folder of another user's)."""
        lock = path.with_suffix(".lock")
        with folder_fd(lock.parent) as dfd:
            for _ in range(2):
                try:
                    fd = open_in(dfd, lock.name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, lock.parent)
                except FileExistsError:
                    try:
                        rfd = open_in(dfd, lock.name, os.O_RDONLY, lock.parent)
                        try:
                            pid = int(os.read(rfd, 64).decode("ascii", "replace").strip() or 0)
                        finally:
                            os.close(rfd)
                        os.kill(pid, 0)
                        return False  # held by a live process
                    except (ValueError, ProcessLookupError, FileNotFoundError):
                        os.unlink(lock.name, dir_fd=dfd)  # stale: its process was killed
                        continue
                    except PermissionError:
                        return False
                with os.fdopen(fd, "w") as f:
                    f.write(str(os.getpid()))
                return True
        return False

    @staticmethod
    def release(path: Path) -> None:
        path.with_suffix(".lock").unlink(missing_ok=True)

    @staticmethod
    def held(paths: Iterable[Path]) -> list[Path]:
        return [p for p in paths if p.with_suffix(".lock").exists()]


def as_store(out: Path | RunStore) -> RunStore:
    """A RunStore of ``out`` (a results root or a store already)."""
    return out if isinstance(out, RunStore) else RunStore(out)
