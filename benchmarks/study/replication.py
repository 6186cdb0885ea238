"""The confirmatory replication (issue 54, item 6; docs/training-study.md "The confirmatory replication").

    python -m benchmarks.study --regime pool --replication      # resumable: admission, tuning, claims' cells
    python -m benchmarks.study --regime hard --replication

Reads its declaration, benchmarks/study/hypotheses.json, committed before any of its runs (``load`` refuses a
file that does not say what the reading needs, naming the field). Per regime:

1. **Admission**: the candidate warm starts in order run their uniform GRPO reference runs (the declared
   reference seeds) and freeze their target and pre-registration, the conditioning figures included; a candidate
   is admitted when those meet the conditioning criteria, until the declared number per regime is admitted. A
   candidate that misses runs nothing more.
2. On each admitted warm start: the reference runs at every declared seed, the tuned uniform GRPO's validation grid
   and choice (benchmarks/study/tuning.py) and its chosen configuration's test cell at every seed (not the
   oracle's other cells), then each claim's cell at every seed.
3. **The reading**: benchmarks/replication.py (also run by every study summary).

The candidate warm starts stay out of the exploratory families (RunStore.family).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.study.execute import Log, run_protocol, run_replication_cells
from benchmarks.study.formats import number
from benchmarks.study.plan import (
    COMPARISON_FAMILIES,
    HYPOTHESES_FILE,
    PARAMS_FILE,
    PROTOCOLS,
    TUNED,
    WS_SEP,
    labels,
)
from benchmarks.study.store import RunStore

FORMAT = 1


@dataclass(frozen=True)
class Claim:
    id: str
    regime: str
    protocol: str
    ours: str
    direction: str


@dataclass(frozen=True)
class Hypotheses:
    candidates: tuple[int, ...]
    per_regime: int
    reference_seeds: tuple[int, ...]
    seeds: tuple[int, ...]
    level: float
    claims: tuple[Claim, ...]
    sha256: str


def _field(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ValueError(f"{HYPOTHESES_FILE.name}: {where}{key} is missing")
    return d[key]


def _seeds(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                   for s in v) or len(set(v)) != len(v):
        raise ValueError(f"{HYPOTHESES_FILE.name}: {where} must be a non-empty list of distinct integers >= 0, "
                         f"got {v!r}")
    return tuple(v)


def load(path: Path = HYPOTHESES_FILE) -> Hypotheses:
    """The declaration, checked: every field the reading needs, of the right kind (ValueError names the field)."""
    raw = path.read_bytes()
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{path.name}: not JSON ({e})") from None
    if _field(d, "format", "") != FORMAT:
        raise ValueError(f"{path.name}: format must be {FORMAT}, got {d['format']!r}")
    adm = _field(d, "admission", "")
    candidates = _seeds(_field(adm, "candidates", "admission."), "admission.candidates")
    per = _field(adm, "per_regime", "admission.")
    if not isinstance(per, int) or isinstance(per, bool) or not 1 <= per <= len(candidates):
        raise ValueError(f"{path.name}: admission.per_regime must be an integer in [1, {len(candidates)}], got {per!r}")
    refs = _seeds(_field(adm, "reference_seeds", "admission."), "admission.reference_seeds")
    seeds = _seeds(_field(d, "seeds", ""), "seeds")
    if not set(refs) <= set(seeds):
        raise ValueError(f"{path.name}: admission.reference_seeds {list(refs)} must be among seeds {list(seeds)}")
    if (label := _field(_field(d, "comparator", ""), "label", "comparator.")) != TUNED:
        raise ValueError(f"{path.name}: comparator.label must be {TUNED!r} (the tuned uniform GRPO), got {label!r}")
    level = _field(_field(d, "decision", ""), "level", "decision.")
    if not isinstance(level, float) or not 0 < level < 1:
        raise ValueError(f"{path.name}: decision.level must be a number in (0, 1), got {level!r}")
    claims, ids = [], set()
    for i, c in enumerate(_field(d, "claims", "") or []):
        where = f"claims[{i}]."
        cl = Claim(*(_field(c, k, where) for k in ("id", "regime", "protocol", "ours", "direction")))
        if not isinstance(cl.id, str) or not cl.id or cl.id in ids:
            raise ValueError(f"{path.name}: {where}id must be a unique non-empty string, got {cl.id!r}")
        if cl.regime not in COMPARISON_FAMILIES:
            raise ValueError(f"{path.name}: {where}regime must be one of {list(COMPARISON_FAMILIES)}, "
                             f"got {cl.regime!r}")
        if cl.protocol not in PROTOCOLS:
            raise ValueError(f"{path.name}: {where}protocol {cl.protocol!r} is not a protocol ({list(PROTOCOLS)})")
        if cl.ours not in labels(cl.protocol, f"{cl.regime}{WS_SEP}{candidates[0]}"):
            raise ValueError(f"{path.name}: {where}ours {cl.ours!r} does not run under {cl.protocol!r} on a warm "
                             f"start of {cl.regime!r}")
        ids.add(cl.id)
        claims.append(cl)
    if not claims:
        raise ValueError(f"{path.name}: claims must name at least one claim")
    return Hypotheses(candidates, per, refs, seeds, level, tuple(claims), hashlib.sha256(raw).hexdigest())


def declared_in(path: Path = HYPOTHESES_FILE) -> str | None:
    """The commit that added the hypotheses file (None where git or the history is not at hand)."""
    try:
        out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", path.name], cwd=path.parent,
                             capture_output=True, text=True, timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[-1] if out else None


def declaration_path(store: RunStore) -> Path:
    """study/replication_declaration.json: the hypotheses file's sha256 and commit, frozen at the first run."""
    return store.root / "replication_declaration.json"


