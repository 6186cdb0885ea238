"""The RLVR training loop: allocation, verification, GRPO update, evaluation, checkpoints.

Pure library code (no orchestration imports). Per step:

1. the allocator and the HF engine run the allocation loop (docs/design.md §3.1), the
   verifier scoring every rollout;
2. the GRPO trainer updates the policy on the allocator's ragged groups;
3. the engine samples from the updated weights (it shares the model object);
4. every ``eval_every`` steps (and each time cumulative rollouts cross a multiple of ``eval_every_rollouts``)
   the policy is evaluated on held-out problems
   (greedy accuracy, pass@k);
5. every ``checkpoint_every`` steps the whole state is checkpointed atomically.

A run directory holds ``checkpoints/``, ``metrics.jsonl`` (one JSON object
per step, results only: equal runs write equal bytes), ``timings.jsonl`` (each
step's wall-clock seconds, ``TIMING_KEYS``, apart so that they never change the
results' hash; ``TrainResult.metrics`` carries both) and ``rollouts.parquet`` (rollouts, passes and tokens per step and
prompt, ``rlvr_core.rollout_log``). Starting again on the same directory
resumes from the newest intact checkpoint and continues exactly as an
uninterrupted run would.

Faults (see tests/reliability):

- the data is validated before anything is generated (``validate_splits``); a
  checkpoint written with other trajectory settings or other data is refused;
- a failing ``engine.generate`` is retried inside the round (``engine_retries``),
  then the step raises ``EngineError`` before its metrics or checkpoint are
  written, so a restart resumes from the last checkpoint;
- a verifier that raises, returns a non-finite value or runs past
  ``verifier_timeout_s`` scores 0.0 and is counted (``verifier_errors``,
  ``verifier_timeouts``); when more than ``max_verifier_error_share`` of a
  step's rollouts fail so, the step raises ``TrainingStopped`` before its update;
- prompts are checked against the policy's tokenizer and position limit before
  anything is generated (``check_prompts_fit``); an out-of-memory in generation,
  update or evaluation raises ``TrainingStopped`` naming what to reduce (the same
  work would fail again, so it is not retried);
- a non-finite loss or gradient skips the update; ``max_nonfinite`` in a row
  raise ``TrainingStopped``; a step without any effective group skips the update.
  Both are logged (``rlvr_core.training`` logger) and recorded in the metrics;
- ``rlvr_core.checkpoint.fault_point`` lets the crash tests SIGKILL the process
  at chosen points (``$RLVR_FAULT_KILL_AT``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import math
import os
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from rlvr_core.allocation import PromptSource, make_allocator, run_allocation_step
from rlvr_core.allocation.loop import EngineError
from rlvr_core.checkpoint import fault_point, load_latest, save_checkpoint
from rlvr_core.config import TrainConfig, short_repr
from rlvr_core.data.context import context_keys
from rlvr_core.data.validate import check_prompts_fit, position_limit, validate_splits
from rlvr_core.errors import ConfigError, OutOfMemory, VerifierTimeout, is_out_of_memory
from rlvr_core.evaluation import evaluate_policy
from rlvr_core.grpo.trainer import GRPOTrainer, TrainerConfig
from rlvr_core.models.policy import load_any_policy as load_policy
from rlvr_core.models.policy import policy_prompts, precision, resolve_device
from rlvr_core.rewards import get_verifier
from rlvr_core.rollout import ENGINES
from rlvr_core.rollout_log import FILENAME as ROLLOUT_LOG
from rlvr_core.rollout_log import RolloutLog
from rlvr_core.runlock import hold_run_folder
from rlvr_core.types import Rollouts

StepCallback = Callable[[dict[str, Any]], None]
log = logging.getLogger(__name__)

__all__ = ["EngineError", "RunState", "Scorer", "TIMINGS", "TIMING_KEYS", "TrainResult", "TrainingStopped",
           "TRAJECTORY_KEYS", "join_timings",
           "VerifierTimeout", "check_resumable", "data_digest", "preflight", "step_record", "train"]

# Keys a resumed run may change: how long it runs and how it is kept, not what it computes. A device
# or threads change (a run moved to another machine) is allowed too. Every other train key (TRAJECTORY_KEYS) shapes
# the trajectory or what its records mean, and a checkpoint only resumes under the same values. That
# includes the evaluation keys (eval_every, eval_size, eval_samples): a run's eval curve is one evaluation
# set at one cadence, so a change is refused rather than recorded half-way through.
RESUMABLE_KEYS: tuple[str, ...] = ("allocators", "seeds", "steps", "max_rollouts", "checkpoint_every", "keep_last",
                                   "max_nonfinite", "engine_retries", "engine_retry_delay_s", "device",
                                   "compute_entropy", "max_verifier_error_share", "verifier_workers",
                                   "allow_no_update", "threads")
TRAJECTORY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TrainConfig) if f.name not in RESUMABLE_KEYS)
# A step record's wall-clock seconds: written to TIMINGS beside metrics.jsonl, never into it.
TIMING_KEYS: tuple[str, ...] = ("generate_s", "verify_s", "allocate_s", "update_s", "eval_s", "step_s")
TIMINGS = "timings.jsonl"


class TrainingStopped(RuntimeError):
    """Training cannot continue (e.g. repeated non-finite updates); the message says why."""


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    resumed_from: int | None
    metrics: list[dict[str, Any]]
    final_eval: dict[str, float]


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
    """

    def __init__(self, verifier_name: str, rows: Sequence[Mapping[str, Any]], *,
                 timeout_s: float | None = None, max_error_share: float = 0.5, workers: int = 2) -> None:
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
                                          and timeout_s > 0):
            raise ConfigError(f"train.verifier_timeout_s: need a positive finite number of seconds or null, "
                              f"got {timeout_s!r}")
        if not (isinstance(max_error_share, (int, float)) and 0 <= max_error_share <= 1):
            raise ConfigError(f"train.max_verifier_error_share: need a number in [0, 1], got {max_error_share!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"train.verifier_workers: need an int >= 1, got {workers!r}")
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


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])


