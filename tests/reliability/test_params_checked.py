"""Every params value is checked when params load, before the train flow opens an MLflow run.

The flow cases call the function ``python -m flows.train`` runs (``flows.train.train.fn``) on a root
that holds real data and a real warm-started policy, so a value the checks let through would go on to
open an MLflow run (the test then sees ``mlflow.db``) and generate (a tripwire raises). A refusal must
be a ConfigError naming the key, with nothing written: no run folder, no tracking.json, no MLflow store.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlvr_core.config import (
    MAX_YAML_NODES,
    SECTIONS,
    TrainConfig,
    load_params,
    parse_set,
    short_repr,
)
from rlvr_core.errors import ConfigError
from rlvr_core.rollout.hf import HFEngine
from rlvr_core.training import check_and_train
from tests.reliability.common import CFG, dataset, make_flow_root

PARAMS = """\
prepare: {task: arithmetic, n_train: 300, n_test: 40, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 2, eval_every: 1, eval_size: 20,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2}
"""


@pytest.fixture
def flow_root(policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline root with data, a base model and params (RLVR_PARAMS); MLflow would write root/mlflow.db."""
    return make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch)


def _refused(root: Path, match: str, **kw: Any) -> ConfigError:
    from flows.train import train as train_flow

    with pytest.raises(ConfigError, match=match) as err:
        train_flow.fn(**kw)
    assert not (root / "mlflow.db").exists(), "an MLflow run was opened before the refusal"
    assert not list(root.rglob("tracking.json")) and not (root / "runs").exists()
    return err.value


def _with_train(text: str, line: str) -> str:
    key = line.split(":", 1)[0]
    text = re.sub(rf"(?<=[{{\s]){re.escape(key)}: [^,}}]+,\s*", "", text)  # a params file may not repeat a key
    return text.replace("keep_last: 2}", f"keep_last: 2, {line}}}")


@pytest.mark.parametrize("line, message", [
    ("verifier_timeout_s: .inf", r"train\.verifier_timeout_s: got inf; need a finite number"),
    ("verifier_timeout_s: 1.0e+12", r"train\.verifier_timeout_s: got 1000000000000\.0; need seconds in \(0, 3600\]"),
    ("clip_eps: .nan", r"train\.clip_eps: got nan; need a finite number"),
    ("clip_eps: 1.5", r"train\.clip_eps: must lie in \(0, 1\)"),
    ("clip_eps_high: 0", r"train\.clip_eps_high: must be None \(symmetric\) or > 0"),
    ("grad_clip: -1", r"train\.grad_clip: got -1; no params key takes a negative number"),
    ("kl_coef: .nan", r"train\.kl_coef: got nan"),
    ("temperature: .inf", r"train\.temperature: got inf"),
    ("top_p: .nan", r"train\.top_p: got nan"),
    ("lr: -.inf", r"train\.lr: got -inf"),
    ("betas: [0.9, 1.0]", r"train\.betas: must be two numbers in \[0, 1\)"),
    ("betas: [0.9]", r"train\.betas: got \[0\.9\]; need a list of 2 items"),
    ("engine_options: {bogus: 1}", r"train\.engine_options\.bogus: not an option of engine 'hf'.*valid: device, micro"),
    ("engine_options: {temperature: 0.5}", r"train\.engine_options\.temperature: set by the run"),
    ("max_new_tokens: 1000000000", (r"train\.max_new_tokens: got 1,000,000,000; at most 32,768 tokens \(a 32k "
                                    r"context; the engine reserves batch_size \* k \* max_new_tokens")),
    ("k: .inf", r"train\.k: got inf; need an int"),
    ("eval_size: -1", r"train\.eval_size: got -1"),
    ("seed: -1", r"train\.seed: got -1"),
    ("seed: 18446744073709551616", r"train\.seed: got 18446744073709551616; a seed is an int from 0 to 4,294,967,295"),
    ("seeds: [0, 4294967296]", r"train\.seeds: got \[0, 4294967296\]; a seed is an int from 0 to 4,294,967,295"),
    ("allocator_params: {sara: {tau_low: '0.5'}}",
     r"train\.allocator_params\.sara\.tau_low: got '0\.5'; need a number"),
    ("allocator_params: {dapo: {max_gen_batches: 4.0}}",
     r"train\.allocator_params\.dapo\.max_gen_batches: got 4\.0; need an int$"),
    ("engine_retry_delay_s: .nan", r"train\.engine_retry_delay_s: got nan"),
    ("micro_batch: 0", r"train\.micro_batch: got 0; need an int >= 1"),
    ("allocator: [sara]", r"train\.allocator: got \['sara'\]; need a string"),
    ("allocator_params: {sara: [1, 2]}", r"train\.allocator_params\.sara: got \[1, 2\]; need a mapping"),
    ("allocator_params: {sarah: {}}", r"train\.allocator_params\.sarah: unknown allocator"),
    ("only_effective: 1", r"train\.only_effective: got 1; need true or false"),
])
def test_flow_refuses_a_bad_train_value_before_mlflow(flow_root: Path, line: str, message: str) -> None:
    (flow_root / "params.yaml").write_text(_with_train(PARAMS, line))
    err = _refused(flow_root, message)
    assert str(flow_root / "params.yaml") in str(err)


