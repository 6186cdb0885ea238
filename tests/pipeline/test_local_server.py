"""flows/local_server.py: one Prefect server around a command (what `make run` wraps `dvc repro` in)."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flows import local_server
from tests.pipeline.conftest import PROJECT, PY, base_env

pytestmark = pytest.mark.slow

CHILD = """
import base64, os, sys, urllib.error, urllib.request
url = os.environ["PREFECT_API_URL"]
with urllib.request.urlopen(url + "/health", timeout=10) as r:
    assert r.status == 200
codes = []
for auth in (os.environ.get("PREFECT_API_AUTH_STRING"), None):  # as handed to the command, then without it
    req = urllib.request.Request(url + "/deployments/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        codes.append(str(urllib.request.urlopen(req, timeout=30).status))
    except urllib.error.HTTPError as e:
        codes.append(str(e.code))
open(sys.argv[1], "w").write(url + "\\n" + os.environ["PREFECT_HOME"] + "\\n" + " ".join(codes) + "\\n"
                         + os.environ.get("PREFECT_API_AUTH_STRING", ""))
sys.exit(3)
"""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2):
            return True
    except OSError:
        return False


def test_command_runs_against_the_server_which_is_stopped_after(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    home = tmp_path / "home"
    seen = []
    for _ in range(2):  # two starts: each hands the command a string of its own
        r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(home), "--", PY, "-c", CHILD, str(out)],
                           cwd=PROJECT, env=base_env(tmp_path), capture_output=True, text=True, timeout=1200)
        assert r.returncode == 3, r.stdout + r.stderr  # the command's own exit status
        url, seen_home, codes, secret = out.read_text().splitlines()
        seen.append(secret)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
        assert Path(seen_home) == home.resolve()
        assert (home / "prefect.db").is_file()  # the server's SQLite database lives under --home
        assert codes == "200 401"  # the command gets the auth string; a client without it is refused
        assert secret.startswith("rlvr:") and secret not in r.stdout + r.stderr and "WARNING" not in r.stderr
        # the home holds every run's logs and parameters (prefect.db): this user's alone
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert "server stopped" in r.stdout
        assert not (home / local_server.AUTH_FILE).exists()  # a stopped server's string is removed with it
        assert not _answers(url)
        with socket.socket() as s:  # nothing listens on the port any more (SO_REUSEADDR: TIME_WAIT is fine)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])))
    assert seen[0] != seen[1]  # rotated: a string taken from one start is worth nothing at the next


def test_no_auth_is_an_opt_out_that_warns(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(tmp_path / "home"), "--no-auth", "--", PY,
                        "-c", CHILD, str(out)], cwd=PROJECT, env=base_env(tmp_path), capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 3, r.stdout + r.stderr
    assert local_server.NO_AUTH_WARNING in r.stderr and "no auth" in r.stdout
    assert out.read_text().splitlines()[2] == "200 200"  # any client is served
    assert not (tmp_path / "home" / local_server.AUTH_FILE).exists()


# A local user who holds the port: it binds 127.0.0.1:argv[1] (retrying every millisecond for argv[2] seconds),
# prints "bound", then answers every connection with a 200 and prints what it was sent ("got <hex>"), as a
# listener of someone else's would, for argv[3] seconds
SQUATTER = r"""
import socket, sys, time
port, wait, hold = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
deadline = time.monotonic() + wait
while True:
    try:
        s.bind(("127.0.0.1", port))
        break
    except OSError:
        if time.monotonic() > deadline:
            print("never bound", flush=True)
            sys.exit(0)
        time.sleep(0.001)
s.listen(64)
s.settimeout(0.2)
print("bound", flush=True)
end = time.monotonic() + hold
while time.monotonic() < end:
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    c.settimeout(1.0)
    try:
        print("got", c.recv(65536).hex(), flush=True)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    except OSError:
        pass
    c.close()
"""
OTHER_UID = 1234


def _squatter(port: int, wait: float, hold: float) -> subprocess.Popen:
    """SQUATTER, as another uid where this test runs as root (as the issue's second user), else as this one."""
    cmd = [sys.executable, "-I", "-c", SQUATTER, str(port), str(wait), str(hold)]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        cmd = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "/usr/bin/python3",
               *cmd[1:]]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _wait_line(stream, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([stream], [], [], 1.0)[0]:
            line = stream.readline()
            if m := re.search(pattern, line):
                return m
    raise AssertionError(f"no line matching {pattern!r} in {timeout:.0f} s")


def test_a_port_someone_listens_on_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    port = local_server.free_port()
    squatter = _squatter(port, 10, 600)
    try:
        _wait_line(squatter.stdout, "bound", 60)
        r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(tmp_path / "home"), "--port", str(port),
                            "--timeout", "120", "--", PY, "-c", CHILD, str(out)],
                           cwd=PROJECT, env=base_env(tmp_path), capture_output=True, text=True, timeout=900)
    finally:
        squatter.kill()
    got = squatter.communicate()[0]
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"port {port} on 127.0.0.1 is in use" in r.stderr and "no auth string sent" in r.stderr
    if os.geteuid() == 0:
        assert f"uid {OTHER_UID}" in r.stderr or f"uid {os.geteuid()}" in r.stderr
    assert "up in" not in r.stdout and not out.exists()  # the command never ran
    assert "got" not in got  # nothing, not even the health probe, went to the squatter
    assert not (tmp_path / "home" / local_server.AUTH_FILE).exists()


