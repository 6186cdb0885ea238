"""VLLMEngine client logic against a fake server that speaks the rollout-server protocol.

The fake runs either in this process (a thread; the client connects by url) or
as a child process started by the client itself (this file run as a script,
with the same command line as scripts/vllm_server.py), so restarts after a
server death are real process deaths. No vllm is needed.

The fake checks tokens and weight paths with the real server's own functions
(``check_auth``, ``resolve_weights_file`` of scripts/vllm_server.py, which imports
no vllm at module level); the real server's request handler itself is tested
with a stand-in for ``vllm.LLM`` at the end of this file.

The fake "generates" deterministically from (seed + child index, weights digest):
the same seeds give the same completions, different weights give different ones.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 22
EOS = 2
_spec = importlib.util.spec_from_file_location("rlvr_vllm_server",
                                               Path(__file__).resolve().parents[2] / "scripts" / "vllm_server.py")
server_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(server_mod)  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- the fake server
class FakeState:
    """What the fake holds: a weights digest and counters; fault switches come from the environment."""

    def __init__(self, model: str, token: str, weights_dir: str | None = None) -> None:
        self.model = model
        self.token = token
        self.weights_dir = server_mod.prepare_weights_dir(weights_dir)
        self.weights_version = 0
        self.digest = self._digest_file(Path(model) / "model.safetensors")
        self.generate_calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.sleeping = False
        self.lock = threading.Lock()

    @staticmethod
    def _digest_file(path: Path) -> float:
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
        return float(sum(float(np.asarray(a, dtype=np.float64).sum()) for a in arrays.values()))

    def _fault(self, name: str) -> bool:
        """Fault ``name`` fires on the generate call number given in FAKE_<NAME> (1-based), once per marker."""
        at = os.environ.get(f"FAKE_{name}")
        if at is None or self.generate_calls != int(at):
            return False
        marker = os.environ.get("FAKE_MARKER")
        if marker:  # fire in the first process only: a restarted server is healthy
            if os.path.exists(marker) and not os.environ.get("FAKE_ALWAYS"):
                return False
            Path(marker).touch()
        return True

    def generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.sleeping:
            return 400, {"error": "asleep"}
        self.generate_calls += 1
        self.bodies.append(body)
        if self._fault("DIE_ON_GENERATE"):
            os._exit(9)  # mid-request: the client sees a dropped connection
        if self._fault("ENGINE_DEAD_ON_GENERATE"):
            threading.Timer(0.1, lambda: os._exit(3)).start()
            return 503, {"error": "engine died: EngineDeadError"}
        if self._fault("HANG_ON_GENERATE"):
            time.sleep(30)
        samp = body["sampling"]
        results = []
        wrong = os.environ.get("FAKE_WRONG_COUNT")
        for r in body["requests"]:
            comps = []
            for j in range(r["n"] - (1 if wrong else 0)):
                rng = np.random.default_rng([r["seed"] + j, int(abs(self.digest) * 1e6) % 2**32])
                length = int(rng.integers(1, samp["max_tokens"] + 1))
                ids = [int(t) for t in rng.integers(3, VOCAB, size=length)]
                stop = length < samp["max_tokens"] or rng.random() < 0.3
                if stop:
                    ids[-1] = EOS
                lps = [float(-np.log(VOCAB) - 0.01 * t) for t in ids]
                comps.append({"token_ids": ids, "logprobs": lps, "finish_reason": "stop" if stop else "length"})
            results.append({"completions": comps})
        return 200, {"results": results, "weights_version": self.weights_version, "seconds": 0.0,
                     "tokens": sum(len(c["token_ids"]) for r in results for c in r["completions"])}

    def score(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"logprobs": [[-0.5 * (i + 1)] * len(s["completion_token_ids"])
                                  for i, s in enumerate(body["sequences"])]}

    def load_weights(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.sleeping:
            return 400, {"error": "asleep"}
        try:
            path = server_mod.resolve_weights_file(body.get("path"), self.weights_dir)
        except server_mod.Forbidden as e:
            return 403, {"error": str(e)}
        except server_mod.BadRequest as e:
            return 400, {"error": str(e)}
        self.digest = self._digest_file(path)
        self.weights_version = body["version"]
        return 200, {"weights_version": self.weights_version, "tensors": [1], "seconds": 0.0}

    def sleep(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.sleeping = True
        return 200, {"sleeping": True}

    def wake_up(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.sleeping = False
        return 200, {"sleeping": False}

    def health(self) -> dict[str, Any]:
        shm = os.environ.get("FAKE_SHM_PREFIX")
        if shm:  # a stand-in for vLLM's message-queue segments, one per server process, held open like them
            shm = f"{shm}-{os.getpid()}"
            if not hasattr(self, "shm_file"):
                self.shm_file = open(shm, "ab")
        claimed = [shm] if shm else []
        claimed += [os.environ["FAKE_SHM_CLAIM"]] if os.environ.get("FAKE_SHM_CLAIM") else []  # not its own
        return {"shm_files": claimed, "status": "ok", "model": self.model,
                "weights_version": self.weights_version, "digest": self.digest,
                "sleeping": self.sleeping, "busy": False, "pid": os.getpid(), "engine_pids": [], "vllm": "fake",
                "generate_calls": self.generate_calls, "weights_dir": str(self.weights_dir)}


def fake_httpd(state: FakeState, port: int = 0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, code: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            refusal = server_mod.check_auth(self.headers.get("Authorization"), state.token)
            if refusal is not None:
                self.close_connection = True
                self._send(refusal[0], {"error": refusal[1]})
            return refusal is None

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            if self.path == "/health":
                self._send(200, state.health())
            else:
                self._send(404, {"error": "no such path"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/shutdown":
                self._send(200, {"status": "stopping"})
                threading.Thread(target=httpd.shutdown, daemon=True).start()
                return
            fn = {"/generate": state.generate, "/score": state.score, "/load_weights": state.load_weights,
                  "/sleep": state.sleep, "/wake_up": state.wake_up}.get(self.path)
            if fn is None:
                self._send(404, {"error": "no such path"})
                return
            with state.lock:
                code, obj = fn(body)
            self._send(code, obj)

    Handler.state = state  # type: ignore[attr-defined]
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    return httpd


def _serve_main() -> None:
    """This file as a server program: the command line of scripts/vllm_server.py (unknown flags ignored)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ready-fd", type=int, default=None)
    ap.add_argument("--ready-file", default=None)  # what older clients passed (the hijack test runs against it)
    ap.add_argument("--weights-dir", default=None)
    args, _ = ap.parse_known_args()
    if os.environ.get("FAKE_FAIL_START"):
        print("fake: refusing to start (FAKE_FAIL_START)", file=sys.stderr, flush=True)
        sys.exit(4)
    with open(os.environ.get("FAKE_ARGV_LOG", os.devnull), "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\n")
    state = FakeState(args.model, server_mod.read_token(None), args.weights_dir)
    time.sleep(float(os.environ.get("FAKE_START_DELAY", "0")))  # vLLM takes seconds to load
    httpd = fake_httpd(state, args.port)
    info = {"port": httpd.server_address[1], "pid": int(os.environ.get("FAKE_READY_PID", os.getpid()))}
    if args.ready_fd is not None:
        server_mod.check_ready_fd(args.ready_fd)
        server_mod.announce_ready(info, args.ready_fd)
    elif args.ready_file:
        Path(args.ready_file + ".tmp").write_text(json.dumps(info))
        os.replace(args.ready_file + ".tmp", args.ready_file)
    httpd.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    _serve_main()
    sys.exit(0)


