import os

# Two torch threads on these 2-core machines run 30-50x slower when the other core is busy.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from pathlib import Path  # noqa: E402

TESTS = Path(__file__).resolve().parent
# The longest files (minutes each: whole pipelines in subprocesses), slowest first, as measured under
# `make test` (`--durations`). `make test` runs one worker per core and keeps a file on one worker (--dist
# loadfile --no-loadscope-reorder: files are handed out in collection order, not by their number of tests),
# so these start first and overlap each other and the many short files instead of running alone at the end.
SLOW_FIRST = ("pipeline/test_replication.py", "pipeline/test_cluster.py", "pipeline/test_dvc_repro.py",
              "rollout/test_vllm_cpu.py", "pipeline/test_flows_local.py", "pipeline/test_thread_env.py",
              "pipeline/test_pretrained_path.py", "reliability/test_sigkill_resume.py", "reliability/test_runlock.py",
              "pipeline/test_recorded_warmstart.py", "pipeline/test_prefect_server.py", "benchmarks/test_study.py",
              "reliability/test_flow_resume.py", "pipeline/test_bad_params.py", "pipeline/test_local_server.py",
              "rollout/test_contract.py", "integrations/test_trl.py", "pipeline/test_lifeline.py")


def slow_first_key(path: Path) -> int:
    """The collection rank of a test file: its place in SLOW_FIRST, every other file after them (in its order)."""
    try:
        rel = path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return len(SLOW_FIRST)
    return SLOW_FIRST.index(rel) if rel in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 (pytest's hook signature)
    items.sort(key=lambda item: slow_first_key(item.path))  # stable: each file keeps its own order
