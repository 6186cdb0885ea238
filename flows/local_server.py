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
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from flows.common import tie_children, tied


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
                   env: dict[str, str] | None = None) -> Iterator[str]:
    """A Prefect server on 127.0.0.1 with its database under ``home``; yields its API URL.

    Raises RuntimeError with the end of the server log when it exits or is not healthy within
    ``timeout_s`` (a loaded 2-core machine can take minutes on a fresh database). The server ends with this
    process, also when it is killed (tie_children).
    """
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    senv = dict(os.environ if env is None else env)
    senv.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    senv.pop("PREFECT_API_URL", None)
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
    t0 = time.monotonic()
    try:
        with prefect_server(a.home, a.port, a.timeout) as url:
            print(f"[local_server] prefect server {url} up in {time.monotonic() - t0:.1f} s "
                  f"(home {a.home.resolve()})", flush=True)
            rc = _call(cmd, dict(os.environ, PREFECT_API_URL=url, PREFECT_HOME=str(a.home.resolve())))
    except RuntimeError as e:
        print(f"[local_server] {e}", file=sys.stderr)
        return 1
    print(f"[local_server] server stopped; {' '.join(cmd)} exited {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
