"""Workers publishing dvc.lock to one git origin (pipeline/remote.py): two at once both land (issue 26, break 5),
and a clone at a detached HEAD publishes to the branch it is told or is refused clearly (break 13)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from pipeline import remote
from rlvr_core.errors import ConfigError

BASE_LOCK = """schema: '2.0'
stages:
  prepare:
    cmd: python -m flows.prepare
    params:
      params.yaml:
        prepare:
          task: arithmetic
          lr: 5e-05
    outs:
    - path: data/arithmetic
      hash: md5
      md5: 0123456789abcdef0123456789abcdef.dir
"""


def entry(stage: str, md5: str) -> str:
    return (f"  {stage}:\n    cmd: python -m flows.train\n    outs:\n    - path: runs/{stage}/checkpoints\n"
            f"      hash: md5\n      md5: {md5}.dir\n")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def origin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bare origin whose main holds BASE_LOCK; dvc commit/push are not what is tested here."""
    for k, v in dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                     GIT_COMMITTER_EMAIL="t@t").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("RLVR_GIT_BRANCH", raising=False)
    monkeypatch.delenv("RLVR_GIT_PUSH", raising=False)
    monkeypatch.setattr(remote, "dvc", lambda *a, **k: "")
    bare, seed = tmp_path / "origin.git", tmp_path / "seed"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    git(tmp_path, "init", "-q", "-b", "main", str(seed))
    (seed / "dvc.lock").write_text(BASE_LOCK)
    git(seed, "add", "dvc.lock")
    git(seed, "commit", "-q", "-m", "base")
    git(seed, "tag", "v1")
    git(seed, "push", "-q", str(bare), "main", "v1")
    return bare


def worker(origin: Path, name: str, stage: str, md5: str, *clone_args: str) -> tuple[remote.Remote, Path]:
    """A worker's clone that has run ``stage``: its dvc.lock entry appended, its summary written."""
    top = origin.parent / name
    git(origin.parent, "clone", "-q", *clone_args, str(origin), str(top))
    (top / "dvc.lock").write_text((top / "dvc.lock").read_text() + entry(stage, md5))
    summary = top / "runs" / stage / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(f'{{"stage": "{stage}"}}\n')
    return remote.Remote("r", top), summary


def origin_lock(origin: Path) -> dict:
    from dvc.utils.serialize import parse_yaml

    return parse_yaml(git(origin, "show", "main:dvc.lock"), "dvc.lock")


def test_two_workers_publishing_at_once_both_land(origin: Path) -> None:
    stages = {"train@grpo-0": "a" * 32, "train@sara-0": "b" * 32}
    workers = [worker(origin, f"w{i}", st, md5) for i, (st, md5) in enumerate(stages.items())]
    errors: list[BaseException] = []
    gate = threading.Barrier(2)

    def publish(sync: remote.Remote, summary: Path, stage: str) -> None:
        try:
            gate.wait()
            sync.publish(stage, [summary])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=publish, args=(*w, st)) for w, st in zip(workers, stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    lock = origin_lock(origin)
    assert set(lock["stages"]) == {"prepare", *stages}
    for st, md5 in stages.items():
        assert lock["stages"][st]["outs"][0]["md5"] == f"{md5}.dir"
        assert git(origin, "show", f"main:runs/{st}/summary.json") == f'{{"stage": "{st}"}}\n'
    assert lock["stages"]["prepare"]["params"]["params.yaml"]["prepare"]["lr"] == 5e-05  # a number, as dvc wrote it


def test_one_worker_behind_another_lands_on_top(origin: Path) -> None:
    # deterministic form of the race: B committed on the old main, A pushed first
    a, a_sum = worker(origin, "a", "train@grpo-0", "a" * 32)
    b, b_sum = worker(origin, "b", "train@sara-0", "b" * 32)
    a.publish("train@grpo-0", [a_sum])
    b.publish("train@sara-0", [b_sum])
    assert set(origin_lock(origin)["stages"]) == {"prepare", "train@grpo-0", "train@sara-0"}
    assert git(b.top, "rev-parse", "HEAD") == git(origin, "rev-parse", "main")


def test_detached_head_is_refused_with_the_fix(origin: Path) -> None:
    sync, summary = worker(origin, "tagged", "train@grpo-0", "a" * 32, "--branch", "v1")
    with pytest.raises(ConfigError, match=r"detached HEAD .*RLVR_GIT_BRANCH=<branch>"):
        sync.publish("train@grpo-0", [summary])
    assert "train@grpo-0" not in origin_lock(origin)["stages"]


def test_detached_head_publishes_to_the_branch_it_is_given(origin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other, other_sum = worker(origin, "other", "train@sara-0", "b" * 32)
    other.publish("train@sara-0", [other_sum])  # main moved past the tag
    sync, summary = worker(origin, "tagged", "train@grpo-0", "a" * 32, "--branch", "v1")
    monkeypatch.setenv("RLVR_GIT_BRANCH", "main")
    sync.publish("train@grpo-0", [summary])
    assert set(origin_lock(origin)["stages"]) == {"prepare", "train@grpo-0", "train@sara-0"}


def test_detached_head_is_refused_before_compute(origin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync, _ = worker(origin, "tagged", "train@grpo-0", "a" * 32, "--branch", "v1")
    monkeypatch.setenv("RLVR_DVC_REMOTE", "r")
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setattr(remote, "root", lambda: sync.top)  # the checks below are tested in test_cluster.py
    monkeypatch.setattr(remote, "check_remote", lambda name, top: name)
    monkeypatch.setattr(remote, "check_tracking_server", lambda uri: None)
    monkeypatch.setattr(remote, "check_params_file", lambda params_file, top: top / "params.yaml")
    with pytest.raises(ConfigError, match="detached HEAD"):
        remote.setup()
    monkeypatch.setenv("RLVR_GIT_BRANCH", "main")
    assert remote.setup() == remote.Remote("r", sync.top)


@pytest.mark.parametrize("bad", ["bad..name", "has space", "-leading", "ends.lock", "trailing/", "@{-1}"])
def test_a_branch_name_git_refuses_is_refused_at_set_up(origin: Path, monkeypatch: pytest.MonkeyPatch,
                                                        bad: str) -> None:
    """A bad $RLVR_GIT_BRANCH fails before compute, naming the variable, not after training at the push."""
    sync, _ = worker(origin, "w", "train@grpo-0", "a" * 32)
    monkeypatch.setenv("RLVR_DVC_REMOTE", "r")
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setattr(remote, "root", lambda: sync.top)
    monkeypatch.setattr(remote, "check_remote", lambda name, top: name)
    monkeypatch.setattr(remote, "check_tracking_server", lambda uri: None)
    monkeypatch.setattr(remote, "check_params_file", lambda params_file, top: top / "params.yaml")
    monkeypatch.setenv("RLVR_GIT_BRANCH", bad)
    with pytest.raises(ConfigError, match=r"^RLVR_GIT_BRANCH=.*: not a valid git branch name \(`git check-ref-format"):
        remote.setup()
    monkeypatch.setenv("RLVR_GIT_BRANCH", "feature/ok-1.2")  # a good name still passes
    assert remote.setup() == remote.Remote("r", sync.top)


def test_deploy_refuses_a_bad_publish_branch() -> None:
    from flows.deploy import deploy

    with pytest.raises(ConfigError, match=r"^--publish-branch \(RLVR_GIT_BRANCH\)='bad\.\.name': not a valid git"):
        deploy("https://example.invalid/repo.git", "gpu", publish_branch="bad..name")
