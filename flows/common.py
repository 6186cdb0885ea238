"""Shared flow helpers: params loading with overrides, --set parsing, JSON writing, Prefect run id, torch threads."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlvr_core.config import Params, load_params
from rlvr_core.config import parse_set as _parse_set
from tasks.paths import params_path


def load(params_file: str | None = None, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Params:
    """Validated params (file from ``params_file`` / $RLVR_PARAMS / params.yaml); raises ConfigError on bad values."""
    return load_params(params_path(params_file), overrides=overrides)


def fix_threads(threads: int) -> None:
    """Run torch's CPU work on ``threads`` threads (params ``train.threads``), whatever $OMP_NUM_THREADS says:
    float sums depend on the thread count, so a stage's results must not depend on the environment."""
    import torch

    torch.set_num_threads(threads)


def parse_set(items: Sequence[str], params_file: str | None = None) -> dict[str, Any]:
    """``--set`` items ['lr=5e-5', 'k=4'] -> {'lr': 5e-05, 'k': 4}, values read as params.yaml reads them;
    ConfigError names the params file and ``train.<key>`` and says the value came from --set."""
    return _parse_set(items, params_path(params_file))


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as sorted, indented JSON atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=float) + "\n")
    os.replace(tmp, path)


def flow_run_id() -> str:
    """The current Prefect flow run id ('' outside a flow run)."""
    from prefect.runtime import flow_run

    return str(flow_run.id or "")
