#!/usr/bin/env bash
# GPU check: the HF rollout engine and the training loop on one CUDA GPU in bf16 with the
# tiny policy; where trl is importable, also TRL's GRPOTrainer and AllocatedGRPOTrainer(sara)
# on a tiny local chat model (s/step of each). Prints rollouts/s, tokens/s and s/step; fails
# loudly (exit 1, "GPU CHECK FAILED") if anything runs on the CPU instead of the GPU or not in bf16.
#
# Needs torch (CUDA), transformers, numpy, scipy, pyyaml, safetensors; no internet, no vllm,
# no datasets (rows are made here; the optional TRL part uses TRL's own datasets dependency).
# Runs in well under 8 minutes (hard limit: 470 s).
#
#   scripts/gpu_check.sh                 # on the GPU machine
#   scripts/gpu_check.sh --allow-cpu     # dry run of the same logic on a CPU-only machine
#   scripts/gpu_check.sh --out check.json --steps 20
#
# PYTHON selects the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 DO_NOT_TRACK=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
LIMIT_S="${GPU_CHECK_LIMIT_S:-470}"

set +e
timeout --signal=TERM --kill-after=10 "$LIMIT_S" "$PYTHON" - "$@" <<'PY'
"""The body of scripts/gpu_check.sh (see there)."""
import argparse
import importlib
import json
import os
import sys
import tempfile
import time


def fail(msg: str) -> None:
    print("\n" + "!" * 78, file=sys.stderr)
    print(f"GPU CHECK FAILED: {msg}", file=sys.stderr)
    print("!" * 78, file=sys.stderr)
    sys.exit(1)


ap = argparse.ArgumentParser(prog="gpu_check.sh")
ap.add_argument("--allow-cpu", action="store_true",
                help="without CUDA, run the same checks on the CPU (a dry run of the script's logic)")
ap.add_argument("--steps", type=int, default=None, help="training steps (default 20 on GPU, 2 on CPU)")
ap.add_argument("--out", default=None, help="write the measurements here as JSON")
args = ap.parse_args()

missing = []
for mod in ("torch", "transformers", "numpy", "scipy", "yaml", "safetensors", "tokenizers"):
    try:
        importlib.import_module(mod)
    except ImportError as e:
        missing.append(f"{mod} ({e})")
if missing:
    fail("missing Python packages: " + ", ".join(missing))

import numpy as np  # noqa: E402
import torch  # noqa: E402

# ------------------------------------------------------------------------ device
if torch.cuda.is_available():
    device = "cuda"
    dry = False
    props = torch.cuda.get_device_properties(0)
    if not torch.cuda.is_bf16_supported():
        fail(f"{props.name} does not support bf16")
    where = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, torch {torch.__version__}"
elif args.allow_cpu:
    device = "cpu"
    dry = True
    where = f"CPU (DRY RUN, --allow-cpu), torch {torch.__version__}"
else:
    fail(f"torch.cuda.is_available() is False (torch {torch.__version__}, built for CUDA "
         f"{torch.version.cuda}); this would run on the CPU. Use --allow-cpu for a dry run.")
print(f"[gpu-check] device: {where}", flush=True)

from rlvr_core.config import TrainConfig  # noqa: E402
from rlvr_core.data.arithmetic import OPS, make_row  # noqa: E402
from rlvr_core.models.tiny import build_tiny_policy, num_parameters, save_policy  # noqa: E402
from rlvr_core.models.warmstart import warm_start  # noqa: E402
from rlvr_core.rollout.hf import HFEngine  # noqa: E402
import rlvr_core.training as training  # noqa: E402

assert "vllm" not in sys.modules, "the GPU check must not need vllm"
BF16 = torch.bfloat16


