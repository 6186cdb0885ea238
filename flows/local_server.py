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
is made once into ``<home>/api_auth_string`` (mode 0600, never printed) and handed to the command as
$PREFECT_API_AUTH_STRING; a client in another shell reads it from that file (README, docs/cluster.md).
``--no-auth`` starts a server that trusts every local user, and says so.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from flows.common import tie_children, tied
from rlvr_core.safefs import write_all

AUTH_FILE = "api_auth_string"  # under the server's home: the basic-auth string every client must send
NO_AUTH_WARNING = ("[local_server] WARNING: --no-auth: the Prefect server asks no client for credentials; any local "
                   "user who can reach 127.0.0.1 can submit flow runs that run as this user")


def auth_string(home: str | os.PathLike) -> str:
    """The server's basic-auth string, made once (``rlvr:<random>``) into ``home``/api_auth_string with mode
    0600 and read from there after; RuntimeError when that file is a link, belongs to another user, or others
    may read it (``chmod 600``). Never printed."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / AUTH_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, f"rlvr:{secrets.token_urlsafe(32)}\n".encode())  # all of it: a short write would cut it
        finally:
            os.close(fd)
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


def _prefect_cli() -> str:
    here = Path(sys.executable).with_name("prefect")
    return str(here) if here.exists() else "prefect"


@contextmanager
def prefect_server(home: Path, port: int | None = None, timeout_s: float = 300.0,
                   env: dict[str, str] | None = None, auth: bool = True) -> Iterator[str]:
    """A Prefect server on 127.0.0.1 with its database under ``home``; yields its API URL. With ``auth`` it
    asks every client for ``auth_string(home)`` (clients send it as $PREFECT_API_AUTH_STRING).

    Raises RuntimeError with the end of the server log when it exits or is not healthy within
    ``timeout_s`` (a loaded 2-core machine can take minutes on a fresh database). The server ends with this
    process, also when it is killed (tie_children).
    """
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if home.stat().st_uid == os.geteuid():  # prefect.db holds every run's logs and parameters: no one else reads it
        home.chmod(0o700)
    port = port or free_port()
    senv = dict(os.environ if env is None else env)
    senv.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    senv.pop("PREFECT_API_URL", None)
    senv.pop("PREFECT_SERVER_API_AUTH_STRING", None)
    if auth:
        senv["PREFECT_SERVER_API_AUTH_STRING"] = senv["PREFECT_API_AUTH_STRING"] = auth_string(home)
    senv = tied(senv)
    log_path = home / "server.log"
    url = f"http://127.0.0.1:{port}/api"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([_prefect_cli(), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=senv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    exited = proc.poll() is not None
                    why = f"exited with {proc.returncode}" if exited else f"was not healthy in {timeout_s:.0f} s"
                    raise RuntimeError(f"prefect server on port {port} {why}; end of {log_path}:\n"
                                       f"{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            yield url
        finally:
            stop(proc)


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
    ap.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the server to be healthy")
    ap.add_argument("--no-auth", action="store_true",
                    help="start a server that asks clients for no credentials (any local user can then run flows)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command to run after --, e.g. -- dvc repro")
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
        with prefect_server(a.home, a.port, a.timeout, auth=not a.no_auth) as url:
            how = "no auth" if a.no_auth else f"clients send the auth string in {a.home.resolve() / AUTH_FILE}"
            print(f"[local_server] prefect server {url} up in {time.monotonic() - t0:.1f} s "
                  f"(home {a.home.resolve()}; {how})", flush=True)
            env = dict(os.environ, PREFECT_API_URL=url, PREFECT_HOME=str(a.home.resolve()))
            env.pop("PREFECT_API_AUTH_STRING", None)
            if not a.no_auth:
                env["PREFECT_API_AUTH_STRING"] = auth_string(a.home)
            rc = _call(cmd, env)
    except RuntimeError as e:
        print(f"[local_server] {e}", file=sys.stderr)
        return 1
    print(f"[local_server] server stopped; {' '.join(cmd)} exited {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
