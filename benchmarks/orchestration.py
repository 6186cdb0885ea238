"""Orchestration overhead: Prefect + MLflow time as a share of training-step time on the CPU default.

    python -m benchmarks.orchestration [--steps 5] [--policy models/warmstart]

Trains the default `train` section (allocator sara) for --steps steps twice from the same policy: once
with plain rlvr_core.training.train, once through the `train` flow's task with per-step MLflow logging
into a temporary SQLite store. Before that it times a process that runs one trivial flow, --repeats
times each way: with a temporary Prefect server of its own (a bare `dvc repro` stage) and against one local
server (`make run`: flows/local_server.py); medians side by side. Writes
benchmarks/results/orchestration/orchestration.json for the default 5 steps and policy, else a temporary folder
(printed) unless --out names one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import output_dir, results_dir

FULL = {"steps": 5, "policy": "models/warmstart", "data": "data/arithmetic", "repeats": 3}  # behind the results

TRIVIAL_FLOW = """
from prefect import flow, task
@task
def one():
    return 1
@flow(name="orchestration-trivial")
def trivial():
    return one()
assert trivial() == 1
"""


def flow_process_seconds(tmp: Path, repeats: int) -> dict:
    """Wall seconds of a fresh process running one trivial flow: own temporary server vs one local server."""
    from flows.local_server import prefect_server

    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    env.pop("PREFECT_API_URL", None)

    def once(extra: dict[str, str]) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", TRIVIAL_FLOW], env=dict(env, **extra), check=True,
                       capture_output=True, timeout=600)
        return time.perf_counter() - t0

    def timed(extra: dict[str, str]) -> list[float]:
        out = []
        for i in range(repeats):
            out.append(once(extra))
            print(f"  trivial flow process {i + 1}/{repeats} ({'local' if 'PREFECT_API_URL' in extra else 'temporary'}"
                  f" server): {out[-1]:.1f} s", flush=True)
        return out

    # a warm-up, so that the temporary side does not pay the first-use database migration of its home (the
    # local server migrates its own before it answers)
    temporary_home = {"PREFECT_HOME": str(tmp / "temporary_home")}
    once(temporary_home)
    temporary = timed(temporary_home)
    t0 = time.perf_counter()
    with prefect_server(tmp / "local_home", env=env) as url:
        start = time.perf_counter() - t0
        local = timed({"PREFECT_API_URL": url, "PREFECT_HOME": str(tmp / "local_home")})
    med_t, med_l = statistics.median(temporary), statistics.median(local)
    return {"repeats": repeats, "temporary_server_s": temporary, "local_server_s": local,
            "median_temporary_server_s": med_t, "median_local_server_s": med_l,
            "local_server_start_s": start, "saved_per_process_s": med_t - med_l}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=FULL["steps"])
    ap.add_argument("--policy", default=FULL["policy"], help="policy folder (warm start output)")
    ap.add_argument("--data", default=FULL["data"])
    ap.add_argument("--repeats", type=int, default=FULL["repeats"], help="trivial-flow processes timed each way")
    ap.add_argument("--out", type=Path, default=None,
                    help="results root, written under its orchestration/ (default benchmarks/results for the full "
                         "protocol, else a temporary one)")
    a = ap.parse_args(argv)
    full = all(getattr(a, key) == v for key, v in FULL.items())
    out_dir = output_dir(results_dir(a.out, full, "orchestration"), "orchestration")
    tmp = Path(tempfile.mkdtemp(prefix="orch_"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
    os.environ.setdefault("RLVR_ROOT", str(tmp))
    processes = flow_process_seconds(tmp, a.repeats)
    # the in-process flow below starts its temporary server on a home whose database exists already
    os.environ.setdefault("PREFECT_HOME", str(tmp / "temporary_home"))
    from prefect import flow

    from pipeline import tracking
    from rlvr_core.config import load_params
    from rlvr_core.training import check_and_train
    from tasks.data import load_split
    from tasks.training import run_training

    cfg = load_params("params.yaml", overrides={"train": {"steps": a.steps, "eval_every": 0}}).train
    rows = load_split(a.data, "train"), load_split(a.data, "test")
    t0 = time.perf_counter()
    plain = check_and_train(cfg, policy_dir=a.policy, train_rows=rows[0], test_rows=rows[1], run_dir=tmp / "plain",
                            resume=False)
    plain_s = time.perf_counter() - t0

    @flow(name="orchestration-bench")
    def bench() -> dict:
        run_id = tracking.start_run("bench", {"train": cfg.__dict__}, {"kind": "bench"})
        res = run_training(cfg, a.policy, a.data, "arithmetic", str(tmp / "flow"), run_id)
        tracking.end_run(run_id)
        return res

    t0 = time.perf_counter()
    res = bench()
    flow_s = time.perf_counter() - t0
    plain_step = sum(r.get("step_s", 0) for r in plain.metrics)
    flow_step = sum(r.get("step_s", 0) for r in res["history"])
    out = {
        "steps": a.steps, "allocator": cfg.allocator, "batch_size": cfg.batch_size, "k": cfg.k,
        "plain_train_s": plain_s, "plain_step_s_total": plain_step,
        "flow_wall_s": flow_s, "flow_task_s": res["seconds"], "flow_step_s_total": flow_step,
        "mlflow_step_logging_s": res["tracking_seconds"],
        "mlflow_share_of_step_time": res["tracking_seconds"] / max(flow_step, 1e-9),
        "per_step_overhead_s": (res["seconds"] - plain_s) / a.steps,
        "per_step_overhead_share": (res["seconds"] - plain_s) / max(plain_s, 1e-9),
        "fixed_flow_overhead_s": flow_s - res["seconds"],
        "flow_process": processes,
    }
    (out_dir / "orchestration.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
