"""Paste the benchmark tables into README.md and docs/results.md between their markers.

Each of DOCS holds ``<!-- <name>:start -->`` / ``<!-- <name>:end -->`` pairs; each is replaced by
benchmarks/results/<generator>/<name>.md as the benchmark wrote it (the one generator folder that holds a
<name>.md), its relative links rewritten to resolve from the document's folder. A table whose <name>_targets.json
beside it records a quick (smoke) run is not pasted. Three short tables are derived here from the benchmarks'
JSON files first, into benchmarks/results/readme/: ``evidence_headline.md`` (the README's opening table, at most
eight rows, with its legend) and ``value_headline.md`` (the allocators that price what a group teaches, against
uniform GRPO) from warmstarts/training_warmstarts.json, ``training_headline.md`` from
study/training_protocols.json (the training study's headline cells, linked from the table of savings across warm
starts, warmstarts/training_summary.md) and ``allocation_headline.md`` from allocation/allocation_targets.json
(the simulated allocation benchmark). The README shows the opening table; docs/results.md every other table.
Usage: python -m benchmarks.readme
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from benchmarks.common import RESULTS, output_dir
from benchmarks.study.formats import interval, p_value, pct, rank_test_words
from benchmarks.study.noise import band_words, reads_as, written_bands
from benchmarks.study.plan import COMPARISONS, ORACLE, PROTOCOLS, REFERENCE, REGIMES, TUNED, VARIANTS, base_regime

ROOT = Path(__file__).resolve().parent.parent
# the documents whose marked sections sync() fills, paths relative to ROOT
DOCS = ("README.md", "docs/results.md", "docs/training-study.md", "docs/design.md")
# the documents that quote no measured figure outside their generated sections (docs/training-study.md declares
# the study's plan in figures: grids, budgets, seeds)
MEASURED_DOCS = ("README.md", "docs/results.md")


# the cells training_headline.md shows (every cell is in benchmarks/results/study/training_study.md): those whose
# variant's plan record names the protocol (benchmarks/study/plan.py Variant.headline: the baselines, the allocators
# the targets name, our strongest candidates and the published baselines), in the regimes marked Regime.headline
# (the warm-start variants are in training_warmstarts.md, steps in rollouts, tokens and seconds across its warm
# starts: warmstarts/training_costs.md, pasted as the README's training_costs)
README_SHOWS = {(p, lab) for lab, v in VARIANTS.items() for p in v.headline}
README_REGIMES = tuple(name for name, r in REGIMES.items() if r.headline)


def training_headline(protocols: list[dict], regime: str = "hard") -> str:
    """The headline cells' table (readme/training_headline.md): every cell of the study's ``regime`` that has run,
    then of the other README_REGIMES (every cell of every regime: benchmarks/results/study/training_study.md)."""
    rows = [r for r in protocols if not r.get("quick") and (r["protocol"], r["allocator"]) in README_SHOWS]
    shown = [regime] + sorted({r["regime"] for r in rows} & set(README_REGIMES) - {regime})
    targets = {r["regime"]: r["target"] for r in rows if r.get("target") is not None and r["regime"] in shown}
    out = ["Held-out greedy accuracy of the tiny policy (every other regime and cell: training_study.md). "
           "Rollouts to target: where each run's isotonic (monotone) fit of its evaluations first reaches the target "
           "(80% of uniform GRPO's gain: " + ", ".join(f"{g} {t:.4f}" for g, t in sorted(targets.items()))
           + "), median [order-statistic interval, 94% at 5 seeds]; the raw first crossing beside it; 'never': the "
           "median (or a bound) fell on a run that did not reach it. p: one-sided rank test against dapo (equal "
           "batch) or grpo (other protocols), misses ranked last. acc @ 30k: the fitted accuracy after 30,000 "
           "rollouts.",
           "",
           "| regime | protocol | allocator | seeds | reached | rollouts to target (fit) | raw first crossing | p "
           "| acc @ 30k | final acc (SE) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for g in shown for r in rows if r["regime"] == g):
        se = r.get("final_accuracy_se")
        acc = "-" if r.get("final_accuracy") is None else f"{r['final_accuracy']:.3f}" + (f" ({se:.3f})" if se else "")
        p = r.get("p_value")
        at = (r.get("acc_at_budget") or {}).get("30000")
        out.append(f"| {r['regime']} | {r['protocol']} | {r['allocator']} | {r['seeds']} | "
                   f"{r.get('reached_fit', r['reached'])}/{r['seeds']} "
                   f"| {interval(r.get('fit_rollouts_to_target') or r.get('rollouts_to_target'))} "
                   f"| {interval(r.get('rollouts_to_target'))} | {p_value(p)} "
                   f"| {'-' if at is None else f'{at:.3f}'} | {acc} |")
    return "\n".join(out) + "\n"


# the README's opening rows: the comparisons marked plan.Comparison.front, in each regime marked Regime.headline
FRONT = tuple((c.protocol, c.ours, c.baseline) for c in COMPARISONS if c.front)
FRONT_ROWS = 8  # four front comparisons (issue 37 added ours, valor) x the two headline families


def _own_ps(r: dict) -> str:
    """`` (p 0.010, 0.155)``: each warm start's own one-sided p ("" where the row has none)."""
    per = r.get("per_warm_start") or []
    return f" (p {', '.join(p_value(p['p_value']) for p in per)})" if per else ""


