"""Flow `prepare`: build the task's dataset into data/<task>/ (reads params `prepare`).

Each task builds its data as it registered it (rlvr_core.tasks): synthetic tasks (arithmetic,
countdown) are generated; hub tasks (math, code) load hub datasets (prepare.dataset /
prepare.eval_dataset, e.g. MATH train and MATH-500, or two LiveCodeBench releases) from the hub or
from local copies (prepare.path / prepare.eval_path),
see rlvr_core.config.PrepareConfig.
"""

from __future__ import annotations

import argparse

from prefect import flow

from flows.common import load, tie_children
from pipeline.paths import data_dir
from tasks.data import generate_dataset


@flow(name="prepare", log_prints=True)
def prepare(params_file: str | None = None) -> dict[str, int]:
    """Build the dataset named by prepare.task (generated or from the hub) and save it; returns rows per split."""
    cfg = load(params_file).prepare
    counts = generate_dataset(cfg, str(data_dir(cfg.task)))
    print(f"prepare: {cfg.task} {counts} -> {data_dir(cfg.task)}")
    return counts


if __name__ == "__main__":
    tie_children()  # its temporary Prefect server and every other child end with it, also on SIGKILL
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default=None, help="params file (default $RLVR_PARAMS or params.yaml)")
    prepare(params_file=ap.parse_args().params)
