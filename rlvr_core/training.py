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

- the inputs are checked once, before anything is loaded or generated (``rlvr_core.preflight``:
  the data, the policy folder and its files against their sha256.json, the prompts against its tokenizer and
  positions, the device, the allocator parameters); a checkpoint written with other trajectory settings, other
  data or from another policy (the warm start replaced since the run started) is refused,
  and so is one whose restored values no run writes or metrics.jsonl does not account for, however its
  hashes were recorded (``rlvr_core.preflight.check_restored_state``: a CheckpointError names the field);
- a failing ``engine.generate`` is retried inside the round (``engine_retries``),
  then the step raises ``EngineError`` before its metrics or checkpoint are
  written, so a restart resumes from the last checkpoint;
- a verifier that raises, returns a non-finite value or runs past
  ``verifier_timeout_s`` scores 0.0 and is counted (``verifier_errors``,
  ``verifier_timeouts``); when more than ``max_verifier_error_share`` of a
  step's rollouts fail so, the step raises ``TrainingStopped`` before its update;
- an out-of-memory in generation,
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
import inspect
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from rlvr_core.allocation import PromptSource, run_allocation_step
from rlvr_core.allocation.loop import EngineError
from rlvr_core.checkpoint import STATE, fault_point, load_latest, save_checkpoint, step_folder_name
from rlvr_core.config import TrainConfig
from rlvr_core.data.context import context_keys
from rlvr_core.errors import OutOfMemory, TrainingStopped, VerifierTimeout, is_out_of_memory
from rlvr_core.evaluation import evaluate_policy
from rlvr_core.grpo.trainer import GRPOTrainer, TrainerConfig
from rlvr_core.models.policy import load_any_policy as load_policy
from rlvr_core.models.policy import policy_prompts, precision
from rlvr_core.preflight import (
    RESUMABLE_KEYS,
    TRAJECTORY_KEYS,
    CheckedInputs,
    check_restored_state,
    check_resumable,
    data_digest,
    preflight,
    read_step_records,
    resume_refused,
)
from rlvr_core.rewards.scoring import Scorer
from rlvr_core.rollout import ENGINES
from rlvr_core.rollout_log import FILENAME as ROLLOUT_LOG
from rlvr_core.rollout_log import RolloutLog
from rlvr_core.runlock import hold_run_folder
from rlvr_core.safefs import append_line, write_text_atomic
from rlvr_core.types import Rollouts, StepRecord

StepCallback = Callable[[StepRecord], None]
log = logging.getLogger(__name__)

# CheckedInputs, preflight, check_resumable, data_digest, RESUMABLE_KEYS and TRAJECTORY_KEYS live in
# rlvr_core.preflight, Scorer in rlvr_core.rewards.scoring, TrainingStopped in rlvr_core.errors: importable here too
__all__ = ["CheckedInputs", "EngineError", "RESUMABLE_KEYS", "RunState", "Scorer", "TIMINGS", "TIMING_KEYS",
           "TrainResult", "TrainingStopped", "TRAJECTORY_KEYS", "join_timings",
           "VerifierTimeout", "check_and_train", "check_resumable", "data_digest", "preflight", "step_record",
           "train"]

# A step record's wall-clock seconds: written to TIMINGS beside metrics.jsonl, never into it.
TIMING_KEYS: tuple[str, ...] = ("generate_s", "verify_s", "allocate_s", "update_s", "eval_s", "step_s")
TIMINGS = "timings.jsonl"


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    resumed_from: int | None
    metrics: list[dict[str, Any]]
    final_eval: dict[str, float]


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])