# ----------------------------------------------------------------------------- tests
import pytest  # noqa: E402

from rlvr_core.errors import ConfigError  # noqa: E402
from rlvr_core.rollout import RolloutEngine, make_engine  # noqa: E402
from rlvr_core.rollout.vllm import VLLMEngine, VLLMServerError, round_seed  # noqa: E402

PROMPTS = ["0047+0083=", "0009*0007=", "0100-0099=", "3,7,25,50>125=", "1,2>3="]
THIS = Path(__file__).resolve()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from rlvr_core.models.tiny import build_tiny_policy, save_policy

    model, tok = build_tiny_policy(hidden=32, layers=1, heads=2, intermediate=64, seed=3)
    folder = save_policy(model, tok, tmp_path_factory.mktemp("policy") / "p")
    return model, tok, folder


def _owned(policy, tmp_path, **kw) -> VLLMEngine:
    """An engine that starts this file's fake server as its child process."""
    model, tok, folder = policy
    args = dict(policy_dir=folder, server_python=sys.executable, server_script=THIS, max_new_tokens=6, seed=11,
                weights_dir=tmp_path / "shm", log_path=tmp_path / "server.log", start_timeout=30, request_timeout=10)
    args.update(kw)
    return VLLMEngine(model, tok, PROMPTS, **args)


TOKEN = "test-token-" + "x" * 20


@pytest.fixture
def inproc(policy, tmp_path, monkeypatch):
    """A fake server in this process (token ``TOKEN``, given to clients in the environment); yields (state, url)."""
    monkeypatch.setenv("RLVR_VLLM_TOKEN", TOKEN)
    (tmp_path / "server-shm").mkdir(mode=0o700)
    state = FakeState(str(policy[2]), TOKEN, str(tmp_path / "server-shm"))
    httpd = fake_httpd(state)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _rows(ro) -> list[tuple]:
    return [(int(p), tuple(pl["completion_ids"]), tuple(pl["logprobs"])) for p, pl in zip(ro.prompt_id, ro.payload)]


def test_import_needs_no_vllm_and_is_registered():
    code = ("import sys, rlvr_core, rlvr_core.rollout, rlvr_core.rollout.vllm as v; "
            "from rlvr_core.rollout import ENGINES; "
            "assert ENGINES.get('vllm') is v.VLLMEngine; "
            "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=THIS.parents[2])


def test_one_batched_request_per_round_with_exact_counts(policy, inproc):
    model, tok, _ = policy
    state, url = inproc
    eng = make_engine("vllm", model=model, tokenizer=tok, prompts=PROMPTS, url=url, max_new_tokens=6, seed=5,
                      temperature=0.7, top_p=0.9)
    assert isinstance(eng, VLLMEngine) and isinstance(eng, RolloutEngine)
    ro = eng.generate({3: 5, 0: 2, 4: 0, 1: 9})
    assert state.generate_calls == 1  # the whole round is one request
    body = state.bodies[0]
    assert [r["n"] for r in body["requests"]] == [5, 2, 9]  # zero-count prompts are not sent
    assert [r["prompt_token_ids"] for r in body["requests"]] == [tok(PROMPTS[p]).input_ids for p in (3, 0, 1)]
    assert body["requests"][0]["prompt_token_ids"][0] == tok.bos_token_id
    assert [r["seed"] for r in body["requests"]] == [round_seed(5, 0, p) for p in (3, 0, 1)]
    assert body["sampling"] == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 6}
    assert len(ro) == 16 and ro.prompt_id.tolist() == [3] * 5 + [0] * 2 + [1] * 9
    assert np.all(ro.reward == 0.0)
    for pid, n_tok, pl in zip(ro.prompt_id, ro.tokens, ro.payload):
        assert pl["prompt_id"] == pid and pl["prompt_ids"] == tok(PROMPTS[pid]).input_ids
        assert n_tok == len(pl["completion_ids"]) == len(pl["logprobs"]) >= 1
        assert pl["text"] == tok.decode(pl["completion_ids"], skip_special_tokens=True)
        assert (pl["finish_reason"] == "stop") == (pl["completion_ids"][-1] == tok.eos_token_id)
    assert len({tuple(pl["completion_ids"]) for pl in ro.payload}) > 12  # children of one prompt differ
    assert len(eng.generate({})) == 0 and state.generate_calls == 1  # empty round: no request