def declaration(store: RunStore) -> dict[str, Any] | None:
    p = declaration_path(store)
    return json.loads(p.read_text()) if p.exists() else None


def freeze_declaration(store: RunStore, hyp: Hypotheses, path: Path = HYPOTHESES_FILE) -> dict[str, Any]:
    """The declaration the replication's runs follow, frozen before the first of them: the hypotheses file's sha256
    and the commit that added it. Refuses a hypotheses file edited after that (its sha256 differs from the frozen
    one), and, before the first run, one that git does not hold as committed (no history, or local edits)."""
    if (d := declaration(store)) is not None:
        if d["hypotheses_sha256"] != hyp.sha256:
            raise SystemExit(f"{path.name} changed after the replication's runs began (frozen sha256 "
                             f"{d['hypotheses_sha256'][:16]}, now {hyp.sha256[:16]}): a declaration is not edited "
                             "after its runs; declare a new replication instead")
        return d
    commit = declared_in(path)
    try:
        edited = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path.name], cwd=path.parent,
                                capture_output=True, timeout=60).returncode != 0
    except (OSError, subprocess.SubprocessError):
        edited = True
    if commit is None or edited:
        raise SystemExit(f"{path.name} is not committed as it stands (no git history here, or local edits): the "
                         "replication's runs must follow a declaration that git shows predates them")
    return store.freeze(declaration_path(store), {"hypotheses_sha256": hyp.sha256, "declared_in": commit,
                                                  "file": path.name})


def candidates(hyp: Hypotheses, base: str) -> list[str]:
    return [f"{base}{WS_SEP}{j}" for j in hyp.candidates]


def admission(store: RunStore, base: str, hyp: Hypotheses) -> dict[str, Any]:
    """Where the admission of ``base``'s warm starts stands, read off their frozen pre-registrations: the admitted,
    the missed (with their conditioning figures) and the next candidate to run (None: the admission is over)."""
    admitted: list[str] = []
    missed: list[dict[str, Any]] = []
    for regime in candidates(hyp, base):
        if len(admitted) == hyp.per_regime:
            return {"admitted": admitted, "missed": missed, "next": None}
        cond = (store.preregistration(regime) or {}).get("conditioning")
        if cond is None:
            return {"admitted": admitted, "missed": missed, "next": regime}
        if cond["conditioned"]:
            admitted.append(regime)
        else:
            missed.append({"regime": regime, **{k: cond.get(k) for k in ("slope_points_per_1k", "headroom_points",
                                                                           "evals_before_target", "meets")}})
    return {"admitted": admitted, "missed": missed, "next": None}


def run(base: str, *, out: Path, work: Path, quick: bool = False, params_file: Path = PARAMS_FILE,
        log: Log = print, hyp: Hypotheses | None = None) -> dict[str, Any]:
    """The replication's runs of regime ``base`` (each skipped when its file exists): the admission, then per
    admitted warm start the reference runs, the tuned uniform GRPO and the claims' cells at every seed."""
    hyp = hyp or load()
    if base not in COMPARISON_FAMILIES:
        raise SystemExit(f"the replication runs on {list(COMPARISON_FAMILIES)}, not {base!r}")
    store = RunStore(out)
    frozen = freeze_declaration(store, hyp)
    log(f"[{base}] replication of {HYPOTHESES_FILE.name} (sha256 {hyp.sha256[:16]}, committed in "
        f"{frozen['declared_in'][:12]})")
    while (nxt := admission(store, base, hyp)["next"]) is not None:
        log(f"[{nxt}] replication candidate: reference seeds {list(hyp.reference_seeds)}, then its conditioning")
        run_protocol(nxt, "reference", hyp.reference_seeds, out=out, work=work, quick=quick, params_file=params_file,
                     log=log)
        if (cond := (store.preregistration(nxt) or {}).get("conditioning")) is None:
            raise RuntimeError(f"regime {nxt}: its reference runs froze no conditioning record")
        log(f"[{nxt}] conditioning: slope {number(cond['slope_points_per_1k'], '.2f')} points per 1,000 rollouts, "
            f"headroom {number(cond['headroom_points'], '.1f')} points, {number(cond['evals_before_target'])} "
            "evaluations before the reach: "
            f"{'admitted' if cond['conditioned'] else 'missed'} ({cond['meets']})")
    st = admission(store, base, hyp)
    log(f"[{base}] replication warm starts: {st['admitted'] or 'none'}; missed: "
        f"{[m['regime'] for m in st['missed']] or 'none'}")
    cells = [(c.protocol, c.ours) for c in hyp.claims if c.regime == base]
    for regime in st["admitted"]:
        run_replication_cells(store, regime, hyp.seeds, cells, work=work, quick=quick, params_file=params_file,
                              log=log)
    return st
