"""The RLVR training loop: allocation, verification, GRPO update, evaluation, checkpoints.

Pure library code (no orchestration imports). Per step:

1. the allocator and the HF engine run the allocation loop (docs/design.md §3.1), the
   verifier scoring every rollout;
2. the GRPO trainer updates the policy on the allocator's ragged groups;
3. the engine samples from the updated weights (it shares the model object);
4. every ``eval_every`` steps the policy is evaluated on held-out problems
   (greedy accuracy, pass@k);
5. every ``checkpoint_every`` steps the whole state is checkpointed atomically.

A run directory holds ``checkpoints/`` and ``metrics.jsonl`` (one JSON object
per step). Starting again on the same directory resumes from the newest intact
checkpoint and continues exactly as an uninterrupted run would.

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
from dataclasses import asdict, dataclass, fields
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
from rlvr_core.runlock import hold_run_folder
from rlvr_core.types import Rollouts

StepCallback = Callable[[dict[str, Any]], None]
log = logging.getLogger(__name__)

__all__ = ["EngineError", "Scorer", "TrainResult", "TrainingStopped", "TRAJECTORY_KEYS", "VerifierTimeout",
           "check_resumable", "data_digest", "train"]

# Keys a resumed run may change: how long it runs and how it is kept, not what it computes. A device
# change (a run moved to another machine) is allowed too. Every other train key (TRAJECTORY_KEYS) shapes
# the trajectory or what its records mean, and a checkpoint only resumes under the same values. That
# includes the evaluation keys (eval_every, eval_size, eval_samples): a run's eval curve is one evaluation
# set at one cadence, so a change is refused rather than recorded half-way through.
RESUMABLE_KEYS: tuple[str, ...] = ("allocators", "seeds", "steps", "max_rollouts", "checkpoint_every", "keep_last",
                                   "max_nonfinite", "engine_retries", "engine_retry_delay_s", "device",
                                   "compute_entropy", "max_verifier_error_share", "verifier_workers",
                                   "allow_no_update")
TRAJECTORY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(TrainConfig) if f.name not in RESUMABLE_KEYS)


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
    ``step`` no later than ``cfg.steps`` (a shorter run cannot be had from a longer one)."""
    old, new = saved.get("config") or {}, asdict(cfg)
    changed = [k for k in TRAJECTORY_KEYS if k in old and _plain(old[k]) != _plain(new[k])]
    if changed:
        diffs = ", ".join(f"train.{k}={short_repr(old[k])} there, {short_repr(new[k])} now" for k in changed)
        raise ConfigError(f"{where}: cannot resume, the run was started with other settings ({diffs}); "
                          "use the same settings, or start a fresh run folder")
    if saved.get("data_digest") not in (None, digest):
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
          resume: bool = True, on_step: StepCallback | None = None, device: str | None = None) -> TrainResult:
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
    validate_splits(train_rows, test_rows, task)
    device = resolve_device(cfg.device if device is None else device)
    digest = data_digest(train_rows)
    run_dir = Path(run_dir)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)

    model, tok = load_policy(policy_dir, device=device)
    limit = position_limit(model.config, tok)  # prompts the tokenizer cannot encode or the model cannot hold
    for split, rows in (("train", train_rows), ("test", test_rows)):
        check_prompts_fit(rows, tok, task, split, max_new_tokens=cfg.max_new_tokens, max_positions=limit)
    # one writer per run folder (RunFolderBusy names the holder), taken once the inputs passed their checks
    with hold_run_folder(run_dir):
        return _train_held(cfg, model, tok, policy_dir=policy_dir, train_rows=train_rows, test_rows=test_rows,
                           run_dir=run_dir, task=task, resume=resume, on_step=on_step, device=device, digest=digest)