def train(checked: CheckedInputs, *, on_step: StepCallback | None = None, resume: bool = True) -> TrainResult:
    """Train on inputs that ``rlvr_core.preflight.preflight`` checked; see the module docstring.

    ``check_and_train`` runs ``preflight`` and then this (the library entry point); the training flow runs
    ``preflight`` itself, before MLflow opens a run, and hands its result here: nothing is checked again.

    Args:
        checked: the run's inputs as ``preflight`` returned them: the ``train`` section, the task (verifier)
            name, the warm-started policy folder (the tiny policy, or any causal LM saved with
            ``save_pretrained``; see ``rlvr_core.models.policy.load_any_policy``), the splits, the run folder
            (checkpoints and metrics.jsonl; resumed if present) and the resolved device
        on_step: called with each step's metrics record (``rlvr_core.types.StepRecord``; progress, tracking)
        resume: continue from the newest checkpoint in the run folder (False: start afresh)
    Prompts: the engine and the evaluation get each row's prompt through the policy
    tokenizer's chat template when it has one (``policy_prompts``), unchanged otherwise.
    With ``cfg.dtype`` "bfloat16" generation, updates and evaluations run under bfloat16
    autocast; weights and optimizer state stay float32.
    Returns:
        TrainResult with every step's metrics (earlier ones read back on resume)
    Raises:
        CheckpointError (a ConfigError) before any rollout for a checkpoint whose restored state no run
        writes; RunFolderBusy (a ConfigError) when another process holds the run folder;
        EngineError when generation keeps failing; TrainingStopped after
        ``cfg.max_nonfinite`` non-finite updates in a row.
    """
    cfg = checked.cfg
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    model, tok = load_policy(checked.policy_dir, device=checked.device)
    # one writer per run folder (RunFolderBusy names the holder), taken once the inputs passed their checks
    with hold_run_folder(checked.run_dir):
        run = _Run(checked, model, tok, on_step=on_step)
        try:
            run.restore(resume)
            run.loop()
        finally:
            run.close()
        return run.result()


