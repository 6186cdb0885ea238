"""A deployment's parameters are untrusted (issue 40, breaks 1-3; pipeline/untrusted.py): every one is checked
before anything is read, generated or tracked, and no message quotes a file it could not parse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import flows.evaluate
import flows.train
import pipeline.untrusted
from rlvr_core.config.reading import read_yaml
from rlvr_core.errors import ConfigError
from tests.pipeline.conftest import TINY

SECRET = "AKIAIOSFODNN7EXAMPLE"


@pytest.fixture
def deployed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project root in ``tmp_path`` and a flow run that belongs to a deployment."""
    monkeypatch.setenv("RLVR_ROOT", str(tmp_path))
    monkeypatch.setenv("RLVR_PARAMS", str(TINY))
    monkeypatch.delenv("RLVR_DVC_REMOTE", raising=False)
    monkeypatch.setattr(pipeline.untrusted, "deployment_id", lambda: "0b7f")
    return tmp_path


def test_a_params_file_outside_the_project_is_refused_and_never_quoted(deployed: Path, tmp_path_factory) -> None:
    creds = tmp_path_factory.mktemp("home") / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = {SECRET}\n")
    with pytest.raises(ConfigError, match=r"params_file = .*resolves outside the project") as info:
        flows.train.train.fn(params_file=str(creds))
    assert SECRET not in str(info.value)
    link = deployed / "params-link.yaml"  # a link inside the project to a file outside it
    link.symlink_to(creds)
    with pytest.raises(ConfigError, match="resolves outside the project"):
        flows.train.train.fn(params_file="params-link.yaml")
    with pytest.raises(ConfigError, match="resolves outside the project"):
        flows.evaluate.evaluate.fn(nightly=True, params_file=str(creds))
    assert sorted(p.name for p in deployed.iterdir()) == ["params-link.yaml"]  # nothing written


def test_a_yaml_error_names_line_and_column_and_quotes_nothing(tmp_path: Path) -> None:
    for text in (f"[default]\naws_access_key_id = {SECRET}\n", f'a: 1\n b: "{SECRET}\n', f"k: \"\\q{SECRET}\"",
                 f"x: !{SECRET} y", f"x: !!int {SECRET}"):
        with pytest.raises(ConfigError, match=r"creds: not valid YAML") as info:
            read_yaml(text, "creds")
        assert SECRET not in str(info.value) and SECRET[:6] not in str(info.value), str(info.value)
    with pytest.raises(ConfigError, match=r"at line 2, column 1"):
        read_yaml(f"[default]\naws_access_key_id = {SECRET}\n", "creds")


def test_a_params_file_inside_the_project_must_be_a_regular_file_of_the_serving_user(deployed: Path) -> None:
    (deployed / "folder.yaml").mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        pipeline.untrusted.check_params_file("folder.yaml")
    shared = deployed / "shared.yaml"
    shared.write_text(TINY.read_text())
    shared.chmod(0o666)
    with pytest.raises(ConfigError, match="writable by no one else"):
        pipeline.untrusted.check_params_file("shared.yaml")
    shared.chmod(0o644)
    assert pipeline.untrusted.check_params_file("shared.yaml") == (shared.resolve(), TINY.read_text())
    (deployed / "latin1.yaml").write_bytes(b"prepare: {task: caf\xe9}\n")
    with pytest.raises(ConfigError, match=r"params_file = 'latin1.yaml': not UTF-8 text \(byte 19\)"):
        pipeline.untrusted.check_params_file("latin1.yaml")
    os.mkfifo(deployed / "fifo.yaml")  # opened without blocking, and refused
    with pytest.raises(ConfigError, match="not a regular file"):
        pipeline.untrusted.check_params_file("fifo.yaml")


class Stop(Exception):
    """Raised where a flow under test has loaded its params: nothing after that is needed."""


