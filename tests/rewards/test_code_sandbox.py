"""Code verifier: scoring, parsing, and the opt-in in-process sandbox's own hostile suite.

Programs run under bubblewrap by default (tests/rewards/test_code_bwrap.py has the
escapes); the in-process tests below opt in with ``isolation="inprocess"``."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox relies on Linux rlimits, sessions and /proc", allow_module_level=True)

from rlvr_core.rewards import get_verifier  # noqa: E402
from rlvr_core.rewards.code import (  # noqa: E402
    CodeResult,
    extract_code,
    normalize_output,
    parse_tests,
    preflight,
    run_tests,
    verify_code,
)
from rlvr_core.rewards.sandbox import (  # noqa: E402
    MEMORY_LIMIT,
    OK,
    OUTPUT_LIMIT,
    SANDBOX_VIOLATION,
    TIMEOUT,
    SandboxLimits,
    SandboxUnavailable,
    SandboxWarning,
    run_python,
)
from rlvr_core.rewards.sandbox import bwrap as bwrap_mod  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("private_tmp"),
    pytest.mark.filterwarnings("ignore::rlvr_core.rewards.sandbox.SandboxWarning"),
]

# bubblewrap (the default) for scoring; the in-process sandbox, explicitly, for its own suite
LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=2.5, memory_bytes=256 * 2**20)
INPROC = SandboxLimits(cpu_seconds=1, wall_seconds=2.5, memory_bytes=256 * 2**20, isolation="inprocess")
ADD_TESTS = [
    {"input": "1 2\n", "output": "3\n"},
    {"input": "10 -4\n", "output": "6"},
    {"input": "100 200\n", "output": "300   \n\n"},
]
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
ONE_TEST = {"tests": [{"input": "1 2\n", "output": "3\n"}]}


def _group_or_session_members(pid: int) -> list[int]:
    """Live, non-zombie processes whose process group or session is ``pid`` (independent of the sandbox code)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        p = int(entry)
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and (os.getpgid(p) == pid or os.getsid(p) == pid):
                found.append(p)
        except (OSError, IndexError):
            continue
    return found


def _assert_clean(result, private_tmp: Path) -> None:
    assert result.pid is not None
    assert _group_or_session_members(result.pid) == []
    assert list(private_tmp.iterdir()) == []


# ---------------------------------------------------------------- scoring


@pytest.mark.usefixtures("bwrap_sandbox")
def test_correct_program_scores_one() -> None:
    completion = f"Here is my solution:\n```python\n{ADD}```\nIt reads two ints."
    assert verify_code(completion, {"tests": ADD_TESTS}, LIMITS) == 1.0
    result = run_tests(extract_code(completion), ADD_TESTS, LIMITS)
    assert isinstance(result, CodeResult)
    assert (result.passed, result.total, result.pass_fraction) == (3, 3, 1.0)
    assert result.statuses == ("passed",) * 3
    assert get_verifier("code") is verify_code


@pytest.mark.usefixtures("bwrap_sandbox")
def test_partly_correct_program_gives_fraction_and_zero_reward() -> None:
    code = "a, b = map(int, input().split())\nprint(a + b if a < 50 else a - b)\n"
    completion = f"```python\n{code}```"
    result = run_tests(code, ADD_TESTS, LIMITS)
    assert (result.passed, result.total) == (2, 3)
    assert result.pass_fraction == pytest.approx(2 / 3)
    assert result.statuses == ("passed", "passed", "wrong_answer")
    assert verify_code(completion, {"tests": ADD_TESTS}, LIMITS) == 0.0
    early = run_tests("print('nope')", ADD_TESTS, LIMITS, stop_on_failure=True)
    assert early.statuses == ("wrong_answer", "skipped", "skipped") and early.pass_fraction == 0.0


@pytest.mark.usefixtures("bwrap_sandbox")
def test_livecodebench_test_case_format() -> None:
    public = json.dumps([{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}])
    private = [{"input": "4 4\n", "output": "8\n", "testtype": "stdin"}]
    example = {"public_test_cases": public, "private_test_cases": private}
    assert [t.output for t in parse_tests(example)] == ["5\n", "8\n"]
    assert verify_code(f"```python\n{ADD}```", example, LIMITS) == 1.0
    with pytest.raises(ValueError, match="testtype 'functional'"):
        parse_tests({"public_test_cases": json.dumps([{"input": "x", "output": "y", "testtype": "functional"}])})
    with pytest.raises(ValueError, match="has no tests"):
        verify_code("print(1)", {"answer": "1"})
    with pytest.raises(ValueError, match=r"example\['tests'\]\[0\]"):
        parse_tests({"tests": [{"in": "1"}]})