class DeviceGuard:
    """Forward hooks that record where the policy ran: input ids and LM-head output device and dtype."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.calls = 0
        self.problems: list[str] = []

    def attach(self, model: torch.nn.Module, label: str) -> torch.nn.Module:
        def on_model(mod, a, kw, out):
            ids = kw.get("input_ids", a[0] if a else None)
            self.calls += 1
            if ids is not None and ids.device.type != self.device_type:
                self.problems.append(f"{label}: input_ids on {ids.device}")

        def on_head(mod, a, out):
            if out.device.type != self.device_type:
                self.problems.append(f"{label}: lm_head output on {out.device}")
            if out.dtype != BF16:
                self.problems.append(f"{label}: lm_head output is {out.dtype}, not bf16")

        model.register_forward_hook(on_model, with_kwargs=True)
        model.lm_head.register_forward_hook(on_head)
        return model

    def check(self, what: str) -> None:
        if self.calls == 0:
            fail(f"{what}: the policy never ran a forward pass")
        if self.problems:
            uniq = sorted(set(self.problems))
            fail(f"{what}: {len(self.problems)} forward passes off the {self.device_type} bf16 path, e.g. {uniq[:3]}")


def problems(n: int, seed: int) -> list[tuple[int, str, int]]:
    """n distinct arithmetic problems (operands below 100) without the datasets package."""
    rng = np.random.default_rng(seed)
    seen: dict[tuple[int, str, int], None] = {}
    while len(seen) < n:
        op = OPS[int(rng.integers(len(OPS)))]
        a = int(rng.integers(0, 100))
        b = int(rng.integers(1, 10)) if op == "*" else int(rng.integers(0, a + 1 if op == "-" else 100))
        seen[(a, op, b)] = None
    return list(seen)


def rows(items: list[tuple[int, str, int]], split: str) -> list[dict]:
    return [make_row(split, i, a, op, b) for i, (a, op, b) in enumerate(items)]


results: dict = {"device": where, "dry_run": dry}
work = tempfile.mkdtemp(prefix="gpu_check_")
t_all = time.perf_counter()

# -------------------------------------------------------------- HF engine in bf16
model, tok = build_tiny_policy(seed=0)
model = model.to(device=device, dtype=BF16)
if any(p.device.type != device or p.dtype != BF16 for p in model.parameters()):
    fail("model.to(device, bfloat16) left parameters elsewhere")
if device == "cuda" and torch.cuda.memory_allocated() == 0:
    fail("no CUDA memory allocated after moving the model to the GPU")
guard = DeviceGuard(device)
guard.attach(model, "hf-engine")
n_prompts, k, rounds = (512, 8, 5) if not dry else (32, 4, 2)
prompts = [r["prompt"] for r in rows(problems(n_prompts, seed=1), "bench")]
eng = HFEngine(model, tok, prompts, max_new_tokens=8, seed=0, micro_batch=4096 if not dry else 512, device=device)
eng.generate({i: 2 for i in range(min(64, n_prompts))})  # warm-up (kernels, allocator)
if device == "cuda":
    torch.cuda.synchronize()
t0 = time.perf_counter()
n_roll = n_tok = 0
for _ in range(rounds):
    ro = eng.generate({i: k for i in range(n_prompts)})
    n_roll += len(ro)
    n_tok += int(ro.tokens.sum())
if device == "cuda":
    torch.cuda.synchronize()
dt = time.perf_counter() - t0
guard.check("HF engine")
results["hf_engine"] = {"rollouts": n_roll, "tokens": n_tok, "seconds": dt, "rollouts_per_s": n_roll / dt,
                        "tokens_per_s": n_tok / dt, "rollouts_per_round": n_prompts * k,
                        "parameters": num_parameters(model)}
print(f"[gpu-check] HF engine, bf16: {n_roll} rollouts, {n_tok} tokens in {dt:.2f} s = "
      f"{n_roll / dt:,.0f} rollouts/s, {n_tok / dt:,.0f} tokens/s ({n_prompts * k} rollouts per round)", flush=True)
del eng, model

# ------------------------------------------------------- training loop, bf16 autocast
pool = problems(2300, seed=2)  # disjoint splits: the training loop refuses overlap
train_rows, test_rows = rows(pool[:2000], "train"), rows(pool[2000:], "test")
t0 = time.perf_counter()
warm_start(train_rows, steps=300 if not dry else 30, seed=0, out_dir=os.path.join(work, "policy"),
           log_every=10**9)
print(f"[gpu-check] warm start (CPU, {300 if not dry else 30} steps): {time.perf_counter() - t0:.1f} s", flush=True)

train_guard = DeviceGuard(device)
_load_policy = training.load_policy


def guarded_load_policy(folder, *, device="cpu"):
    """training.load_policy with the device guard attached to every model it loads."""
    m, t = _load_policy(folder, device=device)
    return train_guard.attach(m, "training"), t


training.load_policy = guarded_load_policy
steps = args.steps or (20 if not dry else 2)
# no rollout budget: the default max_rollouts (12,000) ends a 64-group SARA run after about 5 steps
cfg = TrainConfig(allocator="sara", steps=steps, max_rollouts=None, batch_size=64 if not dry else 8, k=8,
                  eval_every=0, eval_size=256 if not dry else 16, eval_samples=8, checkpoint_every=steps, seed=0)
if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
with torch.autocast(device_type=device, dtype=BF16):
    res = training.check_and_train(cfg, policy_dir=os.path.join(work, "policy"), train_rows=train_rows,
                                   test_rows=test_rows, run_dir=os.path.join(work, "run"), device=device)
wall = time.perf_counter() - t0
training.load_policy = _load_policy
train_guard.check("training loop")
recs = [r for r in res.metrics if r.get("step", 0) >= 1]
if len(recs) != steps:
    fail(f"training ran {len(recs)} steps, expected {steps}")
timed = recs[1:] or recs  # the first step pays one-off costs
step_s = float(np.mean([r["step_s"] - r.get("eval_s", 0.0) for r in timed]))
gen_s = sum(r["generate_s"] for r in timed)
rolls = sum(r["rollouts"] for r in timed)
toks = sum(r["tokens"] for r in timed)
updates = sum(1 for r in recs if not r.get("update_skipped"))
if updates == 0:
    fail("no training step performed an update (no mixed groups?): the backward pass was never exercised")
peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else 0.0
if device == "cuda" and peak <= 0:
    fail("the training loop allocated no CUDA memory")
results["training"] = {"steps": steps, "seconds_per_step": step_s, "wall_seconds": wall,
                       "generate_rollouts_per_s": rolls / max(gen_s, 1e-9), "generate_tokens_per_s": toks / max(gen_s, 1e-9),
                       "rollouts_per_step": rolls / len(timed), "updates": updates, "peak_cuda_mib": peak,
                       "final_eval": res.final_eval}
print(f"[gpu-check] training (sara, bf16 autocast): {step_s:.3f} s/step over {len(timed)} steps, "
      f"{rolls / len(timed):.0f} rollouts/step, generation {rolls / max(gen_s, 1e-9):,.0f} rollouts/s "
      f"{toks / max(gen_s, 1e-9):,.0f} tokens/s, {updates} updates, peak {peak:.0f} MiB", flush=True)

# ------------------------------------------- TRL: GRPOTrainer vs AllocatedGRPOTrainer(sara)
try:
    import trl  # noqa: F401  (trl and accelerate are pure-Python wheels; the check runs only where they are)
except ImportError as e:
    trl = None
    print(f"[gpu-check] TRL: not importable ({e}); TRL check skipped", flush=True)
if trl is not None:
    from datasets import Dataset  # noqa: E402  (a TRL dependency)
    from trl import GRPOConfig, GRPOTrainer  # noqa: E402

    from rlvr_core.integrations.trl import AllocatedGRPOTrainer  # noqa: E402
    from tests.models.chat_model import build_chat_model  # noqa: E402

    chat_dir = str(build_chat_model(os.path.join(work, "trl-chat")))
    trl_rows = rows(problems(256, seed=3), "trl")
    for r in trl_rows:
        r["prompt"] = [{"role": "user", "content": r["prompt"]}]
    trl_ds = Dataset.from_list(trl_rows)

    def first_digit(completions, answer, **kw):
        """Toy binary reward that gives a random model mixed groups: the answer's first digit appears."""
        return [1.0 if str(a).lstrip("-")[0] in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]

    trl_steps = 10 if not dry else 2
    bs, gens, comp = (64, 8, 16) if not dry else (8, 4, 6)
    results["trl"] = {"version": trl.__version__, "steps": trl_steps, "per_device_train_batch_size": bs,
                      "num_generations": gens, "max_completion_length": comp}
    for label in ("plain", "sara"):
        cfg_trl = GRPOConfig(output_dir=os.path.join(work, f"trl-{label}"), per_device_train_batch_size=bs,
                             num_generations=gens, max_completion_length=comp, max_steps=trl_steps,
                             use_cpu=dry, bf16=not dry, report_to="none", logging_steps=1, save_strategy="no",
                             disable_tqdm=True, seed=0, learning_rate=1e-5)
        kw = dict(model=chat_dir, reward_funcs=[first_digit], args=cfg_trl, train_dataset=trl_ds)
        t0 = time.perf_counter()
        trainer = GRPOTrainer(**kw) if label == "plain" else AllocatedGRPOTrainer(allocator="sara", **kw)
        trainer.train()
        wall = time.perf_counter() - t0
        where_p = {p.device.type for p in trainer.model.parameters()}
        if where_p != {device}:
            fail(f"TRL {label}: the model's parameters are on {where_p}, not {device}")
        st = [r["step_time"] for r in trainer.state.log_history if "step_time" in r]
        if len(st) != trl_steps:
            fail(f"TRL {label}: {len(st)} logged steps, expected {trl_steps}")
        timed_st = st[1:] or st
        entry = {"seconds_per_step": float(np.median(timed_st)), "wall_seconds": wall}
        if label == "sara":
            hist = trainer.allocation_history
            entry.update(rollouts_per_step=float(np.mean([h["rollouts"] for h in hist])),
                         effective_groups_per_step=float(np.mean([h["effective_groups"] for h in hist])),
                         rounds_per_step=float(np.mean([h["rounds"] for h in hist])))
        results["trl"][label] = entry
        extra = (f", {entry['rollouts_per_step']:.0f} rollouts/step, {entry['rounds_per_step']:.1f} rounds/step, "
                 f"{entry['effective_groups_per_step']:.1f} effective groups/step") if label == "sara" else ""
        name = "GRPOTrainer" if label == "plain" else "AllocatedGRPOTrainer(sara)"
        print(f"[gpu-check] TRL {trl.__version__} {name}: {entry['seconds_per_step']:.3f} s/step (median of "
              f"{len(timed_st)}){extra}", flush=True)
        del trainer
results["total_seconds"] = time.perf_counter() - t_all
if args.out:
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2, default=float)
if dry:
    print(f"[gpu-check] DRY RUN PASSED on CPU in {results['total_seconds']:.0f} s (--allow-cpu): "
          "the script's logic works; this is not a GPU check", flush=True)
else:
    print(f"[gpu-check] GPU CHECK PASSED in {results['total_seconds']:.0f} s on {where}", flush=True)
PY
rc=$?
set -e
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "GPU CHECK FAILED: over the ${LIMIT_S} s limit" >&2
  exit 1
fi
exit $rc