@pytest.mark.parametrize("text, message", [
    (PARAMS.replace("seed: 0}", "seed: 0, digit_weights: [a, b, c]}"),
     r"prepare\.digit_weights: got \['a', 'b', 'c'\]; need a list whose items are each a number"),
    (PARAMS + "evaluate: {temperature: hot}\n", r"evaluate\.temperature: got 'hot'; need a number"),
    (PARAMS + "evaluate: {max_new_tokens: 100000}\n", r"evaluate\.max_new_tokens: got 100,000; need 1 to 32,768"),
    (PARAMS + "warmstart: {lr: .nan}\n", r"warmstart\.lr: got nan; need a finite number"),
    (PARAMS + "warmstart: {weight_decay: .inf}\n", r"warmstart\.weight_decay: got inf"),
    (PARAMS + "warmstart: {hidden: -128}\n", r"warmstart\.hidden: got -128; no params key takes a negative"),
    (PARAMS + "warmstart: {seed: 4294967296}\n", r"warmstart\.seed: got 4294967296; a seed is an int from 0 to"),
    (PARAMS.replace("seed: 0}", "seed: 4294967296}"), r"prepare\.seed: got 4294967296; a seed is an int from 0 to"),
    ("prepare: {task: arithmetic}\ntrain: [1, 2]\n", r"train: got \[1, 2\]; need a mapping of train keys"),
    ("", r"empty \(or only comments\); a params file needs the sections prepare, train"),
    ("# all the keys\n# are commented out\n", r"empty \(or only comments\)"),
    ("prepare: {task: arithmetic}\nevaluate: {k: 4, n_samples: 4}\n", r"no 'train' section"),
    ("train: {steps: 2}\n", r"no 'prepare' section"),
])
def test_flow_refuses_bad_sections_before_mlflow(flow_root: Path, text: str, message: str) -> None:
    (flow_root / "params.yaml").write_text(text)
    _refused(flow_root, message, allocator="sara")


def test_values_from_overrides_are_reported_against_the_file(flow_root: Path) -> None:
    err = _refused(flow_root, r"train\.lr: got \[1\]; need a number", overrides={"lr": [1]})
    assert f"came from --set or a command-line option, not from {flow_root / 'params.yaml'}" in str(err)
    # --seed 18446744073709551616 opened a FAILED MLflow run and ended in "Overflow when unpacking long long"
    err = _refused(flow_root, r"train\.seed: got 18446744073709551616; a seed is an int from 0 to 4,294,967,295",
                   seed=2**64)
    assert "the value of train.seed came from --set or a command-line option" in str(err)
    # --seed 2 --set seed=1: the option won silently
    _refused(flow_root, r"^train\.seed is given twice, by --seed 2 and --set seed=1; give it once$", seed=2,
             overrides={"seed": 1})
    with pytest.raises(ConfigError, match=r"^p/params\.yaml: train\.lr \(from --set 'lr=\['\): not valid YAML"):
        parse_set(["lr=["], "p/params.yaml")
    with pytest.raises(ConfigError, match=r"--set 'lr': use key=value"):
        parse_set(["lr"], "p/params.yaml")


