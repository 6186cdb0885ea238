"""The vLLM rollout server: ``vllm.LLM`` behind a small JSON-over-HTTP API on 127.0.0.1.

Runs in the vLLM environment (``make vllm-cpu-env`` -> ``.venv-vllm``; on GPU a
venv with requirements-vllm-gpu.txt), never in the training environment. The
client is ``rlvr_core/rollout/vllm.py``, whose ``VLLMServer`` (``rlvr_core/rollout/vllm_server.py``)
starts this program itself:

    .venv-vllm/bin/python scripts/vllm_server.py --model models/policy --port 0 --ready-fd 5

Readiness: once the model is loaded, the server writes one JSON line {"port", "pid",
"start_seconds"} to the pipe whose write end it inherited as ``--ready-fd`` (what the
client uses: no path in the shared temp folder that another user could write first), or
to ``--ready-file``, which must lie in a folder of this user that no one else can write
(refused otherwise); it is written under a fresh random name (``O_EXCL``, never through
a symbolic link) and renamed into place.

Authentication: every launch has a random token, given to the server in
``$RLVR_VLLM_TOKEN`` (removed from the environment at start, so vLLM's engine
processes do not inherit it) or in a file named by ``--token-file`` that only
its owner can read (mode 0600 or stricter); never on the command line, where
``ps`` shows it. Every request must carry ``Authorization: Bearer <token>``:
without it the answer is 401, with a wrong token 403. The client that starts
the server generates the token and sends it.

Weight files: ``/load_weights`` reads only files directly inside the server's
own weights folder (``--weights-dir``: a folder owned by this user that no one
else can read or write, in /dev/shm; by default the server creates one). The
path is resolved first (symbolic links, ``..``); anything outside is refused
with 403.

Endpoints (JSON bodies and answers; errors are {"error": message} with HTTP 400
for a bad request, 401/403 for a missing or wrong token or a weights path
outside the weights folder, 500 for an engine error, 503 when the engine died):

  GET  /health        {"status", "model", "weights_version", "sleeping", "busy", "pid", "engine_pids", "vllm",
                       "weights_dir"}
  POST /generate      {"requests": [{"prompt_token_ids": [int], "n": int, "seed": int}],
                       "sampling": {"temperature", "top_p", "max_tokens"}}
                   -> {"results": [{"completions": [{"token_ids", "logprobs", "finish_reason"}]}],
                       "weights_version", "seconds", "tokens"}
  POST /score         {"sequences": [{"prompt_token_ids", "completion_token_ids"}]}
                   -> {"logprobs": [[float per completion token]]}    (raw model log-probs)
  POST /load_weights  {"path": safetensors file in weights_dir, "version": int}
                   -> {"weights_version", "tensors", "seconds"}
                       (in-place load in every worker, then a prefix-cache reset)
  POST /sleep         {"level": 1|2};  POST /wake_up {"tags": [...] | null}
  GET  /weights_digest  sha256 of the loaded parameters per worker (tests)
  POST /shutdown

Log-probs of sampled tokens are "processed" (after temperature and top-p, the
distribution actually sampled from), matching the HF engine.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
import stat
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOKEN_ENV = "RLVR_VLLM_TOKEN"
MIN_TOKEN_CHARS = 16


class BadRequest(ValueError):
    """A request body the server cannot serve; answered with HTTP 400."""


class Forbidden(BadRequest):
    """A request the server will not serve (a weights path outside its folder); answered with HTTP 403."""


class SetupError(RuntimeError):
    """The server cannot start safely (no token, an unsafe weights folder); the message says why."""


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def read_token(token_file: str | None = None, environ: dict[str, str] | None = None) -> str:
    """This launch's token: from ``token_file`` (owner-only) or ``$RLVR_VLLM_TOKEN``, which is then removed."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if token_file is not None:
        try:
            fd = os.open(token_file, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            raise SetupError(f"--token-file {token_file}: {e.strerror} (a symbolic link is refused)") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _private(st):
                raise SetupError(f"--token-file {token_file}: must be a regular file of this user with mode 0600 "
                                 f"or stricter (it has {stat.filemode(st.st_mode)}); `chmod 600 {token_file}`")
            token = os.read(fd, 4096).decode(errors="replace").strip()
        finally:
            os.close(fd)
    else:
        token = environ.pop(TOKEN_ENV, "").strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise SetupError(f"no token: the server needs one of at least {MIN_TOKEN_CHARS} characters in ${TOKEN_ENV} "
                         "or in --token-file (mode 0600); e.g. `export RLVR_VLLM_TOKEN=$(python -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))')`, and give the client the same token")
    return token


def check_auth(header: str | None, token: str) -> tuple[int, str] | None:
    """None if ``header`` (the Authorization header) carries ``token``; else (401 or 403, why)."""
    if not header:
        return 401, "missing Authorization header: send 'Authorization: Bearer <token>' (this launch's token)"
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return 401, "the Authorization header must read 'Bearer <token>'"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return 403, "wrong token"
    return None


def _prefixes(path: str) -> list[str]:
    parts = Path(path).parts
    return [os.path.join(*parts[:i]) for i in range(1, len(parts) + 1)]


def _secure_path(folder: str) -> None:
    """SetupError unless no one but this user and root can change what ``folder`` names: every component
    of its absolute path, read with ``lstat`` (links not followed), belongs to this user or to root, and so
    does every folder above what it resolves to, which others may not write unless it has the sticky bit
    (``/tmp``). A link another user owns, or a folder of theirs on the way, would let them swap the folder
    for another while the model loads, and a supervisor reading the path would read their file."""
    me = os.getuid()
    real = os.path.realpath(folder)
    for here in _prefixes(os.path.abspath(folder)) + _prefixes(real)[:-1]:
        st = os.lstat(here)
        if st.st_uid not in (me, 0):
            raise SetupError(f"{here} (on the way to {folder}) belongs to uid {st.st_uid}, who could swap the "
                             "folder for another; use a private folder (`mktemp -d`) or --ready-fd")
    for here in _prefixes(real)[:-1]:
        st = os.lstat(here)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise SetupError(f"{here} (on the way to {folder}) may be written by others ({stat.filemode(st.st_mode)}"
                             "), who could swap the folder for another; use a private folder or --ready-fd")


def check_ready_file(path: str) -> int:
    """A descriptor of ``path``'s folder, held until the ready file is written (``announce_ready``);
    SetupError unless the folder belongs to this user, no one else can write it, and no one else can
    change what its path names (``_secure_path``).

    In a folder others can write (the shared temp folder), another user could write the ready
    file first, with a port of their own, or plant a symbolic link where it is written. The file is
    written through the descriptor, so a folder swapped after this check is never written.
    """
    folder = os.path.dirname(os.path.abspath(path))
    try:
        _secure_path(folder)
        fd = os.open(os.path.realpath(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise SetupError(f"--ready-file {path}: {folder}: {e.strerror}") from None
    except SetupError as e:
        raise SetupError(f"--ready-file {path}: {e}") from None
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        os.close(fd)
        raise SetupError(f"--ready-file {path}: its folder {folder} must belong to this user and be writable by no "
                         f"one else (it is {stat.filemode(st.st_mode)}, uid {st.st_uid}); use a private folder "
                         "(`mktemp -d`) or --ready-fd")
    return fd


def check_ready_fd(fd: int) -> None:
    """SetupError unless ``fd`` is an open pipe (the write end the launcher handed down); kept from later children."""
    try:
        st = os.fstat(fd)
    except OSError as e:
        raise SetupError(f"--ready-fd {fd}: {e.strerror}") from None
    if not stat.S_ISFIFO(st.st_mode):
        raise SetupError(f"--ready-fd {fd}: not a pipe")
    os.set_inheritable(fd, False)


def announce_ready(info: dict[str, Any], ready_fd: int | None = None, ready_file: str | None = None,
                   ready_dir_fd: int | None = None) -> None:
    """Write ``info`` as one JSON line to the pipe ``ready_fd`` (then closed) and/or to ``ready_file``.

    The file is written under a fresh random name (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, so a
    planted symbolic link is never followed) in the folder ``ready_dir_fd`` that ``check_ready_file``
    opened (then closed; opened here when not given), and renamed over ``ready_file`` in that folder.
    """
    data = (json.dumps(info) + "\n").encode()
    if ready_fd is not None:
        try:
            os.write(ready_fd, data)  # one write below PIPE_BUF: the reader never sees half of it
        finally:
            os.close(ready_fd)
    if ready_file is None:
        return
    dfd = check_ready_file(ready_file) if ready_dir_fd is None else ready_dir_fd
    name, tmp = os.path.basename(ready_file), f".ready-{secrets.token_hex(8)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    finally:
        os.close(dfd)


def prepare_weights_dir(path: str | None) -> Path:
    """The resolved weights folder: ``path`` (must exist, be ours and owner-only) or a new one in /dev/shm."""
    if path is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        return Path(tempfile.mkdtemp(prefix="rlvr-vllm-weights-", dir=base)).resolve()
    try:
        st = os.lstat(path)
    except OSError as e:
        raise SetupError(f"--weights-dir {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or not _private(st):
        raise SetupError(f"--weights-dir {path}: must be a folder (not a symbolic link) of this user that no one "
                         f"else can read or write (it is {stat.filemode(st.st_mode)}); `chmod 700 {path}`")
    return Path(os.path.realpath(path))


def resolve_weights_file(path: Any, weights_dir: Path) -> Path:
    """The real path of weight file ``path`` if it lies directly in ``weights_dir``; Forbidden otherwise."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise BadRequest(f"path must be a file name in the server's weights folder, got {path!r}")
    given = Path(path) if os.path.isabs(path) else weights_dir / path
    if os.path.islink(given):
        raise Forbidden(f"path {path!r} is a symbolic link; weight files must be regular files in {weights_dir}")
    real = Path(os.path.realpath(given))
    if real.parent != weights_dir:
        raise Forbidden(f"path {path!r} resolves to {real}, outside the server's weights folder {weights_dir}; "
                        "only files written there are loaded")
    if real.suffix != ".safetensors":
        raise Forbidden(f"path {path!r}: only .safetensors files are loaded")
    if not real.is_file():
        raise BadRequest(f"path {path!r} is not a readable weights file")
    return real


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise BadRequest(f"{what} must be a non-empty list of non-negative ints")
    return value


class RolloutServer:
    """Owns the ``vllm.LLM``; every engine call holds one lock (LLM is not thread-safe)."""

    def __init__(self, args: argparse.Namespace, weights_dir: Path) -> None:
        self.weights_dir = weights_dir
        # The worker extension must import in vLLM's engine process too (spawned or forked).
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        sys.path.insert(0, str(HERE))
        import vllm
        from vllm import LLM

        self.vllm_version = vllm.__version__
        self.model = str(args.model)
        kwargs: dict[str, Any] = dict(
            model=self.model,
            tokenizer=self.model,
            dtype=args.dtype,
            seed=args.seed,
            max_model_len=args.max_model_len,
            enable_prefix_caching=True,
            worker_extension_cls="vllm_worker_ext.WeightLoadExtension",
            logprobs_mode="processed_logprobs",
            tensor_parallel_size=args.tensor_parallel_size,
            enforce_eager=args.enforce_eager,
            enable_sleep_mode=args.enable_sleep_mode,
        )
        if args.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
        if args.max_num_seqs is not None:
            kwargs["max_num_seqs"] = args.max_num_seqs
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.load_seconds = time.perf_counter() - t0
        # The first generate pays one-off set-up costs (seconds on CPU); pay them before
        # reporting ready so that round timings and the client's time-outs see a warm engine.
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        t1 = time.perf_counter()
        self.llm.generate([TokensPrompt(prompt_token_ids=[0, 0])],
                          SamplingParams(max_tokens=2, seed=0, logprobs=0, detokenize=False), use_tqdm=False)
        self.llm.reset_prefix_cache()
        self.warmup_seconds = time.perf_counter() - t1
        self.lock = threading.Lock()
        self.weights_version = 0
        self.sleeping = False
        self.busy = False
        self.dead = False

    # ----------------------------------------------------------------- helpers
    def _engine_pids(self) -> list[int]:
        """Process ids of vLLM's engine-core processes (children of this one), for tests and operators."""
        try:
            import psutil

            return [c.pid for c in psutil.Process().children(recursive=True)]
        except Exception:  # noqa: BLE001 - informational only
            return []

    def _shm_files(self) -> list[str]:
        """/dev/shm files this server's processes map or hold open (vLLM's message queues, semaphores).

        Reported so that the client can remove them after this server was killed:
        a SIGKILLed vLLM leaves hundreds of MB of shared memory behind.
        """
        found: set[str] = set()
        for pid in [os.getpid(), *self._engine_pids()]:
            try:
                with open(f"/proc/{pid}/maps") as f:
                    for line in f:
                        i = line.find("/dev/shm/")
                        if i >= 0:
                            found.add(line[i:].strip().removesuffix(" (deleted)"))
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        found.add(target.removesuffix(" (deleted)"))
            except OSError:
                continue
        return sorted(found)

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model, "weights_version": self.weights_version,
                "sleeping": self.sleeping, "busy": self.busy, "pid": os.getpid(),
                "engine_pids": self._engine_pids(), "shm_files": self._shm_files(), "vllm": self.vllm_version,
                "load_seconds": round(self.load_seconds, 3), "warmup_seconds": round(self.warmup_seconds, 3),
                "weights_dir": str(self.weights_dir)}

    def _locked(self, fn: Any, *a: Any) -> Any:
        with self.lock:
            if self.dead:
                raise EngineGone("the engine died earlier; this server is exiting")
            self.busy = True
            try:
                return fn(*a)
            finally:
                self.busy = False

    # --------------------------------------------------------------- endpoints
    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        reqs = body.get("requests")
        samp = body.get("sampling") or {}
        if not isinstance(reqs, list) or not reqs:
            raise BadRequest("requests must be a non-empty list of {prompt_token_ids, n, seed}")
        temperature = float(samp.get("temperature", 1.0))
        top_p = float(samp.get("top_p", 1.0))
        max_tokens = int(samp.get("max_tokens", 16))
        if temperature < 0 or not 0 < top_p <= 1 or max_tokens < 1:
            raise BadRequest(f"sampling: need temperature >= 0, 0 < top_p <= 1, max_tokens >= 1; got {samp}")
        prompts, params = [], []
        for i, r in enumerate(reqs):
            ids = _int_list(r.get("prompt_token_ids"), f"requests[{i}].prompt_token_ids")
            n, seed = r.get("n"), r.get("seed")
            if not isinstance(n, int) or n < 1:
                raise BadRequest(f"requests[{i}].n must be an int >= 1, got {n!r}")
            if not isinstance(seed, int) or not 0 <= seed < 2**63 - 2**20:
                raise BadRequest(f"requests[{i}].seed must be an int in [0, 2**63 - 2**20), got {seed!r}")
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            # n > 1: vLLM gives child j the seed seed + j, so the n samples differ
            params.append(SamplingParams(n=n, seed=seed, temperature=temperature, top_p=top_p,
                                         max_tokens=max_tokens, logprobs=0, detokenize=False))

        def run() -> dict[str, Any]:
            t0 = time.perf_counter()
            outs = self.llm.generate(prompts, params, use_tqdm=False)
            results, tokens = [], 0
            for out in outs:
                comps = []
                for c in sorted(out.outputs, key=lambda c: c.index):
                    ids = [int(t) for t in c.token_ids]
                    lps = [float(c.logprobs[j][t].logprob) for j, t in enumerate(ids)] if c.logprobs is not None else []
                    tokens += len(ids)
                    comps.append({"token_ids": ids, "logprobs": lps, "finish_reason": c.finish_reason})
                results.append({"completions": comps})
            return {"results": results, "weights_version": self.weights_version,
                    "seconds": time.perf_counter() - t0, "tokens": tokens}

        return self._locked(run)

    def score(self, body: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        seqs = body.get("sequences")
        if not isinstance(seqs, list) or not seqs:
            raise BadRequest("sequences must be a non-empty list of {prompt_token_ids, completion_token_ids}")
        prompts, cuts = [], []
        for i, s in enumerate(seqs):
            p = _int_list(s.get("prompt_token_ids"), f"sequences[{i}].prompt_token_ids")
            c = _int_list(s.get("completion_token_ids"), f"sequences[{i}].completion_token_ids")
            prompts.append(TokensPrompt(prompt_token_ids=p + c))
            cuts.append((len(p), len(c)))
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)

        def run() -> dict[str, Any]:
            outs = self.llm.generate(prompts, params, use_tqdm=False)
            rows = []
            for out, (lp_start, n), seq in zip(outs, cuts, prompts):
                ids = seq["prompt_token_ids"]
                plp = out.prompt_logprobs
                rows.append([float(plp[j][ids[j]].logprob) for j in range(lp_start, lp_start + n)])
            return {"logprobs": rows}

        return self._locked(run)

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        path, version = body.get("path"), body.get("version")
        path = str(resolve_weights_file(path, self.weights_dir))  # Forbidden (403) outside the weights folder
        if not isinstance(version, int):
            raise BadRequest(f"version must be an int, got {version!r}")

        def run() -> dict[str, Any]:
            t0 = time.perf_counter()
            counts = self.llm.collective_rpc("rlvr_load_weights_from_file", args=(path,))
            self.llm.reset_prefix_cache()
            self.weights_version = version
            return {"weights_version": version, "tensors": counts, "seconds": time.perf_counter() - t0}

        return self._locked(run)

    def weights_digest(self) -> dict[str, Any]:
        return self._locked(lambda: {"digests": self.llm.collective_rpc("rlvr_weights_digest")})

    def sleep(self, body: dict[str, Any]) -> dict[str, Any]:
        level = body.get("level", 1)
        if level not in (1, 2):
            raise BadRequest(f"level must be 1 or 2, got {level!r}")

        def run() -> dict[str, Any]:
            self.llm.sleep(level=level)
            self.sleeping = True
            return {"sleeping": True}

        return self._locked(run)

    def wake_up(self, body: dict[str, Any]) -> dict[str, Any]:
        tags = body.get("tags")

        def run() -> dict[str, Any]:
            self.llm.wake_up(tags=tags)
            self.sleeping = bool(tags)  # partial wake-ups leave the rest asleep
            return {"sleeping": self.sleeping}

        return self._locked(run)


class EngineGone(RuntimeError):
    """vLLM's engine process is gone; the server answers 503 and exits so its supervisor restarts it."""


def _is_engine_dead(exc: BaseException) -> bool:
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # pragma: no cover - other vLLM layouts
        EngineDeadError = ()  # type: ignore[assignment]
    return isinstance(exc, (EngineGone, EngineDeadError)) or type(exc).__name__ == "EngineDeadError"


def make_handler(server: RolloutServer, httpd_ref: list[ThreadingHTTPServer],
                 token: str) -> type[BaseHTTPRequestHandler]:
    """The request handler: every request is checked against ``token`` before anything else."""
    posts = {"/generate": server.generate, "/score": server.score, "/load_weights": server.load_weights,
             "/sleep": server.sleep, "/wake_up": server.wake_up}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # one line per request on stderr
            sys.stderr.write("[server] " + (fmt % args) + "\n")

        def _send(self, code: int, obj: dict[str, Any]) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def _authorized(self) -> bool:
            refusal = check_auth(self.headers.get("Authorization"), token)
            if refusal is None:
                return True
            self.close_connection = True  # the body (if any) is not read
            self._send(refusal[0], {"error": refusal[1]})
            return False

        def _dispatch(self, fn: Any, *a: Any) -> None:
            try:
                self._send(200, fn(*a))
            except Forbidden as e:
                self._send(403, {"error": str(e)})
            except BadRequest as e:
                self._send(400, {"error": str(e)})
            except Exception as e:  # noqa: BLE001 - every failure becomes an answer
                traceback.print_exc()
                if _is_engine_dead(e):
                    server.dead = True
                    self._send(503, {"error": f"engine died: {e}"})
                    # exit so that the client's restart starts a fresh engine
                    threading.Timer(0.2, lambda: os._exit(3)).start()
                else:
                    self._send(500, {"error": f"{type(e).__name__}: {e}"})

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if not self._authorized():
                return
            if self.path == "/health":
                if server.dead:
                    self._send(503, {"error": "engine died"})
                else:
                    self._send(200, server.health())
            elif self.path == "/weights_digest":
                self._dispatch(server.weights_digest)
            else:
                self._send(404, {"error": f"no GET {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as e:
                self._send(400, {"error": f"bad JSON body: {e}"})
                return
            if self.path == "/shutdown":
                self._send(200, {"status": "stopping"})
                threading.Thread(target=httpd_ref[0].shutdown, daemon=True).start()
            elif self.path in posts:
                self._dispatch(posts[self.path], body)
            else:
                self._send(404, {"error": f"no POST {self.path}"})

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True,
                    help="policy folder (save_pretrained layout: config, safetensors, tokenizer)")
    ap.add_argument("--host", default="127.0.0.1", help="loopback address to bind (only loopback is allowed)")
    ap.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (see --ready-fd)")
    ap.add_argument("--ready-fd", type=int, default=None,
                    help="inherited pipe to write {port, pid} to once the model is loaded (what the client uses)")
    ap.add_argument("--ready-file", default=None,
                    help="write {port, pid} here once the model is loaded; its folder must be private to this user")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--gpu-memory-utilization", type=float, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--enable-sleep-mode", action="store_true")
    ap.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs (faster start)")
    ap.add_argument("--token-file", default=None,
                    help=f"file holding this launch's token (mode 0600); default ${TOKEN_ENV}")
    ap.add_argument("--weights-dir", default=None,
                    help="owner-only folder /load_weights reads from (default: a new one in /dev/shm)")
    args = ap.parse_args(argv)
    if args.host not in LOOPBACK and not args.host.startswith("127."):
        ap.error(f"--host {args.host}: the rollout server binds loopback addresses only")
    if not Path(args.model).is_dir():
        ap.error(f"--model {args.model}: not a folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:  # before vLLM starts its engine processes: they must not inherit the token
        token = read_token(args.token_file)
        weights_dir = prepare_weights_dir(args.weights_dir)
        if args.ready_fd is not None:
            check_ready_fd(args.ready_fd)
        ready_dir_fd = check_ready_file(args.ready_file) if args.ready_file is not None else None
    except SetupError as e:
        print(f"[server] refusing to start: {e}", file=sys.stderr, flush=True)
        return 2
    server = RolloutServer(args, weights_dir)
    ref: list[ThreadingHTTPServer] = []
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(server, ref, token))
    httpd.daemon_threads = True
    ref.append(httpd)
    port = httpd.server_address[1]
    announce_ready({"port": port, "pid": os.getpid(), "start_seconds": time.perf_counter() - t0},
                   args.ready_fd, args.ready_file, ready_dir_fd)
    print(f"[server] ready on http://{args.host}:{port} after {time.perf_counter() - t0:.1f} s "
          f"(vllm {server.vllm_version}, model {args.model}, weights folder {weights_dir})",
          file=sys.stderr, flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        try:
            server.llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        if args.weights_dir is None:  # the folder this server made for itself
            import shutil

            shutil.rmtree(weights_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
