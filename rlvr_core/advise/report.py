"""The advisor's outputs and command line: ``python -m rlvr_core.advise LOG [--k 8] [--batch 32] [--out DIR]``
(also ``rlvr-alloc advise``). Prints the markdown report and writes ``advice.md``, ``advice.json`` and
``advice.png`` into ``--out`` (default: ``advice/<log's folder>-<log's stem>/`` under the current directory, so
never into a run folder that the DVC pipeline hashes; ``default_out``). docs/advisor.md describes every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path

from rlvr_core.advise.core import Advice, AllocatorAdvice, advise, pct
from rlvr_core.advise.logs import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_COLUMNS,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_ROWS,
    Limits,
    LogError,
    format_size,
    parse_size,
)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _count(text: str, what: str = "row") -> int:
    try:
        n = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a {what} count of at least 1: {text!r}")
    return n


def _rows(text: str) -> int:
    return _count(text)


def _columns(text: str) -> int:
    return _count(text, "column")


def _num(t: tuple[float, float, float] | None, digits: int = 2) -> str:
    if t is None or not math.isfinite(t[0]):
        return "n/a"
    return f"{t[0]:.{digits}f} [{t[1]:.{digits}f}, {t[2]:.{digits}f}]"


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None or not math.isfinite(v) else format(v, spec)


def phase_table(adv: Advice) -> list[str]:
    """One row per phase; a figure the log cannot support is n/a."""
    lines = ["| phase | steps | rows | pass share | population Beta(a, b) | pass rate 10/50/90% | logged group size | "
             "zero-variance, logged | zero-variance at k | floor / k | floor rule |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in adv.phases:
        q = "/".join(f"{v:.2f}" for v in p.rate_quantiles) if p.rate_quantiles is not None else "n/a"
        beta = f"({p.beta[0]:.2f}, {p.beta[1]:.2f})" if p.beta is not None else "n/a"
        rule = p.floor_abandon_after_fails
        fails = ("n/a" if rule is None else "never abandon" if rule >= adv.k else
                 f"abandon after {rule} fail(s) in a row")
        lines.append(f"| {p.name} | {p.first_step}-{p.last_step} | {p.rows} | {p.pass_share:.3f} | {beta} | {q} | "
                     f"{p.logged_group_size:g} | {_fmt(p.zero_variance_logged, '.3f')} | "
                     f"{_fmt(p.zero_variance_at_k, '.3f')} | {_fmt(p.floor_ratio_to_k, '.2f')} | {fails} |")
    return lines


def _rank(a: AllocatorAdvice) -> tuple[float, float]:
    """Table order: the largest predicted saving to target first, then the largest proxy saving."""
    def first(t: tuple[float, float, float] | None) -> float:
        return t[0] if t is not None and math.isfinite(t[0]) else -math.inf

    return -first(a.predicted_saving_to_target), -first(a.saving_vs_grpo)


def allocator_table(adv: Advice) -> list[str]:
    lines = ["| allocator | predicted saving to target vs grpo | proxy: saving per trained row vs grpo | vs dapo | "
             "rollouts / trained row | rollouts / effective group | tokens / effective group | validated error | "
             "calibration |", "|---|---|---|---|---|---|---|---|---|"]
    for a in sorted(adv.allocators, key=_rank):
        err = f"{a.validated_error:.0%}" if a.validated_error is not None else "not validated"
        pred = a.predicted_saving_to_target
        lines.append(f"| {a.name} | {pct(pred) if pred else 'n/a'} | "
                     f"{pct(a.saving_vs_grpo) if a.saving_vs_grpo else 'n/a'} | "
                     f"{pct(a.saving_vs_dapo) if a.saving_vs_dapo else 'n/a'} | {_num(a.rollouts_per_trained_row)} | "
                     f"{_num(a.rollouts_per_effective_group, 1)} | {_num(a.tokens_per_effective_group, 0)} | {err} | "
                     f"{a.calibration_note or '-'} |")
    return lines


def recurrence_line(adv: Advice) -> str:
    """The log's recurrence in a sentence."""
    r = adv.recurrence
    if r is None:
        return ""
    gap = f", {r.mean_gap:.1f} steps apart on average" if r.mean_gap is not None else ""
    return (f"Recurrence: {r.recurring} of {r.prompts} distinct prompts ({r.share:.1%}) were logged at more than "
            f"one step{gap}.")