def test_seeds_advance_per_call_and_resume_from_state(policy, inproc):
    model, tok, _ = policy
    _, url = inproc
    a = VLLMEngine(model, tok, PROMPTS, url=url, seed=1)
    first, second = a.generate({0: 4, 2: 3}), a.generate({0: 4, 2: 3})
    assert _rows(first) != _rows(second)
    b = VLLMEngine(model, tok, PROMPTS, url=url, seed=1)
    assert _rows(b.generate({0: 4, 2: 3})) == _rows(first)  # same seed, same call: same rollouts
    c = VLLMEngine(model, tok, PROMPTS, url=url, seed=1)
    c.load_state_dict(a.state_dict() | {"calls": 1})
    assert _rows(c.generate({0: 4, 2: 3})) == _rows(second)
    assert round_seed(1, 0, 0) != round_seed(1, 0, 1) != round_seed(1, 1, 0) != round_seed(2, 0, 0)
    assert all(0 <= round_seed(s, c_, p) < 2**63 for s in (0, -1, 2**40) for c_ in (0, 9) for p in (0, 7))


def test_bad_requests_and_settings_are_refused(policy, inproc, tmp_path):
    model, tok, folder = policy
    _, url = inproc
    eng = VLLMEngine(model, tok, PROMPTS, url=url)
    with pytest.raises(ValueError, match="outside the prompt pool"):
        eng.generate({5: 1})
    with pytest.raises(ValueError, match=r"requests\[0\]"):
        eng.generate({0: -1})
    with pytest.raises(ConfigError, match="url"):
        VLLMEngine(model, tok, PROMPTS, url="http://10.1.2.3:8000")
    with pytest.raises(ConfigError, match="policy_dir"):
        VLLMEngine(model, tok, PROMPTS)
    with pytest.raises(ConfigError, match="temperature"):
        VLLMEngine(model, tok, PROMPTS, url=url, temperature=0)
    with pytest.raises(ConfigError, match="max_model_len"):
        VLLMEngine(model, tok, PROMPTS, url=url, max_new_tokens=8, max_model_len=8)
    with pytest.raises(VLLMServerError, match="make vllm-cpu-env"):
        VLLMEngine(model, tok, PROMPTS, policy_dir=folder, server_python=tmp_path / "nope" / "python")
    with pytest.raises(ConfigError, match="enable_sleep_mode"):
        eng.sleep()


def test_update_weights_pushes_a_shared_memory_file(policy, inproc, tmp_path):
    import torch
    from safetensors.torch import load_file

    model, tok, _ = policy
    state, url = inproc
    eng = VLLMEngine(model, tok, PROMPTS, url=url, weights_dir=tmp_path / "ignored")  # a url server names its folder
    before = _rows(eng.generate({1: 4}))
    eng.load_state_dict({"seed": 0, "calls": 0})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    eng.update_weights()  # pushes model.state_dict()
    files = list(state.weights_dir.glob("*.safetensors"))
    assert len(files) == 1 and state.weights_version == 1 == eng.weights_version
    pushed = load_file(str(files[0]))
    sd = model.state_dict()
    assert "lm_head.weight" not in pushed  # tied to embed_tokens: written once
    for name, t in pushed.items():
        assert torch.equal(t, sd[name])
    assert set(pushed) == set(sd) - {"lm_head.weight"}
    assert state.digest == pytest.approx(float(sum(t.double().sum() for t in pushed.values())), rel=1e-9)
    after = _rows(eng.generate({1: 4}))
    assert after != before  # same seeds, new weights
    eng.update_weights({k: v.clone() for k, v in sd.items()})  # an explicit state dict
    assert state.weights_version == 2 and len(list(state.weights_dir.glob("*.safetensors"))) == 1  # old file removed
    assert not (tmp_path / "ignored").exists()
    bare = VLLMEngine(None, tok, PROMPTS, url=url)
    with pytest.raises(ValueError, match="holds no model"):
        bare.update_weights()
    with pytest.raises(TypeError, match="state"):
        bare.update_weights({"w": [1.0]})


def test_sleep_then_generate_wakes_the_server(policy, inproc):
    model, tok, _ = policy
    state, url = inproc
    eng = VLLMEngine(model, tok, PROMPTS, url=url, enable_sleep_mode=True)
    eng.sleep(level=2)
    assert state.sleeping and eng.sleeping
    eng.update_weights()  # wakes first, then loads
    assert not state.sleeping and state.weights_version == 1
    eng.sleep()
    assert len(eng.generate({0: 2})) == 2 and not state.sleeping


def test_score_and_greedy_go_through_the_server(policy, inproc):
    model, tok, _ = policy
    state, url = inproc
    eng = VLLMEngine(model, tok, PROMPTS, url=url)
    assert eng.score([[1, 3], [1, 4, 5]], [[6, 2], [7]]) == [[-0.5, -0.5], [-1.0]]
    texts = eng.greedy([0, 2], max_new_tokens=3)
    assert len(texts) == 2 and state.bodies[-1]["sampling"]["temperature"] == 0.0
    with pytest.raises(ConfigError, match="completion"):
        eng.score([[1]], [])


