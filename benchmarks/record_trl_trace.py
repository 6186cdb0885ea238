"""Record the replay benchmark's TRL trace: a plain TRL ``GRPOTrainer`` with ``RolloutLogCallback``.

    python -m benchmarks.record_trl_trace [--steps 30] [--out benchmarks/replay/trl_tiny_scripted.parquet]

The model and data are those of the TRL integration tests (tests/integrations/trl_setup.py): the tiny random
Qwen2-style chat model built offline (tests/models/chat_model.py), 48 arithmetic prompts, and the tests'
scripted reward, whose per-prompt pass rates are fixed by construction (0, 0.5 and 1 in turn; the 0.5 prompts
alternate pass and fail within a call). A random model would fail every arithmetic prompt, so a real verifier
would log nothing but all-fail groups; this trace therefore exercises the recording path of any TRL run and gives
the leaderboard a population with known, stationary pass rates, not a learning policy. Writes the trace and its
provenance file (``.json`` beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # a run sets its environment before numpy loads; an import leaves the caller's alone
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

OUT = Path(__file__).resolve().parent / "replay" / "trl_tiny_scripted.parquet"


def record(out: Path, steps: int) -> None:
    from datasets import Dataset
    from trl import GRPOTrainer

    from rlvr_core.integrations.trl import RolloutLogCallback
    from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        log = RolloutLogCallback(out)
        trainer = GRPOTrainer(model=tiny_model(Path(tmp) / "chat"), reward_funcs=[log.wrap(ScriptedReward())],
                              args=grpo_config(Path(tmp) / "run", max_steps=steps),
                              train_dataset=Dataset.from_list(arithmetic_rows(48)), callbacks=[log])
        trainer.train()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    record(args.out, args.steps)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    meta = {"regime": "trl-tiny-scripted (tests/integrations/trl_setup.py)",
            "recorder": "rlvr_core.integrations.trl.RolloutLogCallback on trl.GRPOTrainer", "commit": commit,
            "command": f"python -m benchmarks.record_trl_trace --steps {args.steps}",
            "notes": "tiny random chat model, 48 prompts, 2 prompts x 4 generations a step, scripted per-prompt "
                     "pass rates 0 / 0.5 / 1 (not a learning policy)"}
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} and its provenance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