def replayed_prompts(adv: Advice) -> str:
    """What the replay drew: prompts per seed, and the most that recurred under any allocator."""
    if not adv.allocators:
        return ""
    drawn = max(a.replayed_prompts for a in adv.allocators)
    rec = max(a.replayed_recurring_prompts for a in adv.allocators)
    return (f"The replay drew at most {drawn:,.0f} prompts per seed, {rec:,.1f} of them in more than one step (mean "
            "over seeds, the most under any allocator). ")


def render(adv: Advice) -> str:
    """The report as markdown (what is printed and written to advice.md)."""
    tok = ("no tokens column: token figures n/a" if adv.token_model is None else
           f"tokens per rollout fitted to the log: {adv.token_model[0]:.1f} for a pass, x{adv.token_model[1]:.2f} "
           "for a fail")
    replayed = bool(adv.allocators)
    replay = (f"Replay: k = {adv.k}, batch = {adv.batch} prompts, {adv.sim_steps} simulated steps over the logged "
              f"run, {adv.seeds} replay seeds, {adv.replay_note}; {tok}. {replayed_prompts(adv)}Intervals: 95% "
              "t-intervals over the replay seeds." if replayed else
              "Not replayed: the log cannot support it (the warning above).")
    whole = f"{adv.floor_ratio_to_k:.2f} k" if adv.floor_ratio_to_k is not None else "n/a"
    out = [f"# Allocation advice for {adv.log}", ""] + [f"**Warning.** {w}." for w in adv.warnings]
    out += ["", f"**Recommendation.** {adv.recommendation}.", "", f"Validation: {adv.validation}.", "",
            f"Log: {adv.rows} (step, prompt) rows over {adv.steps} steps. {recurrence_line(adv)} {replay}", "",
            "## The run's pass-rate population, by phase", ""] + phase_table(adv)
    out += ["", f"Floor class: {adv.floor_class}. Whole run: {whole}.", "",
            "## Every registered allocator replayed on this log", ""]
    out += allocator_table(adv) if replayed else ["None: this log cannot support the replay (the warning above "
                                                  "says why)."]
    if adv.skipped:
        out += ["", "Not replayed (do not build with default parameters): "
                + "; ".join(f"{n}: {why}" for n, why in adv.skipped.items())]
    return "\n".join(out) + "\n"


def plot(adv: Advice, path: Path) -> None:
    """Rollouts per trained row per allocator with intervals, and the floor (per trained row, k rows a group)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def cost(a: AllocatorAdvice) -> tuple[float, float, float]:
        return a.rollouts_per_trained_row or tuple(v / adv.k for v in a.rollouts_per_effective_group)

    rows = sorted(adv.allocators, key=lambda a: cost(a)[0])
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1.6))
    if not rows or adv.floor_ratio_to_k is None:  # a log the advisor cannot replay: say so, draw nothing
        ax.axis("off")
        ax.text(0.5, 0.5, textwrap.fill(f"{Path(adv.log).name}: {adv.recommendation}.", 70), ha="center", va="center",
                fontsize=9, transform=ax.transAxes)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return
    for i, a in enumerate(rows):
        m, lo, hi = cost(a)
        if not all(math.isfinite(v) for v in (m, lo, hi)):  # a replay seed found no effective group
            ax.text(0.02, i, "n/a: no trained row in some replay seed", va="center", fontsize=8,
                    transform=ax.get_yaxis_transform())
            continue
        ax.barh(i, m, color="tab:blue" if a.name != "grpo" else "tab:gray")
        ax.errorbar(m, i, xerr=[[m - lo], [hi - m]], color="black", capsize=3)
    ax.axvline(adv.floor_ratio_to_k, color="tab:red", ls="--", label=f"screening floor {adv.floor_ratio_to_k:.2f}")
    ax.axvline(1.0, color="tab:green", ls=":", label="oracle (every rollout trains)")
    ax.set_yticks(range(len(rows)), [a.name for a in rows])
    ax.set_xlabel("simulated rollouts per trained row (lower is better)")
    ax.set_title(f"{Path(adv.log).name}: k = {adv.k}, batch = {adv.batch}", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _json_safe(x: object) -> object:
    """``x`` with every non-finite float as None: advice.json is strict JSON (NaN and Infinity are not JSON; a
    figure with no effective group to divide by is n/a, null)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def write(adv: Advice, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "advice.md", "json": out / "advice.json", "png": out / "advice.png"}
    paths["md"].write_text(render(adv), encoding="utf-8")
    paths["json"].write_text(json.dumps(_json_safe(adv.to_json()), indent=1, default=str, allow_nan=False) + "\n",
                             encoding="utf-8")
    plot(adv, paths["png"])
    return paths


