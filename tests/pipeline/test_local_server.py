"""flows/local_server.py: one Prefect server around a command (what `make run` wraps `dvc repro` in)."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.pipeline.conftest import PROJECT, PY, base_env

pytestmark = pytest.mark.slow

CHILD = """
import os, sys, urllib.request
url = os.environ["PREFECT_API_URL"]
with urllib.request.urlopen(url + "/health", timeout=10) as r:
    assert r.status == 200
open(sys.argv[1], "w").write(url + "\\n" + os.environ["PREFECT_HOME"])
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
    url, seen_home = out.read_text().splitlines()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/api")
    assert Path(seen_home) == home.resolve()
    assert (home / "prefect.db").is_file()  # the server's SQLite database lives under --home
    assert "server stopped" in r.stdout
    assert not _answers(url)
    with socket.socket() as s:  # nothing listens on the port any more (SO_REUSEADDR: TIME_WAIT is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])))


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