def _bomb(levels: int = 9) -> str:
    """``train.k`` as a billion-laughs list: 9 levels of 9 aliases each, 9**9 leaves once expanded."""
    lines = ["train:", "  k:", "    - &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"    - &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "prepare: {task: arithmetic}\n" + "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_at_once_with_a_short_message(flow_root: Path) -> None:
    (flow_root / "params.yaml").write_text(_bomb())
    expands = rf"line \d+, column \d+ expands to more than {MAX_YAML_NODES:,} nodes through aliases"
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=expands):
        load_params(flow_root / "params.yaml")
    assert time.perf_counter() - t0 < 20.0  # was 85 s and 6.5 GB
    err = _refused(flow_root, expands)
    assert len(str(err)) < 400
    # a few aliases are fine: 3 levels expand to 9**3 leaves
    (flow_root / "params.yaml").write_text(_bomb(3))
    with pytest.raises(ConfigError, match=r"train\.k: got \[\[.*; need an int") as small:
        load_params(flow_root / "params.yaml")
    assert len(str(small.value)) < 500


def test_error_messages_bound_the_values_they_show(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS.replace("task: arithmetic", "task: " + "x" * 200_000))
    with pytest.raises(ConfigError, match=r"prepare\.task: got 'xxx") as err:
        load_params(path)
    assert len(str(err.value)) < 500
    path.write_text("prepare: {task: arithmetic}\ntrain:\n  ? " + "z" * 100_000 + "\n  : 1\n")
    with pytest.raises(ConfigError, match=r"train\.zzz") as err:
        load_params(path)
    assert len(str(err.value)) < 800
    assert len(short_repr(list(range(10**6)))) <= 200 and len(short_repr("y" * 10**6, limit=50)) == 50


@pytest.mark.parametrize("typed, value", [("5e-5", 5e-5), ("1E-4", 1e-4), ("1.0e-4", 1e-4), ("2.5E-6", 2.5e-6),
                                           (".0001", 1e-4), ("0.0001", 1e-4)])
def test_numbers_as_people_type_them(tmp_path: Path, typed: str, value: float) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(_with_train(PARAMS.replace("batch_size: 8, ", ""), f"lr: {typed}, batch_size: 1_000, top_p: .5"))
    t = load_params(path).train
    assert t.lr == value and t.batch_size == 1000 and t.top_p == 0.5
    assert parse_set([f"lr={typed}", "batch_size=1_000", "top_p=.5", "allocator=vigor"], path) == {
        "lr": value, "batch_size": 1000, "top_p": 0.5, "allocator": "vigor"}


def _last_wins(text: str) -> str:
    """``text`` with each key given once, keeping the last value (params files may not repeat a key)."""
    return yaml.safe_dump(yaml.safe_load(text), default_flow_style=None)


def _numeric_fields() -> list[tuple[str, str, Any]]:
    out = []
    for sec, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            if int in args or float in args:
                out.append((sec, f.name, hints[f.name]))
    return out


