"""Run a command against one local Prefect server instead of a temporary server per flow process.

    python -m flows.local_server [--home DIR] [--port N] -- dvc repro

Without $PREFECT_API_URL every flow process starts its own temporary Prefect server: a process
running one trivial flow took a median 20 s that way and 5 s against a running server
(benchmarks/results/orchestration/orchestration.json: flow_process). `dvc repro`
starts one process per stage, so `make run` starts this server once (127.0.0.1, a free port unless
--port, SQLite under --home), points the command at it with PREFECT_API_URL and PREFECT_HOME, and
stops the server by its process group when the command ends, however it ends (killed with SIGKILL
too: flows.common.tie_children ends the server and the command then). The exit status is
the command's. Where $PREFECT_API_URL is set already, the command runs against that server and none
is started.

The server asks every client for a basic-auth string (Prefect's ``server.api.auth_string``): without
it, any local user who can reach 127.0.0.1 could submit flow runs that this user then runs. The string
is made anew at each start into ``<home>/api_auth_string`` (mode 0600, never printed), removed when the
server stops, and handed to the command as $PREFECT_API_AUTH_STRING; a client in another shell reads it
from that file (README, docs/cluster.md). ``--no-auth`` starts a server that trusts every local user,
and says so.

The string goes only to the server started here (docs/design.md §8.7). This process binds the port itself
(a port that something listens on is refused before anything starts, naming its uid), hands the listening
socket to the server, which never binds the port, and keeps it open until the command has ended: so no one
else can listen on the port meanwhile, also once the server has died, and whatever answers there is the
server. The command starts once the server answers /health. While it runs, the server's process is watched
(a pidfd): when it exits, the command and every process it started are killed, and only then is the port
freed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import select
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from flows.common import tie_children, tied
from rlvr_core.safefs import write_all

AUTH_FILE = "api_auth_string"  # under the server's home: the basic-auth string every client must send
NO_AUTH_WARNING = ("[local_server] WARNING: --no-auth: the Prefect server asks no client for credentials; any local "
                   "user who can reach 127.0.0.1 can submit flow runs that run as this user")


def _write_new_string(path: Path) -> None:
    """A fresh ``rlvr:<random>`` into ``path``, which must not exist (O_EXCL, mode 0600, not through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, f"rlvr:{secrets.token_urlsafe(32)}\n".encode())  # all of it: a short write would cut it
    finally:
        os.close(fd)


