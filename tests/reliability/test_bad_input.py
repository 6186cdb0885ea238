"""Bad params, data, model folders and resume targets are refused early, with the file/key/row named.

"Early" means before any rollout is generated and before anything is written
that could look like a (partial) result: the engine's ``generate`` is replaced by
a tripwire in the library tests, and the flow tests check that no run folder,
tracking file or MLflow store appears.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlvr_core.config import TrainConfig, load_params
from rlvr_core.data.validate import DataError, validate_rows, validate_splits
from rlvr_core.errors import ConfigError
from rlvr_core.models.tiny import PolicyLoadError
from rlvr_core.rollout.hf import HFEngine
from rlvr_core.tasks import get_task
from rlvr_core.training import check_and_train
from tests.reliability.common import CFG, dataset, make_flow_root

PARAMS = """\
prepare: {task: arithmetic, n_train: 300, n_test: 40, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 2, eval_every: 1, eval_size: 20,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2}
"""


def _params(tmp_path: Path, train_line: str) -> Path:
    path = tmp_path / "params.yaml"
    key = train_line.split(":", 1)[0]
    text = re.sub(rf"(?<=[{{\s]){re.escape(key)}: [^,}}]+,\s*", "", PARAMS)  # a params file may not repeat a key
    path.write_text(text.replace("keep_last: 2}", f"keep_last: 2, {train_line}}}"))
    return path


# ----------------------------------------------------------------------------- params


@pytest.mark.parametrize("line, message", [
    ("lrr: 0.1", r"train\.lrr: unknown key \(did you mean 'lr'\?\)"),
    ("stepz: 3", r"train\.stepz: unknown key \(did you mean 'steps'\?\)"),
    ("steps: ten", r"train\.steps: got 'ten'; need an int"),
    ("k: 2.5", r"train\.k: got 2\.5; need an int"),
    ("k: 1", r"train\.k: got 1; need an int >= 2"),
    ("top_p: 1.5", r"train\.top_p: got 1\.5"),
    ("max_rollouts: -5", r"train\.max_rollouts: got -5"),
    ("allocator: sarah", r"unknown 'sarah'"),
])
def test_bad_params_name_the_file_and_key(tmp_path: Path, line: str, message: str) -> None:
    path = _params(tmp_path, line)
    with pytest.raises(ConfigError, match=message) as err:
        load_params(path)
    assert str(path) in str(err.value)


def test_unknown_section_suggests_the_closest(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS + "trian: {steps: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown section 'trian' \(did you mean 'train'\?\)"):
        load_params(path)


def test_wrong_type_in_a_float_field_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_params(_params(tmp_path, "lr: fast"))


# ----------------------------------------------------------------------------- data


@pytest.fixture
def no_rollouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything is generated."""
    def tripwire(self: Any, requests: Any) -> Any:
        raise AssertionError("a rollout was generated before the bad input was refused")

    monkeypatch.setattr(HFEngine, "generate", tripwire)


def _rows() -> tuple[list[dict], list[dict]]:
    ds = dataset()
    return list(ds["train"]), list(ds["test"])


def _drop(row: dict, field: str) -> dict:
    return {k: v for k, v in row.items() if k != field}


