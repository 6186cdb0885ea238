"""Beyond one machine: a worker (its own clone) pulls from a DVC remote, logs to an MLflow server, pushes back.

The fast tests: a bad worker setup stops before compute with a message naming what is missing.
The slow test plays two machines on localhost (Prefect server, process work pool + worker, MLflow server,
a DVC remote in a local directory, a bare git origin reached through a file:// URL).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from rlvr_core.allocation import ALLOCATORS
from rlvr_core.errors import ConfigError
from tests.pipeline.conftest import PROJECT, PY, TINY, copy_project, free_port, sh, stop

GIT_ID = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def tiny_params_yaml() -> str:
    """The project's params.yaml with the tiny values laid over it (dvc needs every key a stage lists)."""
    full = yaml.safe_load((PROJECT / "params.yaml").read_text())
    for sec, vals in yaml.safe_load(TINY.read_text()).items():
        full[sec].update(vals)
    full["train"]["allocator_params"] = {}
    return yaml.safe_dump(full)


# ------------------------------------------------------------------ bad setups, before compute

@pytest.fixture
def worker_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A committed git + DVC repository as a worker's clone; env as on a worker with no credentials."""
    repo = tmp_path / "clone"
    repo.mkdir()
    (repo / "params.yaml").write_text(tiny_params_yaml())
    env = {**os.environ, **GIT_ID}
    sh(env, repo, "git", "init", "-q", "-b", "main")
    sh(env, repo, PY, "-m", "dvc", "init", "-q")
    (tmp_path / "remote").mkdir()
    sh(env, repo, PY, "-m", "dvc", "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh(env, repo, "git", "add", "-A")
    sh(env, repo, "git", "commit", "-qm", "clone")
    for k in list(os.environ):
        if k.startswith("AWS_") or k in ("SSH_AUTH_SOCK", "DVC_STAGE", "RLVR_PARAMS"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.aws, no ~/.ssh keys
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    monkeypatch.setenv("RLVR_ROOT", str(repo))
    monkeypatch.setenv("RLVR_DVC_REMOTE", "store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    return repo


def test_no_remote_is_local_mode(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import remote

    monkeypatch.delenv("RLVR_DVC_REMOTE")
    assert remote.setup() is None
    monkeypatch.setenv("RLVR_DVC_REMOTE", "store")
    monkeypatch.setenv("DVC_STAGE", "train@sara-0")  # inside `dvc repro`, DVC records the stage itself
    assert remote.setup() is None


def test_remote_without_credentials(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import remote

    sh(None, worker_clone, PY, "-m", "dvc", "remote", "add", "s3store", "s3://rlvr-bucket/cache")
    sh(None, worker_clone, PY, "-m", "dvc", "remote", "add", "sshstore", "ssh://gpu-host/srv/dvc")
    monkeypatch.setenv("RLVR_DVC_REMOTE", "s3store")
    with pytest.raises(ConfigError,
                       match=r"'s3store' \(s3://rlvr-bucket/cache\): no S3 credentials.*AWS_ACCESS_KEY_ID"):
        remote.setup()
    monkeypatch.setenv("RLVR_DVC_REMOTE", "sshstore")
    with pytest.raises(ConfigError, match=r"'sshstore' \(ssh://gpu-host/srv/dvc\): no SSH credentials.*id_ed25519"):
        remote.setup()


def test_unreachable_or_unknown_remote(worker_clone: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train import train
    from pipeline import remote

    shutil.rmtree(tmp_path / "remote")  # the shared directory is not mounted on this worker
    with pytest.raises(ConfigError, match=r"DVC remote 'store' .* unreachable from this worker: .*remote is not a dir"):
        train.fn(allocator="sara")
    assert not (worker_clone / "runs").exists() and not (worker_clone / "data").exists()  # nothing computed
    monkeypatch.setenv("RLVR_DVC_REMOTE", "nas")
    with pytest.raises(ConfigError, match=r"RLVR_DVC_REMOTE=nas: no DVC remote of that name .*configured: store"):
        remote.setup()
    shutil.rmtree(worker_clone / ".dvc")
    with pytest.raises(ConfigError, match=r"not a DVC repository \(no .dvc/\)"):
        remote.setup()


def test_unreachable_tracking_server(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.evaluate import evaluate
    from pipeline import remote

    uri = os.environ["MLFLOW_TRACKING_URI"]
    with pytest.raises(ConfigError, match=rf"MLflow tracking server {uri} is unreachable .*spool.*still spooled"):
        evaluate.fn(nightly=True)
    assert not (worker_clone / "reports").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{worker_clone / 'mlflow.db'}")
    with pytest.raises(ConfigError, match=r"tracking URI is sqlite:.*set MLFLOW_TRACKING_URI=http://"):
        remote.setup()


def test_params_file_not_in_repository(worker_clone: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.deploy import check_params_in_repo, deploy
    from pipeline import remote

    monkeypatch.setattr(remote, "check_tracking_server", lambda uri: None)  # the server is not what is tested here
    (worker_clone / "params_gpu.yaml").write_text(tiny_params_yaml())  # on disk, never committed
    with pytest.raises(ConfigError, match=r"params file params_gpu.yaml: not in the repository this worker cloned"):
        remote.setup("params_gpu.yaml")
    with pytest.raises(ConfigError, match=r"params file nowhere.yaml: not in the repository"):
        remote.setup("nowhere.yaml")
    assert remote.setup("params.yaml") is not None
    # flows.deploy refuses before registering anything (no Prefect server is running here)
    with pytest.raises(ConfigError, match=r"--params params_gpu.yaml: not in the repository at main"):
        deploy("file:///nowhere.git", "gpu", "main", "params_gpu.yaml", repo_dir=worker_clone)
    with pytest.raises(ConfigError, match=r"give a path inside the repository"):
        check_params_in_repo("/etc/params.yaml", "main", worker_clone)
    check_params_in_repo("params.yaml", "main", worker_clone)


def test_run_params_must_match_params_yaml(worker_clone: Path) -> None:
    """With a remote, dvc.lock records params.yaml: a run with other values is refused, not recorded wrongly."""
    from flows.common import load
    from pipeline import remote

    sync = remote.Remote("store", worker_clone)
    (worker_clone / "dvc.yaml").write_text((PROJECT / "dvc.yaml").read_text())
    params = load(None, overrides={"train": {"steps": 50}})
    with pytest.raises(ConfigError, match=r"stage train@sara-0 .* train differs \(\{'steps': 50\}\); commit the"):
        remote.prepare_training(sync, worker_clone / "runs" / "sara-s0", params)
    with pytest.raises(ConfigError, match=r"no dvc.yaml stage writes .*runs/vigor-s0/checkpoints"):
        remote.prepare_training(sync, worker_clone / "runs" / "vigor-s0", load(None))
    with pytest.raises(ConfigError, match=r"no dvc.yaml stage writes .*runs/sara-s1/checkpoints"):  # train.seeds [0]
        remote.prepare_training(sync, worker_clone / "runs" / "sara-s1", load(None, overrides={"train": {"seed": 1}}))


# ------------------------------------------------------------------ two machines on localhost

def _wait_http(url: str, proc: subprocess.Popen, log: Path, what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None and time.time() < deadline, f"{what} did not start:\n{log.read_text()[-3000:]}"
        time.sleep(1)


PREFECT_QUERY = """
import json, sys
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as c:
    if sys.argv[1] == "flow-run":
        r = c.read_flow_run(sys.argv[2])
        print(json.dumps({"work_pool": r.work_pool_name, "state": r.state.type.value,
                          "deployment_id": str(r.deployment_id)}))
    else:
        for i in sys.argv[2:]:
            c.delete_deployment(i)
"""


def _lock_outs(repo: Path) -> dict[str, str]:
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    return {o["path"]: o["md5"] for st in stages.values() for o in st.get("outs", [])}


@pytest.mark.slow
def test_two_machines_on_localhost(prefect_server: str, prefect_auth: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    bin_dir = Path(PY).parent
    prefect = str(bin_dir / "prefect")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "RLVR_ROOT", "RLVR_PARAMS", "MLFLOW_TRACKING_URI", "RLVR_DVC_REMOTE",
                        "DVC_STAGE")}
    env.update(GIT_ID, PATH=f"{bin_dir}:{env['PATH']}", PREFECT_API_URL=prefect_server, DO_NOT_TRACK="1",
               PREFECT_API_AUTH_STRING=prefect_auth, DVC_NO_ANALYTICS="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               OMP_NUM_THREADS="1",
               PREFECT_HOME=str(tmp_path / "laptop" / ".prefect"))
    remote_dir, origin = tmp_path / "dvc-remote", tmp_path / "origin.git"
    remote_dir.mkdir()

    procs: list[tuple[subprocess.Popen, object]] = []
    deployment_ids: list[str] = []
    pool = f"cluster-{free_port()}"
    mlflow_port = free_port()
    mlflow_uri = f"http://127.0.0.1:{mlflow_port}"
    worker_dir = tmp_path / "worker"
    worker_dir.mkdir()
    try:
        # the tracking server every machine logs to
        (tmp_path / "mlflow").mkdir()
        mlog = open(tmp_path / "mlflow" / "server.log", "w")
        mserver = subprocess.Popen(
            [str(bin_dir / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
             "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}",
             "--artifacts-destination", str(tmp_path / "mlflow" / "artifacts"), "--workers", "1"],
            env=env, cwd=tmp_path / "mlflow", stdout=mlog, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((mserver, mlog))

        # machine B, "the GPU box": a process work pool and a worker in its own directory, no project on its path
        sh(env, tmp_path, prefect, "work-pool", "create", pool, "--type", "process")
        wenv = dict(env, PREFECT_HOME=str(worker_dir / ".prefect"), PREFECT_WORKER_QUERY_SECONDS="2")
        wlog = open(worker_dir / "worker.log", "w")
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", pool, "--name", "gpu-box", "--limit", "1"],
                                  env=wenv, cwd=worker_dir, stdout=wlog, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        procs.append((worker, wlog))

        # machine A, "the laptop": the repository with the tiny params, data and warm start pushed to the remote
        seed = tmp_path / "laptop" / "rlvr-alloc"
        seed.mkdir(parents=True)
        copy_project(seed)
        (seed / "params.yaml").write_text(tiny_params_yaml())
        sh(env, seed, "git", "init", "-q", "-b", "main")
        sh(env, seed, PY, "-m", "dvc", "init", "-q")
        sh(env, seed, PY, "-m", "dvc", "remote", "add", "-d", "store", str(remote_dir))
        sh(env, seed, PY, "-m", "dvc", "repro", "prepare", "warmstart")
        sh(env, seed, PY, "-m", "dvc", "push")
        sh(env, seed, "git", "add", "-A")
        sh(env, seed, "git", "commit", "-qm", "tiny pipeline: data and warm start in the DVC remote")
        sh(env, tmp_path, "git", "clone", "-q", "--bare", str(seed), str(origin))
        sh(env, seed, "git", "remote", "add", "origin", origin.as_uri())
        seed_lock = _lock_outs(seed)

        _wait_http(mlflow_uri + "/health", mserver, tmp_path / "mlflow" / "server.log", "mlflow server")
        out = sh(env, seed, PY, "-m", "flows.deploy", "--source", origin.as_uri(), "--pool", pool, "--ref", "main",
                 "--remote", "store", "--tracking-uri", mlflow_uri)
        deployment_ids = re.findall(r"^[0-9a-f]{8}-[0-9a-f-]{27}$", out, re.M)
        assert len(deployment_ids) == len(ALLOCATORS.names()) + 1, out  # train/<each allocator>, evaluate/nightly

        def run(name: str) -> str:
            p = subprocess.run([prefect, "deployment", "run", name, "--watch", "--watch-interval", "1",
                                "--watch-timeout", "1500"], env=env, capture_output=True, text=True, timeout=1680)
            text = p.stdout + p.stderr
            assert p.returncode == 0 and "Completed" in text, \
                text[-3000:] + "\n--- worker ---\n" + (worker_dir / "worker.log").read_text()[-6000:]
            return text

        run("train/sara")
        sh(env, seed, "git", "pull", "-q", "origin", "main")  # the worker pushed dvc.lock
        lock = _lock_outs(seed)
        for path in ("runs/sara-s0/checkpoints", "runs/sara-s0/final_model", "runs/sara-s0/metrics.jsonl"):
            md5 = lock[path]
            obj = remote_dir / "files" / "md5" / md5[:2] / md5[2:]
            assert obj.is_file(), f"{path} ({md5}) is not in the DVC remote"
        assert {p: lock[p] for p in seed_lock} == seed_lock  # data and warm start: pulled, not recomputed
        run_id = json.loads((seed / "runs/sara-s0/tracking.json").read_text())["run_id"]
        assert json.loads((seed / "runs/sara-s0/tracking.json").read_text())["tracking_uri"] == mlflow_uri

        # the same run started again on a worker: a fresh clone pulls the pushed checkpoints and resumes there
        run("train/sara")
        sh(env, seed, "git", "pull", "-q", "origin", "main")
        relock = _lock_outs(seed)
        for path in ("runs/sara-s0/checkpoints", "runs/sara-s0/metrics.jsonl"):  # no step trained again
            assert relock[path] == lock[path], path

        run("evaluate/nightly")
        # while the pool exists (deleting it clears a flow run's pool): the worker ran train/sara's flow run
        flow_run_id = MlflowClient(tracking_uri=mlflow_uri).get_run(run_id).data.tags["prefect_flow_run_id"]
        flow_run = json.loads(sh(env, tmp_path, PY, "-c", PREFECT_QUERY, "flow-run", flow_run_id))
        train_sara = deployment_ids[ALLOCATORS.names().index("sara")]  # flows.deploy: one per registered allocator
        assert flow_run == {"work_pool": pool, "state": "COMPLETED", "deployment_id": train_sara}
    finally:
        if deployment_ids:
            subprocess.run([PY, "-c", PREFECT_QUERY, "delete", *deployment_ids], env=env, capture_output=True,
                           timeout=360)
        for proc, log in reversed(procs):
            stop(proc)
            log.close()
        subprocess.run([prefect, "work-pool", "delete", pool], env=env, capture_output=True, timeout=180)

    # MLflow (the server's store) holds the training run, continued by the resumed flow run, and the evaluation
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    train_run = client.get_run(run_id)
    assert train_run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2]
    tags = train_run.data.tags
    assert tags["data_md5"] == seed_lock["data/arithmetic"] and tags["base_model_md5"] == seed_lock["models/warmstart"]
    clone_dir = Path(tags["run_dir"])
    assert not clone_dir.is_relative_to(seed) and not clone_dir.is_relative_to(PROJECT)  # ran in the worker's clone
    assert train_run.info.artifact_uri.startswith("mlflow-artifacts:")
    assert list((tmp_path / "mlflow" / "artifacts").rglob("final_model/config.json"))  # uploaded through the server
    assert tags["prefect_flow_run_id"] in (worker_dir / "worker.log").read_text()
    evals = client.search_runs([train_run.info.experiment_id], "tags.kind = 'nightly-eval'")
    assert len(evals) == 1, evals
    ev = evals[0]
    assert ev.data.tags["mlflow.parentRunId"] == run_id and ev.data.tags["training_run_id"] == run_id
    assert ev.data.tags["allocator"] == "sara" and "heldout/greedy_acc" in ev.data.metrics

    # machine C: a fresh clone gets the outputs with `dvc pull` and nothing is stale there
    second = tmp_path / "second"
    sh(env, tmp_path, "git", "clone", "-q", origin.as_uri(), str(second))
    sh(env, second, PY, "-m", "dvc", "pull", "--allow-missing")  # train@grpo, experiment, ...: never run
    assert (second / "runs/sara-s0/checkpoints/step_000002/manifest.json").is_file()
    assert (second / "runs/sara-s0/final_model").is_dir()
    status = sh(env, second, PY, "-m", "dvc", "status", "prepare", "warmstart", "train@sara-0")
    assert "up to date" in status.lower() or status.strip() == "", status


def test_nightly_index_from_the_tracking_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's clone has no reports/nightly/index.json: finished nightly evaluations come from MLflow."""
    from pipeline import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    assert tracking.nightly_evaluated() == {}
    for key, step, status in (("runs/sara", 2, "FINISHED"), ("runs/sara", 4, "FINISHED"), ("runs/grpo", 2, "FAILED"),
                              ("runs/deployments/sara", 3, "FINISHED"), ("experiment", 6, "FINISHED")):
        rid = tracking.start_run(f"eval-{key}-step{step}", {},
                                 {"kind": "nightly-eval", "run": Path(key).name, "run_path": key,
                                  "checkpoint": f"/w/{key}/checkpoints/step_{step:06d}"})
        tracking.end_run(rid, status)
    # an evaluation of an earlier version, tagged with the folder's name only: which sara-s0 was it? left out
    tracking.end_run(tracking.start_run("eval-sara-step8", {}, {"kind": "nightly-eval", "run": "sara",
                                                                "checkpoint": "/w/runs/sara/checkpoints/step_000008"}))
    tracking.end_run(tracking.start_run("train-sara", {}, {"run_dir": "/w/runs/sara"}))
    assert tracking.nightly_evaluated() == {"runs/sara": [2, 4], "runs/deployments/sara": [3], "experiment": [6]}


def test_inputs_missing_from_the_remote(worker_clone: Path) -> None:
    """A clone whose dvc.lock records no data or warm start stops, naming them, before check_inputs runs."""
    from pipeline import remote

    (worker_clone / "dvc.yaml").write_text((PROJECT / "dvc.yaml").read_text())
    sync = remote.Remote("store", worker_clone)
    assert sync.needs(["train@sara-0"]) == ["train@sara-0", "warmstart", "prepare"]
    with pytest.raises(ConfigError, match=r"not in dvc.lock or not in DVC remote 'store': "
                                          r"models/warmstart \(warmstart\).*data/arithmetic \(prepare\)"):
        sync.pull(["train@sara-0"])
