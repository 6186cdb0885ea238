"""A checkpoint edited and re-hashed is refused on resume, naming the field (issue #40).

The newest checkpoint's state.json is edited and its manifest entry re-recorded exactly as a tamperer would
(sha256 and size, as ``save_checkpoint`` writes them), so the hashes match. Every restored counter is then
checked for its type, its sign and its agreement with metrics.jsonl, and the nested engine, source,
allocator and RNG states for their keys and types: a tampered value is refused with a CheckpointError
naming the file and the field, before anything is generated, and without an exception chained to it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from rlvr_core.checkpoint import MANIFEST, STATE, CheckpointError, verify
from rlvr_core.config import TrainConfig
from rlvr_core.preflight import preflight
from rlvr_core.rollout.hf import HFEngine
from rlvr_core.training import check_and_train, train
from tests.reliability.common import CFG, dataset

RUN = dict(CFG, steps=4, keep_last=2)  # checkpoints at steps 2 and 4
NEWEST = "checkpoints/step_000004"


@pytest.fixture(scope="module")
def four_step_run(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("tampered") / "run"
    ds = dataset()
    check_and_train(TrainConfig(**RUN), policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                    run_dir=run)
    return run


@pytest.fixture()
def no_rollouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HFEngine, "generate", lambda self, r: (_ for _ in ()).throw(AssertionError("generated")))


def rehash(folder: Path, name: str) -> None:
    """Re-record file ``name``'s sha256 and size in ``folder``'s manifest, as ``save_checkpoint`` records them."""
    data = (folder / name).read_bytes()
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def tamper(folder: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``edit`` to ``folder``'s state.json (as JSON) and re-hash it: the checkpoint still verifies."""
    tree = json.loads((folder / STATE).read_text())
    edit(tree)
    (folder / STATE).write_text(json.dumps(tree, separators=(",", ":")))
    rehash(folder, STATE)
    assert verify(folder) is None


