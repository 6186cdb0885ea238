"""MLflow tracking for the flows: every MLflow call of the project lives here.

Runs are addressed by id through ``MlflowClient`` (no global active run), so a
task can log into the flow's run from any thread. The default store is a SQLite
file under the root (``mlflow.db``); MLFLOW_TRACKING_URI overrides it, e.g. with the URL of the
``mlflow server`` every worker logs to (docs/cluster.md).

Training never waits on, nor dies with, the tracking server: ``StepLogger``
appends step metrics it cannot send to a local JSONL spool (with a warning),
stops calling a server that just failed for ``retry_interval_s``, and replays
the spool in order on its next successful call (or ``flush()`` at the end of
the run). It also never logs a (metric, step) pair the run already has, so a
resumed run that repeats the steps after its last checkpoint leaves exactly one
entry per step. HTTP retries default to 2 and the request timeout to 20 s here
(MLflow's own defaults wait minutes on a dead server); the MLFLOW_HTTP_* env
variables override both.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.paths import root
from rlvr_core.safefs import append_line, write_text_atomic

EXPERIMENT = "rlvr-alloc"
SPOOL = "mlflow_spool.jsonl"
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
log = logging.getLogger(__name__)


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else the SQLite file <root>/mlflow.db."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root() / 'mlflow.db'}"


def private_store(uri: str) -> None:
    """Make a local SQLite store (``sqlite:///<path>``) this user's alone before MLflow opens it: created
    empty with mode 0600 (SQLite takes an empty file as an empty database, and its journal takes the
    database's mode), or, made by an older version with 0644, set to 0600. The store holds every run's
    parameters and tags, as prefect.db does. A link there, a file of another user, or a server URI is left
    as it is."""
    if not uri.startswith("sqlite:///"):
        return
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:  # a link, or a folder that is not there yet: MLflow says what is wrong
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _client() -> Any:
    import mlflow
    from mlflow.tracking import MlflowClient

    private_store(tracking_uri())
    mlflow.set_tracking_uri(tracking_uri())
    return MlflowClient(tracking_uri=tracking_uri())


def _experiment_id(client: Any, name: str = EXPERIMENT) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    # a tracking server stores artifacts itself (its --artifacts-destination, uploaded through it); a local
    # store keeps them beside it under <root>/mlartifacts
    server = tracking_uri().startswith(("http://", "https://"))
    try:
        return client.create_experiment(name, artifact_location=None if server else (root() / "mlartifacts").as_uri())
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
    from mlflow.entities import Param

    client = _client()
    run = client.create_run(_experiment_id(client), run_name=run_name, tags={k: str(v) for k, v in tags.items()})
    flat: dict[str, str] = {}
    _flatten("", params, flat)
    items = [Param(k, v[:6000]) for k, v in sorted(flat.items())]
    for i in range(0, len(items), 100):
        client.log_batch(run.info.run_id, params=items[i : i + 100])
    return run.info.run_id


# what a run was started from: a resumed run keeps the values it started with (``resume_run``)
LINEAGE_TAGS: tuple[str, ...] = ("data_md5", "base_model_md5", "base_model_sha256")


def resume_run(run_id: str, tags: Mapping[str, Any], *, keep: tuple[str, ...] = LINEAGE_TAGS,
               must_match: tuple[str, ...] = ()) -> bool:
    """Reopen run ``run_id`` (status RUNNING, ``tags`` set); False when the store has no such live run.

    A tag of ``keep`` the run already has with another value is not overwritten: the new value goes to
    ``resumed.<tag>`` and a warning names both. A tag of ``must_match`` with another value leaves the run
    untouched and returns False (with a warning): the caller starts a new run.
    """
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    if run.info.lifecycle_stage != "active":
        return False
    old = run.data.tags
    changed = {k: (old[k], str(v)) for k, v in tags.items() if k in keep + must_match and k in old and old[k] != str(v)}
    if conflict := [k for k in changed if k in must_match]:
        warnings.warn(f"MLflow run {run_id} was started from other inputs ({_changes(changed, conflict)}); it is "
                      "not continued: a new run is started", RuntimeWarning, stacklevel=2)
        return False
    client.update_run(run_id, status="RUNNING")
    for k, v in tags.items():
        client.set_tag(run_id, f"resumed.{k}" if k in changed else k, str(v))
    if changed:
        warnings.warn(f"MLflow run {run_id}: resumed with other lineage ({_changes(changed, list(changed))}); the "
                      "run keeps the values it started with, the new ones are tagged resumed.<tag>",
                      RuntimeWarning, stacklevel=2)
    return True


def _changes(changed: Mapping[str, tuple[str, str]], keys: list[str]) -> str:
    return ", ".join(f"{k} {changed[k][0]} there, {changed[k][1]} now" for k in keys)


class StepLogger:
    """on_step callback: logs every numeric value of a step record as an MLflow metric at that step.

    Args:
        run_id: the MLflow run; None while it could not be created yet (everything is
            spooled, see ``adopt_spool``)
        spool: JSONL file for records the server could not take (None: failures raise)
        retry_interval_s: after a failure, records go straight to the spool for this long
        client_factory: builds the MlflowClient (tests inject failing ones)
    ``seconds`` accumulates the time spent inside MLflow (for the overhead
    measurement); ``spooled`` and ``replayed`` count records.
    """

    def __init__(self, run_id: str | None, spool: str | os.PathLike | None = None, *, retry_interval_s: float = 30.0,
                 client_factory: Callable[[], Any] = _client) -> None:
        self.run_id = run_id
        self.spool = Path(spool) if spool is not None else None
        self.retry_interval_s = retry_interval_s
        self._factory = client_factory
        self._client: Any = None
        self._logged: set[tuple[str, int]] | None = None  # (key, step) pairs the run already has
        self._down_until = 0.0
        self.seconds = 0.0
        self.spooled = 0
        self.replayed = 0

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def __call__(self, rec: Mapping[str, Any]) -> None:
        """Log one step record (numeric, finite values; ``rec["step"]`` is the MLflow step)."""
        t0 = time.perf_counter()
        step = int(rec.get("step", 0))
        metrics = {str(k): float(v) for k, v in rec.items()
                   if k != "step" and isinstance(v, (int, float)) and math.isfinite(float(v))}
        entry = {"run_id": self.run_id, "step": step, "timestamp": int(time.time() * 1000), "metrics": metrics}
        try:
            if self.spool is None:
                self._send([entry])
            elif self.run_id is None or time.monotonic() < self._down_until:
                self._append([entry])
            else:
                try:
                    self._replay()
                    self._send([entry])
                except Exception as e:  # noqa: BLE001 - tracking must never stop training
                    self._down(e)
                    self._append([entry])
        finally:
            self.seconds += time.perf_counter() - t0

    def flush(self) -> int:
        """Replay the spool now (end of a run); returns how many records are still spooled."""
        if self.spool is None or self.run_id is None:
            return len(_read_spool(self.spool)) if self.spool is not None else 0
        try:
            self._replay()
        except Exception as e:  # noqa: BLE001
            self._down(e)
        return len(_read_spool(self.spool))

    # ----------------------------------------------------------------- helpers

    def _send(self, entries: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        if self._logged is None:
            self._logged = self._already_logged()
        batch = [Metric(k, v, e["timestamp"], e["step"]) for e in entries for k, v in e["metrics"].items()
                 if (k, e["step"]) not in self._logged]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])
        self._logged.update((m.key, m.step) for m in batch)

    def _already_logged(self) -> set[tuple[str, int]]:
        keys = self.client.get_run(self.run_id).data.metrics
        return {(k, m.step) for k in keys for m in self.client.get_metric_history(self.run_id, k)}

    def _replay(self) -> None:
        assert self.spool is not None
        spooled = _read_spool(self.spool)
        entries = [e for e in spooled if e.get("run_id") == self.run_id]
        if not entries:
            return
        self._send(entries)
        _write_spool(self.spool, [e for e in spooled if e.get("run_id") != self.run_id])
        self.replayed += len(entries)
        self._down_until = 0.0
        warnings.warn(f"MLflow reachable again: replayed {len(entries)} spooled step record(s) from {self.spool}",
                      RuntimeWarning, stacklevel=3)

    def _append(self, entries: list[dict[str, Any]]) -> None:
        assert self.spool is not None
        append_line(self.spool, "".join(json.dumps(e) + "\n" for e in entries), fsync=True)
        self.spooled += len(entries)

    def _down(self, error: BaseException) -> None:
        if self._down_until == 0.0:
            warnings.warn(f"MLflow unreachable ({error.__class__.__name__}: {str(error)[:300]}); step metrics go to "
                          f"{self.spool} and are replayed when it is reachable again", RuntimeWarning, stacklevel=3)
        self._down_until = time.monotonic() + self.retry_interval_s
        self._client = None  # a fresh client (and connection pool) on the next attempt


def adopt_spool(spool: str | os.PathLike, run_id: str) -> int:
    """Give the records spooled while no run existed (run_id None) to ``run_id``; returns how many."""
    path = Path(spool)
    entries = _read_spool(path)
    pending = sum(e.get("run_id") is None for e in entries)
    if pending:
        _write_spool(path, [{**e, "run_id": run_id} if e.get("run_id") is None else e for e in entries])
    return pending


def _write_spool(path: Path, entries: list[dict[str, Any]]) -> None:
    if not entries:
        path.unlink(missing_ok=True)
        return
    write_text_atomic(path, "".join(json.dumps(e) + "\n" for e in entries), fsync=True)


def _read_spool(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash
    return out


def log_metrics(run_id: str, metrics: Mapping[str, Any], step: int | None = None,
                spool: str | os.PathLike | None = None) -> None:
    """Log the numeric entries of ``metrics`` (at ``step`` if given), spooling them if MLflow is unreachable."""
    StepLogger(run_id, spool)({**{k: v for k, v in metrics.items()}, "step": step or 0})


def log_dataset(run_id: str, data_dir: str, split: str, digest: str, context: str = "training") -> None:
    """Log a split of the dataset at ``data_dir`` as a run input, with ``digest`` (the DVC/content hash)."""
    import mlflow
    import pandas as pd

    from rlvr_core.data.disk import load_saved_split

    df = pd.DataFrame(load_saved_split(data_dir, split))  # its arrow files checked first, as training reads them
    from mlflow.entities import DatasetInput, InputTag

    ds = mlflow.data.from_pandas(df, source=str(Path(data_dir).resolve()), name=f"{Path(data_dir).name}-{split}",
                                 digest=digest[:36])
    # through the client: a fluent start_run/end_run would mark the still-running run FINISHED
    _client().log_inputs(run_id, datasets=[DatasetInput(ds._to_mlflow_entity(),
                                                        tags=[InputTag("mlflow.data.context", context)])])


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


def nightly_evaluated() -> dict[str, list[int]]:
    """{run folder's path under the project root (tag ``run_path``): checkpoint steps} of every nightly
    evaluation the store holds (FINISHED runs). Evaluations of earlier versions, tagged with the folder's name
    only (``run``, which runs/<name>/ and runs/deployments/<name>/ share), are left out: those runs are
    evaluated once more.

    A worker's clone starts without reports/nightly/index.json; the tracking server knows what was evaluated.
    """
    client = _client()
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        return {}
    out: dict[str, set[int]] = {}
    for run in client.search_runs([exp.experiment_id], "tags.kind = 'nightly-eval' and attributes.status = 'FINISHED'",
                                  max_results=50000):
        name, ckpt = run.data.tags.get("run_path"), run.data.tags.get("checkpoint", "")
        if name and Path(ckpt).name.startswith("step_"):
            out.setdefault(name, set()).add(int(Path(ckpt).name.split("_")[-1]))
    return {k: sorted(v) for k, v in out.items()}