def _p_holm(r: dict) -> str:
    """A row's Holm-adjusted p (its stratified p where it is in no Holm family), with its Monte Carlo SE if any."""
    if "p_holm" in r:
        return p_value(r["p_holm"], r.get("p_holm_se"))
    return p_value(r["p_value_stratified"], r.get("p_value_stratified_se"))


def _vs_best(r: dict | None) -> str:
    """A row's saving against the tuned uniform GRPO or the test-best one (plan.TUNED, plan.ORACLE: rows of
    warmstarts whose ``best_of`` is the row's baseline), with its one-sided stratified p, or why there is none."""
    if r is None:
        return "not run yet"
    if r["pooled_saving"] is None:
        return "never reaches"
    n = r["warm_starts"]
    return (f"{pct(r['pooled_saving'])} [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}] (p "
            f"{p_value(r['p_value_stratified'], r.get('p_value_stratified_se'))}, {n} warm start{'s' * (n != 1)})")


def _shown(rows: list[dict], comparisons: tuple[tuple[str, str, str], ...]) -> list[dict]:
    """The rows of ``comparisons`` (protocol, ours, baseline) that have run, per README_REGIMES family."""
    by_key = {(r["family"], r["protocol"], r["ours"], r["baseline"]): r for r in rows}
    return [by_key[(g, *c)] for g in README_REGIMES for c in comparisons if (g, *c) in by_key]


def _figure(r: dict) -> str:
    """A row's pooled saving [95% CI], or "never reaches"."""
    if r["pooled_saving"] is None:
        return "never reaches"
    return pct(r["pooled_saving"]) + (f" [{pct(r['pooled_lo'])}, {pct(r['pooled_hi'])}]" if "pooled_lo" in r else "")


def warm_start_names(regimes: list[str]) -> str:
    """``ws2-4`` (a run of warm starts) or ``ws0, ws2`` (the base regime is warm start 0)."""
    ws = sorted(base_regime(r)[1] or 0 for r in regimes)
    if len(ws) > 1 and ws == list(range(ws[0], ws[-1] + 1)):
        return f"ws{ws[0]}-{ws[-1]}"
    return ", ".join(f"ws{w}" for w in ws)


def _named(r: dict) -> str:
    """``, ws2-4``: the warm starts a row pools, where they are fewer than its regime's (``family_warm_starts``)."""
    per = [p["regime"] for p in r.get("per_warm_start") or []]
    full = r.get("family_warm_starts") or []
    return f", {warm_start_names(per)}" if per and len(per) < len(full) else ""


