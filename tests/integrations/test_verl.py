"""rlvr_core.integrations.verl against verl 0.9.1's own code, in verl's environment (.venv-verl).

verl pins transformers<5.11 and tensordict<=0.10, so it cannot live in this suite's environment; `make verl-env`
builds .venv-verl (CI does, in .ci/run) and this test runs tests/integrations/verl_cases.py there with
`.venv-verl/bin/python -m pytest`. Without that environment it is skipped with the reason. In this environment:
the module imports without verl, its public helpers refuse what they should, and the buffer's resume (the folder
verl resumed from, the allocator state's parameters) runs on real state files with verl's base class stood in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = Path(os.environ.get("RLVR_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))


def test_module_imports_without_verl():
    code = ("import sys, rlvr_core.integrations.verl as v; "
            "assert 'verl' not in sys.modules and 'transfer_queue' not in sys.modules; print(v.STATE_DIR)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "allocator_state"


def test_check_state_names_the_field():
    from rlvr_core.integrations.verl import TOTALS, check_state

    totals = {k: 3 for k in TOTALS}
    good = {"allocator": "sara", "params": {}, "state": {}, "source": {}, "history": [{"rollouts": 3}],
            "totals": totals}
    check_state(good, "x")
    with pytest.raises(ValueError, match="field 'source' is missing"):
        check_state({k: v for k, v in good.items() if k != "source"}, "x")
    with pytest.raises(ValueError, match="non-negative"):
        check_state(good | {"totals": totals | {"rollouts": -1}}, "x")
    with pytest.raises(ValueError, match="non-negative integer rollouts"):  # the keys it keeps, as TRL's check
        check_state(good | {"totals": {"rollouts": 3}}, "x")
    with pytest.raises(ValueError, match="history': entry 0 is not a dict of numbers"):
        check_state(good | {"history": [{"rollouts": "3"}]}, "x")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not VERL_PYTHON.exists(),
                    reason=f"no verl environment at {VERL_PYTHON}: run `make verl-env` (or set RLVR_VERL_PYTHON) "
                           "to test the verl integration against verl 0.9.1")
def test_verl_cases_in_verl_env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", PYTHONWARNINGS="ignore")
    out = subprocess.run([str(VERL_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "tests/integrations/verl_cases.py"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=850)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-3000:]


# ----- resume: the folder verl resumed from, and the allocator and parameters the state was written with -----
# The buffer's logic on real state files, in this environment: verl's ReplayBuffer (the base class) stands in with
# the attributes _AllocatorSampling reads; verl_cases.py runs the same refusals on the real class.

class _ReplayBufferStandIn:
    def __init__(self, *, trainer_mode, sampler_kwargs, refill_fn, **_):
        self.trainer_mode, self.sampler_kwargs, self.refill_fn = trainer_mode, sampler_kwargs, refill_fn


class _TrainerStandIn:
    """What the buffer reads of verl's PPOTrainer (refill's __self__): config, train_dataset and the dispatch."""

    def __init__(self, **trainer):
        from omegaconf import OmegaConf

        self.config = OmegaConf.create({"trainer": {"resume_mode": "auto", **trainer},
                                        "data": {"seed": 7},
                                        "actor_rollout_ref": {"rollout": {"n": 4}}})
        self.train_dataset = list(range(40))

    def refill(self, n):  # PPOTrainer._add_prompts_to_generate's place
        return None

    def _submit_batch_to_rollout(self, batch):  # no step runs here
        raise AssertionError("nothing is dispatched in these tests")


def _buffer(allocator="sara", params=None, seed=7, **trainer):
    from rlvr_core.integrations.verl import _AllocatorSampling

    tr = _TrainerStandIn(**trainer)
    tr.config.data.seed = seed  # the allocator's seed, as verl's data.seed gives it
    cls = type("AllocatorReplayBuffer", (_AllocatorSampling, _ReplayBufferStandIn), {})
    buf = cls(trainer_mode="sync", sampler_kwargs={"allocator": allocator, "allocator_params": params or {}},
              refill_fn=tr.refill)
    buf._ensure_allocator(4)
    return buf


def _saved(tmp_path, folder, **kw):
    """A buffer that ran (one recorded step, the stream moved) and saved its state into ``folder``."""
    from rlvr_core.integrations.verl import STATE_DIR

    a = _buffer(default_local_dir=str(tmp_path / "a"), **kw)
    a.prompt_source.take(6)
    a._record({"rollouts": 16, "tokens": 160, "groups": 4, "effective_groups": 2, "useful_rollouts": 8})
    a.save_state(Path(folder) / STATE_DIR, 1)
    return a


def test_state_records_the_parameters_the_allocator_was_built_with(tmp_path):
    a = _saved(tmp_path, tmp_path / "a" / "global_step_1", params={"tau_low": 0.05})
    from rlvr_core.checkpoint import read_state

    params = read_state(tmp_path / "a" / "global_step_1" / "allocator_state")["params"]
    assert params == {"k": 4, "batch_size": 4, "seed": 7, "reward_threshold": 0.0, "tau_low": 0.05}
    assert a.allocator_params == {"tau_low": 0.05}  # what the user gave, kept apart


def test_resume_path_outside_default_local_dir_is_restored(tmp_path):
    elsewhere = tmp_path / "elsewhere" / "global_step_1"
    a = _saved(tmp_path, elsewhere)
    b = _buffer(default_local_dir=str(tmp_path / "b"), resume_mode="resume_path", resume_from_path=str(elsewhere))
    b._maybe_resume(2)
    assert b.allocation_history == a.allocation_history and len(b.allocation_history) == 1
    assert b.allocation_state()["totals"] == a.allocation_state()["totals"]
    assert b.prompt_source.take(6).tolist() == a.prompt_source.take(6).tolist()


@pytest.mark.parametrize("mode", ["resume_path", "auto"])
def test_resume_without_allocator_state_is_refused_naming_the_path(tmp_path, mode):
    ckpt = tmp_path / "ckpts" / "global_step_1"
    ckpt.mkdir(parents=True)  # verl's own checkpoint (actor/, data.pt), no allocator_state/
    trainer = {"resume_mode": mode, "resume_from_path": str(ckpt)} if mode == "resume_path" else {}
    b = _buffer(default_local_dir=str(tmp_path / ("other" if mode == "resume_path" else "ckpts")), **trainer)
    with pytest.raises(FileNotFoundError, match=re.escape(str(ckpt / "allocator_state"))):
        b._maybe_resume(2)


def test_auto_resume_whose_step_folder_is_missing_is_refused(tmp_path):
    b = _buffer(default_local_dir=str(tmp_path / "ckpts"))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "ckpts" / "global_step_4"))):
        b._maybe_resume(5)
    fresh = _buffer(default_local_dir=str(tmp_path / "ckpts"), resume_mode="disable")
    fresh._maybe_resume(5)  # resume_mode=disable: verl resumed nothing, nothing is read
    assert fresh.allocation_history == []


@pytest.mark.parametrize("over,shown", [
    ({"params": {"tau_low": 0.05}}, "tau_low=absent there, 0.05 now"),
    ({"seed": 8}, "seed=7 there, 8 now"),
])
def test_resume_with_other_parameters_is_refused_naming_both(tmp_path, over, shown):
    from rlvr_core.errors import ConfigError

    _saved(tmp_path, tmp_path / "a" / "global_step_1")
    b = _buffer(default_local_dir=str(tmp_path / "a"), **over)
    with pytest.raises(ConfigError) as e:
        b._maybe_resume(2)
    msg = str(e.value)
    assert str(tmp_path / "a" / "global_step_1" / "allocator_state") in msg and "field 'params'" in msg
    assert shown in msg, msg
    assert b.allocation_history == []  # nothing was restored


def _as_earlier_release(folder: Path, user_params: dict) -> None:
    """Rewrite the state as the earlier release wrote it: params = allocator_params alone (hashes recomputed)."""
    import hashlib
    import json

    tree = json.loads((folder / "state.json").read_text())
    tree["params"] = user_params
    data = json.dumps(tree).encode()
    (folder / "state.json").write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_a_state_of_the_earlier_release_is_compared_with_allocator_params(tmp_path):
    from rlvr_core.errors import ConfigError

    ckpt = tmp_path / "a" / "global_step_1"
    a = _saved(tmp_path, ckpt, params={"tau_low": 0.05})
    _as_earlier_release(ckpt / "allocator_state", {"tau_low": 0.05})
    b = _buffer(default_local_dir=str(tmp_path / "a"), params={"tau_low": 0.05})
    with pytest.warns(UserWarning, match="k, batch_size, seed, reward_threshold .* were not recorded"):
        b._maybe_resume(2)
    assert b.allocation_history == a.allocation_history
    c = _buffer(default_local_dir=str(tmp_path / "a"), params={"tau_low": 0.2})
    with pytest.raises(ConfigError, match=re.escape("tau_low=0.05 there, 0.2 now")):
        c._maybe_resume(2)
