"""The vLLM rollout server's process, seen from the client: start, stop, restart, health, and the HTTP link.

``VLLMServer`` is one rollout server (``scripts/vllm_server.py``, run with the vLLM environment's
interpreter): either one it starts itself, or one given by ``url`` that an outside supervisor runs.
``rlvr_core.rollout.vllm.VLLMEngine`` holds one and speaks the rollout protocol through it.

Security: each server launch gets a fresh random token, generated here and handed to the server in
its environment (``$RLVR_VLLM_TOKEN``, never on the command line), and every request carries it
(``Authorization: Bearer``); the server refuses requests without it (401) or with another (403).
Weights are written to a private folder (mode 0700) created in /dev/shm for the server started here
(``--weights-dir``), and the server loads weight files from that folder only. For a server given by
``url``, the token comes from ``token_file`` or ``$RLVR_VLLM_TOKEN``, and the folder is the one the
server reports in ``/health``. The started server announces its port on a pipe it inherits
(``--ready-fd``), never in a file another user could write first; the client refuses another pid,
sends nothing to a connection whose far end belongs to another user (``ForeignServer``: a server
given by ``url`` too, which must therefore run as this user) and never goes through an HTTP proxy
(docs/design.md §8.2).

A started server runs in a session of its own, so that it and vLLM's engine processes are one process
group, killed together; the shared-memory files they held are removed after a kill. This module imports
no vllm and no HTTP library beyond the standard library.
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

from rlvr_core.errors import ConfigError, require

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
#: The server, started here or given by ``url``, must also answer from a socket of this user
#: (``_OwnServerConnection``): a listener of another user's on that port would otherwise get the token.
_OWN_SERVER_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _OwnServerHandler)


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



class VLLMServer:
    """One vLLM rollout server: a process this client starts (``url`` None) or one running at ``url``.

    Args:
        url: an already running server (``http://127.0.0.1:PORT``); None: start one with ``start()``.
        token: the ``url`` server's token (``_server_token``); a started server gets a fresh one per launch.
        model_args: the server's command-line arguments beyond the handshake (``--model``, ``--dtype``,
            ``--seed``, ...); read at every start, so a change reaches the next restart.
        python: interpreter of the vLLM environment (default ``.venv-vllm/bin/python``).
        script: the server program (default ``scripts/vllm_server.py``).
        env: environment overrides for the server process.
        weights_dir: where the private weights folder of a started server is made (default ``/dev/shm``).
        log_path: file that receives a started server's stdout and stderr (default: a temp file).
        start_timeout: seconds to wait for a server to answer after a start (or, for ``url``, at all).
        request_timeout: seconds one request may take before the server counts as hung.

    ``weights_folder`` is where the server loads weight files from: made here (0700) for a started
    server, kept across its restarts and removed by ``close()``; reported in ``/health`` by a ``url`` one.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        model_args: Sequence[str] = (),
        python: str | os.PathLike | None = None,
        script: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        weights_dir: str | os.PathLike | None = None,
        log_path: str | os.PathLike | None = None,
        start_timeout: float = 600.0,
        request_timeout: float = 600.0,
    ) -> None:
        self.external = url is not None
        self.url: str | None = url.rstrip("/") if url is not None else None
        self.token: str | None = token
        self.model_args = [str(a) for a in model_args]
        self.python = Path(python) if python is not None else DEFAULT_SERVER_PYTHON
        self.script = Path(script) if script is not None else SERVER_SCRIPT
        self.env = dict(env or {})
        self.weights_dir = Path(weights_dir) if weights_dir is not None else _default_weights_dir()
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout = float(start_timeout)
        self.request_timeout = float(request_timeout)
        self.weights_folder: Path | None = None  # where the server loads weight files from
        self.own_folder = False  # the folder was made here (removed on close)
        self.restarts = 0  # restarts (or reconnects) over the server's life
        self.proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self._shm: set[str] = set()  # /dev/shm files of the server started here
        self._shm_noted = False  # refreshed once after the first round of each server life

    # ------------------------------------------------------------------- process
    def command(self, ready_fd: int) -> list[str]:
        """The started server's command line: the handshake, its weights folder, then ``model_args``."""
        return [str(self.python), str(self.script), "--host", "127.0.0.1", "--port", "0",
                "--ready-fd", str(ready_fd), "--weights-dir", str(self.weights_folder), *self.model_args]

    def environment(self) -> dict[str, str]:
        """The started server's environment: this one, offline and without PYTHONPATH, plus this launch's token."""
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.pop("PYTHONPATH", None)  # the training environment's packages must not shadow the server's
        env.update(self.env)
        env[TOKEN_ENV] = self.token or ""  # this launch's token: in the environment, not on the command line
        return env

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no server log)"
        text = self.log_path.read_text(errors="replace")
        return text[-chars:]

    def _open_log(self) -> None:
        """Open the server log (a temp file unless ``log_path`` was given) and mark this start in it."""
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="rlvr-vllm-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n=== starting server at {time.strftime('%H:%M:%S')} ===\n".encode())
        self._log_file.flush()

    def start(self) -> None:
        """Start the server program and wait until it answers; VLLMServerError with its log tail otherwise.

        The handshake (docs/design.md §8.2): the server inherits the write end of a pipe (``--ready-fd``)
        and writes ``{"port", "pid"}`` to it once loaded. No path in the shared temp folder is involved,
        so no other user can answer in its place; the pid must be the process started here.
        """
        if not self.python.exists():
            raise VLLMServerError(
                f"the vLLM server environment is missing: {self.python} does not exist. Build it with "
                "`make vllm-cpu-env` (CPU) or install requirements-vllm-gpu.txt into a venv and pass server_python"
            )
        if self.weights_folder is None:  # private (0700), kept across restarts, removed on close
            self.weights_dir.mkdir(parents=True, exist_ok=True)
            self.weights_folder = Path(tempfile.mkdtemp(prefix="rlvr-vllm-", dir=self.weights_dir)).resolve()
            self.own_folder = True
        self.token = secrets.token_urlsafe(32)  # a fresh token for every launch
        self._open_log()
        self._shm_noted = False
        ready_r, ready_w = os.pipe()
        try:  # a session of its own: the server and vLLM's engine processes are one group, killed together
            self.proc = subprocess.Popen(self.command(ready_w), stdin=subprocess.DEVNULL,
                                         stdout=self._log_file, stderr=subprocess.STDOUT, pass_fds=(ready_w,),
                                         env=self.environment(), start_new_session=True)
        finally:
            os.close(ready_w)  # only the server holds the write end now: EOF when it exits
        try:
            port = self._await_ready(ready_r)
        finally:
            os.close(ready_r)
        self.url = f"http://127.0.0.1:{port}"
        self.get("/health", timeout=30.0)
        self.note_shm()

    def _await_ready(self, ready_r: int) -> int:
        """The port the started server announces on its ready pipe; VLLMServerError if it exits or times out."""
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        buf = b""
        while time.monotonic() < deadline and b"\n" not in buf:
            if select.select([ready_r], [], [], 0.2)[0]:
                chunk = os.read(ready_r, 4096)
                buf += chunk
                if not chunk and b"\n" not in buf:  # EOF: the server closed the pipe without announcing
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        self.stop()
                        raise VLLMServerError("the vLLM server closed its ready pipe without announcing a port; "
                                              f"log {self.log_path}:\n{self.log_tail()}") from None
            if self.proc.poll() is not None and b"\n" not in buf:
                raise VLLMServerError(f"the vLLM server exited with code {self.proc.returncode} while starting; "
                                      f"log {self.log_path}:\n{self.log_tail()}")
        if b"\n" not in buf:
            self.stop()
            raise VLLMServerError("the vLLM server did not become ready "
                                  f"within start_timeout={self.start_timeout:.0f} s; "
                                  f"log {self.log_path}:\n{self.log_tail()}")
        return self._announced_port(buf)

    def _announced_port(self, buf: bytes) -> int:
        """The port in the ready line ``buf``; VLLMServerError (the server killed) unless it names our pid."""
        assert self.proc is not None
        try:
            info = json.loads(buf.split(b"\n", 1)[0])
            port, pid = int(info["port"]), int(info["pid"])
        except (ValueError, KeyError, TypeError) as e:
            self.stop()
            raise VLLMServerError(f"the vLLM server announced {buf[:200]!r} on its ready pipe: {e}") from None
        if pid != self.proc.pid or not 0 < port < 65536:
            started = self.proc.pid
            self.stop()
            raise VLLMServerError(f"the vLLM server announced pid {pid} and port {port}; it was started as pid "
                                  f"{started}")
        return port

    def note_shm(self) -> None:
        """Remember the shared-memory files the server's processes hold (read from /proc, not asked of the server).

        They are removed if the server is killed; our own weight files (in a sub-folder) are never among them.
        """
        if self.proc is not None:
            self._shm |= {name for name in group_shm_files(self.proc.pid)
                          if not Path(name).name.startswith("rlvr-vllm-")}

    def after_round(self) -> None:
        """After a generate round: note the segments a started server creates lazily in its first round."""
        if not self.external and not self._shm_noted:
            self.note_shm()
            self._shm_noted = True

    def stop(self) -> None:
        """Kill a started server's whole process group, close its log and remove the shared memory it left."""
        proc, self.proc = self.proc, None
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
        self._remove_shm()

    def _remove_shm(self) -> None:
        # a killed vLLM leaves its message-queue segments behind (hundreds of MB of RAM)
        for name in self._shm:
            try:
                st = os.lstat(name)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                    os.unlink(name)
            except OSError:
                pass
        self._shm.clear()

    def ensure(self) -> None:
        """A server that answers: wait for a ``url`` one; (re)start our own unless its process runs."""
        if self.external:
            self.wait_external()
        elif self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()

    def wait_external(self) -> None:
        """Wait until the ``url`` server answers /health (up to ``start_timeout``) and take its weights folder."""
        deadline = time.monotonic() + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                health = self.get("/health", timeout=10.0)
                folder = health.get("weights_dir")
                if not isinstance(folder, str) or not folder:
                    raise VLLMServerError(f"the vLLM server at {self.url} reports no weights_dir in /health; it is "
                                          "an older server without weight-path checks: update scripts/vllm_server.py")
                self.weights_folder = Path(folder)
                return
            except ServerUnavailable as e:
                last = e
                time.sleep(1.0)
        raise VLLMServerError(f"the vLLM server at {self.url} did not answer /health within "
                              f"{self.start_timeout:.0f} s: {last}")

    def restart(self, reason: Exception) -> None:
        """Replace a dead server (kill and start ours again; wait for a ``url`` one to come back)."""
        self.restarts += 1
        print(f"[vllm] server unavailable ({reason}); "
              f"{'reconnecting' if self.external else 'restarting'} (restart {self.restarts})", file=sys.stderr)
        if not self.external:
            self.stop()
        self.ensure()

    def check_alive(self) -> None:
        """ServerUnavailable when the server started here has exited (a ``url`` one is judged by its answers)."""
        if not self.external and (self.proc is None or self.proc.poll() is not None):
            code = None if self.proc is None else self.proc.returncode
            raise ServerUnavailable(f"server process exited (code {code})")

    def close(self) -> None:
        """Ask a started server to shut down, kill what is left and remove its weights folder; idempotent."""
        if not self.external and self.proc is not None and self.proc.poll() is None and self.url is not None:
            try:
                self.post("/shutdown", {}, timeout=10.0)
                self.proc.wait(timeout=30)
            except (VLLMServerError, subprocess.TimeoutExpired):
                pass
        self.stop()

    def remove_weights_folder(self) -> None:
        """Remove the private weights folder made for a started server (kept across its restarts)."""
        if self.own_folder and self.weights_folder is not None:
            shutil.rmtree(self.weights_folder, ignore_errors=True)
            self.weights_folder, self.own_folder = None, False

    # ---------------------------------------------------------------------- HTTP
    def request(self, method: str, path: str, body: Mapping[str, Any] | None, timeout: float) -> dict[str, Any]:
        """One JSON request with this launch's token; ServerUnavailable when the server does not answer."""
        if self.url is None:
            raise ServerUnavailable("no server address yet")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.token}"})
        try:
            opener = _OWN_SERVER_OPENER  # a server given by url too: its token goes to this user's listener only
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

    def get(self, path: str, timeout: float | None = None) -> dict[str, Any]:
        return self.request("GET", path, None, timeout or self.request_timeout)

    def post(self, path: str, body: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self.request("POST", path, body, timeout or self.request_timeout)


__all__ = ["VLLMServer", "VLLMServerError", "ServerUnavailable", "ForeignServer", "peer_uid", "group_shm_files",
           "SERVER_SCRIPT", "DEFAULT_SERVER_PYTHON", "TOKEN_ENV"]