def test_code_extraction_and_output_normalisation() -> None:
    text = "```\nplain\n```\n```python\nfirst\n```\nthen\n```py\nsecond\n```\n```text\nout\n```"
    assert extract_code(text) == "second\n"
    assert extract_code("```\nonly\n```") == "only\n"
    assert extract_code("print(1)") == "print(1)"
    assert normalize_output("a  \r\nb\t\n\n\n") == "a\nb"
    assert normalize_output("a\n b") != normalize_output("a\nb")  # leading spaces matter


@pytest.mark.usefixtures("bwrap_sandbox")
def test_program_may_use_its_own_directory(private_tmp: Path) -> None:
    code = ("open('scratch.txt', 'w').write('hi')\nimport os\n"
            "print(open('scratch.txt').read(), os.path.exists('main.py'))")
    result = run_python(code, "", LIMITS)
    assert result.status == OK and result.stdout == "hi True\n"
    _assert_clean(result, private_tmp)


@pytest.mark.usefixtures("bwrap_sandbox")
def test_typical_contest_program_runs(private_tmp: Path) -> None:
    code = (
        "import sys, gc, heapq, bisect, math, itertools, functools, re, random, string\n"
        "from collections import deque, Counter\nfrom fractions import Fraction\nfrom decimal import Decimal\n"
        "sys.setrecursionlimit(10**6)\ngc.disable()\n"
        "data = sys.stdin.buffer.read().split()\nn = int(data[0])\nxs = sorted(map(int, data[1:1 + n]))\n"
        "@functools.lru_cache(None)\ndef f(k):\n    return k if k < 2 else f(k - 1) + f(k - 2)\n"
        "print(sum(xs), f(30), Fraction(1, 3) + Fraction(1, 6), math.isqrt(10**12))\n"
    )
    result = run_python(code, "3\n5 1 4\n", LIMITS)
    assert result.status == OK, result.stderr[-500:]
    assert result.stdout == "10 832040 1/2 1000000\n"
    _assert_clean(result, private_tmp)


# ---------------------------------------------------------------- the in-process sandbox (explicit opt-in)

HOSTILE = {
    # (program, expected status, bound on wall seconds: the wall limit plus 1 s of slack)
    "infinite_loop": ("while True:\n    pass\n", TIMEOUT, 3.5),
    "sleeping": ("import time\ntime.sleep(60)\n", TIMEOUT, 3.5),
    "memory_bomb": ("x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))\n", MEMORY_LIMIT, 3.5),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", SANDBOX_VIOLATION, 1.5),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', 'sleep 30 &'])\n", SANDBOX_VIOLATION, 1.5),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 80))\n", SANDBOX_VIOLATION, 1.5),
    "ctypes": ("import ctypes\nctypes.CDLL(None).fork()\n", SANDBOX_VIOLATION, 1.5),
    "introspect_gc": ("import gc\nprint(len(gc.get_objects()))\n", SANDBOX_VIOLATION, 1.5),
    "profile_hook": ("import sys\nsys.setprofile(lambda *a: None)\nopen('x', 'w')\n", SANDBOX_VIOLATION, 1.5),
    "print_gigabytes": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", OUTPUT_LIMIT, 1.5),
    "stderr_flood": ("import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n", OUTPUT_LIMIT, 1.5),
}