def new_auth_string(home: str | os.PathLike) -> str:
    """A new basic-auth string in ``home``/api_auth_string, replacing the one before (written to a fresh
    name and renamed over it, so a link there is replaced, never followed); what a server starting now asks
    for, so that a string taken from an earlier start is worth nothing."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = home / f".{AUTH_FILE}.{secrets.token_hex(8)}"
    _write_new_string(tmp)
    os.replace(tmp, home / AUTH_FILE)
    return auth_string(home)


def drop_auth_string(home: str | os.PathLike, value: str) -> None:
    """Remove ``home``/api_auth_string when it still holds ``value`` (the stopped server's string)."""
    path = Path(home) / AUTH_FILE
    try:
        if auth_string(home) == value:
            path.unlink()
    except (OSError, RuntimeError):
        pass


def auth_string(home: str | os.PathLike) -> str:
    """The server's basic-auth string in ``home``/api_auth_string (made there, mode 0600, when there is none);
    RuntimeError when that file is a link, belongs to another user, or others may read it (``chmod 600``).
    Never printed."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / AUTH_FILE
    try:
        _write_new_string(path)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise RuntimeError(f"{path}: cannot be read ({e.strerror}); remove it to make a new auth string") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise RuntimeError(f"{path}: must be a file of this user with mode 0600 (it is "
                               f"{stat.filemode(st.st_mode)}, uid {st.st_uid}); `chmod 600 {path}`, or remove it "
                               "to make a new one")
        value = os.read(fd, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
    if len(value) < 16:
        raise RuntimeError(f"{path}: holds no auth string; remove it to make a new one")
    return value


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# local addresses in /proc/net/tcp{,6} whose listener receives a connection to 127.0.0.1: itself, any address,
# and IPv6's any address and v4-mapped 127.0.0.1 (a dual-stack listener)
_REACHES_LOOPBACK = {"0100007F", "00000000", "0" * 32, "0000000000000000FFFF00000100007F"}


def listeners(port: int) -> list[tuple[int, int]]:
    """(uid, socket inode) of every TCP socket listening on ``port`` that a client of 127.0.0.1 can reach."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f][1:]
        except OSError:
            continue
        for row in rows:  # sl local remote st tx:rx tr:when retrnsmt uid timeout inode
            addr, _, hexport = row[1].rpartition(":")
            if row[3] == "0A" and int(hexport, 16) == port and addr.upper() in _REACHES_LOOPBACK:
                found.append((int(row[7]), int(row[9])))
    return found


class PortTaken(RuntimeError):
    """The port is held by a socket that is not the started server's: no auth string was sent to it."""


def bind_port(port: int) -> socket.socket:
    """A socket of this process listening on 127.0.0.1:``port``; PortTaken when something else listens there
    or the port cannot be bound. The server is handed this socket (it never binds the port itself), and this
    process keeps it open until the command is stopped: while it is open no one else can bind the port, so
    no client is ever answered by a listener of someone else's, also after the server died."""
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is fine
        sock.bind(("127.0.0.1", port))
        sock.listen(512)
        return sock
    except OSError as e:
        sock.close()
        held = listeners(port)
        why = f"something listens there (uid {held[0][0]})" if held else e.strerror
    raise PortTaken(f"port {port} on 127.0.0.1 is in use: {why}; no server was started and no auth string sent. "
                    "Stop what holds it, or choose another port (--port N; make serve PORT=N)")


# Prefect's server (the app `prefect server start` runs, with its settings) under uvicorn, on the listening
# socket whose fd is argv[1], instead of binding the port itself: `prefect server start` insists on binding
# the port first, which this process holds. Exit status 3 when uvicorn did not start.
_ON_SOCKET = r"""
import socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
import uvicorn
from prefect.server.api.server import create_app
from prefect.settings import get_current_settings
api = get_current_settings().server.api
server = uvicorn.Server(uvicorn.Config(
    app=create_app(final=True), timeout_keep_alive=api.keepalive_timeout, ws_ping_interval=api.websocket_ping_interval,
    ws_ping_timeout=api.websocket_ping_timeout, log_level=get_current_settings().server.logging_level.lower()))
server.run(sockets=[sock])
sys.exit(0 if server.started else 3)
"""


def stop(proc: subprocess.Popen) -> None:
    """Stop a process started with start_new_session=True, and its whole group, by its pid."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@dataclass
class Served:
    """A started server: its API URL and port, and its process."""

    url: str
    port: int
    proc: subprocess.Popen


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # $http_proxy never answers the probe


def _healthy(url: str) -> bool:
    try:
        with _NO_PROXY.open(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _wait_ready(proc: subprocess.Popen, port: int, url: str, timeout_s: float, log_path: Path) -> None:
    """Return once the started server answers /health (only it can: it serves this process's socket);
    RuntimeError when it exits or is not healthy within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not _healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            exited = proc.poll() is not None
            why = f"exited with {proc.returncode}" if exited else f"was not healthy in {timeout_s:.0f} s"
            raise RuntimeError(f"prefect server on port {port} {why}; end of {log_path}:\n"
                               f"{log_path.read_text()[-3000:]}")
        time.sleep(0.5)


@contextmanager
def started_server(home: Path, port: int | None = None, timeout_s: float = 300.0,
                   env: dict[str, str] | None = None, auth: bool = True) -> Iterator[Served]:
    """A Prefect server on 127.0.0.1 with its database under ``home``, serving a socket this process bound and
    holds (``bind_port``), once it answers /health. With ``auth`` it asks every client for a string made anew
    now (``new_auth_string``), which is removed again when the server stops.

    Raises PortTaken when something listens on the port, and RuntimeError with the end of the server log when
    it exits or is not healthy within ``timeout_s`` (a loaded 2-core machine can take minutes on a fresh
    database). The server ends with this process, also when it is killed (tie_children).
    """
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if home.stat().st_uid == os.geteuid():  # prefect.db holds every run's logs and parameters: no one else reads it
        home.chmod(0o700)
    sock = bind_port(port or 0)
    port = sock.getsockname()[1]
    senv = dict(os.environ if env is None else env)
    senv.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
                PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port))  # what the UI points to
    senv.pop("PREFECT_API_URL", None)
    senv.pop("PREFECT_SERVER_API_AUTH_STRING", None)
    secret = new_auth_string(home) if auth else None
    if secret:
        senv["PREFECT_SERVER_API_AUTH_STRING"] = senv["PREFECT_API_AUTH_STRING"] = secret
    senv = tied(senv)
    log_path = home / "server.log"
    url = f"http://127.0.0.1:{port}/api"
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-c", _ON_SOCKET, str(sock.fileno())], env=senv, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(sock.fileno(),))
            try:
                _wait_ready(proc, port, url, timeout_s, log_path)
                yield Served(url, port, proc)
            finally:
                stop(proc)
    finally:
        sock.close()  # the port is free again only now, after the command and the server have ended
        if secret:
            drop_auth_string(home, secret)