def test_owned_server_dies_mid_round_is_restarted_and_the_round_retried(policy, tmp_path):
    healthy = _owned(policy, tmp_path / "a")
    try:
        healthy.update_weights()
        expected = _rows(healthy.generate({0: 3, 3: 4}))
    finally:
        healthy.close()
    marker = tmp_path / "died"
    eng = _owned(policy, tmp_path / "b", server_env={"FAKE_DIE_ON_GENERATE": "1", "FAKE_MARKER": str(marker)})
    try:
        pid0 = eng.health()["pid"]
        eng.update_weights()
        got = _rows(eng.generate({0: 3, 3: 4}))
        assert marker.exists() and eng.restarts == 1
        h = eng.health()
        assert h["pid"] != pid0 and h["weights_version"] == 1  # the last weights were pushed again
        assert got == expected  # the retried round is the round that failed
    finally:
        eng.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid0, 0)


def test_a_killed_servers_shared_memory_is_removed(policy, tmp_path):
    prefix = f"/dev/shm/rlvr-test-fake-{os.getpid()}"
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    victim = Path(f"/dev/shm/rlvr-test-victim-{os.getpid()}")  # a file of ours the server never opened
    victim.write_text("keep")
    eng = _owned(policy, tmp_path, server_env={"FAKE_SHM_PREFIX": prefix, "FAKE_SHM_CLAIM": str(victim)})
    try:
        pid0 = eng.health()["pid"]
        first = Path(f"{prefix}-{pid0}")
        assert first.exists()
        eng.update_weights()
        os.kill(pid0, signal.SIGKILL)
        eng.server.proc.wait(timeout=10)
        assert len(eng.generate({0: 2})) == 2 and eng.restarts == 1
        second = Path(f"{prefix}-{eng.health()['pid']}")
        assert not first.exists() and second.exists()  # the dead server's segment is gone
        assert list((tmp_path / "shm").glob("rlvr-vllm-*/*.safetensors"))  # our weight file is never taken for theirs
        assert victim.read_text() == "keep"  # named in /health, but held by no process of the server: kept
    finally:
        eng.close()
        victim.unlink(missing_ok=True)
    assert not second.exists()


class _Recorder(ThreadingHTTPServer):
    """A listener standing in for another user's server (or proxy): records every request line and header."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self) -> None:
                recorder.seen.append((self.command, self.path, self.headers.get("Authorization")))
                data = json.dumps({"status": "ok", "shm_files": [], "results": []}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def _plant_ready_files(port: int, stop: threading.Event, planted: list[str]) -> None:
    """Another user's move: read the fake server's --ready-file from /proc/PID/cmdline and answer first."""
    while not stop.is_set():
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if str(THIS) in argv and "--ready-file" in argv:
                ready = argv[argv.index("--ready-file") + 1]
                if ready not in planted:
                    Path(ready).write_text(json.dumps({"port": port, "pid": int(proc.name)}))
                    if os.getuid() == 0:
                        os.chown(ready, 65534, 65534)  # as uid 65534 would have written it
                    planted.append(ready)
        time.sleep(0.05)


def test_another_user_cannot_answer_the_servers_launch(policy, tmp_path):
    attacker = _Recorder()
    stop, planted = threading.Event(), []
    spy = threading.Thread(target=_plant_ready_files, args=(attacker.server_address[1], stop, planted), daemon=True)
    spy.start()
    try:
        eng = _owned(policy, tmp_path, server_env={"FAKE_START_DELAY": "1.5"})
        try:
            assert eng.health()["pid"] == eng.server.proc.pid and len(eng.generate({0: 2})) == 2
        finally:
            eng.close()
    finally:
        stop.set()
        spy.join()
        attacker.close()
    assert planted == [] and attacker.seen == []  # no path to write first, and the token never reached it


STUB_VLLM = {  # just enough of vllm for scripts/vllm_server.py's start-up: LLM, SamplingParams, TokensPrompt
    "vllm/__init__.py": "__version__ = 'stub'\n"
                        "class LLM:\n"
                        "    def __init__(self, **kw):\n        self.kw = kw\n"
                        "    def generate(self, *a, **kw):\n        return []\n"
                        "    def reset_prefix_cache(self):\n        pass\n"
                        "class SamplingParams:\n    def __init__(self, **kw):\n        self.kw = kw\n",
    "vllm/inputs.py": "def TokensPrompt(**kw):\n    return kw\n",
}


def test_the_real_server_program_announces_itself_on_the_ready_pipe(policy, tmp_path):
    """scripts/vllm_server.py itself (over a stub vllm) through the handshake, /health and /shutdown."""
    for name, text in STUB_VLLM.items():
        (tmp_path / "stub" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "stub" / name).write_text(text)
    eng = _owned(policy, tmp_path, server_script=server_mod.__file__, server_env={"PYTHONPATH": str(tmp_path / "stub")})
    try:
        health = eng.health()
        assert health["pid"] == eng.server.proc.pid and health["vllm"] == "stub"
        assert health["weights_dir"] == str(eng.server.weights_folder)
        cmdline = Path(f"/proc/{eng.server.proc.pid}/cmdline").read_bytes().decode().split("\0")
        assert "--ready-fd" in cmdline and "--ready-file" not in cmdline  # no path another user could write
    finally:
        eng.close()
    assert eng.server.proc is None and "ready on http://127.0.0.1" in (tmp_path / "server.log").read_text()


PORT_SQUATTER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(4)
print("listening", flush=True)
c, _ = s.accept()
c.settimeout(2)
try:
    print(repr(c.recv(65536)), flush=True)
except OSError:
    print("nothing", flush=True)
"""


