"""Math verifier on ``math-verify``: is the completion's final answer equivalent to the gold one?

``verify_math(completion, example)`` parses the gold answer ``example["answer"]``
(wrapped in ``$...$`` unless it already carries ``$`` or ``\\boxed``) and the
completion (LaTeX, preferring the last ``\\boxed{}``, then plain expressions), and
returns 1.0 when math-verify finds them equivalent (``1/2``, ``0.5`` and
``\\frac{1}{2}`` agree), else 0.0.

Timeouts: math-verify bounds parsing and comparison with ``signal.alarm``, which
works only in the main thread. Called from the main thread, the check runs in
process with those timeouts. Called from any other thread (a thread-pool reward
worker), it runs in a helper interpreter (started once per concurrent caller and
reused) that has its own main thread; a caller waits at most
``3 * timeout_seconds + 5`` s, after which the helper is killed and 0.0 returned.

Requires the ``math-verify`` package (``pip install "math-verify[antlr4_9_3]"``;
the antlr 4.9.3 runtime is the one omegaconf pins as well).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
from typing import Any, Mapping

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# math-verify logs every timeout and parse failure at WARNING; a reward function
# sees thousands of malformed completions, so keep its logger quiet.
logging.getLogger("math_verify").setLevel(logging.ERROR)

DEFAULT_TIMEOUT_SECONDS = 5
DEFAULT_MAX_CHARS = 16_384  # the final answer sits at the end; longer completions keep their tail

_GOLD_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def gold_to_latex(answer: Any) -> str:
    """The gold answer as math-verify expects it: ``$answer$`` unless already delimited."""
    text = str(answer).strip()
    if "\\boxed" in text or "\\fbox" in text or text.startswith("$") or text.startswith("\\("):
        return text
    return f"${text}$"


def _check(gold: str, pred: str, timeout_seconds: int | None) -> bool:
    """math-verify's verdict; ``timeout_seconds`` None disables its signal timeouts."""
    gold_parsed = parse(gold, extraction_config=_GOLD_CONFIG, parsing_timeout=timeout_seconds)
    if not gold_parsed:
        return False
    pred_parsed = parse(pred, extraction_config=_PRED_CONFIG, parsing_timeout=timeout_seconds)
    if not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_seconds))


def _serve() -> None:
    """Helper process loop: JSON lines ``[gold, pred, timeout]`` in, ``1``/``0`` lines out."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stdout = sys.stderr  # nothing else may write to the answer channel
    for line in sys.stdin:
        try:
            gold, pred, timeout_seconds = json.loads(line)
            ok = _check(gold, pred, timeout_seconds)
        except BaseException:  # noqa: BLE001 - any failure is a wrong answer
            ok = False
        out.write("1\n" if ok else "0\n")


class _Helper:
    """A helper interpreter (``_serve``) with its own main thread, reused across calls."""

    def __init__(self) -> None:
        boot = f"import sys; sys.path[:0] = {json.dumps(sys.path)}; from rlvr_core.rewards.math import _serve; _serve()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.warm = False  # True once it has answered (imports done)

    def ask(self, gold: str, pred: str, timeout_seconds: int, wait_seconds: float) -> bool | None:
        """The verdict, or None when the helper did not answer in time (then it is killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps([gold, pred, timeout_seconds]) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], wait_seconds)
            if ready:
                line = self.proc.stdout.readline()
                if line in ("1\n", "0\n"):
                    return line == "1\n"
        except (OSError, ValueError):
            pass
        self.close()
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


_IDLE: queue.LifoQueue[_Helper] = queue.LifoQueue()


def _check_in_helper(gold: str, pred: str, timeout_seconds: int) -> bool:
    try:
        helper = _IDLE.get_nowait()
        if not helper.alive():
            helper.close()
            helper = _Helper()
    except queue.Empty:
        helper = _Helper()
    # start-up (importing sympy and math-verify) is not the candidate's fault
    wait = 3 * timeout_seconds + 5 + (0 if helper.warm else 30)
    verdict = helper.ask(gold, pred, timeout_seconds, wait)
    if verdict is None:
        return False
    helper.warm = True
    _IDLE.put(helper)
    return verdict


def shutdown_helpers() -> None:
    """Stop idle helper processes (also run at exit; a helper whose stdin closes exits too)."""
    while True:
        try:
            _IDLE.get_nowait().close()
        except queue.Empty:
            return


atexit.register(shutdown_helpers)


def verify_math(
    completion: str,
    example: Mapping[str, Any],
    *,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
    max_chars: int = DEFAULT_MAX_CHARS,
    use_helper: bool | None = None,
) -> float:
    """1.0 if the completion's final answer equals ``example["answer"]`` mathematically, else 0.0.

    completion:      model output; only its last ``max_chars`` characters are read
    example:         mapping with ``"answer"`` (the reference answer, a str or number)
    timeout_seconds: per parse / comparison step (math-verify's own limit)
    use_helper:      None picks automatically (main thread: in process, other
                     threads: helper process); True/False force it (False off the
                     main thread runs without any timeout)

    Never raises on the completion (malformed, huge, pathological: 0.0). A
    missing or empty ``example["answer"]`` is a data bug and raises ValueError.
    """
    if "answer" not in example or example["answer"] is None or not str(example["answer"]).strip():
        raise ValueError(
            f"math example needs a non-empty 'answer' (the reference answer); keys present: {sorted(example)}"
        )
    if not isinstance(completion, str) or not completion.strip():
        return 0.0
    gold = gold_to_latex(example["answer"])
    pred = completion[-max_chars:]
    timeout_seconds = max(1, int(timeout_seconds))
    in_main = threading.current_thread() is threading.main_thread()
    if use_helper is None:
        use_helper = not in_main
    try:
        if use_helper:
            return 1.0 if _check_in_helper(gold, pred, timeout_seconds) else 0.0
        # off the main thread without a helper, math-verify's signal timeouts cannot work
        return 1.0 if _check(gold, pred, timeout_seconds if in_main else None) else 0.0
    except Exception:  # noqa: BLE001 - math-verify or sympy failing on odd input is a wrong answer
        return 0.0
