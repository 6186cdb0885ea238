"""The bubblewrap code sandbox: every known escape of the in-process sandbox and the earlier hostile programs.

Each hostile program prints the right answer ("3" for "1 2") only if its escape
worked, so through ``verify_code`` an escape would score 1.0. Each must end inside
its limits, score 0.0, leave no process (found by a marker in the command line:
programs re-exec themselves with it, and their children carry it) and no file
outside a temp dir that is then removed. Needs bubblewrap: skipped without it,
except when CI is set, where these tests fail instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox relies on Linux namespaces", allow_module_level=True)

from rlvr_core.rewards import sandbox as sandbox_mod  # noqa: E402
from rlvr_core.rewards.code import verify_code  # noqa: E402
from rlvr_core.rewards.sandbox import (  # noqa: E402
    MEMORY_LIMIT,
    OK,
    OUTPUT_LIMIT,
    RUNTIME_ERROR,
    TIMEOUT,
    SandboxLimits,
    run_python,
)
from rlvr_core.rewards.sandbox import bwrap as bwrap_mod  # noqa: E402

# allow_processes: the hostile programs below must meet the deeper layers (namespaces, daemons, limits),
# not only the default single-process rule (test_a_runs_memory_in_all_is_bounded_not_only_each_process)
ROOT = Path(sandbox_mod.__file__).parents[3]  # the repository (rlvr_core/rewards/sandbox/__init__.py)
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.5, memory_bytes=256 * 2**20, allow_processes=True)
WALL_BOUND = LIMITS.wall_seconds + 1.5  # the wall limit plus slack for a loaded 2-core machine
ONE_TEST = {"tests": [{"input": "1 2\n", "output": "3\n"}]}
SECRET_KEY = "RLVR_TEST_SECRET"


def tagged(code: str, marker: str) -> str:
    """``code`` that first re-execs the interpreter with ``marker`` in its command line."""
    return (
        "import os as _os, sys as _sys\n"
        f"if {marker!r} not in _sys.argv:\n"
        f"    _os.execv(_sys.executable, [_sys.executable, '-S', '-s', '-B', '-P', 'main.py', {marker!r}])\n"
        + code
    )


class Run:
    """One hostile program run twice: through run_python (in a thread, observed) and verify_code."""

    def __init__(self, code: str, processes_with, marker: str | None = None) -> None:
        self.marker = marker or f"rlvr-marker-{uuid.uuid4().hex}"
        self.code = tagged(code, self.marker)
        self.processes_with = processes_with
        self.seen: set[int] = set()  # marker processes observed while the run was going
        self.seen_uids: set[str] = set()

    def go(self, stdin: str = "1 2\n", limits: SandboxLimits = LIMITS):
        box: dict = {}

        def work() -> None:
            box["result"] = run_python(self.code, stdin, limits)

        t0 = time.monotonic()
        worker = threading.Thread(target=work)
        worker.start()
        while worker.is_alive():
            for pid in self.processes_with(self.marker):
                self.seen.add(pid)
                try:
                    uid_line = next(
                        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
                    )
                    self.seen_uids.add(" ".join(uid_line.split()[1:]))
                except (OSError, StopIteration):
                    pass
            time.sleep(0.02)
        worker.join()
        self.elapsed = time.monotonic() - t0
        self.result = box["result"]
        return self.result

    def check_contained(self, private_tmp: Path, wall_bound: float = WALL_BOUND) -> None:
        assert self.elapsed < wall_bound, (self.elapsed, self.result.status)
        assert self.processes_with(self.marker) == [], "a process of the run outlived it"
        assert list(private_tmp.iterdir()) == []
        # every process of the run that was seen ran as nobody on the host, not as root
        assert self.seen_uids <= {"65534 65534 65534 65534"}, self.seen_uids
        t0 = time.monotonic()
        assert verify_code(f"```python\n{self.code}```", ONE_TEST, LIMITS) == 0.0
        assert time.monotonic() - t0 < wall_bound
        assert self.processes_with(self.marker) == []
        assert list(private_tmp.iterdir()) == []


@pytest.fixture
def outside():
    """A host directory in /tmp that anyone may write to: only the sandbox's mounts keep programs out."""
    d = Path(tempfile.mkdtemp(prefix="rlvr_outside_", dir="/tmp"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d)


pytestmark = pytest.mark.usefixtures("bwrap_sandbox", "private_tmp")


# ---------------------------------------------------------------- the sandbox itself


def test_correct_program_still_scores_one_and_sees_only_its_sandbox(bwrap_sandbox, private_tmp) -> None:
    code = (
        "import os, sys\n"
        "a, b = map(int, input().split())\n"
        "print(a + b)\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), os.getcwd(), sorted(os.listdir('/')), file=sys.stderr)\n"
        "print(sorted(os.environ), file=sys.stderr)\n"
        "st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "print([st[k].strip() for k in ('CapEff', 'CapBnd', 'NoNewPrivs', 'Seccomp')], file=sys.stderr)\n"
        "print(sorted(os.listdir('/proc/self/fd')), file=sys.stderr)\n"
    )
    assert verify_code(f"```python\n{code}```", ONE_TEST, LIMITS) == 1.0
    result = run_python(code, "1 2\n", LIMITS)
    assert result.status == OK and result.stdout == "3\n", result.stderr
    ids, env, status, fds = result.stderr.strip().splitlines()[-4:]
    assert ids.startswith("65534 65534 [] /tmp ")
    assert "root" not in ids and "home" not in ids and "etc" not in ids and "work" not in ids
    allowed = {"PATH", "PYTHONHASHSEED", "PYTHONIOENCODING", "LANG", "HOME", "TMPDIR", "PWD", "LC_CTYPE",
               "LD_LIBRARY_PATH"}
    assert {"PATH", "HOME", "TMPDIR"} <= set(eval(env)) <= allowed, env  # noqa: S307
    expected_seccomp = "2" if "seccomp" in bwrap_sandbox else "0"
    assert eval(status) == ["0000000000000000", "0000000000000000", "1", expected_seccomp]  # noqa: S307
    assert eval(fds) == ["0", "1", "2", "3"]  # noqa: S307 - stdio plus listdir's own descriptor
    assert {"userns", "pidns", "netns", "mountns", "unprivileged"} <= set(result.isolation)
    assert list(private_tmp.iterdir()) == []


def test_threads_and_processes_of_ordinary_programs_work(private_tmp) -> None:
    """Threads (clone3 answers ENOSYS, libc falls back), multiprocessing (needs /dev/shm), time."""
    code = (
        "import threading, concurrent.futures, multiprocessing, time\n"
        "out = []\nt = threading.Thread(target=lambda: out.append(1))\nt.start()\nt.join()\n"
        "with concurrent.futures.ThreadPoolExecutor(4) as ex:\n    s = sum(ex.map(lambda x: x * x, range(10)))\n"
        "with multiprocessing.Pool(2) as p:\n    m = p.map(abs, [-1, -2, 3])\n"
        "print(out, s, m, time.strftime('%Y', time.gmtime(0)))\n"
    )
    result = run_python(code, "", SandboxLimits(cpu_seconds=2, wall_seconds=10, allow_processes=True))
    assert result.status == OK, result.stderr[-500:]
    assert result.stdout == "[1] 285 [1, 2, 3] 1970\n"
    assert "single-process" not in result.isolation
    assert list(private_tmp.iterdir()) == []


# Four children that each touch MIB MiB and hold it at the same time; prints how many held it.
FORK_AND_HOLD = """
import os, time
MIB = 80
r, w = os.pipe()
try:
    for _ in range(4):
        if os.fork() == 0:
            try:
                b = bytearray(MIB * 2**20)
                b[::4096] = b"x" * (len(b) // 4096)
                os.write(w, b"1")
                time.sleep(2)
            finally:
                os._exit(0)
except OSError as e:
    print("fork refused", e.errno)
os.close(w)
held = b""
while chunk := os.read(r, 16):
    held += chunk
print("held", len(held))
"""


def test_a_runs_memory_in_all_is_bounded_not_only_each_process(private_tmp) -> None:
    """Per-process RLIMIT_AS let 4 forked children hold 4 x 80 MiB against memory_bytes = 128 MiB."""
    limits = SandboxLimits(cpu_seconds=3, wall_seconds=10, memory_bytes=128 * 2**20)
    result = run_python(FORK_AND_HOLD, "", limits)
    assert result.status == OK, result.stderr[-500:]
    held = int(result.stdout.split("held ")[1])
    assert held * 80 <= 128, result.stdout  # the run's total stays under memory_bytes
    assert result.stdout.startswith("fork refused 11\n") and "single-process" in result.isolation
    assert "single-process" in sandbox_mod.check_sandbox(limits)
    assert "single-process" not in sandbox_mod.check_sandbox(SandboxLimits(allow_processes=True))
    threads = run_python(  # threads share the address space: they still start
        "import threading, sys\nthreading.stack_size(2**26)\nsys.setrecursionlimit(10**5)\n"
        "f = lambda n: n and 1 + f(n - 1)\nout = []\nt = threading.Thread(target=lambda: out.append(f(20000)))\n"
        "t.start()\nt.join()\nprint(out)\n", "", limits)
    assert threads.status == OK and threads.stdout == "[20000]\n", threads.stderr[-500:]
    assert list(private_tmp.iterdir()) == []


def test_without_a_seccomp_table_the_run_is_held_to_one_process(private_tmp, monkeypatch) -> None:
    """The fallback where the filter has no table for the machine: RLIMIT_NPROC=1 (threads refused too)."""
    monkeypatch.setattr(bwrap_mod, "_seccomp_filter", lambda single_process=False: None)
    bwrap_mod._bwrap_plan.cache_clear()
    try:
        limits = SandboxLimits(cpu_seconds=3, wall_seconds=10, memory_bytes=128 * 2**20)
        result = run_python(FORK_AND_HOLD, "", limits)
        assert result.status == OK and "seccomp" not in result.isolation, result.stderr[-500:]
        assert result.stdout == "fork refused 11\nheld 0\n"
        threads = run_python("import threading\nthreading.Thread(target=print).start()\n", "", limits)
        assert threads.status == RUNTIME_ERROR and "can't start new thread" in threads.stderr
    finally:
        bwrap_mod._bwrap_plan.cache_clear()
    assert list(private_tmp.iterdir()) == []


def test_killed_verifier_takes_its_sandbox_along(tmp_path: Path, processes_with) -> None:
    """--die-with-parent: SIGKILL to the verifier mid-run ends the program and its daemon."""
    marker = f"rlvr-marker-{uuid.uuid4().hex}"
    program = tagged(
        "import os, sys\n"
        f"os.system('setsid ' + sys.executable + ' -S -c \"import time; time.sleep(117)\" {marker}-daemon &')\n"
        "import time\ntime.sleep(60)\n",
        marker,
    )
    (tmp_path / "program.py").write_text(program)
    driver = (
        "import sys\nfrom rlvr_core.rewards.sandbox import SandboxLimits, run_python\n"
        "run_python(open(sys.argv[1]).read(), '', SandboxLimits(cpu_seconds=30, wall_seconds=60,\n"
        "                                                  allow_processes=True))\n"
    )
    verifier = subprocess.Popen([sys.executable, "-c", driver, str(tmp_path / "program.py")],
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 30
        while len(processes_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(processes_with(marker)) >= 2, "program and daemon running"
    finally:
        os.kill(verifier.pid, signal.SIGKILL)
        verifier.wait()
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_marker_scan_sees_a_live_process(processes_with) -> None:
    """Control for the leftover check: the scan finds a process carrying the marker."""
    marker = f"rlvr-marker-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        deadline = time.monotonic() + 10
        while proc.pid not in processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert processes_with(marker) == [proc.pid]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert processes_with(marker) == []


# ---------------------------------------------------------------- the known escapes of the in-process sandbox

SUBINTERP = "import _xxsubinterpreters as I\nI.run_string(I.create(), {inner!r})\n"


def test_subinterpreter_cannot_write_outside(outside: Path, private_tmp: Path, processes_with) -> None:
    for target in (outside / "escaped.txt", Path("/usr/local") / f"escaped_{uuid.uuid4().hex}"):
        inner = f"open({str(target)!r}, 'w').write('escaped')"
        run = Run(SUBINTERP.format(inner=inner) + "print(3)\n", processes_with)
        result = run.go()
        assert result.status == RUNTIME_ERROR and "RunFailedError" in result.stderr, result.stderr[-400:]
        assert not target.exists()
        run.check_contained(private_tmp)
        assert not target.exists()
    # /tmp inside is the program's own tmpfs: writing there works and vanishes with it
    name = f"/tmp/rlvr_escaped_{uuid.uuid4().hex}"
    inner = f"open({name!r}, 'w').write('x')"
    result = run_python(SUBINTERP.format(inner=inner) + f"import os\nprint(os.path.exists({name!r}))", "", LIMITS)
    assert result.status == OK and result.stdout == "True\n"
    assert not Path(name).exists()


def test_parent_environment_cannot_be_read(monkeypatch: pytest.MonkeyPatch, private_tmp: Path, processes_with) -> None:
    monkeypatch.setenv(SECRET_KEY, f"s3cr3t-{uuid.uuid4().hex}")
    find_secret = (
        "import os\n"
        f"found = {SECRET_KEY!r} in os.environ\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try:\n"
        f"            found = found or {SECRET_KEY.encode()!r} in open(f'/proc/{{p}}/environ', 'rb').read()\n"
        "        except OSError as e:\n"
        "            print(p, type(e).__name__, file=__import__('sys').stderr)\n"
        "assert found, 'no secret'\n"
    )
    via_ppid = ("d = open('/proc/%d/environ' % __import__('os').getppid(), 'rb').read()\n"
                f"assert {SECRET_KEY.encode()!r} in d\n")
    for code in (find_secret + "print(3)\n", SUBINTERP.format(inner=via_ppid) + "print(3)\n"):
        run = Run(code, processes_with)
        result = run.go()
        assert result.status == RUNTIME_ERROR, (result.status, result.stderr[-400:])
        assert os.environ[SECRET_KEY] not in result.stdout + result.stderr
        run.check_contained(private_tmp)


def test_setsid_daemon_does_not_outlive_the_run(private_tmp: Path, processes_with) -> None:
    marker = f"rlvr-marker-{uuid.uuid4().hex}"
    daemon = ("import os, sys\n"
              f"os.system('setsid ' + sys.executable + ' -S -c \"import time; time.sleep(117)\" {marker} &')\n")
    code = SUBINTERP.format(inner=daemon) + "import time\ntime.sleep(30)\n"
    run = Run(code, processes_with, marker=marker)
    result = run.go()
    assert result.status == TIMEOUT
    assert len(run.seen) >= 2, "the program and its daemon were seen while running"
    run.check_contained(private_tmp)
    # the daemon started by a program that exits at once dies with it as well
    run = Run(SUBINTERP.format(inner=daemon) + "print(3)\n", processes_with, marker=marker)
    assert run.go().status == OK
    assert processes_with(marker) == []


@pytest.fixture
def listener(tmp_path: Path):
    """A TCP listener on 127.0.0.1 in its own process that records what it receives; stopped by pid."""
    log = tmp_path / "received.bin"
    log.touch()
    server = (
        "import socket, sys\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 0)); s.listen(8)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    data = c.recv(4096)\n"
        "    with open(sys.argv[1], 'ab') as f:\n"
        "        f.write(b'connection:' + data + b'\\n')\n"
        "    c.close()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", server, str(log)], stdout=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:  # control: the listener works
            c.sendall(b"control")
        deadline = time.monotonic() + 5
        while b"control" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.read_bytes() == b"connection:control\n"
        yield port, log
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def test_network_to_localhost_is_unreachable(listener, private_tmp: Path, processes_with) -> None:
    port, log = listener
    connect = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'escaped')\n"
    for code in (connect + "print(3)\n", SUBINTERP.format(inner=connect) + "print(3)\n"):
        run = Run(code, processes_with)
        result = run.go()
        assert result.status == RUNTIME_ERROR, (result.status, result.stderr[-300:])
        assert "ConnectionRefused" in result.stderr or "RunFailedError" in result.stderr
        run.check_contained(private_tmp)
    time.sleep(0.1)
    assert log.read_bytes() == b"connection:control\n"


@pytest.mark.parametrize("module", ["sqlite3", "readline"])
def test_stdlib_modules_cannot_create_files_outside(module: str, outside: Path, private_tmp: Path,
                                                    processes_with) -> None:
    target = outside / f"escaped_{module}"
    code = {
        "sqlite3": f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')\n",
        "readline": f"import readline\nreadline.add_history('x')\nreadline.write_history_file({str(target)!r})\n",
    }[module]
    run = Run(code + "print(3)\n", processes_with)
    result = run.go()
    assert result.status == RUNTIME_ERROR
    assert "ModuleNotFoundError" not in result.stderr and "ImportError" not in result.stderr, result.stderr[-400:]
    assert not target.exists()
    run.check_contained(private_tmp)
    assert not target.exists() and list(outside.iterdir()) == []


@pytest.fixture
def observer(tmp_path: Path):
    """A process that records every SIGUSR1 it gets; stopped by pid."""
    log = tmp_path / "signals.txt"
    code = (
        "import signal, sys, time\n"
        "def on(sig, frame):\n"
        "    open(sys.argv[1], 'a').write('SIGUSR1\\n')\n"
        "signal.signal(signal.SIGUSR1, on)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(log)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        yield proc.pid, log
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def test_signals_cannot_reach_the_verifier_or_other_processes(observer, private_tmp: Path, processes_with) -> None:
    observer_pid, log = observer
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda sig, frame: got.append(sig))
    try:
        code = (
            "import os, signal, sys\n"
            "hits = 0\n"
            f"for pid in (os.getppid(), {observer_pid}, {os.getpid()}):\n"
            "    for send in (lambda p: signal.pidfd_send_signal(os.pidfd_open(p), signal.SIGUSR1),\n"
            "                 lambda p: os.kill(p, signal.SIGUSR1)):\n"
            "        try:\n"
            "            send(pid)\n"
            "            hits += 1\n"
            "        except OSError as e:\n"
            "            print(pid, type(e).__name__, file=sys.stderr)\n"
            "if hits:\n"
            "    print(3)\n"
        )
        run = Run(code, processes_with)
        result = run.go()
        assert result.status == OK and result.stdout == "", result.stderr[-400:]
        assert "PermissionError" in result.stderr and "ProcessLookupError" in result.stderr
        run.check_contained(private_tmp)
        time.sleep(0.1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert got == []
    assert not log.exists()


def test_immutable_flag_ioctl_is_refused(private_tmp: Path, processes_with) -> None:
    code = (
        "import array, fcntl, os\n"
        "fd = os.open('locked', os.O_CREAT | os.O_RDONLY)\n"
        "fcntl.ioctl(fd, 0x40086602, array.array('i', [0x10]))  # FS_IOC_SETFLAGS, FS_IMMUTABLE_FL\n"
        "print(3)\n"
    )
    run = Run(code, processes_with)
    result = run.go()
    assert result.status == RUNTIME_ERROR and ("PermissionError" in result.stderr or "OSError" in result.stderr)
    run.check_contained(private_tmp)
    assert not [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith("rlvr_sandbox_")]


def test_root_files_root_home_cwd_and_fds_are_out_of_sight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_tmp: Path, processes_with
) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    root_only = tmp_path / "root_only.txt"
    root_only.write_text(secret)
    root_only.chmod(0o600)
    cwd = tmp_path / "verifier_cwd"
    cwd.mkdir()
    (cwd / "cwd_marker.txt").write_text(secret)
    monkeypatch.chdir(cwd)
    fd = os.open(root_only, os.O_RDONLY)
    os.set_inheritable(fd, True)  # an inheritable descriptor of the verifier's
    try:
        code = (
            "import os, sys\n"
            f"SECRET = {secret.encode()!r}\n"
            "leaks = []\n"
            f"for path in ({str(root_only)!r}, '/etc/shadow', '/root/.bashrc'):\n"
            "    try:\n"
            "        leaks.append((path, open(path, 'rb').read(64)))\n"
            "    except OSError as e:\n"
            "        print(path, type(e).__name__, file=sys.stderr)\n"
            f"for d in ('/root', {str(cwd)!r}, '/home', '/etc', '/work'):\n"
            "    try:\n"
            "        leaks.append((d, os.listdir(d)))\n"
            "    except OSError as e:\n"
            "        print(d, type(e).__name__, file=sys.stderr)\n"
            "for fd in range(3, 1024):\n"
            "    try:\n"
            "        if SECRET in os.pread(fd, 4096, 0):\n"
            "            leaks.append(('fd', fd))\n"
            "    except OSError:\n"
            "        pass\n"
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
            "    for entry in ('cwd', 'root'):\n"
            "        try:\n"
            "            if 'cwd_marker.txt' in os.listdir(f'/proc/{pid}/{entry}'):\n"
            "                leaks.append((pid, entry))\n"
            "        except OSError:\n"
            "            pass\n"
            "    try:\n"
            "        for fd in os.listdir(f'/proc/{pid}/fd'):\n"
            "            try:\n"
            "                if SECRET in open(f'/proc/{pid}/fd/{fd}', 'rb').read(4096):\n"
            "                    leaks.append((pid, 'fd', fd))\n"
            "            except OSError:\n"
            "                pass\n"
            "    except OSError as e:\n"
            "        print(pid, 'fd', type(e).__name__, file=sys.stderr)\n"
            "print(leaks, file=sys.stderr)\n"
            "if leaks:\n"
            "    print(3)\n"
        )
        run = Run(code, processes_with)
        result = run.go()
        assert result.status == OK and result.stdout == "", result.stderr[-600:]
        assert result.stderr.strip().splitlines()[-1] == "[]"
        assert secret not in result.stderr
        run.check_contained(private_tmp)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the earlier hostile programs

HOSTILE = {
    # name: (program, expected status)
    "infinite_loop": ("while True:\n    pass\n", TIMEOUT),
    "sleeping": ("import time\ntime.sleep(60)\n", TIMEOUT),
    "memory_bomb": ("x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))\n", MEMORY_LIMIT),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", None),  # RLIMIT_NPROC stops it: error or timeout
    "subprocess_daemon": (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(30)', sys.argv[1]],"
        " start_new_session=True)\n",
        OK,
    ),
    "shell_daemon": ("import os\nos.system('sleep 30 &')\nimport time\ntime.sleep(30)\n", TIMEOUT),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 80))\nprint(3)\n", RUNTIME_ERROR),
    "dns": ("import socket\nsocket.getaddrinfo('example.com', 80)\nprint(3)\n", RUNTIME_ERROR),
    "ctypes_fork": ("import ctypes, time\nctypes.CDLL(None).fork()\ntime.sleep(30)\n", TIMEOUT),
    "new_user_namespace": (
        "import subprocess\nsubprocess.run(['unshare', '-Ur', 'true'], check=True)\nprint(3)\n",
        RUNTIME_ERROR,
    ),
    "raise_own_limits": (
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\nprint(3)\n",
        RUNTIME_ERROR,
    ),
    "print_gigabytes": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", OUTPUT_LIMIT),
    "stderr_flood": ("import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n", OUTPUT_LIMIT),
    "fill_the_disk": (
        "i = 0\nwhile True:\n    with open(f'fill{i}', 'wb') as f:\n        f.write(b'x' * 2**20)\n    i += 1\n",
        RUNTIME_ERROR,
    ),
    "fill_dev_shm": (
        "i = 0\nwhile True:\n    with open(f'/dev/shm/fill{i}', 'wb') as f:\n"
        "        f.write(b'x' * 2**20)\n    i += 1\n",
        RUNTIME_ERROR,
    ),
    "one_huge_file": ("open('big', 'wb').write(b'x' * 2**26)\nprint(3)\n", RUNTIME_ERROR),
    "write_to_root": ("open('/escaped', 'w').write('x')\nprint(3)\n", RUNTIME_ERROR),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(name: str, private_tmp: Path, processes_with) -> None:
    code, expected = HOSTILE[name]
    run = Run(code, processes_with)
    result = run.go()
    if expected is None:
        assert result.status in (RUNTIME_ERROR, TIMEOUT), (result.status, result.stderr[-300:])
    else:
        assert result.status == expected, (result.status, result.stderr[-300:])
    assert len(result.stdout.encode()) <= LIMITS.max_output_bytes
    if result.status == TIMEOUT:
        assert run.seen, "the running program was visible to the marker scan"
    why = {"fill_the_disk": "No space left on device", "fill_dev_shm": "No space left on device",
           "one_huge_file": "File too large", "write_to_root": "Read-only file system",
           "socket": "ConnectionRefusedError", "new_user_namespace": "CalledProcessError"}.get(name)  # fmt: skip
    if why is not None:
        assert why in result.stderr, result.stderr[-300:]
    # killing 64 forking processes takes the kernel up to ~1.5 s more on a loaded 2-core machine
    run.check_contained(private_tmp, WALL_BOUND + (1.5 if name == "fork_bomb" else 0.0))


def test_writes_outside_the_sandbox_fail(outside: Path, private_tmp: Path, processes_with) -> None:
    target = outside / "escaped.txt"
    attempts = [
        f"open({str(target)!r}, 'w').write('escaped')",
        f"import os\nfd = os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)\nos.write(fd, b'x')",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('escaped')",
        f"import shutil\nopen('f', 'w').write('x')\nshutil.copy('f', {str(target)!r})",
        f"import os\nopen('f', 'w').write('x')\nos.rename('f', {str(target)!r})",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        "open('/usr/escaped', 'w').write('x')",
        "import os\nos.mkdir('/opt/escaped')",
    ]
    for code in attempts:
        run = Run(code + "\nprint(3)\n", processes_with)
        result = run.go()
        assert result.status == RUNTIME_ERROR, (code, result.status, result.stderr[-300:])
        assert not target.exists(), code
        run.check_contained(private_tmp)
    assert list(outside.iterdir()) == []
    assert not Path("/usr/escaped").exists() and not Path("/opt/escaped").exists()


def test_as_an_ordinary_user_bwrap_maps_the_uid_itself(tmp_path: Path) -> None:
    """The non-root path: bwrap maps 65534 to the caller and applies --disable-userns itself."""
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if os.geteuid() != 0 or setpriv is None or not os.access(python, os.X_OK):
        pytest.skip("needs root (to become nobody), setpriv and /usr/bin/python3")
    src = Path(tempfile.mkdtemp(prefix="rlvr_nonroot_", dir="/tmp"))
    try:
        shutil.copytree(ROOT / "rlvr_core", src / "rlvr_core")
        script = src / "check.py"
        script.write_text(
            "import os, sys\n"
            "sys.path.insert(0, os.path.dirname(__file__))\n"
            "from rlvr_core.rewards.sandbox import SandboxLimits, run_python\n"
            "from rlvr_core.rewards.code import verify_code\n"
            "L = SandboxLimits(cpu_seconds=1, wall_seconds=2.5, memory_bytes=256 * 2**20)\n"
            "r = run_python('import os; print(os.getuid(), sorted(os.listdir(\"/\")))', '', L)\n"
            "print(os.getuid(), r.status, r.stdout.strip())\n"
            "r = run_python('import subprocess; subprocess.run([\"unshare\", \"-Ur\", \"true\"], check=True)', '', L)\n"
            "print(r.status)\n"
            "print(verify_code('```python\\nprint(sum(map(int, input().split())))\\n```', "
            "{'tests': [{'input': '1 2', 'output': '3'}]}, L))\n"
        )
        for path in [src, *src.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        done = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-S", str(script)],
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-1000:]
        lines = done.stdout.splitlines()
        assert lines[0].startswith("65534 ok 65534 [") and "'usr'" in lines[0] and "'root'" not in lines[0], lines
        assert lines[1:] == ["runtime_error", "1.0"]
    finally:
        shutil.rmtree(src)