def check_and_train(cfg: TrainConfig, *, policy_dir: str | os.PathLike, train_rows: Sequence[Mapping[str, Any]],
                    test_rows: Sequence[Mapping[str, Any]], run_dir: str | os.PathLike, task: str = "arithmetic",
                    resume: bool = True, on_step: StepCallback | None = None,
                    device: str | None = None) -> TrainResult:
    """``preflight`` the inputs, then ``train`` on them: the library entry point.

    Args:
        cfg: the ``train`` section
        policy_dir, train_rows, test_rows, run_dir, task: the policy folder, the splits (task rows with the
            verifier's fields, ``rlvr_core.data.validate``), the run folder and the verifier name
        resume, on_step: as for ``train``
        device: overrides ``cfg.device`` (None: ``cfg.device``, "auto" resolved by ``preflight``)
    Raises:
        ConfigError (DataError, PolicyLoadError, CheckpointError) before any rollout for bad data,
        a bad policy folder or a checkpoint of another configuration; then what ``train`` raises.
    """
    checked = preflight(cfg, task, train_rows, test_rows, policy_dir, run_dir, device=device, resume=resume)
    return train(checked, on_step=on_step, resume=resume)


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

    def __init__(self, checked: CheckedInputs, model: Any, tok: Any, *, on_step: StepCallback | None) -> None:
        cfg, task, device, policy_dir = checked.cfg, checked.task, checked.device, checked.policy_dir
        train_rows, test_rows, run_dir = checked.train_rows, checked.test_rows, checked.run_dir
        self.cfg, self.model, self.tok, self.task, self.device = cfg, model, tok, task, device
        self.digest, self.policy_dir, self.policy_digest = checked.digest, policy_dir, checked.policy_digest
        self.train_rows, self.on_step = train_rows, on_step
        self.run_dir, self.ckpt_dir, self.metrics_path = run_dir, run_dir / "checkpoints", run_dir / "metrics.jsonl"
        self.timings_path = run_dir / TIMINGS
        self.allocator = checked.make_allocator()
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
            folder = self.ckpt_dir / step_folder_name(step0)
            examples = {"allocator": self.allocator.state_dict(), "source": self.source.state_dict(),
                        "engine": self.engine.state_dict(), "trainer": self.trainer.state_dict()}
            results = check_restored_state(saved, folder, self.metrics_path, self.cfg, examples)  # CheckpointError
            check_resumable(saved, self.cfg, self.digest, str(folder), step=step0, policy=self.policy_digest,
                            policy_dir=self.policy_dir)
            self._load(saved, folder)
            timings = read_step_records(self.timings_path, upto=step0)
            _write_metrics(self.metrics_path, results)  # drop lines written after the checkpoint
            _write_metrics(self.timings_path, timings)
            st.history = join_timings(results, timings)
        else:  # a fresh run: nothing of an earlier run in this folder may be mistaken for this one's
            self.metrics_path.unlink(missing_ok=True)
            self.timings_path.unlink(missing_ok=True)
            if not resume:
                shutil.rmtree(self.ckpt_dir, ignore_errors=True)
        logged = [r["step"] for r in st.history if r["step"] and r.get("rollouts", 0) > 0]
        # drops later steps; records as lost_steps the steps with rollouts whose rows the file lacks (or is missing)
        self.rollout_log = RolloutLog(self.run_dir / ROLLOUT_LOG, self.train_rows, upto=st.step, logged=logged)
        if st.step == 0:
            te = time.perf_counter()
            rec = {"step": 0, "cum_rollouts": 0, "cum_tokens": 0, **self.evaluate(), "eval_s": time.perf_counter() - te}
            self._emit(rec)

    def _load(self, saved: Mapping[str, Any], folder: Path) -> None:
        """Load a checked state (``check_restored_state``) into the components; what a component's
        ``load_state_dict`` still refuses is a CheckpointError naming it, without the component's trace."""
        loads: tuple[tuple[str, Callable[[Any], None]], ...] = (
            ("trainer", self.trainer.load_state_dict), ("allocator", self.allocator.load_state_dict),
            ("source", self.source.load_state_dict), ("engine", self.engine.load_state_dict), ("rng", _set_rng_state))
        for key, load in loads:
            try:
                load(saved[key])
            except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, OverflowError) as e:
                if is_out_of_memory(e):
                    raise
                problem = f"{key}: cannot be restored ({e.__class__.__name__}: {str(e)[:300]})"
                raise resume_refused(str(folder / STATE), problem) from None
        self.scorer.errors = saved["verifier_errors"]
        self.scorer.timeouts = saved.get("verifier_timeouts", 0)
        self.state.load_state_dict(saved)

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
        rounds = [0]

        def score(rollouts: Rollouts) -> None:
            fault_point("generate", step)
            self.scorer(rollouts)
            self.rollout_log.add(step, rollouts, round_index=rounds[0])
            rounds[0] += 1

        with precision(self.device, cfg.dtype), _stop_on_oom(f"step {step}: generation", "the prompt length, "
                                                              f"train.max_new_tokens (now {cfg.max_new_tokens})"):
            batch, stats = run_allocation_step(self.allocator, self.engine, self.source, score=score,
                                               retries=cfg.engine_retries, retry_delay_s=cfg.engine_retry_delay_s,
                                               step=step)
        self.scorer.check_step(step)  # TrainingStopped when most of the step's rewards are verifier failures
        # the decision log: each prompt's trained rows and status, and the allocator's prior and p_eff
        self.rollout_log.decide(step, batch, self.allocator.step_beliefs)
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
            "config": cfg, "data_digest": self.digest, "policy_digest": self.policy_digest,
        }, keep_last=self.cfg.keep_last, meta={"config": cfg, "data_digest": self.digest,
                                                "policy_digest": self.policy_digest})

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
                *, allocate_s: float, update_s: float) -> StepRecord:
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
        "adv_abs_mean": upd.get("adv/adv_abs_mean", 0.0),  # mean |advantage| over the trained rows
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
    append_line(path, json.dumps(rec, default=float) + "\n")  # never through a planted link (safefs)


def _write_metrics(path: Path, recs: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, default=float) + "\n" for r in recs), fsync=True)


def join_timings(results: Sequence[Mapping[str, Any]], timings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each step's record of metrics.jsonl with its seconds from timings.jsonl (none for a step it lacks)."""
    by_step = {t["step"]: t for t in timings}
    return [{**r, **{k: v for k, v in by_step.get(r["step"], {}).items() if k in TIMING_KEYS}} for r in results]
