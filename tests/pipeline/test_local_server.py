"""flows/local_server.py: one Prefect server around a command (what `make run` wraps `dvc repro` in)."""

from __future__ import annotations

import socket
import stat
import subprocess
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
open(sys.argv[1], "w").write(url + "\\n" + os.environ["PREFECT_HOME"] + "\\n" + " ".join(codes))
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
    r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(home), "--", PY, "-c", CHILD, str(out)],
                       cwd=PROJECT, env=base_env(tmp_path), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 3, r.stdout + r.stderr  # the command's own exit status
    url, seen_home, codes = out.read_text().splitlines()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
    assert Path(seen_home) == home.resolve()
    assert (home / "prefect.db").is_file()  # the server's SQLite database lives under --home
    assert codes == "200 401"  # the command gets the auth string; a client without it is refused
    secret = (home / local_server.AUTH_FILE).read_text().strip()
    assert secret not in r.stdout + r.stderr and "WARNING" not in r.stderr
    # the home holds every run's logs and parameters (prefect.db) and the string: this user's alone
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / local_server.AUTH_FILE).stat().st_mode) == 0o600
    assert "server stopped" in r.stdout
    assert not _answers(url)
    with socket.socket() as s:  # nothing listens on the port any more (SO_REUSEADDR: TIME_WAIT is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])))


def test_no_auth_is_an_opt_out_that_warns(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(tmp_path / "home"), "--no-auth", "--", PY,
                        "-c", CHILD, str(out)], cwd=PROJECT, env=base_env(tmp_path), capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 3, r.stdout + r.stderr
    assert local_server.NO_AUTH_WARNING in r.stderr and "no auth" in r.stdout
    assert out.read_text().splitlines()[2] == "200 200"  # any client is served
    assert not (tmp_path / "home" / local_server.AUTH_FILE).exists()


def test_a_server_that_cannot_start_is_reported_and_the_command_never_runs(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([PY, "-m", "flows.local_server", "--home", str(tmp_path / "home"), "--port", str(port),
                            "--timeout", "120", "--", PY, "-c", CHILD, str(out)],
                           cwd=PROJECT, env=base_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"prefect server on port {port}" in r.stderr
    assert not out.exists()


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