def _train_held(cfg: TrainConfig, model: Any, tok: Any, *, policy_dir: str | os.PathLike,
                train_rows: list[Mapping[str, Any]], test_rows: list[Mapping[str, Any]], run_dir: Path, task: str,
                resume: bool, on_step: StepCallback | None, device: str, digest: str) -> TrainResult:
    """The body of ``train`` once its inputs are checked and this process holds ``run_dir``."""
    ckpt_dir = run_dir / "checkpoints"
    metrics_path = run_dir / "metrics.jsonl"
    allocator = make_allocator(cfg.allocator, **cfg.allocator_kwargs())
    # each prompt's feature key, for allocators with a contextual prior (the others ignore it)
    source = PromptSource(len(train_rows), seed=cfg.seed, context=context_keys(train_rows, task))
    engine = _build_engine(cfg, model, tok, policy_prompts(tok, train_rows, task), policy_dir=policy_dir, device=device)
    trainer = GRPOTrainer(model, TrainerConfig.from_train(cfg),
                          ref_model=_frozen_copy(policy_dir, device) if cfg.kl_coef > 0 else None,
                          pad_id=tok.pad_token_id, device=device)
    scorer = Scorer(task, train_rows, timeout_s=cfg.verifier_timeout_s, max_error_share=cfg.max_verifier_error_share,
                    workers=cfg.verifier_workers)
    rng = np.random.default_rng(cfg.seed)
    eval_idx = np.sort(rng.choice(len(test_rows), size=min(cfg.eval_size, len(test_rows)), replace=False))
    eval_rows = [test_rows[i] for i in eval_idx]

    start, resumed_from, history, nonfinite_run = 0, None, [], 0
    cum = {"rollouts": 0, "tokens": 0}
    if resume and (latest := load_latest(ckpt_dir)) is not None:
        step0, state = latest
        check_resumable(state, cfg, digest, str(ckpt_dir / f"step_{step0:06d}"), step=step0)
        trainer.load_state_dict(state["trainer"])
        allocator.load_state_dict(state["allocator"])
        source.load_state_dict(state["source"])
        engine.load_state_dict(state["engine"])
        scorer.errors = state["verifier_errors"]
        scorer.timeouts = state.get("verifier_timeouts", 0)
        _set_rng_state(state["rng"])
        start, resumed_from, nonfinite_run, cum = step0, step0, state["nonfinite_run"], dict(state["cum"])
        history = _read_metrics(metrics_path, upto=step0)
        _write_metrics(metrics_path, history)  # drop lines written after the checkpoint
    else:  # a fresh run: nothing of an earlier run in this folder may be mistaken for this one's
        metrics_path.unlink(missing_ok=True)
        if not resume:
            shutil.rmtree(ckpt_dir, ignore_errors=True)

    def evaluate() -> dict[str, float]:
        reduce = f"train.eval_size (now {cfg.eval_size}), train.eval_samples (now {cfg.eval_samples})"
        with precision(device, cfg.dtype), _stop_on_oom("the held-out evaluation", reduce):
            return evaluate_policy((model, tok), eval_rows, task, k=cfg.k, n_samples=cfg.eval_samples,
                                   temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                   seed=cfg.seed, device=device)

    if start == 0:
        te = time.perf_counter()
        ev = {f"eval/{k}": v for k, v in evaluate().items()}
        rec = {"step": 0, "cum_rollouts": 0, "cum_tokens": 0, **ev, "eval_s": time.perf_counter() - te}
        history.append(rec)
        _append_metrics(metrics_path, rec)
        if on_step:
            on_step(rec)

    step = start

    def score(rollouts: Rollouts) -> None:
        fault_point("generate", step)
        scorer(rollouts)

    try:
        for step in range(start + 1, cfg.steps + 1):
            if cfg.max_rollouts is not None and cum["rollouts"] >= cfg.max_rollouts:
                break  # a resumed run whose budget was already spent
            t0 = time.perf_counter()
            errors0, timeouts0 = scorer.errors, scorer.timeouts
            scorer.begin_step()
            with precision(device, cfg.dtype), _stop_on_oom(f"step {step}: generation", "the prompt length, "
                                                            f"train.max_new_tokens (now {cfg.max_new_tokens})"):
                batch, stats = run_allocation_step(allocator, engine, source, score=score, retries=cfg.engine_retries,
                                                   retry_delay_s=cfg.engine_retry_delay_s)
            scorer.check_step(step)  # TrainingStopped when most of the step's rewards are verifier failures
            t1 = time.perf_counter()
            if getattr(engine, "enable_sleep_mode", False):
                engine.sleep()  # a colocated server frees the accelerator while the trainer runs
            with precision(device, cfg.dtype), _stop_on_oom(f"step {step}: the policy update",
                                                            f"train.micro_batch (now {cfg.micro_batch})"):
                upd = trainer.step(batch)
            engine.update_weights()  # HF: shares the model object, nothing to do; vLLM: pushes the new weights
            t2 = time.perf_counter()
            fault_point("update", step)
            nonfinite_run = nonfinite_run + 1 if upd.get("nonfinite", 0) else 0
            _log_step_faults(step, stats.effective_groups, stats.groups, stats.hit_cap, upd, nonfinite_run,
                             cfg.max_nonfinite, scorer.errors - errors0, scorer.timeouts - timeouts0)
            cum["rollouts"] += stats.rollouts
            cum["tokens"] += stats.tokens
            rec = {
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
                "allocate_s": (t1 - t0) - stats.extra["generate_seconds"] - stats.extra["verify_seconds"],
                "update_s": t2 - t1, "cum_rollouts": cum["rollouts"], "cum_tokens": cum["tokens"],
                "trained_tokens": upd.get("n_tokens", 0.0), "trained_sequences": upd.get("n_sequences", 0.0),
            }
            last = step == cfg.steps or (cfg.max_rollouts is not None and cum["rollouts"] >= cfg.max_rollouts)
            if (cfg.eval_every and step % cfg.eval_every == 0) or last:
                te = time.perf_counter()
                rec.update({f"eval/{k}": v for k, v in evaluate().items()})
                rec["eval_s"] = time.perf_counter() - te
            rec["step_s"] = time.perf_counter() - t0
            history.append(rec)
            _append_metrics(metrics_path, rec)
            fault_point("metrics", step)
            if on_step:
                on_step(rec)
            if nonfinite_run >= cfg.max_nonfinite:
                raise TrainingStopped(f"step {step}: {nonfinite_run} consecutive non-finite losses or gradients; "
                                      f"lower train.lr (now {cfg.lr}) or check the data")
            if step % cfg.checkpoint_every == 0 or last:
                save_checkpoint(ckpt_dir, step, {
                    "step": step, "trainer": trainer.state_dict(), "allocator": allocator.state_dict(),
                    "source": source.state_dict(), "engine": engine.state_dict(), "rng": _rng_state(),
                    "verifier_errors": scorer.errors, "verifier_timeouts": scorer.timeouts,
                    "nonfinite_run": nonfinite_run, "cum": dict(cum), "config": asdict(cfg), "data_digest": digest,
                }, keep_last=cfg.keep_last, meta={"config": asdict(cfg), "data_digest": digest})
            if last:
                break
    finally:
        scorer.close()  # the verifier's helper processes, if any
        if hasattr(engine, "close"):
            engine.close()  # a rollout server this run started
    final = {k[5:]: v for k, v in history[-1].items() if k.startswith("eval/")} if history else {}
    steps_done = history[-1]["step"] if history else 0
    return TrainResult(run_dir, steps_done, resumed_from, history, final)


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
