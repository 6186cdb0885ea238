"""Issue 13 section 4: prompts are checked against the policy's tokenizer and length limit before
training (and before MLflow opens a run); an out-of-memory fails at once, unretried, naming what to reduce."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rlvr_core.allocation.loop import generate_with_retry
from rlvr_core.config import TrainConfig
from rlvr_core.data.validate import DataError
from rlvr_core.errors import OutOfMemory, is_out_of_memory
from rlvr_core.rollout import RolloutEngine
from rlvr_core.rollout.hf import HFEngine
from rlvr_core.training import TrainingStopped, check_and_train
from tests.reliability.common import CFG, dataset, make_flow_root

LONG = "1" * 19_999 + "="  # 20,000 characters of the tiny vocabulary


def _plain_rows() -> tuple[list[dict], list[dict]]:
    """The reliability data with only the fields the verifier reads (so any prompt is self-consistent)."""
    ds = dataset()
    keep = ("id", "prompt", "answer")
    return ([{k: r[k] for k in keep} for r in ds["train"]], [{k: r[k] for k in keep} for r in ds["test"]])


@pytest.fixture
def no_rollouts(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(self: Any, requests: Any) -> Any:
        raise AssertionError("a rollout was generated before the bad input was refused")

    monkeypatch.setattr(HFEngine, "generate", tripwire)


@pytest.mark.parametrize("split, prompt, message", [
    ("train", LONG, r"train row 3 .*the prompt is 20001 tokens \(20000 characters\); with train\.max_new_tokens=8 it "
                    r"needs 20009 positions, but the policy holds 128.*lower train\.max_new_tokens"),
    ("test", "12 + 34 =", r"test row 3 .*character ' ' at position 2 outside the tiny policy's vocabulary"),
    ("train", "0012+0034=?", r"train row 3 .*character '\?' at position 10"),
])
def test_prompts_the_policy_cannot_read_are_refused_before_any_rollout(policy_dir: Path, tmp_path: Path,
                                                                       no_rollouts: None, split: str, prompt: str,
                                                                       message: str) -> None:
    tr, te = _plain_rows()
    rows = tr if split == "train" else te
    rows[3] = {**rows[3], "prompt": prompt}
    t0 = time.monotonic()
    with pytest.raises(DataError, match=message):
        check_and_train(TrainConfig(**CFG), policy_dir=policy_dir, train_rows=tr, test_rows=te,
                        run_dir=tmp_path / "run")
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "run").exists()


def test_max_new_tokens_beyond_the_model_is_refused(policy_dir: Path, tmp_path: Path, no_rollouts: None) -> None:
    tr, te = _plain_rows()
    # within the params bound (TrainConfig refuses more than MAX_NEW_TOKENS), beyond the tiny policy's 128 positions
    with pytest.raises(DataError, match=r"train row 0 .*train\.max_new_tokens=1000 it needs \d+ positions"):
        check_and_train(TrainConfig(**{**CFG, "max_new_tokens": 1000}), policy_dir=policy_dir, train_rows=tr,
                        test_rows=te,
              run_dir=tmp_path / "run")


# ----------------------------------------------------------------------------- the train flow

PARAMS = """\
prepare: {task: arithmetic, n_train: 400, n_test: 60, seed: 0}
train: {allocator: sara, allocators: [sara], k: 4, batch_size: 8, steps: 2, eval_every: 1, eval_size: 20,
        eval_samples: 0, checkpoint_every: 1, keep_last: 2}