def test_the_child_runs_prelude_py_verbatim_and_importing_it_runs_nothing(tmp_path: Path) -> None:
    """The in-process child gets the text of sandbox/prelude.py after ``-c``, unchanged; importing it refuses."""
    import importlib

    from rlvr_core.rewards.sandbox import inprocess

    prelude = Path(inprocess.__file__).with_name("prelude.py")
    program = str(tmp_path / "main.py")
    argv, env, _ = inprocess._inprocess_command((), INPROC, str(tmp_path), program, False)
    at = argv.index("-c")
    assert argv[:at] == [INPROC.python, "-S", "-s", "-B", "-P"]
    assert argv[at + 1] == prelude.read_text(encoding="utf-8")
    assert argv[at + 2 : at + 4] == [str(tmp_path), "1"] and argv[at + 5 :] == [program]
    assert argv[at + 4].split(",")[0] == f"RLIMIT_AS={INPROC.memory_bytes}" and env["HOME"] == str(tmp_path)
    compile(argv[at + 1], "prelude", "exec")  # the text the child runs is a whole program
    with pytest.raises(ImportError, match="never imported"):
        importlib.import_module("rlvr_core.rewards.sandbox.prelude")
    assert "rlvr_core.rewards.sandbox.prelude" not in sys.modules


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_inprocess_hostile_program_is_contained(name: str, private_tmp: Path) -> None:
    code, expected_status, max_wall = HOSTILE[name]
    t0 = time.monotonic()
    result = run_python(code, "1 2\n", INPROC)
    elapsed = time.monotonic() - t0
    assert result.status == expected_status, (result.status, result.stderr[-300:])
    assert elapsed < max_wall
    assert len(result.stdout.encode()) <= LIMITS.max_output_bytes
    _assert_clean(result, private_tmp)
    assert verify_code(f"```python\n{code}```", {"tests": ADD_TESTS[:1]}, INPROC) == 0.0
    assert list(private_tmp.iterdir()) == []


def test_inprocess_writing_outside_its_directory_is_blocked(private_tmp: Path) -> None:
    target = Path("/tmp") / f"sandbox_escape_{uuid.uuid4().hex}"
    attempts = [
        f"open({str(target)!r}, 'w').write('escaped')",
        f"import os\nfd = os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)\nos.write(fd, b'x')",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('escaped')",
        f"import os\nd = os.open('/tmp', os.O_RDONLY)\nos.open({target.name!r}, os.O_CREAT | os.O_WRONLY, dir_fd=d)",
        "import os\nos.chdir('/tmp')\nopen('relative_escape_" + target.name + "', 'w').write('x')",
        f"import shutil\nopen('f', 'w').write('x')\nshutil.copy('f', {str(target)!r})",
        f"import os\nopen('f', 'w').write('x')\nos.rename('f', {str(target)!r})",
        # tampering with what a naive hook would rely on
        "import builtins, posixpath, os\nbuiltins.any = lambda *a: False\nbuiltins.isinstance = lambda *a: False\n"
        f"posixpath.realpath = os.path.realpath = lambda p, **k: os.getcwd()\nopen({str(target)!r}, 'w')",
        f"class S(str):\n    def startswith(self, *a):\n        return True\nopen(S({str(target)!r}), 'w')",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
    ]
    try:
        for code in attempts:
            result = run_python(code + "\nprint('done')", "", INPROC)
            assert result.status == SANDBOX_VIOLATION, (code, result.status, result.stderr[-300:])
            assert "done" not in result.stdout
            assert not target.exists(), code
            assert not (Path("/tmp") / f"relative_escape_{target.name}").exists()
            _assert_clean(result, private_tmp)
    finally:
        for leftover in (target, Path("/tmp") / f"relative_escape_{target.name}"):
            if leftover.exists() or leftover.is_symlink():
                leftover.unlink()


def test_inprocess_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch, private_tmp: Path) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLVR_TEST_SECRET", secret)
    result = run_python("import os\nprint(sorted(os.environ.items()))", "", INPROC)
    assert result.status == OK
    assert secret not in result.stdout and "RLVR_TEST_SECRET" not in result.stdout
    env = dict(eval(result.stdout))  # noqa: S307 - our own program's repr output
    assert set(env) <= {"PATH", "PYTHONHASHSEED", "PYTHONIOENCODING", "LANG", "HOME", "TMPDIR", "LC_CTYPE"}
    # reading the parent's environment through /proc is blocked too
    leak = run_python("import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())", "", INPROC)
    assert leak.status == SANDBOX_VIOLATION and secret not in leak.stdout
    _assert_clean(leak, private_tmp)