def test_a_port_taken_over_by_another_user_gets_no_token(policy, tmp_path):
    """The started server dies; uid 65534 binds its port before the client notices: nothing is sent to it."""
    python = "/usr/bin/python3"  # one that uid 65534 can run
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("needs root (to listen as a second user, uid 65534) and /usr/bin/python3")
    eng = _owned(policy, tmp_path)
    squatter = None
    try:
        port = int(eng.url.rsplit(":", 1)[1])
        os.killpg(eng.server.proc.pid, signal.SIGKILL)
        eng.server.proc.wait(timeout=10)
        squatter = subprocess.Popen([python, "-S", "-c", PORT_SQUATTER, str(port)], user=65534, group=65534,
                                    stdout=subprocess.PIPE, text=True, cwd="/")
        assert squatter.stdout.readline() == "listening\n"
        with pytest.raises(VLLMServerError, match=f"127.0.0.1:{port} is held by uid 65534"):
            eng.health()  # a request that does not look at the process first
        assert squatter.stdout.readline() == "b''\n"  # connected, then closed: no request, no token
        assert len(eng.generate({0: 2})) == 2 and eng.restarts == 1  # generate notices the death and restarts
    finally:
        eng.close()
        if squatter is not None:
            squatter.kill()
            squatter.wait()
            squatter.stdout.close()


def test_peer_uid_names_the_listeners_owner_by_sock_diag_and_by_proc(monkeypatch):
    from rlvr_core.rollout import vllm_server as vllm_server_mod

    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("needs root (to listen as a second user, uid 65534) and /usr/bin/python3")
    listener = subprocess.Popen([python, "-S", "-c", "import socket, time\ns = socket.socket()\n"
                                 "s.bind(('127.0.0.1', 0))\ns.listen(8)\nprint(s.getsockname()[1], flush=True)\n"
                                 "time.sleep(30)\n"],
                                user=65534, group=65534, stdout=subprocess.PIPE, text=True, cwd="/")
    mine = socket.create_server(("127.0.0.1", 0))
    try:
        theirs = int(listener.stdout.readline())
        for port, uid in ((theirs, 65534), (mine.getsockname()[1], os.getuid())):
            with socket.create_connection(("127.0.0.1", port)) as c:  # still in the accept queue: not accepted
                assert vllm_server_mod._diag_uid(c) == uid and vllm_server_mod.peer_uid(c) == uid
                monkeypatch.setattr(vllm_server_mod, "_diag_uid", lambda sock: None)  # the /proc/net/tcp path
                assert vllm_server_mod.peer_uid(c) == uid
                monkeypatch.undo()
    finally:
        mine.close()
        listener.kill()
        listener.wait()
        listener.stdout.close()


def test_a_ready_announcement_with_another_pid_is_refused(policy, tmp_path):
    with pytest.raises(VLLMServerError, match="announced pid 1 and port"):
        _owned(policy, tmp_path, server_env={"FAKE_READY_PID": "1"})


def test_the_server_writes_a_ready_file_only_in_a_private_folder_and_never_through_a_link(tmp_path):
    shared = Path(tempfile.gettempdir())
    assert shared.stat().st_mode & 0o002  # the shared temp folder: anyone can write there
    with pytest.raises(server_mod.SetupError, match="writable by no one else"):
        server_mod.check_ready_file(str(shared / "ready.json"))
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    server_mod.check_ready_file(str(folder / "ready.json"))
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    (folder / "ready.json.tmp").symlink_to(victim)  # planted where the server used to write first
    server_mod.announce_ready({"port": 1234, "pid": 5}, ready_file=str(folder / "ready.json"))
    assert victim.read_text() == "root's file"
    assert json.loads((folder / "ready.json").read_text()) == {"port": 1234, "pid": 5}
    assert not (folder / "ready.json").is_symlink() and (folder / "ready.json").stat().st_mode & 0o077 == 0
    r, w = os.pipe()
    server_mod.check_ready_fd(w)
    server_mod.announce_ready({"port": 1, "pid": 2}, ready_fd=w)
    assert json.loads(os.read(r, 100)) == {"port": 1, "pid": 2} and os.read(r, 100) == b""  # written, then closed
    os.close(r)
    with pytest.raises(server_mod.SetupError, match="not a pipe"):
        server_mod.check_ready_fd(os.open(victim, os.O_RDONLY))


@pytest.mark.parametrize("fault", ["ENGINE_DEAD_ON_GENERATE", "HANG_ON_GENERATE"])
def test_dead_engine_and_hung_server_are_restarted(policy, tmp_path, fault):
    marker = tmp_path / "fired"
    eng = _owned(policy, tmp_path, request_timeout=2, server_env={f"FAKE_{fault}": "1", "FAKE_MARKER": str(marker)})
    try:
        pid0 = eng.health()["pid"]
        assert len(eng.generate({1: 2})) == 2
        assert eng.restarts == 1 and eng.health()["pid"] != pid0
    finally:
        eng.close()


def test_restarts_are_bounded_and_the_error_carries_the_log(policy, tmp_path):
    eng = _owned(policy, tmp_path, max_restarts=1,
                 server_env={"FAKE_DIE_ON_GENERATE": "1", "FAKE_MARKER": str(tmp_path / "m"), "FAKE_ALWAYS": "1"})
    try:
        with pytest.raises(VLLMServerError, match="after 1 restart"):
            eng.generate({0: 1})
    finally:
        eng.close()
    with pytest.raises(VLLMServerError, match=r"(?s)exited with code 4.*FAKE_FAIL_START"):
        _owned(policy, tmp_path / "c", server_env={"FAKE_FAIL_START": "1"})


