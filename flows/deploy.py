"""Deploy the same flows to a Prefect work pool of GPU workers (not used by the tests).

    prefect work-pool create gpu --type process          # once, on the server
    prefect worker start --pool gpu                      # on every GPU machine (with this repo installed)
    python -m flows.deploy --source https://github.com/<org>/rlvr-alloc.git --pool gpu [--ref main]

Workers clone ``--source`` at ``--ref`` and run ``flows/train.py:train`` / ``flows/evaluate.py:evaluate``
there; each train deployment presets its allocator like flows/serve.py, and evaluate/nightly keeps its cron.
Use ``--params`` to point the workers at a GPU params file (e.g. a larger model and the vllm engine).
"""

from __future__ import annotations

import argparse

from prefect import flow

from flows.serve import ALLOCATORS


def deploy(source: str, pool: str, ref: str = "main", params: str | None = None, cron: str = "0 2 * * *") -> list[str]:
    """Register every deployment on work pool ``pool`` from git ``source``; returns the deployment ids."""
    from prefect.runner.storage import GitRepository

    repo = GitRepository(url=source, branch=ref)
    train_flow = flow.from_source(source=repo, entrypoint="flows/train.py:train")
    eval_flow = flow.from_source(source=repo, entrypoint="flows/evaluate.py:evaluate")
    extra = {"params_file": params} if params else {}
    ids = [train_flow.deploy(name=a.replace("+", "-"), work_pool_name=pool, parameters={"allocator": a, **extra},
                             tags=["train", a, "gpu"], build=False, push=False)
           for a in ALLOCATORS]
    ids.append(eval_flow.deploy(name="nightly", work_pool_name=pool, parameters={"nightly": True, **extra},
                                cron=cron, tags=["evaluate", "gpu"], build=False, push=False))
    return [str(i) for i in ids]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="git URL of this repository")
    ap.add_argument("--pool", default="gpu")
    ap.add_argument("--ref", default="main")
    ap.add_argument("--params", default=None, help="params file path inside the repository")
    ap.add_argument("--cron", default="0 2 * * *")
    a = ap.parse_args()
    print("\n".join(deploy(a.source, a.pool, a.ref, a.params, a.cron)))
