"""Run under ``accelerate launch --multi_gpu --num_processes 2`` with use_cpu=True (gloo):
AllocatedGRPOTrainer on gloo; each rank writes JSON.

argv: model_dir out_dir allocator steps
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from datasets import Dataset  # noqa: E402

from rlvr_core.integrations.trl import AllocatedGRPOTrainer  # noqa: E402
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config  # noqa: E402

model, out, allocator, steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
reward = ScriptedReward()
args = grpo_config(out / "run", per_device_train_batch_size=4, max_steps=steps)
tr = AllocatedGRPOTrainer(model=model, reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_list(arithmetic_rows(48)), allocator=allocator)
tr.train()
rank = tr.accelerator.process_index
logs = [{k: v for k, v in rec.items() if k.startswith("allocation/")} for rec in tr.state.log_history
        if "allocation/rollouts" in rec]
(out / f"rank{rank}.json").write_text(json.dumps({
    "world": tr.accelerator.num_processes, "history": tr.allocation_history, "logged": logs,
    "scored": reward.rows, "backend": str(tr.accelerator.state.backend),
}))
