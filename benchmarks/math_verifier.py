"""Wall time of one step's math verification on hostile completions (it must stay bounded).

    python -m benchmarks.math_verifier [--n 256] [--timeout-s S] [--workers W]

Scores N hostile completions (towers of powers, deep nesting, huge factorials: each
makes math-verify run until its timeout) plus nothing else, through the training
loop's ``Scorer``, and prints one JSON line with the wall seconds. ``--timeout-s`` and
``--workers`` are passed only when given, so the same script times the code before
those keys existed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import time

import numpy as np

HOSTILE = (
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{" + "(" * 300 + "1" + ")" * 300 + "}",
    r"\boxed{10^{10^{10}}!}",
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--timeout-s", type=float, default=None)
    ap.add_argument("--workers", type=int, default=None)
    a = ap.parse_args()
    from rlvr_core.training import Scorer
    from rlvr_core.types import Rollouts

    rows = [{"id": "p0", "prompt": "What is 2+3?", "answer": "5"}]
    texts = [HOSTILE[i % len(HOSTILE)] for i in range(a.n)]
    ro = Rollouts(np.zeros(a.n, np.int64), np.zeros(a.n), np.ones(a.n, np.int64), [{"text": t} for t in texts])
    accepted = inspect.signature(Scorer).parameters
    kwargs = {k: v for k, v in (("timeout_s", a.timeout_s), ("workers", a.workers)) if v is not None}
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise SystemExit(f"this Scorer takes no {unknown}")
    scorer = Scorer("math", rows, **kwargs)
    t0 = time.perf_counter()
    scorer(ro)
    wall = time.perf_counter() - t0
    close = getattr(scorer, "close", None)
    if close:
        close()
    print(json.dumps({"n": a.n, **kwargs, "wall_s": round(wall, 1), "per_completion_s": round(wall / a.n, 3),
                      "reward_sum": float(ro.reward.sum()), "errors": scorer.errors, "timeouts": scorer.timeouts}))


if __name__ == "__main__":
    main()
