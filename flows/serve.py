"""Serve the deployments in one process against a Prefect server ($PREFECT_API_URL):

    train/<allocator> for every registered allocator (rlvr_core.allocation.ALLOCATORS: train/grpo,
        train/dapo, train/sara, train/saraplusdps, ...: the name as rlvr_core.registry.slug spells it)
    evaluate/nightly (cron, default 02:00 every day; --cron to change)

then `prefect deployment run train/sara` (optionally `--param steps=50`) starts a run.
RLVR_PARAMS and RLVR_ROOT in this process's environment choose the params file and run root.
"""

from __future__ import annotations

import argparse

from prefect import serve

from flows.evaluate import evaluate
from flows.train import train
from rlvr_core.allocation import ALLOCATORS
from rlvr_core.registry import slug


def deployments(cron: str = "0 2 * * *") -> list:
    """The train deployment per allocator (allocator preset) and the scheduled nightly evaluation."""
    out = [train.to_deployment(name=slug(a), parameters={"allocator": a}, tags=["train", a],
                               description=f"GRPO training with the {a} allocator")
           for a in ALLOCATORS.names()]
    out.append(evaluate.to_deployment(name="nightly", parameters={"nightly": True}, cron=cron, tags=["evaluate"],
                                      description="evaluate every run's newest checkpoint not yet evaluated"))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cron", default="0 2 * * *", help="schedule of evaluate/nightly")
    ap.add_argument("--limit", type=int, default=1, help="flow runs at a time (1: runs share the CPU/GPU)")
    a = ap.parse_args()
    serve(*deployments(a.cron), limit=a.limit)