# the served runner, as flows.serve's would: polls the API with the auth string until it is stopped
RUNNER = """
import base64, os, sys, time, urllib.error, urllib.request
open(sys.argv[1], "w").write(str(os.getpid()))
auth = "Basic " + base64.b64encode(os.environ["PREFECT_API_AUTH_STRING"].encode()).decode()
while True:
    req = urllib.request.Request(os.environ["PREFECT_API_URL"] + "/deployments/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": auth})
    try:
        code = urllib.request.urlopen(req, timeout=5).status
    except urllib.error.HTTPError as e:
        code = e.code
    except OSError as e:
        code = type(e).__name__
    with open(sys.argv[2], "a") as f:
        f.write(f"{code}\\n")
    time.sleep(0.02)
"""


def test_a_server_that_dies_takes_its_command_along_and_a_squatter_gets_no_string(tmp_path: Path) -> None:
    home, pid_file, codes = tmp_path / "home", tmp_path / "runner.pid", tmp_path / "codes.txt"
    served = subprocess.Popen([PY, "-m", "flows.local_server", "--home", str(home), "--", PY, "-c", RUNNER,
                               str(pid_file), str(codes)], cwd=PROJECT, env=base_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    squatter = None
    try:
        m = _wait_line(served.stdout, r"127\.0\.0\.1:(\d+)/api up in .* \(pid (\d+);", 900)
        port, server_pid = int(m.group(1)), int(m.group(2))
        deadline = time.monotonic() + 300
        while (not codes.exists() or codes.read_text().count("200") < 5) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert codes.read_text().count("200") >= 5  # the runner is polling the real server
        secret = (home / local_server.AUTH_FILE).read_text().strip()
        squatter = _squatter(port, 120, 5)  # retries the bind every millisecond from now on
        os.killpg(server_pid, signal.SIGKILL)  # the server crashes
        rc = served.wait(timeout=300)
        err = served.stderr.read()
        assert rc == 1, err
        assert "the prefect server exited" in err and "killed" in err
        _wait_line(squatter.stdout, "bound", 120)  # the port is free again only after the command was stopped
        got = squatter.communicate(timeout=60)[0]
    finally:
        for p in (served, squatter):
            if p is not None and p.poll() is None:
                p.kill()
    assert not Path(f"/proc/{pid_file.read_text()}").exists()  # the runner is gone
    assert "got" not in got  # nothing reached the squatter, let alone the string
    assert secret.encode().hex() not in got and not (home / local_server.AUTH_FILE).exists()


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(tmp_path)], cwd=PROJECT,
                       env=base_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert r.returncode == 2 and "give the command to run" in r.stderr


def test_a_server_the_user_set_is_used_and_none_is_started(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = dict(base_env(tmp_path), PREFECT_API_URL="http://127.0.0.1:9/api")
    code = "import os; print('url=' + os.environ['PREFECT_API_URL'])"
    r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(home), "--", PY, "-c", code], cwd=PROJECT,
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "url=http://127.0.0.1:9/api" in r.stdout and "against that server" in r.stdout
    assert not (home / "prefect.db").exists()