def test_server_command_line_and_close(policy, tmp_path):
    argv_log = tmp_path / "argv.jsonl"
    eng = _owned(policy, tmp_path, dtype="float32", enable_sleep_mode=True, server_args=["--enforce-eager"],
                 server_env={"FAKE_ARGV_LOG": str(argv_log)})
    argv = json.loads(argv_log.read_text().splitlines()[0])
    for flag, value in (("--dtype", "float32"), ("--host", "127.0.0.1"), ("--port", "0"), ("--seed", "11"),
                        ("--max-model-len", "128")):
        assert argv[argv.index(flag) + 1] == value
    assert "--enable-sleep-mode" in argv and argv[-1] == "--enforce-eager"
    pid = eng.health()["pid"]
    eng.update_weights()
    eng.close()
    eng.close()  # idempotent
    assert not list((tmp_path / "shm").iterdir())  # the private weights folder and its file are gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_wrong_answer_is_an_error_not_a_restart(policy, tmp_path):
    eng = _owned(policy, tmp_path, server_env={"FAKE_WRONG_COUNT": "1"})
    try:
        with pytest.raises(VLLMServerError, match="returned 2 completions for prompt 0, asked for 3"):
            eng.generate({0: 3})
        assert eng.restarts == 0
    finally:
        eng.close()


def test_external_server_is_waited_for_then_reused(policy, tmp_path, monkeypatch):
    """A server given by url is not ours to restart: the client waits for it to come back."""
    model, tok, folder = policy
    monkeypatch.setenv("RLVR_VLLM_TOKEN", TOKEN)
    state = FakeState(str(folder), TOKEN)  # a folder of its own in /dev/shm
    httpd = fake_httpd(state)
    port = httpd.server_address[1]
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    eng = VLLMEngine(model, tok, PROMPTS, url=f"http://127.0.0.1:{port}", start_timeout=20, request_timeout=5)
    eng.update_weights()
    httpd.shutdown()
    httpd.server_close()
    back: list[ThreadingHTTPServer] = []

    def supervisor() -> None:  # brings a fresh server up on the same port a little later
        time.sleep(1.0)
        h = fake_httpd(FakeState(str(folder), TOKEN), port)  # another folder: the last weights are copied there
        back.append(h)
        h.serve_forever(poll_interval=0.05)

    threading.Thread(target=supervisor, daemon=True).start()
    try:
        assert len(eng.generate({2: 3})) == 3
        assert eng.restarts == 1
        assert eng.health()["weights_version"] == 1  # weights pushed again after the reconnect
    finally:
        for h in back:
            h.shutdown()
            h.server_close()
        for st in (state, *[h.RequestHandlerClass.state for h in back]):
            shutil.rmtree(st.weights_dir, ignore_errors=True)
    with pytest.raises(VLLMServerError, match="did not answer /health"):
        VLLMEngine(model, tok, PROMPTS, url=f"http://127.0.0.1:{port}", start_timeout=1)


def test_kill_signal_reaches_the_whole_server_group(policy, tmp_path):
    """close() after the leader was killed still leaves no process of the group behind."""
    eng = _owned(policy, tmp_path)
    pid = eng.health()["pid"]
    os.kill(pid, signal.SIGKILL)
    eng.server.proc.wait(timeout=10)
    assert len(eng.generate({0: 1})) == 1 and eng.restarts == 1
    eng.close()


# ----------------------------------------------------------------------------- token and weight-path refusals
def _raw(url: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    """One request with no client logic: (HTTP status, JSON answer)."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class _StubLLM:
    """Stands in for ``vllm.LLM`` behind the real server's handler: records what the engine was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def generate(self, *a, **kw):
        self.calls.append(("generate",))
        return []

    def collective_rpc(self, name, args=()):
        self.calls.append((name, *args))
        return [1]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def real_handler(tmp_path):
    """scripts/vllm_server.py's own handler and RolloutServer endpoints over a stub LLM, on 127.0.0.1."""
    folder = tmp_path / "weights"
    folder.mkdir(mode=0o700)
    srv = object.__new__(server_mod.RolloutServer)  # everything but the vLLM start-up in __init__
    srv.__dict__.update(weights_dir=server_mod.prepare_weights_dir(str(folder)), llm=_StubLLM(), lock=threading.Lock(),
                        weights_version=0, sleeping=False, busy=False, dead=False, model="stub", vllm_version="stub",
                        load_seconds=0.0, warmup_seconds=0.0)
    ref: list = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), server_mod.make_handler(srv, ref, TOKEN))
    httpd.daemon_threads = True
    ref.append(httpd)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


GEN = {"requests": [{"prompt_token_ids": [1, 3], "n": 1, "seed": 0}], "sampling": {"max_tokens": 2}}


@pytest.mark.parametrize("where", ["real", "fake"])
def test_requests_without_the_token_or_with_a_wrong_one_are_refused(where, real_handler, inproc, tmp_path):
    srv, url = real_handler if where == "real" else inproc
    weights = srv.weights_dir / "w.safetensors"
    from safetensors.numpy import save_file

    save_file({"w": np.ones(2, np.float32)}, str(weights))
    for path, body in (("/health", None), ("/generate", GEN), ("/load_weights", {"path": str(weights), "version": 1}),
                       ("/shutdown", {})):
        code, ans = _raw(url, path, body)
        assert code == 401 and "Authorization" in ans["error"], (path, code, ans)
        code, ans = _raw(url, path, body, token=TOKEN[:-1] + "y")
        assert code == 403 and ans["error"] == "wrong token", (path, code, ans)
    assert _raw(url, "/health", token="")[0] == 401
    if where == "real":
        assert srv.llm.calls == [] and srv.weights_version == 0  # nothing reached the engine
    else:
        assert srv.generate_calls == 0 and srv.weights_version == 0
    code, ans = _raw(url, "/health", token=TOKEN)
    assert code == 200 and ans["weights_dir"] == str(srv.weights_dir)