def data_digest(rows: Sequence[Mapping[str, Any]]) -> str:
    """sha256 over the prompts in order: identifies the training split a checkpoint belongs to."""
    h = hashlib.sha256()
    for r in rows:
        h.update(r["prompt"].encode())
        h.update(b"\0")
    return h.hexdigest()


def check_resumable(saved: Mapping[str, Any], cfg: TrainConfig, digest: str, where: str,
                    step: int | None = None) -> None:
    """Raise ConfigError unless a checkpoint (its state, or its manifest's meta) was written under ``cfg``'s
    trajectory settings (``TRAJECTORY_KEYS``), on the same training split (``data_digest``), and at a
    ``step`` no later than ``cfg.steps`` (a shorter run cannot be had from a longer one). A checkpoint that
    does not record every trajectory key and the digest is refused: what it does not record could differ."""
    old, new = saved.get("config"), asdict(cfg)
    missing = [k for k in TRAJECTORY_KEYS if not isinstance(old, Mapping) or k not in old]
    if missing or not isinstance(saved.get("data_digest"), str):  # a setting it does not record could differ
        what = f"train.{', train.'.join(missing[:4])}{', ...' if len(missing) > 4 else ''}" if missing else \
            "the training split's digest"
        raise ConfigError(f"{where}: cannot resume, the checkpoint does not record {what}, so a changed setting "
                          "could not be told; start a fresh run folder")
    changed = [k for k in TRAJECTORY_KEYS if _plain(old[k]) != _plain(new[k])]
    if changed:
        diffs = ", ".join(f"train.{k}={short_repr(old[k])} there, {short_repr(new[k])} now" for k in changed)
        raise ConfigError(f"{where}: cannot resume, the run was started with other settings ({diffs}); "
                          "use the same settings, or start a fresh run folder")
    if saved["data_digest"] != digest:
        raise ConfigError(f"{where}: cannot resume, the run was trained on a different training split "
                          "(prompt digest differs); use the same data, or start a fresh run folder")
    if step is not None and step > cfg.steps:
        raise ConfigError(f"{where}: cannot resume, the run already has {step} steps done, more than "
                          f"train.steps={cfg.steps}; ask for {step} or more steps, or start a fresh run folder")