def _band(r: dict, bands: dict) -> str:
    """``[-20%, 17%]; **saving**``: the family's A/A band and what the row's saving may be called by it."""
    b = bands.get(r["family"])
    if b is None:
        return "not run yet; no A/A band"
    word = reads_as(r, b)
    return f"{band_words(b)}; {'**saving**' if word == 'saving' else word}"


def _saving_rows(shown: list[dict], rows: list[dict] | tuple = (), bands: dict | None = None) -> list[str]:
    """The header and one line per row of the README's saving tables; a matched-updates row carries its reading
    against the reference runs (the row of ``rows`` whose baseline is plan.REFERENCE) beside its own, a row read
    against the best uniform GRPO its readings against plan.TUNED and plan.ORACLE, and every row its family's A/A
    band (``bands``, benchmarks.null_controls.aa_bands) with what its saving may be called by it."""
    def by(baseline: str) -> dict[tuple[str, str, str], dict]:
        return {(r["family"], r["protocol"], r["ours"]): r for r in rows if r["baseline"] == baseline}

    refs, tuned, oracle = by(REFERENCE), by(TUNED), by(ORACLE)
    bands = bands or {}
    out = ["| regime | allocator | baseline | protocol | fewer rollouts to target [95% CI] | p | holds in | "
           "A/A band; reads as | vs tuned uniform GRPO [95% CI] | vs test-best uniform GRPO (a bound) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in shown:
        key = (r["family"], r["protocol"], r["ours"])
        saving, p = _figure(r), _p_holm(r)
        if (ref := refs.get(key)) is not None and r["baseline"] == ref.get("reference_of"):
            saving += f"; vs the reference grpo: {_figure(ref)}"
            p += f"; {_p_holm(ref)}"
        out.append(f"| {r['family']} | {r['ours']} | {r['baseline']} | {r['protocol']} | {saving} | {p} | "
                   f"{r['holds_in']} of {r['warm_starts']} warm starts{_named(r)}{_own_ps(r)} | {_band(r, bands)} | "
                   f"{_vs_best(tuned.get(key))} | {_vs_best(oracle.get(key))} |")
    return out


# the README's rows of the allocators that price what a group teaches (plan.Comparison.value)
VALUE = tuple((c.protocol, c.ours, c.baseline) for c in COMPARISONS if c.value)


def value_headline(rows: list[dict], bands: dict | None = None) -> str:
    """The README's table of the value-priced allocators (readme/value_headline.md): the value-based baselines and
    ours against uniform GRPO at equal rollouts, in the opening table's columns and legend."""
    shown = _shown(rows, VALUE)
    if not shown:
        return ""
    return "\n".join([*_saving_rows(shown, rows, bands), "",
                      "Columns as in the opening table. Published: knapsack-rl, vip, mopps, cures (run where prompts "
                      "recur, `pool`); ours: valor, valor[reuse] (docs/allocators/)."]) + "\n"


def evidence_headline(rows: list[dict], bands: dict | None = None) -> str:
    """The README's opening table (readme/evidence_headline.md): per headline regime and front comparison that has
    run, the pooled saving in fitted rollouts to target [95% CI] across warm starts, the stratified p and the warm
    starts where it holds (the rows of warmstarts/training_warmstarts.json), then a bulleted legend."""
    if len(FRONT) * len(README_REGIMES) > FRONT_ROWS:
        raise ValueError(f"plan: {len(FRONT)} Comparison.front x {len(README_REGIMES)} Regime.headline could show "
                         f"more than {FRONT_ROWS} rows in the README's opening table")
    shown = _shown(rows, FRONT)
    if not shown:
        return ""
    out = _saving_rows(shown, rows, bands)
    protocols = sorted({r["protocol"] for r in shown}, key=list(PROTOCOLS).index)
    out += ["",
            "- **regime**: the task, read over its warm starts (each its own starting policy, uniform GRPO reference "
            "runs and target; [regimes.md](benchmarks/results/regimes/regimes.md)).",
            "- **protocol**: what the two allocators share. "
            + " ".join(f"`{p}`: {PROTOCOLS[p].note}." for p in protocols),
            "- **fewer rollouts to target**: 1 - the median over the allocator's runs of the rollouts until its "
            "isotonic fit reaches the target (80% of uniform GRPO's gain), divided by the baseline's median in the "
            "same warm start; below zero: it needs more. A baseline's miss counts at its whole budget, ours as never. "
            "Interval: bootstrap over runs within each warm start.",
            f"- **p**: one-sided rank test stratified by warm start, misses ranked last, {rank_test_words(shown)}, "
            "adjusted by Holm's rule over the rows of docs/results.md's table of savings.",
            "- **holds in**: the warm starts whose own saving is above zero, each warm start's own one-sided p "
            "beside; a row over fewer warm starts than its regime's conditioned ones names them (ws0: the regime's "
            "own warm start).",
            "- **A/A band; reads as**: the central 95% of the pooled savings of uniform GRPO against itself, its "
            "runs re-split at random ([null_controls.md](benchmarks/results/null_controls/null_controls.md)). A row "
            "is a **saving** only when its interval lies above zero and its estimate above the band, a loss when "
            "both lie below, else not separated.",
            "- **vs tuned uniform GRPO**: the same saving against the configuration (k, lr, passes per batch at "
            "256 rollouts per update) its warm start chose on the validation split by the same statistic, with "
            "its one-sided stratified p, not Holm-adjusted ([grpo_tuning.md](benchmarks/results/grpo_tuning/"
            "grpo_tuning.md)).",
            "- **vs test-best**: against the configuration of that grid best on the test split itself, a bound no "
            "user can choose, not a baseline. All savings of a row pool the warm starts where every baseline ran.",
            "- **vs the reference grpo**: a matched-updates row read against the reference runs too (uniform GRPO at "
            "the regime's own batch, the baseline of the equal-rollouts rows), over the same warm starts, with its "
            "own Holm-adjusted p after the matched one's.",
            "- Every other comparison, the costs in tokens and seconds, the targets and the simulated allocation "
            "benchmark: [docs/results.md](docs/results.md)."]
    return "\n".join(out) + "\n"


ALLOCATION_TARGETS = {
    "sara_vs_dapo_saving_early_k8": "`sara` spends >= 22% fewer rollouts per effective group than `dapo` on `early`",
    "sara_vs_dapo_saving_ushape_k8": "the same on `ushape`",
    "sara_vs_dapo_saving_replay_k8": "the same on `replay` (the pass rates of a real `hard` GRPO run)",
    "sara_carry_vs_dapo_saving_drift_k8": "`sara[carry]` spends >= 35% fewer than `dapo` on `drift`",
    "vigor_useful_share_above_grpo": "`vigor` has a higher useful share than `grpo`, every scenario, k = 8 and 16",
    "decision_round_ms_1024_live": "one decision round for 1,024 live prompts < 5 ms (slowest allocator, median)",
}


def allocation_headline(targets: dict) -> str:
    """The README's allocation table: each target of benchmarks/results/allocation/allocation_targets.json,
    measured."""
    out = ["| target (simulated engine, k = 8) | measured | met |", "|---|---|---|"]
    for key, what in ALLOCATION_TARGETS.items():
        t = targets["targets"].get(key)
        if t is None:
            continue
        v = t["value"]
        if isinstance(v, dict) and key == "vigor_useful_share_above_grpo":
            ours, theirs = zip(*v.values())
            shown = f"{min(ours):.2f}-{max(ours):.2f} vs {min(theirs):.2f}-{max(theirs):.2f}"
        elif isinstance(v, dict):
            shown = f"{max(v.values()):.1f} ms"
        else:
            shown = f"{100 * v:.1f}%"
        out.append(f"| {what} | {shown} | {'yes' if t['met'] else '**no**'} |")
    return "\n".join(out) + "\n"


def write_headlines(results: Path, protocols: list[dict] | None = None, comparisons: list[dict] | None = None,
                    bands: dict | None = None) -> None:
    """Derive the headline tables from the benchmarks' JSON files under the results root ``results`` (when they
    exist) into its readme/; ``protocols``: the study's cell records in memory (else its training_protocols.json);
    ``comparisons``: the warm-start comparison rows in memory (else warmstarts/training_warmstarts.json's), which
    hold the readings against the tuned and the test-best uniform GRPO; ``bands``: each family's A/A band (else
    null_controls/null_controls.json's)."""
    if bands is None:
        bands = written_bands(results)
    cells = results / "study" / "training_protocols.json"
    targets = results / "allocation" / "allocation_targets.json"
    warm = results / "warmstarts" / "training_warmstarts.json"
    if protocols is None and cells.is_file():
        protocols = json.loads(cells.read_text())
    if protocols is not None:
        (output_dir(results, "readme") / "training_headline.md").write_text(training_headline(protocols))
    if comparisons is None and warm.is_file():
        comparisons = json.loads(warm.read_text())["headline"]
    if comparisons is not None:
        (output_dir(results, "readme") / "evidence_headline.md").write_text(evidence_headline(comparisons, bands))
        (output_dir(results, "readme") / "value_headline.md").write_text(value_headline(comparisons, bands))
    if targets.is_file() and not _quick_run(targets):
        (output_dir(results, "readme") / "allocation_headline.md").write_text(
            allocation_headline(json.loads(targets.read_text())))


def sync(readme: Path = ROOT / "README.md", results: Path = RESULTS, links_from: str = ".") -> list[str]:
    """Paste each marked section's table from the results root ``results`` into the document ``readme``; the names of
    the sections pasted. ``links_from``: the document's folder relative to the project root (the tables' relative
    links name paths from the root, rewritten to resolve from there)."""
    text = readme.read_text()
    done = []
    for name in re.findall(r"<!-- ([\w-]+):start -->", text):
        src = table_file(results, name)
        if src is None:
            print(f"skip {name}: no {name}.md in a folder of {results} yet", file=sys.stderr)
            continue
        if _quick_run(src.with_name(f"{name}_targets.json")):
            print(f"skip {name}: {src} comes from a --quick run; rerun the full benchmark", file=sys.stderr)
            continue
        body = relink(src.read_text().strip(), links_from)
        # the body between the markers may be empty (a fresh section) or a previous table
        text = re.sub(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)",
                      lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text, flags=re.S)
        done.append(name)
    readme.write_text(text)
    return done


