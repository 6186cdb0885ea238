"""Math verifier on ``math-verify``: is the completion's final answer equivalent to the gold one?

``verify_math(completion, example)`` parses the gold answer ``example["answer"]``
(wrapped in ``$...$`` unless it already carries ``$`` or ``\\boxed``) and the
completion (LaTeX, preferring the last ``\\boxed{}``, then plain expressions), and
returns 1.0 when math-verify finds them equivalent (``1/2``, ``0.5`` and
``\\frac{1}{2}`` agree), else 0.0.

Timeouts: math-verify bounds parsing and comparison with ``signal.alarm`` (whole
seconds, ``DEFAULT_TIMEOUT_SECONDS`` = 2 each), which works only in the main
thread. Called from the main thread, the check runs in process with those
timeouts. Called from any other thread (a thread-pool reward worker), it runs in
a helper interpreter (started once per concurrent caller and reused) that has
its own main thread; a caller waits at most ``wall_seconds(timeout)`` s, after
which the helper is killed and 0.0 returned.

A training step scores its completions with ``score_batch`` (the training
loop's ``Scorer`` finds it as ``verify_math.score_batch``): ``workers`` helper
processes in parallel, so that a step's verification costs at most about
``ceil(N / workers) * wall_seconds(timeout)`` however hostile the completions
(a completion that makes math-verify run to its limit costs that limit, not
more); ``train.verifier_timeout_s`` sets the limit, ``train.verifier_workers``
the pool.

Requires the ``math-verify`` package (``pip install "math-verify[antlr4_9_3]"``;
the antlr 4.9.3 runtime is the one omegaconf pins as well).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import select
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlvr_core.errors import VerifierTimeout

# math-verify logs every timeout and parse failure at WARNING; a reward function
# sees thousands of malformed completions, so keep its logger quiet.
logging.getLogger("math_verify").setLevel(logging.ERROR)

DEFAULT_TIMEOUT_SECONDS = 2  # per math-verify stage; a hostile completion costs about this much
DEFAULT_MAX_CHARS = 16_384  # the final answer sits at the end; longer completions keep their tail

_GOLD_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def gold_to_latex(answer: Any) -> str:
    """The gold answer as math-verify expects it: ``$answer$`` unless already delimited."""
    text = str(answer).strip()
    if "\\boxed" in text or "\\fbox" in text or text.startswith("$") or text.startswith("\\("):
        return text
    return f"${text}$"


def stage_seconds(timeout_s: float | None) -> int:
    """math-verify's per-stage limit for a requested limit in seconds: whole seconds (``signal.alarm``),
    rounded up, at least 1; None gives ``DEFAULT_TIMEOUT_SECONDS``."""
    if timeout_s is None:
        return DEFAULT_TIMEOUT_SECONDS
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout: need a positive finite number of seconds or None, got {timeout_s!r}")
    return max(1, math.ceil(timeout_s))


def wall_seconds(timeout_seconds: int) -> float:
    """How long a caller waits for a helper's verdict: three math-verify stages (gold parse, answer
    parse, comparison) and a margin; past it the helper is killed (work stuck in C code ignores alarms)."""
    return 3 * timeout_seconds + 2


_GOLD_CACHE: dict[str, list[Any]] = {}
_GOLD_CACHE_SIZE = 4096
_WARM = False


def _warm_up() -> None:
    """Parse and compare once without time limits: math-verify's first call loads its LaTeX grammar and
    sympy's parsers, which can take longer than a tight limit on a loaded machine, and would then score
    a correct answer 0.0."""
    global _WARM
    if not _WARM:
        verify(parse("$1/2$", extraction_config=_GOLD_CONFIG, parsing_timeout=None),
               parse(r"\boxed{0.5}", extraction_config=_PRED_CONFIG, parsing_timeout=None), timeout_seconds=None)
        _WARM = True


def _parse_gold(gold: str, timeout_seconds: int | None) -> list[Any]:
    """The parsed gold answer, kept once it parsed (a step scores many completions against the same
    few gold answers); a failed parse is not kept."""
    hit = _GOLD_CACHE.get(gold)
    if hit is not None:
        return hit
    parsed = parse(gold, extraction_config=_GOLD_CONFIG, parsing_timeout=timeout_seconds)
    if parsed:
        if len(_GOLD_CACHE) >= _GOLD_CACHE_SIZE:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[gold] = parsed
    return parsed


def _check(gold: str, pred: str, timeout_seconds: int | None) -> bool:
    """math-verify's verdict; ``timeout_seconds`` None disables its signal timeouts."""
    if timeout_seconds is not None:
        _warm_up()
    gold_parsed = _parse_gold(gold, timeout_seconds)
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
    try:
        _warm_up()  # before the first request: start-up is not a candidate's time
    except Exception:  # noqa: BLE001 - a helper that cannot warm up still answers (or times out)
        pass
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