def _plain(v: Any) -> Any:
    """Tuples and lists compare alike (a config read back from a checkpoint or YAML)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    return v


def train(cfg: TrainConfig, *, policy_dir: str | os.PathLike, train_rows: Sequence[Mapping[str, Any]],
          test_rows: Sequence[Mapping[str, Any]], run_dir: str | os.PathLike, task: str = "arithmetic",
          resume: bool = True, on_step: StepCallback | None = None, device: str | None = None,
          inputs_checked: bool = False) -> TrainResult:
    """Train the policy in ``policy_dir`` with ``cfg.allocator``; see the module docstring.

    Args:
        cfg: the ``train`` section
        policy_dir: the warm-started policy folder (the tiny policy, or any causal LM saved with
            ``save_pretrained``; see ``rlvr_core.models.policy.load_any_policy``)
        train_rows, test_rows: task rows with the verifier's fields (``rlvr_core.data.validate``)
        run_dir: where checkpoints and metrics.jsonl go (resumed if present)
        task: verifier name
        on_step: called with each step's metrics dict (progress, tracking)
        device: overrides ``cfg.device`` (None: ``cfg.device``, "auto" resolved here)
        inputs_checked: ``preflight`` already checked these rows against this policy folder (the training
            flow runs it before MLflow opens a run), so the splits and the prompts' fit are not checked again
    Prompts: the engine and the evaluation get each row's prompt through the policy
    tokenizer's chat template when it has one (``policy_prompts``), unchanged otherwise.
    With ``cfg.dtype`` "bfloat16" generation, updates and evaluations run under bfloat16
    autocast; weights and optimizer state stay float32.
    Returns:
        TrainResult with every step's metrics (earlier ones read back on resume)
    Raises:
        ConfigError (DataError, PolicyLoadError) before any rollout for bad data,
        a bad policy folder or a checkpoint of another configuration; RunFolderBusy
        (a ConfigError) when another process holds ``run_dir``;
        EngineError when generation keeps failing; TrainingStopped after
        ``cfg.max_nonfinite`` non-finite updates in a row.
    """
    train_rows = list(train_rows) if not isinstance(train_rows, list) else train_rows
    test_rows = list(test_rows) if not isinstance(test_rows, list) else test_rows
    if not inputs_checked:
        validate_splits(train_rows, test_rows, task)
    device = resolve_device(cfg.device if device is None else device)
    digest = data_digest(train_rows)
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)

    model, tok = load_policy(policy_dir, device=device)
    if not inputs_checked:
        limit = position_limit(model.config, tok)  # prompts the tokenizer cannot encode or the model cannot hold
        for split, rows in (("train", train_rows), ("test", test_rows)):
            check_prompts_fit(rows, tok, task, split, max_new_tokens=cfg.max_new_tokens, max_positions=limit)
    # one writer per run folder (RunFolderBusy names the holder), taken once the inputs passed their checks
    with hold_run_folder(run_dir):
        return _train_held(cfg, model, tok, policy_dir=policy_dir, train_rows=train_rows, test_rows=test_rows,
                           run_dir=run_dir, task=task, resume=resume, on_step=on_step, device=device, digest=digest)


def preflight(cfg: TrainConfig, task: str, train_rows: Sequence[Mapping[str, Any]],
              test_rows: Sequence[Mapping[str, Any]], policy_dir: str | os.PathLike,
              run_dir: str | os.PathLike, *, source: str | None = None) -> None:
    """Every check a run can fail before it loads weights or generates anything: the splits, the policy
    folder and its tokenizer against the prompts, the device, the allocator parameters, and a checkpoint in
    ``run_dir`` written with other settings or data (or in the refused pickle format).

    ``train`` checks its own inputs as it loads the policy; the training flow calls this first, so that a
    bad input fails before MLflow opens a run. ``source`` names the data in error messages.
    """
    from rlvr_core.checkpoint import check_format, latest_manifest
    from rlvr_core.data.validate import check_against_policy
    from rlvr_core.models.policy import check_policy_folder

    validate_splits(train_rows, test_rows, task, source=source)
    check_policy_folder(policy_dir)  # PolicyLoadError names the folder and what is wrong with it
    # prompts outside the tokenizer's vocabulary, or too long for the model's positions (a certain OOM)
    check_against_policy(train_rows, test_rows, policy_dir, task, max_new_tokens=cfg.max_new_tokens, source=source)
    resolve_device(cfg.device)  # cuda on a machine without one fails here
    make_allocator(cfg.allocator, **cfg.allocator_kwargs())  # allocator_params are checked here
    if (latest := latest_manifest(Path(run_dir) / "checkpoints")) is not None:
        check_format(*latest)  # CheckpointError for a pickle-format checkpoint
        check_resumable(latest[1].get("meta", {}), cfg, data_digest(train_rows), str(latest[0]),
                        step=latest[1].get("step"))


def _train_held(cfg: TrainConfig, model: Any, tok: Any, *, policy_dir: str | os.PathLike,
                train_rows: list[Mapping[str, Any]], test_rows: list[Mapping[str, Any]], run_dir: Path, task: str,
                resume: bool, on_step: StepCallback | None, device: str, digest: str) -> TrainResult:
    """The body of ``train`` once its inputs are checked and this process holds ``run_dir``."""
    run = _Run(cfg, model, tok, policy_dir=policy_dir, train_rows=train_rows, test_rows=test_rows, run_dir=run_dir,
               task=task, on_step=on_step, device=device, digest=digest)
    try:
        run.restore(resume)
        run.loop()
    finally:
        run.close()
    return run.result()


@dataclass
class RunState:
    """What a run carries from step to step besides its components' own state (allocator, trainer, ...).

    step: the last finished step; resumed_from: the checkpoint step this process started from (None: fresh);
    nonfinite_run: consecutive non-finite updates; cum: rollouts and tokens generated so far;
    history: every step's metrics record (read back from metrics.jsonl on resume, not checkpointed).
    """

    step: int = 0
    resumed_from: int | None = None
    nonfinite_run: int = 0
    cum: dict[str, int] = field(default_factory=lambda: {"rollouts": 0, "tokens": 0})
    history: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "nonfinite_run": self.nonfinite_run, "cum": dict(self.cum)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = self.resumed_from = int(state["step"])
        self.nonfinite_run = int(state["nonfinite_run"])
        self.cum = {k: int(v) for k, v in state["cum"].items()}


class _Run:
    """One training run's components and its phases: restore, then per step allocate, update, record,
    evaluate and checkpoint (``loop``), then close."""

    def __init__(self, cfg: TrainConfig, model: Any, tok: Any, *, policy_dir: str | os.PathLike,
                 train_rows: list[Mapping[str, Any]], test_rows: list[Mapping[str, Any]], run_dir: Path, task: str,
                 on_step: StepCallback | None, device: str, digest: str) -> None:
        self.cfg, self.model, self.tok, self.task, self.device, self.digest = cfg, model, tok, task, device, digest
        self.train_rows, self.on_step = train_rows, on_step
        self.run_dir, self.ckpt_dir, self.metrics_path = run_dir, run_dir / "checkpoints", run_dir / "metrics.jsonl"
        self.timings_path = run_dir / TIMINGS
        self.allocator = make_allocator(cfg.allocator, **cfg.allocator_kwargs())
        # each prompt's feature key, for allocators with a contextual prior (the others ignore it)
        self.source = PromptSource(len(train_rows), seed=cfg.seed, context=context_keys(train_rows, task))
        self.engine = _build_engine(cfg, model, tok, policy_prompts(tok, train_rows, task), policy_dir=policy_dir,
                                    device=device)
        self.trainer = GRPOTrainer(model, TrainerConfig.from_train(cfg),
                                   ref_model=_frozen_copy(policy_dir, device) if cfg.kl_coef > 0 else None,
                                   pad_id=tok.pad_token_id, device=device)
        self.scorer = Scorer(task, train_rows, timeout_s=cfg.verifier_timeout_s,
                             max_error_share=cfg.max_verifier_error_share, workers=cfg.verifier_workers)
        rng = np.random.default_rng(cfg.seed)
        eval_idx = np.sort(rng.choice(len(test_rows), size=min(cfg.eval_size, len(test_rows)), replace=False))
        self.eval_rows = [test_rows[i] for i in eval_idx]
        self.state = RunState()
        self.rollout_log: RolloutLog | None = None

    # ----- phases ------------------------------------------------------------------------------------------
    def restore(self, resume: bool) -> None:
        """Continue from the newest checkpoint (``resume``), or start afresh and evaluate the initial policy."""
        st = self.state
        if resume and (latest := load_latest(self.ckpt_dir)) is not None:
            step0, saved = latest
            check_resumable(saved, self.cfg, self.digest, str(self.ckpt_dir / f"step_{step0:06d}"), step=step0)
            self.trainer.load_state_dict(saved["trainer"])
            self.allocator.load_state_dict(saved["allocator"])
            self.source.load_state_dict(saved["source"])
            self.engine.load_state_dict(saved["engine"])
            self.scorer.errors = saved["verifier_errors"]
            self.scorer.timeouts = saved.get("verifier_timeouts", 0)
            _set_rng_state(saved["rng"])
            st.load_state_dict(saved)
            results = _read_metrics(self.metrics_path, upto=step0)
            timings = _read_metrics(self.timings_path, upto=step0)
            _write_metrics(self.metrics_path, results)  # drop lines written after the checkpoint
            _write_metrics(self.timings_path, timings)
            st.history = join_timings(results, timings)
        else:  # a fresh run: nothing of an earlier run in this folder may be mistaken for this one's
            self.metrics_path.unlink(missing_ok=True)
            self.timings_path.unlink(missing_ok=True)
            if not resume:
                shutil.rmtree(self.ckpt_dir, ignore_errors=True)
        self.rollout_log = RolloutLog(self.run_dir / ROLLOUT_LOG, self.train_rows, upto=st.step)  # drops later steps
        if st.step == 0:
            te = time.perf_counter()
            rec = {"step": 0, "cum_rollouts": 0, "cum_tokens": 0, **self.evaluate(), "eval_s": time.perf_counter() - te}
            self._emit(rec)

    def loop(self) -> None:
        cfg, st = self.cfg, self.state
        for step in range(st.step + 1, cfg.steps + 1):
            if self._budget_spent():
                break  # a resumed run whose budget was already spent
            t0 = time.perf_counter()
            errors0, timeouts0 = self.scorer.errors, self.scorer.timeouts
            batch, stats, allocate_s = self.allocate(step)
            upd, update_s = self.update(step, batch)
            _log_step_faults(step, stats.effective_groups, stats.groups, stats.hit_cap, upd, st.nonfinite_run,
                             cfg.max_nonfinite, self.scorer.errors - errors0, self.scorer.timeouts - timeouts0)
            st.step = step
            on_grid = cfg.eval_every_rollouts and (st.cum["rollouts"] // cfg.eval_every_rollouts
                                                   < (st.cum["rollouts"] + stats.rollouts) // cfg.eval_every_rollouts)
            st.cum["rollouts"] += stats.rollouts
            st.cum["tokens"] += stats.tokens
            rec = step_record(step, stats, batch, upd, self.scorer, st.cum, allocate_s=allocate_s, update_s=update_s)
            last = step == cfg.steps or self._budget_spent()
            if (cfg.eval_every and step % cfg.eval_every == 0) or on_grid or last:
                te = time.perf_counter()
                rec.update(self.evaluate())
                rec["eval_s"] = time.perf_counter() - te
            rec["step_s"] = time.perf_counter() - t0
            self._emit(rec)
            if st.nonfinite_run >= cfg.max_nonfinite:
                raise TrainingStopped(f"step {step}: {st.nonfinite_run} consecutive non-finite losses or gradients; "
                                      f"lower train.lr (now {cfg.lr}) or check the data")
            if step % cfg.checkpoint_every == 0 or last:
                self.checkpoint(step)
            if last:
                break

    def allocate(self, step: int) -> tuple[Any, Any, float]:
        """The step's allocation loop, every rollout scored; (batch, stats, seconds outside generate/verify)."""
        cfg, t0 = self.cfg, time.perf_counter()
        self.scorer.begin_step()

        def score(rollouts: Rollouts) -> None:
            fault_point("generate", step)
            self.scorer(rollouts)
            self.rollout_log.add(step, rollouts)

        with precision(self.device, cfg.dtype), _stop_on_oom(f"step {step}: generation", "the prompt length, "
                                                              f"train.max_new_tokens (now {cfg.max_new_tokens})"):
            batch, stats = run_allocation_step(self.allocator, self.engine, self.source, score=score,
                                               retries=cfg.engine_retries, retry_delay_s=cfg.engine_retry_delay_s)
        self.scorer.check_step(step)  # TrainingStopped when most of the step's rewards are verifier failures
        ex = stats.extra
        return batch, stats, (time.perf_counter() - t0) - ex["generate_seconds"] - ex["verify_seconds"]

    def update(self, step: int, batch: Any) -> tuple[dict[str, float], float]:
        """The GRPO update on the step's batch, the new weights pushed to the engine; (metrics, seconds)."""
        cfg, t1 = self.cfg, time.perf_counter()
        if self.engine.enable_sleep_mode:
            self.engine.sleep()  # a colocated server frees the accelerator while the trainer runs
        with precision(self.device, cfg.dtype), _stop_on_oom(f"step {step}: the policy update",
                                                              f"train.micro_batch (now {cfg.micro_batch})"):
            upd = self.trainer.step(batch)
        self.engine.update_weights()  # HF: shares the model object, nothing to do; vLLM: pushes the new weights
        update_s = time.perf_counter() - t1
        fault_point("update", step)
        st = self.state
        st.nonfinite_run = st.nonfinite_run + 1 if upd.get("nonfinite", 0) else 0
        return upd, update_s

    def evaluate(self) -> dict[str, float]:
        cfg = self.cfg
        reduce = f"train.eval_size (now {cfg.eval_size}), train.eval_samples (now {cfg.eval_samples})"
        with precision(self.device, cfg.dtype), _stop_on_oom("the held-out evaluation", reduce):
            ev = evaluate_policy((self.model, self.tok), self.eval_rows, self.task, k=cfg.pass_k,
                                 n_samples=cfg.eval_samples, temperature=cfg.temperature,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, device=self.device)
        return {f"eval/{k}": v for k, v in ev.items()}

    def checkpoint(self, step: int) -> None:
        self.rollout_log.flush()  # before the checkpoint: a resume from it finds its steps in the file
        cfg, st = asdict(self.cfg), self.state
        save_checkpoint(self.ckpt_dir, step, {
            **st.state_dict(), "trainer": self.trainer.state_dict(), "allocator": self.allocator.state_dict(),
            "source": self.source.state_dict(), "engine": self.engine.state_dict(), "rng": _rng_state(),
            "verifier_errors": self.scorer.errors, "verifier_timeouts": self.scorer.timeouts,
            "config": cfg, "data_digest": self.digest,
        }, keep_last=self.cfg.keep_last, meta={"config": cfg, "data_digest": self.digest})

    def close(self) -> None:
        self.scorer.close()  # the verifier's helper processes, if any
        self.engine.close()  # a rollout server this run started
        if self.rollout_log is not None:
            self.rollout_log.flush()  # the finished steps, also of a run that stopped

    def result(self) -> TrainResult:
        h = self.state.history
        final = {k[5:]: v for k, v in h[-1].items() if k.startswith("eval/")} if h else {}
        return TrainResult(self.run_dir, h[-1]["step"] if h else 0, self.state.resumed_from, h, final)

    # ----- helpers -----------------------------------------------------------------------------------------
    def _budget_spent(self) -> bool:
        return self.cfg.max_rollouts is not None and self.state.cum["rollouts"] >= self.cfg.max_rollouts

    def _emit(self, rec: dict[str, Any]) -> None:
        """Record a step: history, metrics.jsonl and timings.jsonl, the rollout log's step end, the callback."""
        self.state.history.append(rec)
        _append_metrics(self.metrics_path, {k: v for k, v in rec.items() if k not in TIMING_KEYS})
        _append_metrics(self.timings_path, {"step": rec["step"], **{k: rec[k] for k in TIMING_KEYS if k in rec}})
        if rec["step"]:
            self.rollout_log.end_step(rec["step"])
            fault_point("metrics", rec["step"])
        if self.on_step:
            self.on_step(rec)


