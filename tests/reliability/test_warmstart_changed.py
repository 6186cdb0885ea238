"""A run does not resume on another warm start than the one it started from (issue #41).

The tester ran 3 steps with ``kl_coef=0.1``, replaced models/warmstart by another warm start and resumed to
step 6: the KL of steps 4-6 jumped from ~1e-3 to ~1.4 (the reference policy is read from the folder), and
nothing refused it. A checkpoint now records the digest of the policy folder its run started from
(``rlvr_core.models.integrity.policy_digest``), and a resume on a folder of another digest is refused,
naming both digests and the folder, before anything is generated or tracked; a resumed MLflow run keeps the
lineage tags it started with.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from rlvr_core.checkpoint import checkpoint_meta, read_state
from rlvr_core.config import TrainConfig
from rlvr_core.errors import ConfigError
from rlvr_core.models.integrity import check_policy_files
from rlvr_core.models.policy import load_any_policy, save_any_policy
from rlvr_core.rollout.hf import HFEngine
from rlvr_core.training import check_and_train
from tests.reliability.common import CFG, dataset, make_flow_root

RUN = dict(CFG, steps=3, kl_coef=0.1, checkpoint_every=3, eval_every=0, eval_samples=0)

PARAMS = """\
prepare: {task: arithmetic, n_train: 400, n_test: 60, seed: 0}
train: {allocator: grpo, allocators: [grpo], k: 4, batch_size: 4, steps: 2, eval_every: 0, eval_size: 10,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2, seed: 1, kl_coef: 0.1, allow_no_update: true}
"""


def _other_warm_start(folder: Path) -> None:
    """Replace the policy in ``folder`` by another one (its weights moved), written as the warm start writes one."""
    model, tok = load_any_policy(folder)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)
    shutil.rmtree(folder)
    save_any_policy(model, tok, folder)


def test_resume_on_a_replaced_warm_start_is_refused(policy_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    policy, run, ds = tmp_path / "models/warmstart", tmp_path / "run", dataset()
    shutil.copytree(policy_dir, policy)
    started = check_policy_files(policy)
    check_and_train(TrainConfig(**RUN), policy_dir=policy, train_rows=ds["train"], test_rows=ds["test"], run_dir=run)
    ckpt = run / "checkpoints/step_000003"
    assert checkpoint_meta(ckpt)["policy_digest"] == started == read_state(ckpt)["policy_digest"]

    _other_warm_start(policy)
    now = check_policy_files(policy)
    assert now != started
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "run.lock"}
    monkeypatch.setattr(HFEngine, "generate", lambda self, r: (_ for _ in ()).throw(AssertionError("generated")))
    message = rf"step_000003: cannot resume, the run started from another policy than policy folder " \
              rf"'{re.escape(str(policy))}' holds now \(policy digest {started} there, {now} now"
    with pytest.raises(ConfigError, match=message):
        check_and_train(TrainConfig(**{**RUN, "steps": 6}), policy_dir=policy, train_rows=ds["train"],
                        test_rows=ds["test"],
              run_dir=run)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "run.lock"} == before


def test_a_checkpoint_without_the_policy_digest_is_refused(policy_dir: Path, tmp_path: Path) -> None:
    from rlvr_core.preflight import check_resumable

    cfg = TrainConfig(**RUN)
    with pytest.raises(ConfigError, match=r"ckpt: cannot resume, the checkpoint does not record the digest of the "
                                          r"policy the run started from"):
        check_resumable({"config": asdict(cfg), "data_digest": "d"}, cfg, "d", "ckpt", policy="p",
                        policy_dir=policy_dir)


@pytest.fixture
def flow_root(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline root; the flow function runs in process, its training task as a plain function."""
    import logging

    import flows.train
    import tasks.training

    root = make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch, generate=True)
    monkeypatch.setattr(tasks.training, "get_run_logger", lambda: logging.getLogger("test-flow"))
    monkeypatch.setattr(flows.train, "run_training", tasks.training.run_training.fn)
    return root


def test_the_flow_refuses_before_mlflow_and_keeps_the_run_s_tags(flow_root: Path) -> None:
    from mlflow.tracking import MlflowClient

    from flows.train import train as train_flow

    train_flow.fn()
    run = flow_root / "runs/grpo-s1"
    run_id = json.loads((run / "tracking.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{flow_root / 'mlflow.db'}")
    first = client.get_run(run_id)
    started = check_policy_files(flow_root / "models/warmstart")
    assert first.data.tags["base_model_sha256"] == started and first.info.status == "FINISHED"

    _other_warm_start(flow_root / "models/warmstart")
    with pytest.raises(ConfigError, match=rf"step_000002: cannot resume.*policy digest {started} there"):
        train_flow.fn(steps=4)
    after = client.get_run(run_id)
    assert after.data.tags == first.data.tags and after.info.status == "FINISHED"  # not reopened, not retagged
    assert len(client.search_runs([first.info.experiment_id])) == 1


def test_a_resumed_mlflow_run_keeps_its_lineage_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    tags = {"base_model_md5": "aaa", "base_model_sha256": "s1", "run_dir": "x"}
    run_id = tracking.start_run("t", {"train": {"k": 4}}, tags)
    with pytest.warns(RuntimeWarning, match=r"base_model_md5 aaa there, bbb now.*tagged resumed\.<tag>"):
        assert tracking.resume_run(run_id, {**tags, "base_model_md5": "bbb", "run_dir": "y"})
    got = tracking.get_run(run_id).data.tags
    assert (got["base_model_md5"], got["resumed.base_model_md5"], got["run_dir"]) == ("aaa", "bbb", "y")

    tracking.end_run(run_id)
    with pytest.warns(RuntimeWarning, match=r"base_model_sha256 s1 there, s2 now\); it is not continued"):
        assert not tracking.resume_run(run_id, {**tags, "base_model_sha256": "s2"}, must_match=("base_model_sha256",))
    assert tracking.get_run(run_id).info.status == "FINISHED"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tracking.resume_run(run_id, tags, must_match=("base_model_sha256",))  # the same inputs: continued