def test_the_client_sends_its_token_and_reports_a_refusal(policy, inproc, monkeypatch):
    model, tok, _ = policy
    state, url = inproc
    eng = VLLMEngine(model, tok, PROMPTS, url=url)
    assert len(eng.generate({0: 2})) == 2
    monkeypatch.setenv("RLVR_VLLM_TOKEN", "not-the-token-of-this-server")
    with pytest.raises(VLLMServerError, match=r"refused the token for /health \(HTTP 403\).*RLVR_VLLM_TOKEN"):
        VLLMEngine(model, tok, PROMPTS, url=url)
    monkeypatch.delenv("RLVR_VLLM_TOKEN")
    with pytest.raises(ConfigError, match="needs its token"):
        VLLMEngine(model, tok, PROMPTS, url=url)


def test_the_token_never_goes_to_an_http_proxy(policy, inproc, tmp_path, monkeypatch):
    model, tok, _ = policy
    proxy = _Recorder()
    try:
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        _, url = inproc
        eng = VLLMEngine(model, tok, PROMPTS, url=url)
        assert len(eng.generate({0: 2})) == 2 and eng.health()["status"] == "ok"
        owned = _owned(policy, tmp_path)
        try:
            assert len(owned.generate({1: 1})) == 1
        finally:
            owned.close()
    finally:
        proxy.close()
    assert proxy.seen == []


def test_token_file_must_be_owner_only(policy, inproc, tmp_path, monkeypatch):
    model, tok, _ = policy
    _, url = inproc
    monkeypatch.delenv("RLVR_VLLM_TOKEN")
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0600"):
        VLLMEngine(model, tok, PROMPTS, url=url, token_file=f)
    f.chmod(0o600)
    assert len(VLLMEngine(model, tok, PROMPTS, url=url, token_file=f).generate({1: 1})) == 1


@pytest.mark.parametrize("where", ["real", "fake"])
def test_load_weights_reads_only_the_servers_own_folder(where, real_handler, inproc, tmp_path):
    from safetensors.numpy import save_file

    srv, url = real_handler if where == "real" else inproc
    inside = srv.weights_dir / "ok.safetensors"
    outside = tmp_path / "elsewhere" / "evil.safetensors"
    outside.parent.mkdir()
    for f in (inside, outside):
        save_file({"w": np.ones(2, np.float32)}, str(f))
    (srv.weights_dir / "link.safetensors").symlink_to(outside)
    (srv.weights_dir / "inner-link.safetensors").symlink_to(inside)
    (srv.weights_dir / "sub").symlink_to(outside.parent, target_is_directory=True)
    (srv.weights_dir / "notes.txt").write_text("x")
    refused = {
        str(outside): "outside the server's weights folder",
        str(srv.weights_dir / ".." / "elsewhere" / "evil.safetensors"): "outside the server's weights folder",
        str(srv.weights_dir / "sub" / "evil.safetensors"): "outside the server's weights folder",
        str(srv.weights_dir / "link.safetensors"): "symbolic link",
        str(srv.weights_dir / "inner-link.safetensors"): "symbolic link",
        "../elsewhere/evil.safetensors": "outside the server's weights folder",
        str(srv.weights_dir / "notes.txt"): "only .safetensors",
        "/etc/passwd": "outside the server's weights folder",
    }
    for path, why in refused.items():
        code, ans = _raw(url, "/load_weights", {"path": path, "version": 1}, token=TOKEN)
        assert code == 403 and why in ans["error"], (path, code, ans)
    assert _raw(url, "/load_weights", {"path": str(srv.weights_dir / "absent.safetensors"), "version": 1},
                token=TOKEN)[0] == 400
    assert srv.weights_version == 0
    if where == "real":
        assert srv.llm.calls == []
    code, ans = _raw(url, "/load_weights", {"path": str(inside), "version": 1}, token=TOKEN)
    assert code == 200 and ans["weights_version"] == 1, ans
    if where == "real":
        assert srv.llm.calls == [("rlvr_load_weights_from_file", str(inside)), ("reset_prefix_cache",)]
    assert _raw(url, "/load_weights", {"path": "ok.safetensors", "version": 2}, token=TOKEN)[0] == 200  # a bare name


def test_owned_server_gets_a_fresh_token_per_launch_never_on_its_command_line(policy, tmp_path):
    argv_log = tmp_path / "argv.jsonl"
    eng = _owned(policy, tmp_path, server_env={"FAKE_ARGV_LOG": str(argv_log)})
    try:
        first, pid0 = eng.server.token, eng.health()["pid"]
        folder = eng.server.weights_folder
        assert folder.parent == (tmp_path / "shm").resolve() and (folder.stat().st_mode & 0o777) == 0o700
        with open(f"/proc/{pid0}/cmdline", "rb") as f:
            assert first.encode() not in f.read()
        assert _raw(eng.url, "/health")[0] == 401 and _raw(eng.url, "/health", token=first)[0] == 200
        os.kill(pid0, signal.SIGKILL)
        eng.server.proc.wait(timeout=10)
        assert len(eng.generate({0: 1})) == 1 and eng.restarts == 1
        assert eng.server.token != first and _raw(eng.url, "/health", token=first)[0] == 403
        assert eng.server.weights_folder == folder  # the same private folder across restarts
        argv = [json.loads(line) for line in argv_log.read_text().splitlines()]
        assert len(argv) == 2 and all(a[a.index("--weights-dir") + 1] == str(folder) for a in argv)
        assert not any(first in x or eng.server.token in x for a in argv for x in a)
    finally:
        eng.close()
    assert not folder.exists()