def step_record(step: int, stats: Any, batch: Any, upd: Mapping[str, float], scorer: Scorer, cum: Mapping[str, int],
                *, allocate_s: float, update_s: float) -> dict[str, Any]:
    """One step's metrics record (metrics.jsonl), from the allocation's stats and the update's metrics."""
    return {
        "step": step, "rollouts": stats.rollouts, "tokens": stats.tokens,
        "effective_groups": stats.effective_groups, "groups": stats.groups,
        "effective_ratio": stats.effective_groups / max(stats.groups, 1),
        "useful_share": stats.useful_rollouts / max(stats.rollouts, 1),
        "committed": stats.committed, "abandoned": stats.abandoned, "skipped_prompts": stats.skipped,
        "rounds": stats.rounds, "hit_cap": stats.hit_cap,
        "reward_mean": float(batch.rollouts.reward.mean()) if len(batch.rollouts) else 0.0,
        "loss": upd.get("loss", 0.0), "kl": upd.get("kl", 0.0), "grad_norm": upd.get("grad_norm", 0.0),
        "clip_frac": upd.get("clip_frac", 0.0), "update_skipped": upd.get("skipped", 0.0),
        "nonfinite": upd.get("nonfinite", 0.0), "verifier_errors": scorer.errors,
        "verifier_timeouts": scorer.timeouts, "engine_retries": stats.extra.get("engine_retries", 0),
        "generate_s": stats.extra["generate_seconds"], "verify_s": stats.extra["verify_seconds"],
        "allocate_s": allocate_s, "update_s": update_s, "cum_rollouts": cum["rollouts"], "cum_tokens": cum["tokens"],
        "trained_tokens": upd.get("n_tokens", 0.0), "trained_sequences": upd.get("n_sequences", 0.0),
        # completions an allocator reused from earlier steps (ar3po): in "tokens", not in "rollouts"
        "reused_rollouts": stats.extra.get("reused_rollouts", 0), "reused_tokens": stats.extra.get("reused_tokens", 0),
    }


