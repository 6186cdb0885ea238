"""Code verifier for stdin/stdout problems (LiveCodeBench style), run in the sandbox.

Example format (the ``example`` mapping a verifier receives):

- ``tests``: list of ``{"input": str, "output": str}``; the program reads ``input``
  on stdin and must print ``output``; or
- ``public_test_cases`` (and optionally ``private_test_cases``): LiveCodeBench's
  form, a JSON string (or an already decoded list) of
  ``{"input": str, "output": str, "testtype": "stdin"}``. Only ``"stdin"`` tests
  are supported; ``"functional"`` tests (call a method of class ``Solution``)
  are rejected with a clear error.

The completion's code is the last fenced block tagged ``python``/``py``/``python3``;
failing that the last fenced block of any tag; failing that the whole text.
Outputs match when equal after stripping trailing whitespace on every line and
dropping trailing blank lines.

Every program runs under bubblewrap (``rlvr_core.rewards.sandbox``). Without it the
verifier refuses to start: ``get_verifier("code")`` (through ``preflight``) and
every call raise ``SandboxUnavailable`` naming the install command
(``apt-get install bubblewrap``). The weaker in-process sandbox runs only when
asked for explicitly, ``SandboxLimits(isolation="inprocess")``, and warns.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlvr_core.rewards.sandbox import (
    OK,
    PASSED,
    WRONG_ANSWER,
    SandboxLimits,
    SandboxUnavailable,
    check_sandbox,
    run_python,
)

__all__ = [
    "CodeResult", "DEFAULT_LIMITS", "SandboxUnavailable", "TestCase", "extract_code", "normalize_output",
    "parse_tests", "preflight", "run_tests", "verify_code",
]  # fmt: skip

DEFAULT_LIMITS = SandboxLimits()

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3"})


@dataclass(frozen=True)
class TestCase:
    """One stdin/stdout test."""

    input: str
    output: str

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class CodeResult:
    """Outcome of running a program on its tests.

    passed:        number of tests whose output matched
    total:         number of tests
    pass_fraction: passed / total
    statuses:      (total,) per-test status: "passed", "wrong_answer", "timeout",
                   "memory_limit", "output_limit", "runtime_error",
                   "sandbox_violation", or "skipped" (after the first failure when
                   stopping early)
    wall_seconds:  (total,) per-test wall time (0.0 for skipped tests)
    """

    passed: int
    total: int
    pass_fraction: float
    statuses: tuple[str, ...]
    wall_seconds: tuple[float, ...]

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


def extract_code(completion: str) -> str:
    """The program in ``completion`` (see the module docstring for the rule)."""
    blocks = _FENCE.findall(completion)
    for tag, body in reversed(blocks):
        if tag.lower() in _PYTHON_TAGS:
            return body
    if blocks:
        return blocks[-1][1]
    return completion


def normalize_output(text: str) -> str:
    """Strip trailing whitespace per line and trailing blank lines; unify newlines."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _as_cases(raw: Any, field: str) -> list[TestCase]:
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"example[{field!r}] is a string but not valid JSON ({e}); "
                             "expected a list of tests") from e
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ValueError(f"example[{field!r}] must be a list of {{'input': str, 'output': str}}, "
                         f"got {type(raw).__name__}")
    cases: list[TestCase] = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or "input" not in item or "output" not in item:
            raise ValueError(f"example[{field!r}][{i}] must be a mapping with 'input' and 'output', got {item!r:.120}")
        kind = item.get("testtype", "stdin")
        if kind != "stdin":
            raise ValueError(
                f"example[{field!r}][{i}] has testtype {kind!r}; only 'stdin' tests are supported "
                "(functional tests need a call harness)"
            )
        if not isinstance(item["input"], str) or not isinstance(item["output"], str):
            raise ValueError(f"example[{field!r}][{i}]: 'input' and 'output' must be strings")
        cases.append(TestCase(item["input"], item["output"]))
    return cases


def parse_tests(example: Mapping[str, Any]) -> list[TestCase]:
    """Tests of ``example`` from ``tests`` or LiveCodeBench's ``public/private_test_cases``.

    Raises ValueError naming the field when the example has none or they are malformed.
    """
    if "tests" in example:
        cases = _as_cases(example["tests"], "tests")
    elif "public_test_cases" in example:
        cases = _as_cases(example["public_test_cases"], "public_test_cases")
        private = example.get("private_test_cases")
        if private:
            cases += _as_cases(private, "private_test_cases")
    else:
        raise ValueError(
            f"code example has no tests: expected a 'tests' list of {{'input', 'output'}} "
            f"or LiveCodeBench 'public_test_cases'; keys present: {sorted(example)}"
        )
    if not cases:
        raise ValueError("code example has an empty test list")
    return cases


def run_tests(
    code: str,
    tests: Sequence[TestCase | Mapping[str, str]],
    limits: SandboxLimits | None = None,
    *,
    stop_on_failure: bool = False,
) -> CodeResult:
    """Run ``code`` once per test in the sandbox and compare outputs.

    With ``stop_on_failure`` the remaining tests after the first failure are
    marked "skipped" (and count as not passed).
    """
    limits = limits or DEFAULT_LIMITS
    cases = [t if isinstance(t, TestCase) else _as_cases([t], "tests")[0] for t in tests]
    statuses: list[str] = []
    walls: list[float] = []
    for case in cases:
        if stop_on_failure and statuses and statuses[-1] != PASSED:
            statuses.append("skipped")
            walls.append(0.0)
            continue
        result = run_python(code, case.input, limits)
        if result.status == OK:
            same = normalize_output(result.stdout) == normalize_output(case.output)
            statuses.append(PASSED if same else WRONG_ANSWER)
        else:
            statuses.append(result.status)
        walls.append(result.wall_seconds)
    passed = sum(s == PASSED for s in statuses)
    total = len(cases)
    return CodeResult(
        passed=passed,
        total=total,
        pass_fraction=passed / total if total else 0.0,
        statuses=tuple(statuses),
        wall_seconds=tuple(walls),
    )


def verify_code(completion: str, example: Mapping[str, Any], limits: SandboxLimits | None = None) -> float:
    """1.0 if the completion's program passes every test of ``example``, else 0.0.

    Stops at the first failing test. Malformed examples raise ValueError (a data
    bug); anything the completion does yields 0.0. Raises ``SandboxUnavailable``
    when bubblewrap is missing (see the module docstring).
    """
    tests = parse_tests(example)
    if not isinstance(completion, str):
        return 0.0
    result = run_tests(extract_code(completion), tests, limits, stop_on_failure=True)
    return 1.0 if result.all_passed else 0.0


def preflight(limits: SandboxLimits | None = None) -> tuple[str, ...]:
    """Refuse to start without a working sandbox: raise ``SandboxUnavailable`` with the fix.

    Returns the isolation layers that will be active. ``get_verifier("code")`` calls
    it, so a trainer fails at setup instead of scoring every rollout 0.0.
    """
    return check_sandbox(limits or DEFAULT_LIMITS)


verify_code.preflight = preflight  # type: ignore[attr-defined]
