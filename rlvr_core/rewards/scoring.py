"""Scoring rollouts with a task's verifier, as the training loop does: ``Scorer``.

A failed verifier call scores 0.0 and is counted; a step whose rollouts are mostly failures stops
the run (``TrainingStopped``) before its update. The training loop (``rlvr_core.training``) and the
benchmarks (``benchmarks/study.py``, ``benchmarks/math_verifier.py``) score through it.
"""

from __future__ import annotations

import math
import signal
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from rlvr_core.errors import TrainingStopped, VerifierTimeout
from rlvr_core.rewards import get_verifier
from rlvr_core.types import Rollouts

__all__ = ["Scorer"]


class Scorer:
    """Fills rollouts.reward with the verifier; a failed call scores 0.0 and is counted.

    ``errors`` counts calls that raised or returned a non-finite value,
    ``timeouts`` calls that ran past ``timeout_s`` seconds (None: no limit).

    Verifiers with a ``score_batch`` function (``math``: CPU-bound sympy work)
    score a whole round at once on a pool of ``workers`` helper processes, each
    call bounded by the verifier's own wall limit (``timeout_s``, None: the
    verifier's default); see ``rlvr_core.rewards.math.score_batch``. The others
    (``arithmetic``: microseconds a call) run here, one after the other. There
    the limit uses ``signal.setitimer`` on the main thread when no other
    interval timer is running (it interrupts pure-Python loops); elsewhere the
    call runs on a daemon thread that is abandoned when it overruns (a thread
    cannot be stopped: a runaway verifier keeps a share of the interpreter until
    it returns, so off the main thread prefer verifiers that bound their own
    work, like the sandboxed code verifier).

    Per step (``begin_step`` ... ``check_step``): when more than
    ``max_error_share`` of the step's rollouts were errors or timeouts,
    ``check_step`` raises TrainingStopped naming the verifier and the first
    failure, so that a run whose rewards are failures does not train on them.

    The three knobs are ``train.verifier_timeout_s``, ``train.max_verifier_error_share`` and
    ``train.verifier_workers``, checked once, by ``TrainConfig`` (a timeout in (0, 3600] seconds
    or None, a share in [0, 1], an int >= 1); the Scorer takes them as given.
    """

    def __init__(self, verifier_name: str, rows: Sequence[Mapping[str, Any]], *,
                 timeout_s: float | None = None, max_error_share: float = 0.5, workers: int = 2) -> None:
        self.name = verifier_name
        self.verify = get_verifier(verifier_name)
        self.batch = getattr(self.verify, "score_batch", None)
        self.rows = rows
        self.timeout_s = timeout_s
        self.max_error_share = float(max_error_share)
        self.workers = workers
        self.errors = 0
        self.timeouts = 0
        self.begin_step()

    def begin_step(self) -> None:
        """Start counting a new step's rollouts and failures."""
        self.step_scored = 0
        self.step_failed = 0
        self.first_failure: str | None = None

    def check_step(self, step: int) -> None:
        """TrainingStopped when more than ``max_error_share`` of this step's rollouts failed to score."""
        if self.step_scored and self.step_failed / self.step_scored > self.max_error_share:
            raise TrainingStopped(
                f"step {step}: {self.step_failed} of {self.step_scored} rollouts "
                f"({self.step_failed / self.step_scored:.0%}) were errors or timeouts of the {self.name!r} verifier, "
                f"more than train.max_verifier_error_share={self.max_error_share:g}; first: {self.first_failure}. "
                "The run stops before updating on them: fix the verifier or its settings "
                "(train.verifier_timeout_s) and start again")

    def _failed(self, kind: str, detail: str) -> None:
        self.step_failed += 1
        if kind == "timeout":
            self.timeouts += 1
        else:
            self.errors += 1
        if self.first_failure is None:
            self.first_failure = detail[:300]

    def __call__(self, rollouts: Rollouts) -> None:
        texts = [pl["text"] for pl in (rollouts.payload or [])]
        rows = [self.rows[pid] for pid in rollouts.prompt_id.tolist()[:len(texts)]]
        if self.batch is not None:
            results: list[Any] = list(self.batch(texts, rows, timeout_s=self.timeout_s, workers=self.workers))
        else:
            results = []
            for text, row in zip(texts, rows):
                try:
                    results.append(self._call(text, row))
                except Exception as e:  # noqa: BLE001 - a broken verifier must not stop training by itself
                    results.append(e)
        rewards = np.zeros(len(rollouts))
        for i, r in enumerate(results):
            self.step_scored += 1
            if isinstance(r, VerifierTimeout):
                self._failed("timeout", f"timeout ({r})" if str(r) else f"timeout after {self.timeout_s} s")
            elif isinstance(r, BaseException):
                self._failed("error", f"{r.__class__.__name__}: {r}")
            elif math.isfinite(r := float(r)):
                rewards[i] = r
            else:
                self._failed("error", f"non-finite reward {r}")
        rollouts.reward[:] = rewards

    def close(self) -> None:
        """Stop the verifier's helper processes, if it has any."""
        close = getattr(self.verify, "close", None)
        if close is not None:
            close()

    def _call(self, text: str, row: Mapping[str, Any]) -> float:
        if self.timeout_s is None:
            return float(self.verify(text, row))
        if threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
            return self._call_with_alarm(text, row)
        return self._call_on_thread(text, row)

    def _call_with_alarm(self, text: str, row: Mapping[str, Any]) -> float:
        def on_alarm(signum: int, frame: Any) -> None:
            raise VerifierTimeout()

        previous = signal.signal(signal.SIGALRM, on_alarm)
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, float(self.timeout_s))  # type: ignore[arg-type]
                return float(self.verify(text, row))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)

    def _call_on_thread(self, text: str, row: Mapping[str, Any]) -> float:
        out: dict[str, Any] = {}

        def work() -> None:
            try:
                out["value"] = float(self.verify(text, row))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                out["error"] = e

        worker = threading.Thread(target=work, name="verifier", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise VerifierTimeout()  # the daemon thread is abandoned
        if "error" in out:
            raise out["error"]
        return out["value"]
