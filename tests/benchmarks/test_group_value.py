"""The group-value probe (benchmarks/group_value.py): it measures without changing training, its groups' gradients
add up to the update's, and its fit recovers a known form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from benchmarks import group_value as gv
from rlvr_core.config import TrainConfig
from rlvr_core.models.tiny import build_tiny_policy, save_policy
from rlvr_core.training import check_and_train
from tests.reliability.common import dataset, read_metrics, strip_timing

CFG = dict(allocator="grpo", steps=3, batch_size=8, k=4, eval_every=3, eval_size=20, eval_samples=0,
           checkpoint_every=3, keep_last=1, seed=1, lr=5e-3)


class SummingProbe(gv.Probe):
    """Also records, per update, <the whole update's gradient, h> beside the sum of its groups' <g, h>."""

    sums: list[tuple[float, float]]

    def _groups(self, trainer, train_batch, local, normaliser) -> None:
        before = len(self.records)
        super()._groups(trainer, train_batch, local, normaliser)
        h, _ = self.heldout_gradient(trainer)
        trainer.optimizer.zero_grad(set_to_none=False)
        trainer._pass(local, normaliser, grad=True)
        full = float(torch.cat([p.grad.reshape(-1) for p in trainer.params]) @ h)
        self.sums = [*getattr(self, "sums", []), (full, sum(r["inner"] for r in self.records[before:]))]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64)
    return save_policy(model, tok, tmp_path_factory.mktemp("gv") / "policy")


def _train(policy, run_dir, probe=None):
    ds = dataset()
    cfg = TrainConfig(**CFG)
    if probe is None:
        return check_and_train(cfg, policy_dir=policy, train_rows=ds["train"], test_rows=ds["test"], run_dir=run_dir)
    with gv.probing(probe):
        return check_and_train(cfg, policy_dir=policy, train_rows=ds["train"], test_rows=ds["test"], run_dir=run_dir)


def test_the_probe_measures_every_trained_group_and_leaves_training_unchanged(policy, tmp_path) -> None:
    rows = list(dataset()["test"])[:16]
    ids, mask = gv.heldout_targets(rows, policy, "arithmetic")
    probe = SummingProbe(ids, mask, list(dataset()["train"]))
    _train(policy, tmp_path / "plain")
    from rlvr_core.grpo.trainer import GRPOTrainer

    original = GRPOTrainer.step
    _train(policy, tmp_path / "probed", probe)
    assert GRPOTrainer.step is original  # the class is restored on the way out
    assert strip_timing(read_metrics(tmp_path / "probed")) == strip_timing(read_metrics(tmp_path / "plain"))
    assert probe.updates == 3 and probe.records
    trained = sum(r["trained_sequences"] for r in read_metrics(tmp_path / "plain") if "trained_sequences" in r)
    assert sum(r["n"] for r in probe.records) == trained  # every trained row belongs to a measured group
    assert all(0 < r["p_hat"] < 1 and r["n"] == 4 for r in probe.records)  # GRPO trains mixed groups of k
    for full, summed in probe.sums:  # the groups' gradients add up to the update's
        assert summed == pytest.approx(full, rel=1e-4, abs=1e-7)
    again = [r["prompt_id"] for r in probe.records if r["times_trained"] > 0]
    assert all(any(q["prompt_id"] == p and q["update"] < r["update"] for q in probe.records)
               for p, r in zip(again, [r for r in probe.records if r["times_trained"] > 0]))


def test_the_fit_recovers_a_known_form_and_slope() -> None:
    rng = np.random.default_rng(0)
    p = rng.choice(np.arange(1, 8) / 8, size=4000)
    times = rng.integers(0, 10, size=4000)
    value = 2.0 * p * (1 - p) - 0.01 * times + rng.normal(0, 0.02, size=4000)
    groups = pd.DataFrame({"p_hat": p, "value": value, "times_trained": times, "n": 8, "adv_abs_mass": 1.0,
                           "difficulty": 2, "regime": "hard-ws3", "variant": "grpo", "seed": 0})
    fits = {f["form"]: f for f in gv.fit(groups)["all"]["forms"]}
    assert max(fits, key=lambda k: fits[k]["r2"] or -1) == "p(1-p)"
    assert fits["p(1-p)"]["bin_rank_correlation"] > 0.9 and fits["mixed"]["bin_rank_correlation"] is None
    h = gv.history_slope(groups)
    assert h["lo"] < -0.01 < h["hi"] and h["slope"] == pytest.approx(-0.01, abs=0.002)
    assert gv.fit(groups)["hard"]["groups"] == 4000  # the family scope


def test_split_groups_of_the_whole_size_measure_the_whole_group(policy, tmp_path) -> None:
    """A whole group 'split' into one part of its size is the group itself: value_n4 equals its value; parts of 2
    count their own mixed share."""
    rows = list(dataset()["test"])[:16]
    ids, mask = gv.heldout_targets(rows, policy, "arithmetic")
    probe = gv.Probe(ids, mask, list(dataset()["train"]), subsizes=(4, 2), whole=4)
    _train(policy, tmp_path / "r", probe)
    assert probe.records, "the run trained no group"
    for r in probe.records:
        assert r["value_n4"] == pytest.approx(r["value"], rel=1e-5, abs=1e-9) and r["mixed_n4"] == 1.0
        assert r["mixed_n2"] in (0.0, 0.5, 1.0) and "value_n2" in r


def test_the_calibration_recovers_known_exponents_size_growth_and_discount() -> None:
    rng = np.random.default_rng(1)
    m = 6000
    p = rng.choice(np.arange(1, 8) / 8, size=m)
    times = rng.integers(0, 8, size=m)
    value = 3.0 * p**0.5 * (1 - p) ** 3 * (1 - 0.05 * times) + rng.normal(0, 0.005, size=m)
    mixed2, mixed4 = rng.uniform(0.2, 1.0, m), rng.uniform(0.5, 1.0, m)
    groups = pd.DataFrame({"p_hat": p, "value": value, "times_trained": times, "n": 8,
                           "value_n2": mixed2 * value * (2 / 8) ** 0.6, "mixed_n2": mixed2,
                           "value_n4": mixed4 * value * (4 / 8) ** 0.6, "mixed_n4": mixed4})
    cal = gv.calibrate(groups)
    d = cal["declared"]
    assert (d["value_a"], d["value_b"]) == (0.5, 3.0)
    assert d["size_exponent"] == pytest.approx(0.6, abs=0.01)
    assert all(t["lo"] <= 0.6 <= t["hi"] for t in cal["sizes"])
    assert d["novelty"] > 0  # the value falls with earlier trainings: a discount is declared
    flat = gv.calibrate(groups.assign(value=3.0 * p**0.5 * (1 - p) ** 3 + rng.normal(0, 0.005, size=m)))
    assert flat["declared"]["novelty"] == 0.0  # no fall, no discount
    assert "Declared" in "\n".join(gv.calibration_md(cal))