@pytest.mark.parametrize("sec, key, hint", _numeric_fields(), ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("bad", [".nan", ".inf", "-.inf", "-1"])
def test_every_numeric_key_refuses_nan_inf_and_negatives(tmp_path: Path, sec: str, key: str, hint: Any,
                                                         bad: str) -> None:
    path = tmp_path / "params.yaml"
    body = PARAMS if sec in ("prepare", "train") else PARAMS + f"{sec}: {{}}\n"
    if sec == "prepare":
        body = body.replace("seed: 0}", f"seed: 0, {key}: {bad}}}") if key != "seed" else \
            body.replace("seed: 0}", f"seed: {bad}}}")
    elif sec == "train":
        body = _with_train(body, f"{key}: {bad}")
    else:
        body = body.replace(f"{sec}: {{}}", f"{sec}: {{{key}: {bad}}}")
    path.write_text(_last_wins(body))
    with pytest.raises(ConfigError, match=rf"{sec}\.{key}: got (nan|inf|-inf|-1)\b"):
        load_params(path)


def test_overflowing_timeout_no_longer_reaches_setitimer() -> None:
    """The value that made every setitimer raise OverflowError (480 of 480 verifier errors, FINISHED)."""
    with pytest.raises(ConfigError, match="verifier_timeout_s"):
        TrainConfig(verifier_timeout_s=math.inf)
    assert TrainConfig(verifier_timeout_s=2.0).verifier_timeout_s == 2.0


# ----------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def two_step_run(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("resume_keys") / "run"
    ds = dataset()
    check_and_train(TrainConfig(**{**CFG, "steps": 2}), policy_dir=policy_dir, train_rows=ds["train"],
                    test_rows=ds["test"],
          run_dir=run)
    return run


@pytest.mark.parametrize("change, message", [
    ({"dtype": "bfloat16"}, r"train\.dtype='float32' there, 'bfloat16' now"),
    ({"eval_size": 10}, r"train\.eval_size=20 there, 10 now"),
    ({"micro_batch": 2}, r"train\.micro_batch=256 there, 2 now"),
    ({"clip_eps_high": 0.28}, r"train\.clip_eps_high=None there, 0\.28 now"),
    ({"steps": 1}, r"the run already has 2 steps done, more than train\.steps=1"),
])
def test_resume_refuses_what_would_change_the_run(policy_dir: Path, two_step_run: Path, tmp_path: Path,
                                                  change: dict, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    before = (run / "metrics.jsonl").read_text()
    monkeypatch.setattr(HFEngine, "generate", lambda self, r: (_ for _ in ()).throw(AssertionError("generated")))
    ds = dataset()
    with pytest.raises(ConfigError, match=rf"step_000002: cannot resume.*{message}"):
        check_and_train(TrainConfig(**{**CFG, "steps": 2, **change}), policy_dir=policy_dir, train_rows=ds["train"],
                        test_rows=ds["test"], run_dir=run)
    assert (run / "metrics.jsonl").read_text() == before



def _unrecord(folder: Path, key: str | None) -> None:
    """Remove train.``key`` (None: the whole config) from a checkpoint's state and manifest, hashes recomputed."""
    import hashlib
    import json

    state = json.loads((folder / "state.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    for tree in (state, manifest["meta"]):
        tree["config"].pop(key) if key else tree.pop("config")
    data = json.dumps(state).encode()
    (folder / "state.json").write_bytes(data)
    manifest["files"]["state.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("key, message", [(None, r"train\.allocator, train\.allocator_params, .*, \.\.\."),
                                          ("lr", r"train\.lr, so a changed setting could not be told")])
def test_resume_refuses_a_checkpoint_that_does_not_record_its_settings(policy_dir: Path, two_step_run: Path,
                                                                       tmp_path: Path, key: str | None, message: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint with its config removed resumed with lr changed to 0.5: only the keys present were compared."""
    run = tmp_path / "run"
    shutil.copytree(two_step_run, run)
    _unrecord(run / "checkpoints" / "step_000002", key)
    monkeypatch.setattr(HFEngine, "generate", lambda self, r: (_ for _ in ()).throw(AssertionError("generated")))
    ds = dataset()
    with pytest.raises(ConfigError, match=rf"step_000002: cannot resume, the checkpoint does not record {message}"):
        check_and_train(TrainConfig(**{**CFG, "steps": 3, "lr": 0.5}), policy_dir=policy_dir, train_rows=ds["train"],
                        test_rows=ds["test"], run_dir=run)


def test_flow_refuses_fewer_steps_than_the_run_has(flow_root: Path, two_step_run: Path) -> None:
    """``--steps 1`` on a folder with 2 steps done says so instead of reporting the 2 steps."""
    keys = {k: v for k, v in CFG.items() if k != "steps"}
    (flow_root / "params.yaml").write_text("prepare: {task: arithmetic}\ntrain: {allocators: [sara], "
                                           + ", ".join(f"{k}: {v}" for k, v in keys.items()) + "}\n")
    shutil.copytree(two_step_run, flow_root / "runs/sara-s1")  # CFG: seed 1
    before = sorted(p.name for p in (flow_root / "runs/sara-s1").iterdir())
    from flows.train import train as train_flow

    with pytest.raises(ConfigError, match=r"step_000002: cannot resume, the run already has 2 steps done, more "
                                          r"than train\.steps=1; ask for 2 or more steps"):
        train_flow.fn(allocator="sara", steps=1)
    assert sorted(p.name for p in (flow_root / "runs/sara-s1").iterdir()) == before
    assert not (flow_root / "mlflow.db").exists()
