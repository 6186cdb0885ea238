"""params.yaml is the study's regime ``hard``; ``easy`` is overrides on it. The study's configurations are the
ones its committed results were trained with (benchmarks/results/study, regimes.md)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from benchmarks import regimes
from benchmarks.study import data, execute, plan
from rlvr_core.config import load_params

# prepare and warmstart of the two regimes as the study trained them (before params.yaml moved to hard)
COMMON_PREPARE = {"task": "arithmetic", "n_train": 20000, "n_test": 3000, "seed": 0, "digit_weights": None,
                  "ops": ("+", "-", "*")}
COMMON_WARMSTART = {"steps": 2400, "batch_size": 64, "lr": 7e-4, "warmup": 100, "min_lr_ratio": 0.1,
                    "weight_decay": 0.0, "seed": 0, "hidden": 128, "layers": 2, "heads": 4, "intermediate": 512}
SETTINGS = {"easy": ({"digits": (1, 2, 3)}, {"noise": 0.6, "noisy_difficulties": (2, 3)}),
            "hard": ({"digits": (1, 2, 3, 4)}, {"noise": 0.8, "noisy_difficulties": (2, 3, 4)})}
# the warm-started policies the study cached under runs/study (hash of the prepare + warmstart settings)
POLICY_KEYS = {"easy": "6120b3bb6a99", "hard": "e2f475331011"}


def test_the_regimes_train_what_the_study_trained() -> None:
    for name, (prep, ws) in SETTINGS.items():
        p = plan.regime_params(name)
        got_prep, got_ws = asdict(p.prepare), asdict(p.warmstart)
        assert {k: got_prep[k] for k in {**COMMON_PREPARE, **prep}} == {**COMMON_PREPARE, **prep}, name
        assert {k: got_ws[k] for k in {**COMMON_WARMSTART, **ws}} == {**COMMON_WARMSTART, **ws}, name
        assert data.policy_key(p) == POLICY_KEYS[name], name


def test_params_yaml_is_hard_and_hard_is_the_chosen_candidate() -> None:
    base = load_params(plan.PARAMS_FILE)
    hard = plan.regime_params("hard")
    assert hard.warmstart == base.warmstart and hard.train == base.train
    assert asdict(hard.prepare) == {**asdict(base.prepare), "n_test": plan.TEST_ROWS + plan.VALIDATION_ROWS}
    chosen = plan.regime_params(plan.merge(plan.EASY, regimes.CANDIDATES[regimes.CHOSEN]))
    assert chosen == hard
    # a candidate means what it meant when declared: its overrides on the easy setting
    d1234 = plan.regime_params(plan.merge(plan.EASY, regimes.CANDIDATES["d1234"]))
    assert d1234.prepare.digits == (1, 2, 3, 4) and d1234.warmstart == plan.regime_params("easy").warmstart


def test_study_runs_differ_between_regimes_only_in_the_regime() -> None:
    for label in ("grpo", "sara", "dapo", "vigor"):
        easy, hard = (execute.run_params(r, label, 1, protocol="equal-batch") for r in ("easy", "hard"))
        assert {**asdict(easy.train), "max_rollouts": None} == {**asdict(hard.train), "max_rollouts": None}
        assert (easy.train.max_rollouts, hard.train.max_rollouts) == (30000, 40000)  # the study's BUDGET
        assert hard.train.steps == 100000 and hard.train.eval_size == 2000 and hard.train.eval_every == 6


def test_params_steps_yaml_is_regime_steps() -> None:
    """params-steps.yaml (the preset `dvc repro` runs after `cp params-steps.yaml params.yaml`) is params.yaml with
    regime ``steps``'s overrides: the same keys, and the regime's values."""
    import yaml

    preset_file = plan.ROOT / "params-steps.yaml"
    base, preset = (yaml.safe_load(f.read_text()) for f in (plan.PARAMS_FILE, preset_file))
    assert {s: set(v) for s, v in base.items()} == {s: set(v) for s, v in preset.items()}
    changed = {(s, k): preset[s][k] for s in base for k in base[s] if base[s][k] != preset[s][k]}
    assert changed == {(s, k): v for s, vals in plan.STEPS.items() for k, v in vals.items()}
    steps = plan.regime_params("steps")
    loaded = load_params(preset_file)
    assert loaded.train == steps.train and loaded.warmstart == steps.warmstart and loaded.evaluate == steps.evaluate
    assert asdict(steps.prepare) == {**asdict(loaded.prepare), "n_test": plan.TEST_ROWS + plan.VALIDATION_ROWS}
    assert loaded.prepare.task == "arithmetic-steps" and loaded.train.max_new_tokens >= 60
    assert {n for n, r in plan.REGIMES.items() if r.extra_criteria} == {"steps"} and plan.REGIMES["steps"].budget


def test_regime_steps_builds_the_worked_answer_rows() -> None:
    p = plan.regime_params(plan.merge(plan.STEPS, {"prepare": {"n_train": 40, "n_test": 10}}))
    ds = data.dataset(p)
    assert len(ds["train"]) == 40 and ds["train"][0]["prompt"].endswith("=")
    with pytest.raises(ValueError, match="the study supports tasks arithmetic, arithmetic-steps, got 'countdown'"):
        data.dataset(plan.regime_params({"prepare": {"task": "countdown"},
                                               "train": {"max_new_tokens": 16}, "evaluate": {"max_new_tokens": 16}}))


def test_policy_dir_warm_starts_with_the_regimes_task(tmp_path, monkeypatch) -> None:
    import rlvr_core.models.warmstart as ws

    seen = {}

    def fake(rows, *, teacher, out_dir, **kwargs):
        seen.update(task=teacher, steps=kwargs["steps"])
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(ws, "warm_start", fake)
    out = data.policy_dir(plan.regime_params("steps"), tmp_path, [], quick=True)
    from rlvr_core.tasks import get_task

    assert seen == {"task": get_task("arithmetic-steps").teacher, "steps": 30} and (out / "config.json").exists()
