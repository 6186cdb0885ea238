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
    assert pipeline.untrusted.check_params_file("shared.yaml") == shared.resolve()


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
