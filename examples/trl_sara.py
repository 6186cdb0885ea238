"""SARA inside TRL's GRPOTrainer: the one-class switch, on CPU in well under two minutes.

    python examples/trl_sara.py                      # tiny random chat model built locally, 6 steps
    python examples/trl_sara.py --quick              # 2 steps (what the test runs)
    python examples/trl_sara.py --model PATH         # a local causal LM with a chat template

Everything is offline: the rows are rlvr-alloc's arithmetic problems, the
default model is a random tiny Qwen2 (tests/models/chat_model.py). A random
model almost never answers correctly, so without ``--model`` the reward is a
toy one (1 when the completion contains the answer's first digit) that gives
mixed groups to allocate; with ``--model`` it is the arithmetic verifier.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="local model folder (default: build a tiny random one)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="2 steps")
    ap.add_argument("--allocator", default="sara", help="any registered allocator: grpo, dapo, sara, vigor, ...")
    a = ap.parse_args()

    from datasets import Dataset
    from trl import GRPOConfig

    from rlvr_core.data.arithmetic import make_arithmetic
    from rlvr_core.integrations.trl import AllocatedGRPOTrainer
    from rlvr_core.rewards.arithmetic import verify_arithmetic

    rows = [dict(r) for r in make_arithmetic(64, 0, seed=0, digits=(1, 2))["train"]]
    for r in rows:
        r["prompt"] = [{"role": "user", "content": r["prompt"]}]
    ds = Dataset.from_list(rows)

    def correct(completions, answer, **kw):  # the arithmetic verifier, one score per completion
        return [verify_arithmetic(c[0]["content"], {"answer": ans}) for c, ans in zip(completions, answer)]

    def first_digit(completions, answer, **kw):  # toy reward for a random model
        return [1.0 if str(ans).lstrip("-")[0] in c[0]["content"] else 0.0 for c, ans in zip(completions, answer)]

    tmp = tempfile.TemporaryDirectory()
    model = a.model
    if model is None:
        from tests.models.chat_model import build_chat_model

        model = str(build_chat_model(Path(tmp.name) / "tiny-chat"))
    reward = correct if a.model else first_digit

    args = GRPOConfig(output_dir=str(Path(tmp.name) / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, max_steps=2 if a.quick else a.steps, learning_rate=1e-4,
                      use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0)
    trainer = AllocatedGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds,
                                   allocator=a.allocator,
                                   allocator_params={"tau_low": 0.5} if a.allocator == "sara" else {})
    trainer.train()

    print(f"\n{a.allocator} inside TRL: per step (from TRL's logs)")
    print("step  rollouts  rounds  committed  abandoned  effective_groups  reward")
    for rec in trainer.state.log_history:
        if "allocation/rollouts" in rec:
            print(f"{rec['step']:>4}  {rec['allocation/rollouts']:>8.0f}  {rec['allocation/rounds']:>6.0f}  "
                  f"{rec['allocation/committed']:>9.0f}  {rec['allocation/abandoned']:>9.0f}  "
                  f"{rec['allocation/effective_groups']:>16.0f}  {rec['reward']:.3f}")
    tot = trainer.allocation_history
    eff = sum(h["effective_groups"] for h in tot)
    print(f"total: {sum(h['rollouts'] for h in tot):.0f} rollouts, {eff:.0f} effective groups")
    tmp.cleanup()


if __name__ == "__main__":
    main()
