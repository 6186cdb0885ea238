"""MLflow tracking for the flows: every MLflow call of the project lives here.

Runs are addressed by id through ``MlflowClient`` (no global active run), so a
task can log into the flow's run from any thread. The default store is a SQLite
file under the root (``mlflow.db``); MLFLOW_TRACKING_URI overrides it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from tasks.paths import root

EXPERIMENT = "rlvr-alloc"


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else the SQLite file <root>/mlflow.db."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root() / 'mlflow.db'}"


def _client() -> Any:
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(tracking_uri())
    return MlflowClient(tracking_uri=tracking_uri())


def _experiment_id(client: Any, name: str = EXPERIMENT) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=(root() / "mlartifacts").as_uri())
    except Exception:  # noqa: BLE001 - created concurrently by another flow run
        return client.get_experiment_by_name(name).experiment_id


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)


def start_run(run_name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
    """Create a run with the flattened ``params`` and ``tags``; returns its id."""
    from mlflow.entities import Param, RunTag

    client = _client()
    run = client.create_run(_experiment_id(client), run_name=run_name, tags={k: str(v) for k, v in tags.items()})
    flat: dict[str, str] = {}
    _flatten("", params, flat)
    items = [Param(k, v[:6000]) for k, v in sorted(flat.items())]
    for i in range(0, len(items), 100):
        client.log_batch(run.info.run_id, params=items[i : i + 100])
    return run.info.run_id


class StepLogger:
    """on_step callback: logs every numeric value of a step record as an MLflow metric at that step.

    ``seconds`` accumulates the time spent inside MLflow (for the overhead measurement).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.client = _client()
        self.seconds = 0.0

    def __call__(self, rec: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        t0 = time.perf_counter()
        step = int(rec.get("step", 0))
        now = int(time.time() * 1000)
        metrics = [Metric(str(k), float(v), now, step) for k, v in rec.items()
                   if k != "step" and isinstance(v, (int, float)) and math.isfinite(float(v))]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
        self.seconds += time.perf_counter() - t0


def log_metrics(run_id: str, metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Log the numeric entries of ``metrics`` (at ``step`` if given)."""
    StepLogger(run_id)({**{k: v for k, v in metrics.items()}, "step": step or 0})


def log_dataset(run_id: str, data_dir: str, split: str, digest: str, context: str = "training") -> None:
    """Log a split of the dataset at ``data_dir`` as a run input, with ``digest`` (the DVC/content hash)."""
    import mlflow
    import pandas as pd
    from datasets import load_from_disk

    df = pd.DataFrame(load_from_disk(data_dir)[split][:])
    ds = mlflow.data.from_pandas(df, source=str(Path(data_dir).resolve()), name=f"{Path(data_dir).name}-{split}",
                                 digest=digest[:36])
    _client()
    with mlflow.start_run(run_id=run_id):
        mlflow.log_input(ds, context=context)


def log_artifacts(run_id: str, folder: str, artifact_path: str) -> None:
    """Upload ``folder`` as the run's artifact folder ``artifact_path``."""
    _client().log_artifacts(run_id, folder, artifact_path)


def end_run(run_id: str, status: str = "FINISHED") -> None:
    _client().set_terminated(run_id, status=status)


def set_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    client = _client()
    for k, v in tags.items():
        client.set_tag(run_id, k, str(v))


def get_run(run_id: str) -> Any:
    """The MLflow run (for tests and the nightly evaluation)."""
    return _client().get_run(run_id)


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in _client().get_metric_history(run_id, key)]