@pytest.mark.parametrize("make_bad, message", [
    (lambda tr, te: ([], te), r"train split is empty"),
    (lambda tr, te: (tr, []), r"test split is empty"),
    (lambda tr, te: (tr[:5] + [_drop(tr[5], "answer")] + tr[6:], te),
     r"train row 5 \('arith-train-\d+'\): missing field\(s\) \['answer'\]"),
    (lambda tr, te: (tr, te[:3] + [_drop(te[3], "prompt")]), r"test row 3 .*missing field\(s\) \['prompt'\]"),
    (lambda tr, te: (tr[:7] + [{**tr[7], "answer": 130}] + tr[8:], te), r"train row 7 .*'answer' must be str, got 130"),
    (lambda tr, te: (tr[:2] + [{**tr[2], "answer": "thirteen"}], te), r"train row 2 .*decimal integer"),
    (lambda tr, te: (tr[:2] + [{**tr[2], "prompt": "  "}], te), r"train row 2 .*'prompt' is empty"),
    (lambda tr, te: (tr + [dict(tr[0], prompt="0001+0001=")], te), r"train: duplicate row ids \['arith-train-0+'\]"),
    (lambda tr, te: (tr, te + [dict(tr[4], id="leak")]),
     r"appears in both 'train' and split 'test'.*1 of \d+ held-out"),
    (lambda tr, te: (tr[:3] + ["0001+0001="], te), r"train row 3: expected a mapping"),
])
def test_bad_data_is_refused_before_any_rollout(policy_dir: Path, tmp_path: Path, no_rollouts: None,
                                                make_bad: Any, message: str) -> None:
    tr, te = make_bad(*_rows())
    with pytest.raises(DataError, match=message):
        check_and_train(TrainConfig(**CFG), policy_dir=policy_dir, train_rows=tr, test_rows=te,
                        run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_task_specific_fields() -> None:
    row = {"id": "c0", "prompt": "3,7,25,50>125=", "numbers": [3, 7, 25, 50], "target": 125}
    validate_rows([row], get_task("countdown"), "train")
    with pytest.raises(DataError, match=r"field 'numbers' must be list\[int\]"):
        validate_rows([{**row, "numbers": [3, "7"]}], get_task("countdown"), "train")
    with pytest.raises(DataError, match=r"needs one of the fields \['tests', 'public_test_cases'\]"):
        validate_rows([{"id": "p0", "prompt": "print sum"}], get_task("code"), "train")
    with pytest.raises(DataError, match=r"'answer' is empty"):
        validate_rows([{"id": "m0", "prompt": "1+1?", "answer": " "}], get_task("math"), "train")
    with pytest.raises(DataError, match=r"^data/x: train split is empty"):
        validate_splits([], [row], get_task("countdown"), source="data/x")


# ----------------------------------------------------------------------------- model folder


@pytest.mark.parametrize("damage, message", [
    (lambda d: shutil.rmtree(d), "does not exist"),
    (lambda d: (d / "config.json").unlink(), "has no config.json"),
    # a folder without its sha256.json (written elsewhere): the files are not checked, what loads is
    (lambda d: ((d / "config.json").write_text(json.dumps({"model_type": "gpt2"})), (d / "sha256.json").unlink()),
     "weights do not match config.json"),
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "gpt2"})), r"config\.json has 22 bytes, its "
     r"sha256\.json records"),
    (lambda d: (d / "tokenizer.json").unlink(), "has no tokenizer.json"),
])
def test_missing_or_incompatible_model_folder(policy_dir: Path, tmp_path: Path, no_rollouts: None, damage: Any,
                                              message: str) -> None:
    bad = tmp_path / "policy"
    shutil.copytree(policy_dir, bad)
    damage(bad)
    tr, te = _rows()
    with pytest.raises(PolicyLoadError, match=message):
        check_and_train(TrainConfig(**CFG), policy_dir=bad, train_rows=tr, test_rows=te, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- resuming another run


@pytest.fixture(scope="module")
def two_step_run(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("resume") / "run"
    tr, te = _rows()
    check_and_train(TrainConfig(**{**CFG, "steps": 2}), policy_dir=policy_dir, train_rows=tr, test_rows=te, run_dir=run)
    return run


@pytest.mark.parametrize("change, message", [
    ({"lr": 1e-3}, r"train\.lr=0\.0001 there, 0\.001 now"),
    ({"allocator": "vigor"}, r"train\.allocator='sara' there, 'vigor' now"),
    ({"seed": 7, "k": 2}, r"train\.k=4 there, 2 now, train\.seed=1 there, 7 now"),
])
def test_resuming_with_other_settings_is_refused(policy_dir: Path, two_step_run: Path, tmp_path: Path,
                                                 no_rollouts: None, change: dict, message: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    before = (run / "metrics.jsonl").read_text()
    tr, te = _rows()
    with pytest.raises(ConfigError, match=rf"step_000002: cannot resume.*{message}"):
        check_and_train(TrainConfig(**{**CFG, **change}), policy_dir=policy_dir, train_rows=tr, test_rows=te,
                        run_dir=run)
    assert (run / "metrics.jsonl").read_text() == before  # the run folder is untouched


def test_resuming_on_other_data_is_refused(policy_dir: Path, two_step_run: Path, tmp_path: Path,
                                           no_rollouts: None) -> None:
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    tr, te = _rows()
    with pytest.raises(ConfigError, match="different training split"):
        check_and_train(TrainConfig(**CFG), policy_dir=policy_dir, train_rows=tr[:-1], test_rows=te, run_dir=run)


# ----------------------------------------------------------------------------- the train flow


@pytest.fixture
def flow_root(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline root with data, a base model and params; the flow function is called without Prefect."""
    import datasets

    tr, te = _rows()
    data = datasets.DatasetDict({"train": datasets.Dataset.from_list(tr), "test": datasets.Dataset.from_list(te)})
    return make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch, data=data)


def _save_rows(root: Path, tr: list[dict], te: list[dict]) -> None:
    import datasets

    shutil.rmtree(root / "data/arithmetic")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(tr), "test": datasets.Dataset.from_list(te)}
                         ).save_to_disk(str(root / "data/arithmetic"))


def _nothing_written(root: Path) -> None:
    assert not (root / "runs").exists()
    assert not (root / "mlflow.db").exists()


def test_flow_refuses_overlapping_splits_before_tracking(flow_root: Path) -> None:
    from flows.train import train as train_flow

    tr, te = _rows()
    _save_rows(flow_root, tr, te + [dict(tr[0], id="leak")])
    where = re.escape(f"{flow_root / 'data/arithmetic'}: problem {tr[0]['prompt']!r} appears in both")
    with pytest.raises(DataError, match=where):
        train_flow.fn(allocator="sara")
    _nothing_written(flow_root)


def test_flow_refuses_rows_without_a_field(flow_root: Path) -> None:
    from flows.train import train as train_flow

    tr, te = _rows()
    _save_rows(flow_root, [_drop(r, "answer") for r in tr], [_drop(r, "answer") for r in te])
    with pytest.raises(DataError, match=r"train row 0 .*missing field\(s\) \['answer'\]"):
        train_flow.fn(allocator="sara")
    _nothing_written(flow_root)


@pytest.mark.parametrize("overrides, error, message", [
    ({"lrr": 0.1}, ConfigError, r"did you mean 'lr'"),
    ({"steps": "ten"}, ConfigError, r"train\.steps: got 'ten'"),
    ({"allocator_params": {"sara": {"tau_low": 2.0}}}, ConfigError, r"tau_low"),
])
def test_flow_refuses_bad_parameters(flow_root: Path, overrides: dict, error: type, message: str) -> None:
    from flows.train import train as train_flow

    with pytest.raises(error, match=message):
        train_flow.fn(allocator="sara", overrides=overrides)
    _nothing_written(flow_root)


def test_flow_refuses_a_bad_model_folder(flow_root: Path) -> None:
    from flows.train import train as train_flow

    (flow_root / "models/warmstart/tokenizer.json").unlink()
    with pytest.raises(PolicyLoadError, match="has no tokenizer.json"):
        train_flow.fn(allocator="sara")
    shutil.rmtree(flow_root / "models/warmstart")
    with pytest.raises(ConfigError, match=r"models/warmstart: missing; run `python -m flows.warmstart`"):
        train_flow.fn(allocator="sara")
    _nothing_written(flow_root)


def test_flow_refuses_to_resume_a_run_of_other_settings(flow_root: Path, two_step_run: Path) -> None:
    from flows.train import train as train_flow

    # written with CFG: k=4, seed=1, batch 8; the flow trains seed 0
    shutil.copytree(two_step_run, flow_root / "runs/sara-s0")
    before = sorted(p.name for p in (flow_root / "runs/sara-s0").iterdir())
    with pytest.raises(ConfigError, match=r"step_000002: cannot resume.*train\.seed=1 there, 0 now"):
        train_flow.fn(allocator="sara")
    assert sorted(p.name for p in (flow_root / "runs/sara-s0").iterdir()) == before
    assert not (flow_root / "mlflow.db").exists()
