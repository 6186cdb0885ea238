"""verl rollout dumps as advisor input (rlvr_core.advise.trl_log, docs/advisor.md "verl rollout dumps"): the files
verl 0.9.1 writes with ``trainer.rollout_data_dir=DIR`` (``RayPPOTrainer._write_generations``: DIR/<step>.jsonl,
one object per sample: input, output, gts, score, step and the reward-extra-info lists of the batch's length)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rlvr_core.advise import LogError, advise, load_log


def write_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path, global_steps):
    """verl 0.9.1's ``RayPPOTrainer._write_generations`` (verl/trainer/ppo/ray_trainer.py), as it writes a step."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{global_steps}.jsonl")
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores, "step": [global_steps] * n}
    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v
    with open(filename, "w") as f:
        for i in range(n):
            entry = {k: v[i] for k, v in base_data.items()}
            f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")


def dump(folder, steps: int = 4, prompts: int = 6, n: int = 4, seed: int = 0) -> np.ndarray:
    """A rollout_data_dir of ``steps`` steps of ``prompts`` x ``n`` samples (verl repeats each prompt n times, in
    order); returns the passes per (step, prompt)."""
    rng = np.random.default_rng(seed)
    passes = np.zeros((steps, prompts), int)
    for t in range(1, steps + 1):
        inputs, outputs, scores, acc = [], [], [], []
        for j in range(prompts):
            r = rng.random(n) < rng.beta(0.5, 1.0)
            passes[t - 1, j] = int(r.sum())
            for ok in r:
                inputs.append(f"user\nQuestion {t}.{j}: what is {j} + {t}?\nassistant\n")
                outputs.append("The answer is " + ("right" if ok else "wrong, sorry") + ".")
                scores.append(1.0 if ok else 0.0)
                acc.append(bool(ok))
        write_generations(inputs, outputs, [str(t + j) for j in range(len(inputs))], scores,
                          {"acc": acc, "pred": ["x"] * len(inputs), "short": [1]}, str(folder), t)
    return passes


def test_a_verl_rollout_dir_is_a_log_of_one_row_per_step_and_prompt(tmp_path):
    passes = dump(tmp_path / "rollouts")
    df = load_log(tmp_path / "rollouts")
    assert len(df) == 4 * 6 and (df["rollouts"] == 4).all()
    assert sorted(df["step"].unique()) == [1, 2, 3, 4]
    assert df.groupby("step")["passes"].sum().tolist() == passes.sum(axis=1).tolist()
    assert (df["tokens"] > 0).all()  # estimated from the output's characters
    by_acc = load_log(tmp_path / "rollouts", reward_columns=["acc"])  # a bool column as the reward
    assert by_acc["passes"].tolist() == df["passes"].tolist()


def test_advice_on_a_verl_dump(tmp_path):
    dump(tmp_path / "rollouts", steps=6, prompts=8)
    adv = advise(tmp_path / "rollouts", k=4, batch=8, seeds=2, steps=6, allocators=["grpo", "sara"])
    assert adv.rows == 48 and adv.replay == "fresh" and adv.recommendation


@pytest.mark.parametrize("field, value, pattern", [
    ("score", "high", r"2\.jsonl: row 3 \(line 3\), column 'score': not a number \(value 'high'"),
    ("score", -1.0, r"2\.jsonl: row 3 \(line 3\), column 'score': reward \(score\) outside \[0, 1\]"),
    ("input", 7, r"2\.jsonl: row 3 \(line 3\), column 'input': neither text nor a conversation"),
    ("step", 2.5, r"2\.jsonl: row 3 \(line 3\), column 'step': not a whole number"),
])
def test_a_malformed_verl_dump_is_refused_naming_file_line_and_field(tmp_path, field, value, pattern):
    dump(tmp_path / "rollouts")
    path = tmp_path / "rollouts" / "2.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[2])
    rec[field] = value
    lines[2] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LogError, match=pattern):
        load_log(tmp_path / "rollouts")


def test_one_step_file_and_a_dump_without_its_reward_are_refused(tmp_path):
    dump(tmp_path / "rollouts")
    with pytest.raises(LogError, match=r"1\.jsonl: column 'step': every row is from step 1"):
        load_log(tmp_path / "rollouts" / "1.jsonl")
    for p in (tmp_path / "rollouts").glob("*.jsonl"):
        p.write_text("".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "score"}) + "\n"
                             for x in p.read_text().splitlines()))
    with pytest.raises(LogError, match=r"no reward column \['score'\]"):
        load_log(tmp_path / "rollouts")
