"""The study's command line: ``python -m benchmarks.study`` (the flags: benchmarks/study/__init__.py)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks import study
from benchmarks.common import RESULTS
from benchmarks.common import default_out as _default_out
from benchmarks.study import replication
from benchmarks.study.backfill import backfill_beliefs, backfill_logs
from benchmarks.study.execute import run_protocol, verify_policy
from benchmarks.study.heldout import CONTROL_CELLS, heldout_large
from benchmarks.study.plan import PROTOCOLS, QUICK, REGIMES, WS_SEP
from benchmarks.study.round_price import round_price
from benchmarks.study.store import RunStore
from benchmarks.study.summarize import aggregate


def default_out(out: Path | None, quick: bool) -> Path:
    """``out`` when given, else a fresh temporary folder for --quick (never benchmarks/results), else RESULTS."""
    return _default_out(out, quick, "study", full=RESULTS)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.study", description=study.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regime", default="hard", choices=sorted(REGIMES))
    ap.add_argument("--warm-start", type=int, default=None, metavar="J",
                    help=f"the regime from warm-start seed J (regime <regime>{WS_SEP}J: its own policy, reference "
                    "runs and target)")
    ap.add_argument("--protocol", default="equal-batch", choices=list(PROTOCOLS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=None, metavar="LABEL",
                    help="only these allocators of the protocol, in this order (default: all, in the protocol's order)")
    ap.add_argument("--quick", action="store_true", help="short warm start, 2 seeds, tiny budget, temporary --out")
    ap.add_argument("--out", type=Path, default=None, help="results root: run files and summaries in its study/ "
                    "(default benchmarks/results; --quick: a temporary folder)")
    ap.add_argument("--work", type=Path, default=None, help="run folders and policies (default runs/study)")
    ap.add_argument("--summarize-only", action="store_true", help="rebuild the outputs from the run files")
    ap.add_argument("--redraw", action="store_true", help="draw every cell's figure again, even one whose inputs "
                    "did not change (its PNG records a digest of them)")
    ap.add_argument("--verify-policy", action="store_true",
                    help="accept this machine's rebuilt warm start of --regime when its digest differs from the "
                    "target's: rerun reference seed 0 and keep policy.json if the curve is identical")
    ap.add_argument("--backfill-logs", action="store_true",
                    help="give --regime's runs without a decision log one: rerun each from its recorded settings and "
                    "keep the log only if the rerun equals the recorded run (benchmarks/study/backfill.py)")
    ap.add_argument("--backfill-beliefs", action="store_true",
                    help="give --regime's runs whose decision log predates the prior and p_eff columns, and whose "
                    "allocator holds them, a log with them: rerun each as --backfill-logs does and replace the log "
                    "only if the new one equals it at every row and column it has")
    ap.add_argument("--heldout-large", action="store_true",
                    help="evaluate --regime's runs of --cells on the large held-out set (14,000 problems): rerun each "
                    "from its recorded settings and keep the new curve only if the rerun equals the recorded run "
                    "(benchmarks/study/heldout.py)")
    ap.add_argument("--cells", nargs="+", default=None, metavar="PROTOCOL/VARIANT",
                    help="--heldout-large: the cells, as run folders (default: the DAPO control's, "
                    f"{' '.join(CONTROL_CELLS)}); --backfill-logs, --backfill-beliefs: only these cells' runs "
                    "(default: every run)")
    ap.add_argument("--limit", type=int, default=None, metavar="N",
                    help="--backfill-logs, --backfill-beliefs, --heldout-large: at most N runs in this command (resume "
                    "with the same command)")
    ap.add_argument("--replication", action="store_true",
                    help="the confirmatory replication of --regime (hard or pool): admit its fresh warm starts, then "
                    "run the tuned uniform GRPO and the claims' cells of benchmarks/study/hypotheses.json there at "
                    "its seeds (benchmarks/study/replication.py; resumable)")
    ap.add_argument("--round-price", action="store_true", help="measure the price of synchronous rounds")
    ap.add_argument("--round-steps", type=int, default=6)
    return ap


def main(argv: list[str] | None = None) -> int:
    for key, value in study.ENVIRONMENT.items():  # __main__ set them already; a caller in-process too
        os.environ.setdefault(key, value)
    args = parser().parse_args(argv)
    if sum((args.backfill_logs, args.backfill_beliefs, args.heldout_large)) > 1:
        parser().error("--backfill-logs, --backfill-beliefs and --heldout-large each rerun runs: give one per command")
    reruns = args.backfill_logs or args.backfill_beliefs or args.heldout_large
    if args.limit is not None and (args.limit < 1 or not reruns):
        parser().error("--limit takes a number of runs >= 1, with --backfill-logs, --backfill-beliefs or "
                       "--heldout-large")
    if args.replication and (args.warm_start is not None or reruns or args.summarize_only or args.round_price):
        parser().error("--replication chooses its own warm starts and runs its own cells: give it --regime only")
    if args.warm_start is not None:
        args.regime = f"{args.regime}{WS_SEP}{args.warm_start}"
    args.out = default_out(args.out, args.quick)
    if args.work is None:
        args.work = args.out / "work" if args.quick else Path("runs/study")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    seeds = list(range(QUICK["seeds"] if args.quick else args.seeds))
    if args.round_price:
        round_price(args.regime, work=args.work, results=args.out, quick=args.quick,
                    steps=2 if args.quick else args.round_steps)
        print((args.out / "study" / "training_round_price.md").read_text())
        return 0
    stamped = lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True)  # noqa: E731
    if args.heldout_large:
        heldout_large(RunStore(args.out), args.regime, work=args.work, cells=args.cells or list(CONTROL_CELLS),
                      limit=args.limit, log=stamped)
        return 0
    if args.backfill_logs or args.backfill_beliefs:
        fill = backfill_logs if args.backfill_logs else backfill_beliefs
        fill(RunStore(args.out), args.regime, work=args.work, limit=args.limit, cells=args.cells, log=stamped)
        return 0
    if args.verify_policy:
        verify_policy(RunStore(args.out), args.regime, work=args.work, log=stamped)
        return 0
    if args.replication:
        t0 = time.perf_counter()
        replication.run(args.regime, out=args.out, work=args.work, quick=args.quick, log=stamped)
        print(f"{args.regime}/replication: done in {time.perf_counter() - t0:.0f} s", flush=True)
    elif not args.summarize_only:
        t0 = time.perf_counter()
        run_protocol(args.regime, args.protocol, seeds, out=args.out, work=args.work, quick=args.quick,
                     variants=args.variants, log=stamped)
        print(f"{args.regime}/{args.protocol}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    records = aggregate(args.out, args.out, redraw=args.redraw)
    print(f"{len(records)} cells -> {args.out / 'study' / 'training_protocols.json'}")
    return 0