@contextmanager
def prefect_server(home: Path, port: int | None = None, timeout_s: float = 300.0,
                   env: dict[str, str] | None = None, auth: bool = True) -> Iterator[str]:
    """``started_server``'s API URL (clients send ``auth_string(home)`` as $PREFECT_API_AUTH_STRING)."""
    with started_server(home, port, timeout_s, env, auth) as served:
        yield served.url


SERVED = "RLVR_SERVED"  # a token in the environment of the command and of every process it starts


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, AttributeError, OSError):
        return None


def _kill_served(child: subprocess.Popen, token: str) -> None:
    """SIGKILL the command, then every process whose environment carries ``token`` (what it started, in any
    session), until none is left."""
    try:
        child.kill()
    except ProcessLookupError:
        pass
    needle = f"{SERVED}={token}".encode()
    for _ in range(20):
        left = 0
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    with open(f"/proc/{d}/environ", "rb") as f:
                        if needle not in f.read().split(b"\0"):
                            continue
                    os.kill(int(d), signal.SIGKILL)
                    left += 1
                except OSError:
                    continue
        if not left:
            break
        time.sleep(0.05)
    child.wait()


def run_served(cmd: list[str], env: dict[str, str], served: Served) -> int:
    """Run ``cmd`` against ``served`` and return its exit status; when the server dies first, kill the command
    and everything it started (once the port is freed they would go on sending the auth string to whoever
    binds it) and return 1. 127: no such command; 130 after Ctrl-C."""
    token = secrets.token_hex(8)
    try:
        child = subprocess.Popen(cmd, env={**env, SERVED: token})
    except FileNotFoundError:
        print(f"[local_server] no such command: {cmd[0]}", file=sys.stderr)
        return 127
    watch = [fd for fd in (_pidfd(served.proc.pid),) if fd is not None]
    try:
        while child.poll() is None and served.proc.poll() is None:
            select.select(watch, [], [], 1.0)  # a pidfd reads ready when its process ends
        if child.poll() is not None:
            return child.returncode
        _kill_served(child, token)
        print(f"[local_server] the prefect server exited with {served.proc.returncode}: killed {cmd[0]} and every "
              f"process it started, so that none sends the auth string to whoever binds port {served.port} once "
              "it is free", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # Ctrl-C reached the command too: give it time to stop
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_served(child, token)
        return 130
    except BaseException:
        _kill_served(child, token)
        raise
    finally:
        for fd in watch:
            os.close(fd)


def _call(cmd: list[str], env: dict[str, str]) -> int:
    """The command's exit status: 127 when it does not exist, 130 after Ctrl-C (which reached it too)."""
    try:
        return subprocess.call(cmd, env=env)
    except FileNotFoundError:
        print(f"[local_server] no such command: {cmd[0]}", file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, default=Path(".prefect"), help="PREFECT_HOME of the server and the command")
    ap.add_argument("--port", type=int, default=None,
                    help="port on 127.0.0.1 (default: a free one); refused when something listens there")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the server to be healthy")
    ap.add_argument("--no-auth", action="store_true",
                    help="start a server that asks clients for no credentials (any local user can then run flows)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command to run after --, e.g. -- dvc repro")
    if a.port is not None and not 1 <= a.port <= 65535:
        ap.error(f"--port must be 1-65535 (got {a.port})")
    tie_children()  # killed, even with SIGKILL, it leaves neither the server nor the command running
    if os.environ.get("PREFECT_API_URL"):  # the user's own server: use it, start none
        print(f"[local_server] PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): running the command "
              "against that server", flush=True)
        return _call(cmd, dict(os.environ))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so that the server is stopped
    if a.no_auth:
        print(NO_AUTH_WARNING, file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        with started_server(a.home, a.port, a.timeout, auth=not a.no_auth) as served:
            how = "no auth" if a.no_auth else f"clients send the auth string in {a.home.resolve() / AUTH_FILE}"
            print(f"[local_server] prefect server {served.url} up in {time.monotonic() - t0:.1f} s "
                  f"(pid {served.proc.pid}; home {a.home.resolve()}; {how})", flush=True)
            env = dict(os.environ, PREFECT_API_URL=served.url, PREFECT_HOME=str(a.home.resolve()))
            env.pop("PREFECT_API_AUTH_STRING", None)
            if not a.no_auth:
                env["PREFECT_API_AUTH_STRING"] = auth_string(a.home)
            rc = run_served(cmd, env, served)
    except RuntimeError as e:
        print(f"[local_server] {e}", file=sys.stderr)
        return 1
    print(f"[local_server] server stopped; {' '.join(cmd)} exited {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
