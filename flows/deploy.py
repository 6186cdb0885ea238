"""Deploy the same flows to a Prefect work pool of GPU workers (docs/cluster.md; tests/pipeline/test_cluster.py).

    prefect work-pool create gpu --type process          # once, on the server
    prefect worker start --pool gpu --limit 1            # on every GPU machine (with this repo's environment)
    python -m flows.deploy --source https://github.com/<org>/rlvr-alloc.git --pool gpu [--ref main] \\
        [--remote store --tracking-uri http://mlflow-host:5000]

Workers clone ``--source`` at ``--ref`` and run ``flows/train.py:train`` / ``flows/evaluate.py:evaluate``
there; each train deployment presets its allocator like flows/serve.py, and evaluate/nightly keeps its cron.
``--remote`` and ``--tracking-uri`` go to the runs' environment as RLVR_DVC_REMOTE and MLFLOW_TRACKING_URI:
a run then pulls its inputs from that DVC remote, pushes its outputs and dvc.lock back, and logs to the
tracking server (pipeline/remote.py). Use ``--params`` to point the workers at a params file committed to the
repository (without a remote; with one, dvc.lock records params.yaml, so commit the values there).
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from prefect import flow

from flows.serve import ALLOCATORS
from pipeline.remote import check_branch_name
from rlvr_core.errors import ConfigError
from rlvr_core.registry import slug


def check_params_in_repo(params: str, ref: str, repo_dir: Path) -> None:
    """``params`` must be a relative path committed at ``ref`` (or origin/``ref``) of the checkout ``repo_dir``."""
    if Path(params).is_absolute() or ".." in Path(params).parts:
        raise ConfigError(f"--params {params}: workers read it from their clone; give a path inside the repository")
    for rev in (ref, f"origin/{ref}"):
        p = subprocess.run(["git", "cat-file", "-e", f"{rev}:{params}"], cwd=repo_dir, capture_output=True)
        if p.returncode == 0:
            return
    raise ConfigError(f"--params {params}: not in the repository at {ref} (checked {repo_dir}); the workers clone "
                      f"{ref} and would not find it: commit and push it first")


def deploy(source: str, pool: str, ref: str = "main", params: str | None = None, cron: str = "0 2 * * *",
           remote: str | None = None, tracking_uri: str | None = None, repo_dir: str | Path = ".",
           publish_branch: str | None = None) -> list[str]:
    """Register every deployment on work pool ``pool`` from git ``source``; returns the deployment ids.
    ``publish_branch`` (RLVR_GIT_BRANCH) is the branch workers push dvc.lock to: needed when ``ref`` is a tag."""
    from prefect.runner.storage import GitRepository

    if params:
        check_params_in_repo(params, ref, Path(repo_dir))
    if publish_branch:
        check_branch_name(publish_branch, "--publish-branch (RLVR_GIT_BRANCH)")
    env = {k: v for k, v in (("RLVR_DVC_REMOTE", remote), ("MLFLOW_TRACKING_URI", tracking_uri),
                             ("RLVR_GIT_BRANCH", publish_branch)) if v}
    jobvars = {"env": env} if env else None
    repo = GitRepository(url=source, branch=ref)
    train_flow = flow.from_source(source=repo, entrypoint="flows/train.py:train")
    eval_flow = flow.from_source(source=repo, entrypoint="flows/evaluate.py:evaluate")
    extra = {"params_file": params} if params else {}
    ids = [train_flow.deploy(name=slug(a), work_pool_name=pool, parameters={"allocator": a, **extra},
                             tags=["train", a, "gpu"], job_variables=jobvars, build=False, push=False,
                             print_next_steps=False, ignore_warnings=True)
           for a in ALLOCATORS]
    ids.append(eval_flow.deploy(name="nightly", work_pool_name=pool, parameters={"nightly": True, **extra},
                                cron=cron, tags=["evaluate", "gpu"], job_variables=jobvars, build=False, push=False,
                                print_next_steps=False, ignore_warnings=True))
    return [str(i) for i in ids]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, help="git URL of this repository")
    ap.add_argument("--pool", default="gpu")
    ap.add_argument("--ref", default="main")
    ap.add_argument("--params", default=None, help="params file path inside the repository")
    ap.add_argument("--cron", default="0 2 * * *")
    ap.add_argument("--remote", default=None, help="DVC remote name (or URL) the runs pull from and push to")
    ap.add_argument("--tracking-uri", default=None, help="MLflow tracking server every run logs to")
    ap.add_argument("--publish-branch", default=None,
                    help="branch the runs push dvc.lock to (default: --ref; needed when --ref is a tag or a commit)")
    a = ap.parse_args()
    try:
        print("\n".join(deploy(a.source, a.pool, a.ref, a.params, a.cron, a.remote, a.tracking_uri,
                                publish_branch=a.publish_branch)))
    except ConfigError as e:
        raise SystemExit(f"flows.deploy: {e}") from None