"""


@pytest.mark.parametrize("prompt, message", [
    (LONG, r"train row 5 .*the prompt is 20001 tokens"),
    ("12+34=\u00a0", r"train row 5 .*character '\\xa0' at position 6"),
])
def test_flow_refuses_unreadable_prompts_before_mlflow(policy_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       prompt: str, message: str) -> None:
    import datasets

    from flows.train import train as train_flow

    tr, te = _plain_rows()
    tr[5] = {**tr[5], "prompt": prompt}
    data = datasets.DatasetDict({"train": datasets.Dataset.from_list(tr), "test": datasets.Dataset.from_list(te)})
    root = make_flow_root(tmp_path / "root", policy_dir, PARAMS, monkeypatch, data=data)
    with pytest.raises(DataError, match=f"{root / 'data/arithmetic'}: {message}"):
        train_flow.fn(allocator="sara")
    assert not (root / "runs").exists() and not (root / "mlflow.db").exists()  # no MLflow run was opened


# ----------------------------------------------------------------------------- out of memory


@pytest.mark.parametrize("exc, oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 160.00 GiB"), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 171798691840 bytes"), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (MemoryError(), True),
    (OutOfMemory("x"), True),
    (RuntimeError("connection reset by peer"), False),
    (OSError("disk"), False),
])
def test_out_of_memory_is_recognised(exc: BaseException, oom: bool) -> None:
    assert is_out_of_memory(exc) is oom


class _Engine(RolloutEngine):
    def __init__(self, exc: BaseException) -> None:
        self.exc, self.calls, self.state = exc, 0, {"calls": 0}

    def generate(self, requests: Any) -> Any:
        self.calls += 1
        self.state["calls"] += 1
        raise self.exc

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def _chained(inner: BaseException, how: str, depth: int = 1) -> BaseException:
    """``inner`` wrapped ``depth`` times in RuntimeErrors, by ``raise ... from`` or inside ``except``."""
    exc = inner
    for i in range(depth):
        try:
            try:
                raise exc
            except BaseException as e:
                if how == "cause":
                    raise RuntimeError(f"worker {i} failed") from e
                if how == "suppressed":
                    raise RuntimeError(f"worker {i} failed") from None
                raise RuntimeError(f"worker {i} failed")  # noqa: B904 - the implicit __context__ is the point
        except RuntimeError as outer:
            exc = outer
    return exc


@pytest.mark.parametrize("exc, oom", [
    (_chained(MemoryError(), "cause"), True),
    (_chained(torch.OutOfMemoryError("CUDA out of memory"), "context"), True),
    (_chained(OutOfMemory("x"), "cause", depth=5), True),
    (_chained(RuntimeError("connection reset by peer"), "cause"), False),
    (_chained(MemoryError(), "suppressed"), False),  # `from None`: the author says it is not the story
    (_chained(MemoryError(), "cause", depth=40), False),  # the walk is bounded (OOM_CHAIN_DEPTH)
])
def test_an_out_of_memory_inside_another_error_is_recognised(exc: BaseException, oom: bool) -> None:
    assert is_out_of_memory(exc) is oom


def test_an_exception_chain_with_a_cycle_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert is_out_of_memory(a) is False


@pytest.mark.parametrize("how", ["cause", "context"])
def test_a_wrapped_out_of_memory_is_not_retried(how: str) -> None:
    wrapped = _Engine(_chained(MemoryError("no room"), how))
    with pytest.raises(RuntimeError, match="worker 0 failed"):
        generate_with_retry(wrapped, {0: 4}, retries=3, retry_delay_s=0.0)
    assert wrapped.calls == 1 and wrapped.state == {"calls": 0}


def test_out_of_memory_is_not_retried_but_other_faults_are() -> None:
    oom = _Engine(MemoryError("no room"))
    t0 = time.monotonic()
    with pytest.raises(MemoryError):
        generate_with_retry(oom, {0: 4}, retries=3, retry_delay_s=5.0)
    assert oom.calls == 1 and time.monotonic() - t0 < 1.0 and oom.state == {"calls": 0}  # state restored
    flaky = _Engine(RuntimeError("server went away"))
    with pytest.raises(Exception, match="after 3 attempt"):
        generate_with_retry(flaky, {0: 4}, retries=2, retry_delay_s=0.0)
    assert flaky.calls == 3


@pytest.mark.parametrize("make", [lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 160.00 GiB"),
                                  lambda: OSError(errno.ENOMEM, "Cannot allocate memory"),  # was retried 3 + 2 times
                                  lambda: RuntimeError("std::bad_alloc")], ids=["cuda", "ENOMEM", "bad_alloc"])
def test_an_oom_in_generation_stops_training_at_once_naming_what_to_reduce(
        policy_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any) -> None:
    calls = {"n": 0}
    real = HFEngine._forward_loop

    def forward(self: HFEngine, seqs: Any, max_new: int, generator: Any) -> Any:
        if generator is None:  # greedy evaluation runs; sampling does not fit
            return real(self, seqs, max_new, generator)
        calls["n"] += 1
        raise make()

    monkeypatch.setattr(HFEngine, "_forward_loop", forward)
    tr, te = _plain_rows()
    t0 = time.monotonic()
    with pytest.raises(TrainingStopped, match=r"^step 1: generation: generation ran out of memory on cpu for \d+ "
                                              r"sequences of up to 11 prompt tokens \+ 8 new tokens.*reduce the prompt "
                                              r"length, train\.max_new_tokens \(now 8\).*engine_options\.micro_batch.*"
                                              r"retrying the same batch cannot help") as err:
        check_and_train(TrainConfig(**{**CFG, "eval_samples": 0, "engine_retries": 3, "engine_retry_delay_s": 10.0}),
                        policy_dir=policy_dir, train_rows=tr, test_rows=te, run_dir=tmp_path / "run")
    assert calls["n"] == 1, "an out-of-memory was retried"
    assert time.monotonic() - t0 < 60  # no 10 s + 20 s + 40 s of retry delays
    assert isinstance(err.value.__cause__, OutOfMemory)


def test_prefect_does_not_retry_an_out_of_memory_stop() -> None:
    from prefect.states import Failed

    from tasks.training import run_training, should_retry

    oom = Failed(data=TrainingStopped("step 1: generation ran out of memory"))
    assert should_retry(run_training, None, oom) is False