@pytest.fixture
def elsewhere(deployed: Path, tmp_path_factory, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The flows' working directory is another folder than $RLVR_ROOT (flows/serve.py allows it), holding a
    params file and a checkpoint folder of the same names as the project's, of another user's where the test
    runs as root. Returns the train.threads each flow loaded, recorded where it pins its threads."""
    other = tmp_path_factory.mktemp("cwd")
    theirs = other / "mine.yaml"
    (deployed / "mine.yaml").write_text(TINY.read_text().replace("train:\n", "train:\n  threads: 1\n", 1))
    theirs.write_text(TINY.read_text().replace("train:\n", "train:\n  threads: 2\n", 1))
    (other / "runs/sara-s0/checkpoints/step_000002").mkdir(parents=True)
    if os.geteuid() == 0:  # as the issue found it: the namesake is another user's
        for p in (theirs, other / "runs/sara-s0/checkpoints/step_000002"):
            os.chown(p, 65534, 65534)
    monkeypatch.chdir(other)
    loaded: dict[str, int] = {}

    def fix_cpu(threads: int) -> None:
        loaded["threads"] = threads
        raise Stop

    monkeypatch.setattr(flows.train, "fix_cpu", fix_cpu)
    monkeypatch.setattr(flows.evaluate, "fix_cpu", lambda threads: loaded.__setitem__("threads", threads))
    return loaded


def test_the_params_file_read_is_the_one_checked_whatever_the_working_directory(
        deployed: Path, elsewhere, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Stop):
        flows.train.train.fn(params_file="mine.yaml")
    assert elsewhere == {"threads": 1}  # the project's file, not the working directory's namesake
    elsewhere.clear()
    monkeypatch.setattr(flows.evaluate, "nightly_pass", lambda params: {"threads": params.train.threads})
    assert flows.evaluate.evaluate.fn(nightly=True, params_file="mine.yaml") == {"threads": 1}
    assert elsewhere == {"threads": 1}


def test_the_checkpoint_evaluated_is_the_one_checked_whatever_the_working_directory(
        deployed: Path, elsewhere, monkeypatch: pytest.MonkeyPatch) -> None:
    evaluated: list[Path] = []
    monkeypatch.setattr(flows.evaluate, "_eval", lambda params, ckpt: evaluated.append(ckpt) or {})
    flows.evaluate.evaluate.fn(checkpoint="runs/sara-s0/checkpoints/step_000002")
    assert evaluated == [(deployed / "runs/sara-s0/checkpoints/step_000002").resolve()]


@pytest.mark.parametrize("options", [{"url": "http://127.0.0.1:45999", "token_file": "/root/secret0600"},
                                     {"token_file": "/root/secret0600"}, {"server_script": "/tmp/x.py"}])
def test_engine_options_that_name_a_url_a_token_file_or_a_program_are_refused(deployed: Path, options) -> None:
    with pytest.raises(ConfigError, match=r"train.engine_options.\w+.*refused in a run of deployment 0b7f"):
        flows.train.train.fn(overrides={"engine": "vllm", "engine_options": options})
    assert not list(deployed.iterdir())


@pytest.mark.parametrize("out_dir", ["../../etc", "/etc", "runs/sara-s0", "runs/deployments", "runs/deployments/../x",
                                     "runs/deployments/link/inner"])
def test_out_dir_must_resolve_under_runs_deployments(deployed: Path, out_dir: str, tmp_path_factory) -> None:
    victim = tmp_path_factory.mktemp("victim")
    (victim / "summary.json").write_text("theirs")
    (deployed / "runs" / "deployments").mkdir(parents=True)
    (deployed / "runs" / "deployments" / "link").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"out_dir = .*outside .*runs/deployments"):
        flows.train.train.fn(out_dir=out_dir)
    assert (victim / "summary.json").read_text() == "theirs" and sorted(os.listdir(victim)) == ["summary.json"]
    assert sorted(p.name for p in (deployed / "runs").iterdir()) == ["deployments"]


def test_an_out_dir_under_runs_deployments_is_kept(deployed: Path) -> None:
    assert pipeline.untrusted.check_out_dir("runs/deployments/mine") == (deployed / "runs/deployments/mine").resolve()


def test_a_local_run_may_still_choose_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline.untrusted, "deployment_id", lambda: "")
    pipeline.untrusted.refuse_engine_options({}, "nowhere")  # nothing given, nothing refused
    flows.train.refuse_launch_options({"url": "http://127.0.0.1:1"})  # a local run: allowed


@pytest.mark.parametrize("kwargs, match", [
    ({"checkpoint": "/etc"}, "outside runs/ and experiment/"),
    ({"checkpoint": "../elsewhere/checkpoints/step_000001"}, "outside runs/ and experiment/"),
    ({"run": "../../etc"}, "give a run folder's name"),
    ({}, "writes reports/evaluation.json"),
    ({"nightly": "yes"}, "nightly = 'yes'"),
])
def test_an_evaluation_of_a_deployment_reads_the_projects_runs_only(deployed: Path, kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        flows.evaluate.evaluate.fn(**kwargs)
    assert not list(deployed.iterdir())