def default_out(log: Path) -> Path:
    """``advice/<folder>-<stem>/`` under the current directory: runs/grpo-s0/rollouts.parquet ->
    advice/grpo-s0-rollouts/. Never beside the log, where it would change the hash of a DVC dependency (``runs``
    is one of the evaluate and report stages'); the folder's name keeps two runs' rollouts.parquet apart."""
    folder = Path(log).resolve().parent.name
    return Path("advice") / (f"{folder}-{Path(log).stem}" if folder else Path(log).stem)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rlvr-alloc advise", description="Will rollout allocation pay on my run? "
                                 "Replays every registered allocator on a run's own rollout log (docs/advisor.md).")
    ap.add_argument("log", type=Path, help="rollouts.parquet, a RolloutLogCallback log, a .csv/.jsonl of "
                    "(step, prompt_id, reward[, tokens]) rows, one per completion, or a TRL completion log "
                    "(<output_dir>/completions/ of GRPOConfig(log_completions=True), or one of its files), or a "
                    "verl rollout dump (the trainer.rollout_data_dir folder)")
    ap.add_argument("--k", type=int, default=8, help="group size (rollouts per prompt), default 8")
    ap.add_argument("--batch", type=int, default=32, help="prompts per step, default 32")
    ap.add_argument("--seeds", type=int, default=5, help="replay seeds behind each interval, default 5")
    ap.add_argument("--steps", type=int, default=60, help="simulated steps over the logged run, default 60")
    ap.add_argument("--pool", type=int, default=None, metavar="N",
                    help="force a recurring pool of N prompts: 'what if my prompts recurred' (default: a stream of "
                    "fresh prompts if no prompt of the log recurs, else the largest prompt id + 1)")
    ap.add_argument("--reward-column", action="append", default=None, metavar="NAME", dest="reward_columns",
                    help="a TRL completion log's or verl dump's reward column (repeat for several, summed; default: "
                    "TRL's every numeric column but step, advantage and tokens; verl's score)")
    ap.add_argument("--out", type=Path, default=None, help="folder for advice.{md,json,png} (default: "
                    "advice/<LOG's folder>-<LOG's stem>/ under the current directory)")
    ap.add_argument("--max-rows", type=_rows, default=DEFAULT_MAX_ROWS, metavar="N",
                    help=f"refuse a log of more rows (default {DEFAULT_MAX_ROWS:,}; docs/advisor.md, Size limits)")
    ap.add_argument("--max-bytes", type=_size, default=DEFAULT_MAX_BYTES, metavar="SIZE",
                    help=f"refuse a log whose columns decode to more (e.g. 8GiB; default "
                    f"{format_size(DEFAULT_MAX_BYTES)})")
    ap.add_argument("--max-line-bytes", type=_size, default=DEFAULT_MAX_LINE_BYTES, metavar="SIZE",
                    help=f"refuse a .csv/.jsonl log with a longer line (default {format_size(DEFAULT_MAX_LINE_BYTES)})")
    ap.add_argument("--max-columns", type=_columns, default=DEFAULT_MAX_COLUMNS, metavar="N",
                    help=f"refuse a log of more columns (a JSONL log's distinct keys; default {DEFAULT_MAX_COLUMNS:,})")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    limits = Limits(args.max_rows, args.max_bytes, args.max_line_bytes, args.max_columns)
    try:
        adv = advise(args.log, k=args.k, batch=args.batch, seeds=args.seeds, steps=args.steps, pool=args.pool,
                     limits=limits, reward_columns=args.reward_columns)
    except (LogError, FileNotFoundError, ValueError) as e:
        print(f"rlvr-alloc advise: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"rlvr-alloc advise: error: {args.log}: ran out of memory replaying the log ({e.__class__.__name__}); "
              "give a smaller log or lower --max-rows", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else default_out(args.log)
    paths = write(adv, out)
    sys.stdout.write(render(adv))
    for w in adv.warnings:  # also on stderr, so that a script that keeps only stdout's files still sees them
        print(f"rlvr-alloc advise: warning: {args.log}: {w}", file=sys.stderr)
    print(f"\nwritten: {', '.join(str(p) for p in paths.values())}")
    return 0