def setting(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit setting the state's value at dotted ``path`` to ``value``."""
    *parents, leaf = path.split(".")

    def edit(tree: dict[str, Any]) -> None:
        for key in parents:
            tree = tree[key]
        tree[leaf] = value
    return edit


def _more_rollouts(tree: dict[str, Any]) -> None:
    tree["cum"]["rollouts"] += 8  # a plausible value: type and sign are right, metrics.jsonl disagrees


def _resume(policy_dir: Path, run: Path, **kw: Any) -> Any:
    ds = dataset()
    return check_and_train(TrainConfig(**{**RUN, "steps": 5}), policy_dir=policy_dir, train_rows=ds["train"],
                           test_rows=ds["test"], run_dir=run, **kw)


def _copy(four_step_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(four_step_run, run)
    return run


TAMPERED = [
    (setting("cum.rollouts", -1e6), r"cum\.rollouts = -1000000\.0: must be a whole number >= 0"),
    (setting("nonfinite_run", -1e9), r"nonfinite_run = -1000000000\.0: must be a whole number >= 0"),
    (setting("verifier_errors", "lots"), r"verifier_errors = 'lots': must be a whole number >= 0"),
    (setting("engine", {"x": 1}), r"engine: missing 'calls', 'seed'; unexpected 'x'"),
    (setting("nonfinite_run", True), r"nonfinite_run = True: must be a whole number >= 0 \(an int, not a bool"),
    (setting("cum.tokens", float("nan")), r"cum\.tokens = nan: must be a whole number >= 0"),
    (setting("verifier_timeouts", -3), r"verifier_timeouts = -3: must be a whole number >= 0"),
    (lambda t: t.pop("verifier_errors"), r"verifier_errors: missing"),
    (setting("cum.extra", 5), r"cum: unexpected 'extra'"),
    (setting("engine.calls", 2.5), r"engine\.calls = 2\.5: must be a whole number >= 0"),
    (setting("engine.seed", 7), r"engine\.seed = 7: is not train\.seed = 1"),
    (setting("source.pos", -1), r"source\.pos = -1: must be a whole number >= 0"),
    (setting("source.front", ["0"]), r"source\.front\[0\] = '0': must be a prompt id"),
    (setting("allocator.in_step", True), r"allocator\.in_step = True: must be False"),
    (lambda t: t["allocator"].pop("ledger"), r"allocator: missing 'ledger'"),
    (setting("rng.numpy", {"$tuple": ["MT19937", 1, 2]}), r"rng\.numpy = .*: must be a tuple of 5 items"),
    (_more_rollouts, r"cum\.rollouts = \d+ disagrees with metrics\.jsonl line 5 \(step 4\): cum_rollouts = \d+"),
    (setting("nonfinite_run", 1), r"nonfinite_run = 1 disagrees with metrics\.jsonl: 0 non-finite"),
    (setting("verifier_errors", 3), r"verifier_errors = 3 disagrees with metrics\.jsonl line 5 \(step 4\)"),
]


@pytest.mark.parametrize("edit, message", TAMPERED)
def test_a_tampered_rehashed_state_is_refused_naming_the_field(policy_dir: Path, four_step_run: Path, tmp_path: Path,
                                                                no_rollouts: None, edit: Any, message: str) -> None:
    """Today: cum.rollouts = -1e6 raised the rollout budget by a million, nonfinite_run = -1e9 disabled the
    non-finite guard, verifier_errors = "lots" crashed with a TypeError, engine = {"x": 1} with KeyError 'seed'."""
    run = _copy(four_step_run, tmp_path)
    tamper(run / NEWEST, edit)
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match=rf"step_000004[/\\]state\.json: {message}") as refused:
        _resume(policy_dir, run)
    assert refused.value.__cause__ is None and refused.value.__context__ is None  # no trace of another error
    assert "cannot resume" in str(refused.value) and "start a fresh run folder" in str(refused.value)
    assert (run / "metrics.jsonl").read_text() == before  # nothing was rewritten


@pytest.mark.parametrize("edit, message", [TAMPERED[0], TAMPERED[3], TAMPERED[-3]])
def test_preflight_refuses_a_tampered_state_before_anything_is_loaded(policy_dir: Path, four_step_run: Path,
                                                                      tmp_path: Path, edit: Any, message: str) -> None:
    """The train flow runs preflight before MLflow opens a run: the refusal comes from there."""
    run = _copy(four_step_run, tmp_path)
    ds = dataset()
    cfg = TrainConfig(**{**RUN, "steps": 5})
    preflight(cfg, "arithmetic", ds["train"], ds["test"], policy_dir, run)  # the untouched copy passes
    tamper(run / NEWEST, edit)
    with pytest.raises(CheckpointError, match=rf"step_000004[/\\]state\.json: {message}"):
        preflight(cfg, "arithmetic", ds["train"], ds["test"], policy_dir, run)


@pytest.mark.parametrize("edit, message", [TAMPERED[0], TAMPERED[3]])
def test_restore_refuses_a_state_tampered_after_preflight(policy_dir: Path, four_step_run: Path, tmp_path: Path,
                                                          no_rollouts: None, edit: Any, message: str) -> None:
    """train(checked) does not run preflight again; the restore checks what it loads itself."""
    run = _copy(four_step_run, tmp_path)
    ds = dataset()
    cfg = TrainConfig(**{**RUN, "steps": 5})
    checked = preflight(cfg, "arithmetic", ds["train"], ds["test"], policy_dir, run)
    tamper(run / NEWEST, edit)
    with pytest.raises(CheckpointError, match=rf"step_000004[/\\]state\.json: {message}"):
        train(checked)


def _lines(run: Path) -> list[str]:
    return (run / "metrics.jsonl").read_text().splitlines()


def _write_lines(run: Path, lines: list[str], end: str = "\n") -> None:
    (run / "metrics.jsonl").write_text("\n".join(lines) + end)


def _edit_record(run: Path, step: int, **values: Any) -> None:
    lines = _lines(run)
    lines[step] = json.dumps({**json.loads(lines[step]), **values})
    _write_lines(run, lines)


def _consistent_budget_edit(run: Path) -> None:
    """cum.rollouts lowered in the state and in step 4's record alike: the steps' own rollouts disagree."""
    tamper(run / NEWEST, setting("cum.rollouts", 0))
    _edit_record(run, 4, cum_rollouts=0)


@pytest.mark.parametrize("damage, message", [
    (lambda run: _write_lines(run, [*_lines(run)[:2], "{not json", *_lines(run)[2:]]),
     r"metrics\.jsonl line 3: not a JSON object"),
    (lambda run: _write_lines(run, [*_lines(run)[:2], "[1, 2]", *_lines(run)[2:]]),
     r"metrics\.jsonl line 3: not a JSON object with a whole-number step"),
    (lambda run: _write_lines(run, [x for i, x in enumerate(_lines(run)) if i != 3]),
     r"metrics\.jsonl line 4: step 4 follows step 2"),
    (lambda run: _write_lines(run, _lines(run)[:4]), r"metrics\.jsonl holds no record of step 4"),
    (lambda run: _edit_record(run, 3, rollouts=-5), r"metrics\.jsonl line 4 \(step 3\): rollouts = -5: must be a "
                                                    r"whole number >= 0"),
    (lambda run: _edit_record(run, 2, nonfinite="x"), r"metrics\.jsonl line 3 \(step 2\): nonfinite = 'x': must be "
                                                      r"0 or 1"),
    (_consistent_budget_edit, r"metrics\.jsonl line 5 \(step 4\): cum_rollouts = 0 is not the sum of the steps' "
                              r"rollouts \(\d+\)"),
])
def test_metrics_that_do_not_account_for_the_checkpoint_are_refused(policy_dir: Path, four_step_run: Path,
                                                                    tmp_path: Path, no_rollouts: None, damage: Any,
                                                                    message: str) -> None:
    """metrics.jsonl is what the restored counters are checked against: a malformed line was skipped, a missing
    step passed, so an edit of both the state and the step's record went unseen."""
    run = _copy(four_step_run, tmp_path)
    damage(run)
    with pytest.raises(CheckpointError, match=rf"{message}.*start a fresh run folder") as refused:
        _resume(policy_dir, run)
    assert refused.value.__cause__ is None and refused.value.__context__ is None


def test_a_line_cut_by_a_crash_after_the_checkpoint_is_still_accepted(policy_dir: Path, four_step_run: Path,
                                                                      tmp_path: Path) -> None:
    """A SIGKILL half-way through appending step 5's record leaves an unterminated last line: not refused."""
    run = _copy(four_step_run, tmp_path)
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 5, "rollo')
    ds = dataset()
    cfg = TrainConfig(**{**RUN, "steps": 5})
    checked = preflight(cfg, "arithmetic", ds["train"], ds["test"], policy_dir, run)
    assert checked.run_dir == run


def test_a_checkpoint_with_non_zero_counters_resumes(policy_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks refuse what no run writes, not what a run does: a checkpoint taken right after a non-finite
    update (nonfinite_run = 1) in a run with verifier errors resumes, its counters carried on."""
    import rlvr_core.training as training
    from rlvr_core.rewards import scoring

    real_verifier, real_load = scoring.get_verifier, training.load_policy
    box: dict[str, Any] = {"next": 1}

    def flaky(name: str) -> Any:
        verify_one = real_verifier(name)
        return lambda text, row: (_ for _ in ()).throw(ValueError("flaky")) if len(text) % 5 == 0 else \
            verify_one(text, row)

    def load(*args: Any, **kw: Any) -> Any:
        model, tok = real_load(*args, **kw)

        def nan_in_step_2(module: Any, inputs: Any, output: Any) -> Any:
            if torch.is_grad_enabled() and box["next"] == 2:
                output.logits = output.logits * float("nan")
            return output
        model.register_forward_hook(nan_in_step_2)
        return model, tok

    def on_step(rec: dict[str, Any]) -> None:
        box["next"] = rec["step"] + 1

    monkeypatch.setattr(scoring, "get_verifier", flaky)
    monkeypatch.setattr(training, "load_policy", load)
    ds = dataset()
    run = tmp_path / "run"
    cfg = {**RUN, "steps": 2, "batch_size": 16, "eval_every": 0, "eval_samples": 0}
    first = check_and_train(TrainConfig(**cfg), policy_dir=policy_dir, train_rows=ds["train"], test_rows=ds["test"],
                            run_dir=run, on_step=on_step)
    saved = json.loads((run / "checkpoints/step_000002" / STATE).read_text())
    assert saved["nonfinite_run"] == 1 and saved["verifier_errors"] == first.metrics[-1]["verifier_errors"] > 0
    again = check_and_train(TrainConfig(**{**cfg, "steps": 3}), policy_dir=policy_dir, train_rows=ds["train"],
                            test_rows=ds["test"], run_dir=run, on_step=on_step)
    assert again.resumed_from == 2 and [r["step"] for r in again.metrics] == [0, 1, 2, 3]
    assert again.metrics[3]["verifier_errors"] >= saved["verifier_errors"]
    assert again.metrics[3]["cum_rollouts"] == saved["cum"]["rollouts"] + again.metrics[3]["rollouts"]
