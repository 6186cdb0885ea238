"""The confirmatory replication's reading (issue 54, item 6; docs/training-study.md "The confirmatory replication").

    python -m benchmarks.replication        # (also run by `python -m benchmarks.study --summarize-only`)

Reads the declaration (benchmarks/study/hypotheses.json, checked by benchmarks.study.replication.load) and the
replication's run files: each claim against ``grpo[tuned]`` (each admitted warm start's tuned uniform GRPO) pooled
over its regime's admitted warm starts, with warmstarts' rules (the pooled saving and its 95% bootstrap interval,
the one-sided rank test stratified by warm start), Holm's rule over every claim of the file, and the declared
decision: confirmed, not confirmed, or not read yet (a cell misses a seed, or the admission is not over; while one
claim is not read, none is decided). The runs: ``python -m benchmarks.study --regime pool --replication``.

Writes benchmarks/results/replication/: replication.json and replication.md, naming the commit that added the
hypotheses file and its sha256.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common import RESULTS, output_dir
from benchmarks.study import tuning as T
from benchmarks.study.formats import number, p_value, pct
from benchmarks.study.plan import HYPOTHESES_FILE, PROTOCOLS, TUNED
from benchmarks.study.replication import Hypotheses, admission, declaration, declared_in, load
from benchmarks.study.stats import compare, holm_with_se, pooled_costs
from benchmarks.study.store import RunStore, as_store
from benchmarks.warmstarts import Baselines


def _complete(runs: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> bool:
    return {int(r["seed"]) for r in runs} >= set(seeds)


def measure(out: Path | RunStore, hyp: Hypotheses | None = None) -> dict[str, Any]:
    """Each claim read against grpo[tuned] over its regime's admitted warm starts, with the declared decision."""
    store, hyp = as_store(out), hyp or load()
    view = Baselines(store)
    adm = {base: admission(store, base, hyp) for base in sorted({c.regime for c in hyp.claims})}
    rows = []
    for c in hyp.claims:
        regimes = adm[c.regime]["admitted"]
        first = PROTOCOLS[c.protocol].first_seed
        gaps = []
        for r in regimes:
            if not T.chosen_config(store, r):
                gaps.append(f"{r}: no tuned choice yet")
                continue
            ours = view.cell(r, c.protocol, c.ours)
            base = view.cell(r, c.protocol, TUNED)
            if not _complete(ours, [first + s for s in hyp.seeds]):
                gaps.append(f"{r}: {c.ours} has {len(ours)} of {len(hyp.seeds)} seeds")
            if not _complete(base, hyp.seeds):
                gaps.append(f"{r}: {TUNED} has {len(base)} of {len(hyp.seeds)} seeds")
        if len(regimes) < hyp.per_regime and adm[c.regime]["next"] is not None:
            gaps.insert(0, f"admission not over ({len(regimes)} of {hyp.per_regime} warm starts admitted)")
        row: dict[str, Any] = {"id": c.id, "regime": c.regime, "protocol": c.protocol, "ours": c.ours,
                               "baseline": TUNED, "direction": c.direction, "warm_starts": regimes, "missing": gaps}
        if not gaps and regimes:
            got = compare(view, regimes, c.protocol, c.ours, TUNED)
            if got is not None:
                ci = pooled_costs(view, regimes, c.protocol, c.ours, TUNED, ("cum_rollouts",))["cum_rollouts"]
                row.update({k: got[k] for k in ("pooled_saving", "p_value_stratified", "p_value_stratified_se",
                                                "p_method", "holds_in", "ours_runs", "base_runs", "per_warm_start")},
                           pooled_lo=ci["lo"], pooled_hi=ci["hi"])
        rows.append(row)
    read = [r for r in rows if "p_value_stratified" in r]
    # Holm over every claim of the file: a claim not read yet holds the family open, so none is decided early
    if len(read) == len(rows):
        for r, (p, se) in zip(read, holm_with_se([r["p_value_stratified"] for r in read],
                                                 [r["p_value_stratified_se"] for r in read])):
            r.update(p_holm=p, p_holm_se=se)
    frozen = declaration(store)  # the runs' declaration, frozen at the first of them (else the one in git now)
    declared = {"declared_in": frozen["declared_in"] if frozen else declared_in(),
                "frozen": frozen is not None,
                "changed_since": bool(frozen) and frozen["hypotheses_sha256"] != hyp.sha256}
    for r in rows:  # claims read against a declaration other than the one their runs followed decide nothing
        r["verdict"] = "not read: the declaration changed after its runs began" if declared["changed_since"] \
            else verdict(r, hyp.level)
    return {"hypotheses": {"file": str(HYPOTHESES_FILE.relative_to(HYPOTHESES_FILE.parents[2])),
                           "sha256": hyp.sha256, **declared},
            "admission": adm, "seeds": list(hyp.seeds), "level": hyp.level, "claims": rows}