def sync_all(results: Path = RESULTS, root: Path = ROOT) -> dict[str, list[str]]:
    """sync() every document of DOCS under ``root``: document -> the sections pasted."""
    return {doc: sync(root / doc, results, links_from=str(Path(doc).parent)) for doc in DOCS}


def relink(body: str, links_from: str) -> str:
    """The markdown ``body`` with each relative link target (a path from the project root) rewritten to resolve from
    the folder ``links_from`` (relative to the root; "." leaves them as they are)."""
    if links_from in ("", "."):
        return body
    return re.sub(r"\]\(([^)#:\s]+)(#[^)]*)?\)",
                  lambda m: f"]({os.path.relpath(m.group(1), links_from)}{m.group(2) or ''})", body)


def table_file(results: Path, name: str) -> Path | None:
    """The generator folder's <name>.md under the results root (None: none); more than one is an error."""
    found = sorted(p for p in results.glob(f"*/{name}.md") if p.parent.name != "archive")
    if len(found) > 1:
        raise ValueError(f"README section {name}: more than one {name}.md under {results}: "
                         f"{[str(p.relative_to(results)) for p in found]}")
    return found[0] if found else None


def _quick_run(meta: Path) -> bool:
    """Whether a benchmark's <name>_targets.json says its run was a --quick one."""
    if not meta.is_file():
        return False
    return bool(json.loads(meta.read_text()).get("run", {}).get("quick", False))


if __name__ == "__main__":
    write_headlines(RESULTS)
    for doc, names in sync_all().items():
        print(f"synced {doc}:", ", ".join(names) or "nothing")
