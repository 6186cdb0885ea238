"""Plain data passed between allocators, engines, verifiers and the trainer.

Rollouts are columnar (numpy arrays of equal length R) so allocator decisions
stay vectorised; engine-specific payloads (text, token ids, log-probs) ride
along in ``payload`` and are never inspected by allocators.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TypedDict

import numpy as np


def plain(v: Any) -> Any:
    """``v`` with every tuple made a list, in mappings and lists too: a value read back from a checkpoint,
    YAML or a Hydra list then compares equal to the one given (``(1, 2)`` and ``[1, 2]`` alike)."""
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, Mapping):
        return {k: plain(x) for k, x in v.items()}
    return v


# One allocation round: prompt id -> number of new rollouts wanted for it.
Requests = Mapping[int, int]


@dataclass
class Rollouts:
    """R rollouts, one row each.

    prompt_id: (R,) int64, index of the prompt in the prompt pool
    reward:    (R,) float64, verifier reward (binary tasks: 0.0 or 1.0)
    tokens:    (R,) int64, generated tokens (for token accounting)
    payload:   optional length-R list of engine objects (text, token ids, log-probs)
    """

    prompt_id: np.ndarray
    reward: np.ndarray
    tokens: np.ndarray
    payload: list[Any] | None = None

    def __post_init__(self) -> None:
        self.prompt_id = np.asarray(self.prompt_id, dtype=np.int64).reshape(-1)
        self.reward = np.asarray(self.reward, dtype=np.float64).reshape(-1)
        self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        n = len(self.prompt_id)
        if len(self.reward) != n or len(self.tokens) != n:
            raise ValueError(
                f"Rollouts columns differ in length: prompt_id={n}, reward={len(self.reward)}, "
                f"tokens={len(self.tokens)}"
            )
        if self.payload is not None and len(self.payload) != n:
            raise ValueError(f"Rollouts payload has {len(self.payload)} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.prompt_id)

    @classmethod
    def empty(cls) -> "Rollouts":
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), None)

    def select(self, idx: np.ndarray | Sequence[int]) -> "Rollouts":
        idx = np.asarray(idx, dtype=np.int64)
        payload = None if self.payload is None else [self.payload[i] for i in idx]
        return Rollouts(self.prompt_id[idx], self.reward[idx], self.tokens[idx], payload)

    @classmethod
    def concat(cls, parts: Sequence["Rollouts"]) -> "Rollouts":
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        has_payload = [p.payload is not None for p in parts]
        if any(has_payload) and not all(has_payload):
            raise ValueError("cannot concatenate rollouts with and without payloads")
        payload = [x for p in parts for x in p.payload] if all(has_payload) else None
        return cls(
            np.concatenate([p.prompt_id for p in parts]),
            np.concatenate([p.reward for p in parts]),
            np.concatenate([p.tokens for p in parts]),
            payload,
        )


@dataclass
class TrainBatch:
    """The groups an allocator hands to the GRPO update: ragged, grouped by id.

    rollouts:  R rollouts
    group_id:  (R,) int64 in [0, G); rows of one group share a prompt
    effective: (G,) bool, the group's rewards are mixed (std > eps)
    """

    rollouts: Rollouts
    group_id: np.ndarray
    effective: np.ndarray

    @property
    def num_groups(self) -> int:
        return int(len(self.effective))

    def group_sizes(self) -> np.ndarray:
        return np.bincount(self.group_id, minlength=self.num_groups)


@dataclass
class StepStats:
    """Counters for one allocation step; every allocator fills the same fields."""

    rollouts: int = 0  # rollouts generated this step (all of them)
    tokens: int = 0  # tokens generated this step
    rounds: int = 0  # synchronous generate calls
    prompts: int = 0  # distinct prompts that got at least one rollout
    groups: int = 0  # groups in the training batch
    effective_groups: int = 0  # mixed groups in the training batch
    useful_rollouts: int = 0  # rollouts inside effective groups of the batch
    useful_tokens: int = 0
    committed: int = 0  # SARA: groups committed (completed to k)
    abandoned: int = 0  # SARA: prompts stopped early
    skipped: int = 0  # prompts skipped before any rollout (GRESO, DPS)
    hit_cap: int = 0  # 1 when a cap (generation batches, rounds, budget) ended the step short
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        d.update(self.extra)
        return d


class StepRecord(TypedDict, total=False):
    """One line of a run's metrics.jsonl (``rlvr_core.training.step_record``), as ``train`` hands it to ``on_step``.

    Step 0 (the initial policy's evaluation) holds only ``step``, the cumulative counts, ``eval_s`` and its
    ``eval/<metric>`` keys; a training step holds every field below, and the ``eval/<metric>`` keys on the
    steps that evaluated. The seconds (``generate_s`` ... ``step_s``) go to timings.jsonl, not metrics.jsonl.
    Whether a step changed the policy is ``step_updated``, the one rule every reader uses.
    """

    step: int
    rollouts: int
    tokens: int
    effective_groups: int
    groups: int
    effective_ratio: float
    useful_share: float
    committed: int
    abandoned: int
    skipped_prompts: int
    rounds: int
    hit_cap: int
    reward_mean: float
    loss: float
    kl: float
    grad_norm: float
    clip_frac: float
    update_skipped: float  # 1.0: no effective group, no update
    nonfinite: float  # 1.0: a non-finite loss or gradient, the update skipped
    verifier_errors: int
    verifier_timeouts: int
    engine_retries: int
    cum_rollouts: int
    cum_tokens: int
    trained_tokens: float
    trained_sequences: float
    adv_abs_mean: float  # mean |advantage| over the trained rows
    reused_rollouts: int
    reused_tokens: int
    generate_s: float
    verify_s: float
    allocate_s: float
    update_s: float
    eval_s: float
    step_s: float


def step_updated(rec: Mapping[str, Any]) -> bool:
    """Whether the step of ``rec`` (a ``StepRecord``) changed the policy: a training step (not step 0's
    evaluation) whose update was neither skipped (no effective group) nor non-finite."""
    return rec.get("step", 0) > 0 and "rollouts" in rec and not rec.get("update_skipped") \
        and not rec.get("nonfinite")