def verdict(r: Mapping[str, Any], level: float) -> str:
    """The declared decision on one read claim: ``confirmed`` when its Holm-adjusted p (plus 2 Monte Carlo SEs
    where not exact) is below ``level`` and its pooled saving's interval lies above zero; ``not read yet`` while a
    claim of the family is not read."""
    if "p_holm" not in r:
        return "not read yet"
    p, se = r["p_holm"], r.get("p_holm_se") or 0.0
    lo = r.get("pooled_lo")
    ok = p is not None and p + 2 * se < level and lo is not None and math.isfinite(lo) and lo > 0
    return "confirmed" if ok else "not confirmed"


def markdown(res: Mapping[str, Any]) -> str:
    h = res["hypotheses"]
    out = ["# The confirmatory replication", "",
           f"Hypotheses: [{h['file']}](../../../{h['file']}), added in commit "
           f"{h['declared_in'] or 'unknown (no git history here)'}, sha256 {h['sha256'][:16]}"
           f"{' (frozen with the first run)' if h['frozen'] else ''}"
           f"{'; **the file changed after the runs began: the claims are not read**' if h['changed_since'] else ''}"
           ". Seeds "
           f"{res['seeds'][0]}-{res['seeds'][-1]} on the test split; each claim against `{TUNED}` (each warm "
           "start's tuned uniform GRPO, chosen on its validation split); p: one-sided rank test stratified by warm "
           f"start, Holm-adjusted over the {len(res['claims'])} claims; confirmed when that p is below "
           f"{res['level']:g} and the pooled saving's 95% interval lies above zero.", "",
           "## Admission", "", "| regime | admitted | missed the conditioning | next candidate |", "|---|---|---|---|"]
    for base, a in res["admission"].items():
        missed = ", ".join(f"{m['regime']} (slope {number(m['slope_points_per_1k'], '.2f')}, headroom "
                           f"{number(m['headroom_points'], '.1f')}, {number(m['evals_before_target'])} evaluations)"
                           for m in a["missed"]) or "none"
        out.append(f"| {base} | {', '.join(a['admitted']) or 'none yet'} | {missed} | {a['next'] or '-'} |")
    out += ["", "## Claims", "",
            "| claim | regime | allocator vs baseline | warm starts | fewer rollouts to target [95% CI] | p | "
            "p (Holm) | holds in | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["claims"]:
        ws = ", ".join(r["warm_starts"]) or "none yet"
        if "pooled_saving" in r:
            s = "never reaches" if r["pooled_saving"] is None else \
                f"{pct(r['pooled_saving'])} [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}]"
            p = p_value(r["p_value_stratified"], r.get("p_value_stratified_se"))
            ph = p_value(r["p_holm"], r.get("p_holm_se")) if "p_holm" in r else "-"
            holds = f"{r['holds_in']} of {len(r['per_warm_start'])}"
        else:
            s, p, ph, holds = "; ".join(r["missing"]) or "-", "-", "-", "-"
        out.append(f"| {r['id']} | {r['regime']} | {r['ours']} vs {r['baseline']} ({r['protocol']}) | {ws} | {s} | "
                   f"{p} | {ph} | {holds} | **{r['verdict']}** |")
    out += ["", "Resume: `python -m benchmarks.study --regime pool --replication` and `python -m benchmarks.study "
            "--regime hard --replication` (each run is skipped when its file exists)."]
    return "\n".join(out) + "\n"


def write(res: Mapping[str, Any], results: Path) -> None:
    """replication.json and replication.md in ``results``/replication/."""
    dest = output_dir(results, "replication")
    (dest / "replication.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    (dest / "replication.md").write_text(markdown(res))


def main(argv: Sequence[str] | None = None) -> int:
    res = measure(RunStore(RESULTS))
    write(res, RESULTS)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