def test_each_launch_gets_the_engines_model_arguments_and_a_restart_the_restored_seed(policy, tmp_path):
    """The server class starts what the engine asks for; after load_state_dict the next start has its seed."""
    argv_log = tmp_path / "argv.jsonl"
    eng = _owned(policy, tmp_path, server_env={"FAKE_ARGV_LOG": str(argv_log)}, server_args=["--max-num-seqs", "4"])
    try:
        eng.load_state_dict({"seed": 23, "calls": 5})
        os.kill(eng.health()["pid"], signal.SIGKILL)
        eng.server.proc.wait(timeout=10)
        assert len(eng.generate({0: 1})) == 1 and eng.restarts == 1
    finally:
        eng.close()
    argv = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert len(argv) == 2
    for a, seed in zip(argv, ("11", "23")):
        flags = dict(zip(a, a[1:]))  # each flag to the word after it
        assert flags["--model"] == str(policy[2]) and flags["--seed"] == seed and flags["--port"] == "0"
        assert flags["--max-model-len"] == str(eng.max_model_len) and a[-2:] == ["--max-num-seqs", "4"]
        assert flags["--ready-fd"].isdigit() and flags["--host"] == "127.0.0.1"


def test_server_refuses_to_start_without_a_token_or_with_an_unsafe_setup(policy, tmp_path):
    _, _, folder = policy
    script = Path(server_mod.__file__)
    env = {k: v for k, v in os.environ.items() if k != "RLVR_VLLM_TOKEN"}
    p = subprocess.run([sys.executable, str(script), "--model", str(folder)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "refusing to start: no token" in p.stderr
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    p = subprocess.run([sys.executable, str(script), "--model", str(folder), "--weights-dir", str(loose)],
                       env={**env, "RLVR_VLLM_TOKEN": TOKEN}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--weights-dir" in p.stderr and "chmod 700" in p.stderr
    tf = tmp_path / "tok"
    tf.write_text(TOKEN)
    tf.chmod(0o640)
    with pytest.raises(server_mod.SetupError, match="mode 0600"):
        server_mod.read_token(str(tf))
    tf.chmod(0o600)
    assert server_mod.read_token(str(tf)) == TOKEN
    (tmp_path / "tok-link").symlink_to(tf)
    with pytest.raises(server_mod.SetupError, match="symbolic link"):
        server_mod.read_token(str(tmp_path / "tok-link"))
    environ = {"RLVR_VLLM_TOKEN": TOKEN}
    assert server_mod.read_token(None, environ) == TOKEN and "RLVR_VLLM_TOKEN" not in environ  # not inherited
    with pytest.raises(server_mod.SetupError, match="no token"):
        server_mod.read_token(None, {"RLVR_VLLM_TOKEN": "short"})


# ----------------------------------------------------------------------------- another local user (issue 40)
OTHER_UID = 1234
_LISTENER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(4)
print(s.getsockname()[1], flush=True)
s.settimeout(30)
with open(sys.argv[1], "ab", buffering=0) as out:
    while True:
        try:
            c, _ = s.accept()
        except OSError:
            break
        c.settimeout(5)
        try:
            out.write(c.recv(65536))
        except OSError:
            pass
        c.close()
"""


def test_a_url_server_of_another_user_never_receives_the_token(policy, tmp_path, monkeypatch):
    """Break 2: uid 1234 listens on a loopback port and a run is pointed at it with a 0600 token file."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a second uid needs root and setpriv")
    model, tok, _ = policy
    seen = Path(tempfile.mkdtemp(prefix="rlvr-listener-")) / "seen"
    seen.parent.chmod(0o777)
    listener = subprocess.Popen(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                                 "/usr/bin/python3", "-I", "-c", _LISTENER, str(seen)],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = int(listener.stdout.readline())
        secret = tmp_path / "secret0600"
        secret.write_text("s3cr3t-token-of-root-0123456789\n")
        secret.chmod(0o600)
        monkeypatch.delenv("RLVR_VLLM_TOKEN", raising=False)
        with pytest.raises(VLLMServerError, match=rf"held by uid {OTHER_UID}.*nothing was sent"):
            VLLMEngine(model, tok, PROMPTS, url=f"http://127.0.0.1:{port}", token_file=secret, start_timeout=10)
    finally:
        listener.kill()
        listener.wait()
    assert b"s3cr3t" not in (seen.read_bytes() if seen.exists() else b"")
    shutil.rmtree(seen.parent, ignore_errors=True)


def test_a_ready_file_folder_reached_through_another_users_link_is_refused(tmp_path):
    """Break 7: a link of uid 1234's to a private folder of this user's passes a check that follows links."""
    if os.geteuid() != 0:
        pytest.skip("a link owned by another uid needs root to make (lchown)")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "theirs"
    link.symlink_to(private)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(server_mod.SetupError, match=rf"belongs to uid {OTHER_UID}, who could swap"):
        server_mod.check_ready_file(str(link / "ready.json"))


def test_a_ready_folder_swapped_after_the_check_is_never_written(tmp_path):
    """Break 7: the folder is swapped for another while the model loads; the file goes to the folder checked."""
    parent = tmp_path / "p"
    parent.mkdir(mode=0o700)
    checked = parent / "ready"
    checked.mkdir(mode=0o700)
    fd = server_mod.check_ready_file(str(checked / "ready.json"))
    moved = parent / "moved"
    checked.rename(moved)
    checked.mkdir(mode=0o700)  # what someone put in its place
    server_mod.announce_ready({"port": 1, "pid": 2}, ready_file=str(checked / "ready.json"), ready_dir_fd=fd)
    assert not (checked / "ready.json").exists()
    assert json.loads((moved / "ready.json").read_text()) == {"port": 1, "pid": 2}