def _ask_helper(gold: str, pred: str, timeout_seconds: int) -> bool | None:
    """An idle (or new) helper's verdict; None when it gave none in time (it is killed then)."""
    try:
        helper = _IDLE.get_nowait()
        if not helper.alive():
            helper.close()
            helper = _Helper()
    except queue.Empty:
        helper = _Helper()
    # start-up (importing sympy and math-verify) is not the candidate's fault
    wait = wall_seconds(timeout_seconds) + (0 if helper.warm else 30)
    verdict = helper.ask(gold, pred, timeout_seconds, wait)
    if verdict is None:
        return None
    helper.warm = True
    _IDLE.put(helper)
    return verdict


def _check_in_helper(gold: str, pred: str, timeout_seconds: int) -> bool:
    return bool(_ask_helper(gold, pred, timeout_seconds))


def shutdown_helpers() -> None:
    """Stop idle helper processes (also run at exit; a helper whose stdin closes exits too)."""
    while True:
        try:
            _IDLE.get_nowait().close()
        except queue.Empty:
            return


atexit.register(shutdown_helpers)


def _gold_of(example: Mapping[str, Any]) -> str:
    if "answer" not in example or example["answer"] is None or not str(example["answer"]).strip():
        raise ValueError(
            f"math example needs a non-empty 'answer' (the reference answer); keys present: {sorted(example)}"
        )
    return gold_to_latex(example["answer"])


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
    gold = _gold_of(example)
    if not isinstance(completion, str) or not completion.strip():
        return 0.0
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


DEFAULT_WORKERS = 2


def score_batch(
    completions: Sequence[Any],
    examples: Sequence[Mapping[str, Any]],
    *,
    timeout_s: float | None = None,
    workers: int = DEFAULT_WORKERS,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> list[float | Exception]:
    """Score N completions on ``workers`` helper processes at once (one step's verification).

    completions: (N,) model outputs; examples: (N,) rows with ``"answer"``
    timeout_s:   limit per math-verify stage, in seconds (``stage_seconds``; None: 2 s); a helper
                 that gives no verdict within ``wall_seconds`` is killed and its item is a timeout
    workers:     helper processes working at once (each an interpreter with sympy, ~100 MB)
    Returns, per item, 1.0 or 0.0, a ``VerifierTimeout`` (killed helper) or the ``ValueError`` of a
    row without an answer (a data bug); never raises for a completion. Wall time is at most about
    ``ceil(N / workers) * wall_seconds(...)``, plus the helpers' start-up on first use.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: need an int >= 1, got {workers!r}")
    if len(completions) != len(examples):
        raise ValueError(f"score_batch: {len(completions)} completions but {len(examples)} examples")
    seconds = stage_seconds(timeout_s)
    out: list[float | Exception] = [0.0] * len(completions)
    jobs: list[tuple[int, str, str]] = []
    for i, (completion, example) in enumerate(zip(completions, examples)):
        try:
            gold = _gold_of(example)
        except ValueError as e:
            out[i] = e
            continue
        if isinstance(completion, str) and completion.strip():
            jobs.append((i, gold, completion[-max_chars:]))

    def run(job: tuple[int, str, str]) -> None:
        i, gold, pred = job
        verdict = _ask_helper(gold, pred, seconds)
        out[i] = (VerifierTimeout(f"math-verify gave no verdict within {wall_seconds(seconds):g} s; helper killed")
                  if verdict is None else float(verdict))

    if jobs:
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="math-verify") as pool:
            list(pool.map(run, jobs))
    return out


# the training loop's Scorer scores a round through these (see rlvr_core.rewards.scoring.Scorer)
verify_math.score_batch = score_batch  # type: ignore[attr-defined]
verify_math.close = shutdown_helpers  # type: ignore[attr-defined]
