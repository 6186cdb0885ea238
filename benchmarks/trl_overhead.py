"""AllocatedGRPOTrainer under TRL 1.16 on CPU: per-step overhead and rollouts per effective group.

1. Overhead: plain ``GRPOTrainer`` and ``AllocatedGRPOTrainer(allocator="grpo")`` on the
   same tiny local chat model and rows, run alternately (``--repeats`` runs of
   ``--steps`` steps each, interleaved so load on the machine hits both alike);
   per-step wall clock is TRL's own ``step_time`` (generation + scoring + loss +
   backward of one step), the first step of every run dropped. Target:
   median overhead < 10%.
2. Rollouts per effective group for sara and dapo: under TRL (the trainer
   generating with the tiny model) and with rlvr-alloc's own allocation loop
   (``rlvr_core.allocation.run_allocation_step``) on the same rows, the same
   prompt order and the same scripted reward (known pass rates 0 / 0.5 / 1 by
   row; see tests/integrations/trl_setup.py). Rewards do not depend on the
   completion text, so the two must agree exactly when the integration feeds the
   allocator what its own loop does.

Writes benchmarks/results/trl_overhead/trl.json and trl.md (``--out DIR``: the results root, DIR/trl_overhead/).

    python -m benchmarks.trl_overhead            # ~2-4 min on a busy 2-core machine
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, output_dir
from rlvr_core.rollout import RolloutEngine
from tests.integrations.trl_setup import ScriptedReward, arithmetic_rows, grpo_config, tiny_model


class ScriptedEngine(RolloutEngine):
    """rlvr-alloc's engine protocol with the scripted reward rule (no text)."""

    def __init__(self, rows: list[dict]) -> None:
        self.rate = [r["pass_rate"] for r in rows]

    def generate(self, requests):
        from rlvr_core.types import Rollouts

        pid, rew = [], []
        for q, n in requests.items():
            for j in range(n):  # within one call, a 0.5 prompt alternates 1, 0, ...
                pid.append(q)
                p = self.rate[q]
                rew.append((1.0 if j % 2 == 0 else 0.0) if p == 0.5 else p)
        return Rollouts(np.asarray(pid, np.int64), np.asarray(rew), np.full(len(pid), 6, np.int64))


def step_times(trainer) -> list[float]:
    return [rec["step_time"] for rec in trainer.state.log_history if "step_time" in rec]


def overhead(model: str, ds, out: Path, steps: int, repeats: int) -> dict:
    from trl import GRPOTrainer

    from rlvr_core.integrations.trl import AllocatedGRPOTrainer

    times: dict[str, list[float]] = defaultdict(list)
    for rep in range(repeats):
        for name in ("plain", "grpo"):
            args = grpo_config(out / f"{name}{rep}", max_steps=steps)
            if name == "plain":
                tr = GRPOTrainer(model=model, reward_funcs=[ScriptedReward()], args=args, train_dataset=ds)
            else:
                tr = AllocatedGRPOTrainer(model=model, reward_funcs=[ScriptedReward()], args=args, train_dataset=ds,
                                          allocator="grpo")
            tr.train()
            times[name].extend(step_times(tr)[1:])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"steps_per_run": steps, "runs_each": repeats, "samples": {k: len(v) for k, v in times.items()},
            "median_step_s": med, "overhead": med["grpo"] / med["plain"] - 1.0, "target": 0.10,
            "step_times_s": dict(times)}


def rollouts_per_group(model: str, ds, rows: list[dict], out: Path, steps: int) -> dict:
    from rlvr_core.allocation import make_allocator, run_allocation_step
    from rlvr_core.integrations.trl import AllocatedGRPOTrainer, SamplerOrderSource

    res = {}
    for name in ("sara", "dapo"):
        tr = AllocatedGRPOTrainer(model=model, reward_funcs=[ScriptedReward()],
                                  args=grpo_config(out / name, max_steps=steps), train_dataset=ds, allocator=name)
        tr.train()
        h = tr.allocation_history
        trl = {"rollouts": sum(x["rollouts"] for x in h), "effective_groups": sum(x["effective_groups"] for x in h),
               "rounds": sum(x["rounds"] for x in h)}
        # rlvr-alloc's own loop, same parameters, same prompt order, same reward rule
        alloc = make_allocator(name, **tr.allocator_params)
        src = SamplerOrderSource(len(rows), tr.allocator_params["batch_size"], seed=tr.args.seed)
        eng = ScriptedEngine(rows)
        own = {"rollouts": 0, "effective_groups": 0, "rounds": 0}
        for _ in range(steps):
            _, st = run_allocation_step(alloc, eng, src)
            own["rollouts"] += st.rollouts
            own["effective_groups"] += st.effective_groups
            own["rounds"] += st.rounds
        for d in (trl, own):
            d["rollouts_per_effective_group"] = d["rollouts"] / max(d["effective_groups"], 1)
        res[name] = {"params": tr.allocator_params, "steps": steps, "trl": trl, "rlvr_alloc": own,
                     "equal": trl == own}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--alloc-steps", type=int, default=12)
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args()
    import trl
    from datasets import Dataset

    rows = arithmetic_rows(48)
    ds = Dataset.from_list(rows)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tiny_model(tmp / "chat")
        ov = overhead(model, ds, tmp, a.steps, a.repeats)
        rpg = rollouts_per_group(model, ds, rows, tmp, a.alloc_steps)
    result = {
        "what": "AllocatedGRPOTrainer vs plain GRPOTrainer, tiny Qwen2 chat model (hidden 64, 2 layers), CPU, "
                "per_device_train_batch_size=8, num_generations=4, max_completion_length=6",
        "trl": trl.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "overhead": ov, "rollouts_per_effective_group": rpg, "wall_s": time.time() - t0,
    }
    out = output_dir(Path(a.out), "trl_overhead")
    (out / "trl.json").write_text(json.dumps(result, indent=2))
    m = ov["median_step_s"]
    lines = [
        "# AllocatedGRPOTrainer under TRL (written by benchmarks/trl_overhead.py)", "",
        f"TRL {trl.__version__}, CPU, tiny chat model; {result['what']}.", "",
        "## Per-step wall clock, allocator=grpo vs plain GRPOTrainer", "",
        "| trainer | median s/step | steps measured |", "|---|---|---|",
        f"| plain GRPOTrainer | {m['plain']:.4f} | {ov['samples']['plain']} |",
        f"| AllocatedGRPOTrainer(grpo) | {m['grpo']:.4f} | {ov['samples']['grpo']} |", "",
        f"Overhead: {100 * ov['overhead']:+.1f}% (target < {100 * ov['target']:.0f}%: "
        f"{'met' if ov['overhead'] < ov['target'] else 'MISSED'}). {a.repeats} alternating runs of {a.steps} steps "
        "each, first step of each run dropped.", "",
        f"## Rollouts per effective group, {a.alloc_steps} steps, scripted reward (pass rates 0 / 0.5 / 1)", "",
        "| allocator | under TRL | rlvr-alloc's own loop | rollouts (TRL / own) | identical |", "|---|---|---|---|---|",
    ]
    for name, r in rpg.items():
        lines.append(f"| {name} | {r['trl']['rollouts_per_effective_group']:.2f} | "
                     f"{r['rlvr_alloc']['rollouts_per_effective_group']:.2f} | {r['trl']['rollouts']} / "
                     f"{r['rlvr_alloc']['rollouts']} | {'yes' if r['equal'] else 'no'} |")
    (out / "trl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