@contextlib.contextmanager
def _stop_on_oom(what: str, reduce: str) -> Iterator[None]:
    """An out-of-memory inside becomes TrainingStopped (not retried: the same work would fail again),
    naming ``what`` ran out and the settings to ``reduce``."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only out-of-memory is translated
        if not is_out_of_memory(e):
            raise
        if isinstance(e, OutOfMemory):  # it already says what did not fit and what to reduce
            raise TrainingStopped(f"{what}: {str(e)[:800]}") from e
        raise TrainingStopped(f"{what} ran out of memory ({e.__class__.__name__}: {str(e)[:400]}); "
                              f"reduce {reduce}; retrying the same work cannot help") from e


def _log_step_faults(step: int, effective: int, groups: int, hit_cap: Any, upd: Mapping[str, float],
                     nonfinite_run: int, max_nonfinite: int, new_errors: int, new_timeouts: int) -> None:
    """Warn about what went wrong in a step (the same facts are in its metrics record)."""
    if upd.get("nonfinite", 0):
        log.warning("step %d: non-finite loss or gradient (loss=%s, grad_norm=%s); update skipped "
                    "(%d in a row, the run stops at %d)", step, upd.get("loss"), upd.get("grad_norm"),
                    nonfinite_run, max_nonfinite)
    elif upd.get("skipped", 0):
        log.warning("step %d: no effective group (%d of %d groups mixed%s); no update this step", step, effective,
                    groups, ", generation cap reached" if hit_cap else "")
    if new_errors or new_timeouts:
        log.warning("step %d: %d verifier error(s) and %d timeout(s) scored 0.0", step, new_errors, new_timeouts)


def _build_engine(cfg: TrainConfig, model: Any, tok: Any, prompts: list[str], *, policy_dir: str | os.PathLike,
                  device: str) -> Any:
    """The engine named ``cfg.engine`` over the training prompts.

    ``device`` and ``policy_dir`` go to engines whose constructor takes them
    (the HF engine runs on ``device``; the vLLM server loads ``policy_dir``);
    ``cfg.engine_options`` are passed through.
    """
    cls = ENGINES.get(cfg.engine)
    accepted = inspect.signature(cls).parameters
    context = {k: v for k, v in (("device", device), ("policy_dir", str(policy_dir))) if k in accepted}
    return cls(model, tok, prompts, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
               seed=cfg.seed, **{**context, **cfg.engine_options})


def _frozen_copy(policy_dir: str | os.PathLike, device: str) -> torch.nn.Module:
    ref, _ = load_policy(policy_dir, device=device)
    return ref


def _append_metrics(path: Path, rec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(rec, default=float) + "\n")


def _write_metrics(path: Path, recs: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in recs:
            f.write(json.dumps(r, default=float) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def join_timings(results: Sequence[Mapping[str, Any]], timings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each step's record of metrics.jsonl with its seconds from timings.jsonl (none for a step it lacks)."""
    by_step = {t["step"]: t for t in timings}
    return [{**r, **{k: v for k, v in by_step.get(r["step"], {}).items() if k in TIMING_KEYS}} for r in results]


def _read_metrics(path: Path, upto: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if rec.get("step", math.inf) <= upto:
            out.append(rec)
    return out