def test_missing_bubblewrap_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs with or without bubblewrap installed: its absence is simulated."""
    real_which = shutil.which
    monkeypatch.setattr(bwrap_mod.shutil, "which",
                        lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    bwrap_mod._bwrap_plan.cache_clear()
    try:
        from rlvr_core.training import Scorer

        for refuse in (
            lambda: Scorer("code", [ONE_TEST]),  # a trainer fails at setup, not with every reward 0.0
            lambda: get_verifier("code"),
            preflight,
            lambda: verify_code("```python\nprint(3)\n```", ONE_TEST, LIMITS),
            lambda: run_python("print(3)"),
        ):
            with pytest.raises(SandboxUnavailable, match=r"bubblewrap \(`bwrap`\) is not installed"
                                                         r".*apt-get install bubblewrap.*isolation='inprocess'"):
                refuse()
        # the weaker mode still runs, on explicit opt-in, and warns
        inproc = SandboxLimits(cpu_seconds=1, wall_seconds=2.5, memory_bytes=256 * 2**20, isolation="inprocess")
        with pytest.warns(SandboxWarning, match="can be bypassed"):
            assert verify_code("```python\nprint(3)\n```", ONE_TEST, inproc) == 1.0
    finally:
        monkeypatch.undo()
        bwrap_mod._bwrap_plan.cache_clear()
    if shutil.which("bwrap") is not None:
        assert get_verifier("code") is verify_code


def test_limits_reject_impossible_settings() -> None:
    from rlvr_core.errors import ConfigError

    with pytest.raises(ConfigError, match="SandboxLimits.memory_bytes"):
        SandboxLimits(memory_bytes=1000)
    with pytest.raises(ConfigError, match="SandboxLimits.wall_seconds"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ConfigError, match="SandboxLimits.isolation.*'bwrap', 'inprocess'"):
        SandboxLimits(isolation="none")
    with pytest.raises(ConfigError, match="SandboxLimits.network_namespace: applies to isolation='inprocess' only"):
        SandboxLimits(network_namespace=False)
    with pytest.raises(ConfigError, match="SandboxLimits.max_disk_bytes"):
        SandboxLimits(max_disk_bytes=10)
    with pytest.raises(ConfigError, match="SandboxLimits.wall_seconds: must be finite"):
        SandboxLimits(wall_seconds=float("inf"))


def test_inprocess_unprivileged_uid_where_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root with an interpreter the unprivileged uid can execute, the program runs as nobody."""
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root and /usr/bin/python3")
    # pytest's tmp_path is private to root; the unprivileged uid needs a searchable parent
    private_tmp = Path(tempfile.mkdtemp(prefix="rlvr_sandbox_test_", dir="/tmp"))
    private_tmp.chmod(0o711)
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    try:
        _run_as_nobody(private_tmp)
    finally:
        private_tmp.rmdir()  # fails loudly if a sandbox directory was left behind


def _run_as_nobody(private_tmp: Path) -> None:
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=5, python="/usr/bin/python3", isolation="inprocess")
    result = run_python("import os\nprint(os.getuid(), os.getgid(), os.getgroups())", "", limits)
    if "unprivileged" not in result.isolation:
        pytest.skip(f"unprivileged uid cannot run /usr/bin/python3 here (isolation={result.isolation})")
    assert result.status == OK and result.stdout.split()[:2] == ["65534", "65534"]
    assert verify_code(f"```python\n{ADD}```", {"tests": ADD_TESTS}, limits) == 1.0
    _assert_clean(result, private_tmp)


def test_inprocess_unreachable_tmpdir_falls_back_to_current_user(private_tmp: Path) -> None:
    """pytest's 0700 tmp_path is not searchable by nobody: the run still works, without that layer."""
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root and /usr/bin/python3")
    private_tmp.chmod(0o700)
    result = run_python("print(6 * 7)", "", SandboxLimits(python="/usr/bin/python3", isolation="inprocess"))
    assert result.status == OK and result.stdout == "42\n"
    assert "unprivileged" not in result.isolation
    _assert_clean(result, private_tmp)


def test_inprocess_mode_warns_that_it_is_weaker(private_tmp: Path) -> None:
    with pytest.warns(SandboxWarning, match="isolation='inprocess'.*can be bypassed.*apt-get install bubblewrap"):
        result = run_python("print(6 * 7)", "", INPROC)
    assert result.status == OK and result.stdout == "42\n"
    assert result.isolation[0] == "inprocess"
    _assert_clean(result, private_tmp)
