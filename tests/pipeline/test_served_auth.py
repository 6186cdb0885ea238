"""The served pipeline asks every client for its auth string (issue 40; flows/local_server.py): a request without
it, or from another local user who cannot read it, is refused (401) before any flow run is made."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from flows import local_server

OTHER_UID = 1234
FILTER = "/deployments/filter"


def _post(url: str, auth: str | None) -> int:
    req = urllib.request.Request(url + FILTER, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_requests_without_the_auth_string_are_refused(prefect_server: str, prefect_auth: str,
                                                      prefect_home: Path) -> None:
    assert _post(prefect_server, None) == 401
    assert _post(prefect_server, "rlvr:guessed") == 401
    assert _post(prefect_server, prefect_auth) == 200
    with urllib.request.urlopen(prefect_server + "/health", timeout=30) as r:  # probes need no credentials
        assert r.status == 200
    st = (prefect_home / local_server.AUTH_FILE).stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_another_local_user_can_neither_read_the_string_nor_submit_runs(prefect_server: str) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a second uid needs root and setpriv")
    # a home the other user can walk into (pytest's own temporary folders are 0700, which would refuse the read
    # whatever the file's mode): only the string's own 0600 keeps it private; a 0644 file beside it is read
    home = Path(tempfile.mkdtemp(prefix="rlvr-auth-")) / ".prefect"
    try:
        local_server.auth_string(home)
        for folder in (home.parent, home):
            folder.chmod(0o755)
        (home / "public.txt").write_text("anyone")
        (home / "public.txt").chmod(0o644)
        seen = _as_other_user(prefect_server, home)
    finally:
        shutil.rmtree(home.parent)
    assert seen["public"] is True, "the other user could not reach the folder: the read check proves nothing"
    assert seen["read"] == "PermissionError"
    assert seen["/deployments/filter"] == seen["/flow_runs/"] == seen["/logs/filter"] == 401


def _as_other_user(prefect_server: str, home: Path) -> dict:
    """What uid OTHER_UID gets: reading the auth string and a public file in ``home``, and three API calls."""
    probe = f"""
import json, urllib.request, urllib.error
out = {{}}
for key, name in (("read", {local_server.AUTH_FILE!r}), ("public", "public.txt")):
    try:
        open({str(home)!r} + "/" + name).read()
        out[key] = True
    except OSError as e:
        out[key] = e.__class__.__name__
body = json.dumps({{"name": "x", "parameters": {{"out_dir": "/root"}}}}).encode()
for path in ("/deployments/filter", "/flow_runs/", "/logs/filter"):
    req = urllib.request.Request({prefect_server!r} + path, data=body, method="POST",
                                 headers={{"Content-Type": "application/json"}})
    try:
        out[path] = urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as e:
        out[path] = e.code
print(json.dumps(out))
"""
    r = subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                        "/usr/bin/python3", "-I", "-c", probe], capture_output=True, text=True, timeout=360)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_new_string_replaces_the_old_one_and_a_link_there_is_never_followed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = local_server.new_auth_string(home)
    second = local_server.new_auth_string(home)
    assert first != second and local_server.auth_string(home) == second
    path = home / local_server.AUTH_FILE
    path.unlink()
    target = tmp_path / "victim"
    target.write_text("keep")
    path.symlink_to(target)
    third = local_server.new_auth_string(home)  # the link is replaced by a file, the target is untouched
    assert target.read_text() == "keep" and not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and sorted(p.name for p in home.iterdir()) == [path.name]
    local_server.drop_auth_string(home, "rlvr:another-string-not-this-one")  # only its own string is removed
    assert path.exists()
    local_server.drop_auth_string(home, third)
    assert not path.exists()


def test_the_auth_string_is_made_private_and_refused_when_others_can_read_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = local_server.auth_string(home)
    assert first == local_server.auth_string(home) and len(first) > 30
    path = home / local_server.AUTH_FILE
    path.chmod(0o644)
    with pytest.raises(RuntimeError, match="mode 0600"):
        local_server.auth_string(home)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RuntimeError, match="cannot be read"):
        local_server.auth_string(home)
