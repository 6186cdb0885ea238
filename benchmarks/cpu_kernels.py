"""CPU kernels and replication: which kernels make a training stage's bytes depend on the machine, and what pinning
them costs.

    python -m benchmarks.cpu_kernels [--steps 30] [--rounds 3] [--out DIR]

Prepares the default pipeline (params.yaml: data, the recorded warm start) in a temporary root, then trains
`python -m flows.train --allocator grpo --steps S` there under each kernel setting, --rounds times, the settings
interleaved in every round so that a loaded machine slows them alike:

- `pinned`: the pipeline's default (flows.common.CPU_KERNELS: torch's vectorised kernels at AVX2 width, MKL's
  AVX2 code path);
- `pinned, AVX2-only MKL`: the same, with MKL told the processor has no AVX-512 (MKL_ENABLE_INSTRUCTIONS=AVX2), as
  on an AVX2 machine;
- `native`: the processor's own choice (RLVR_CPU_KERNELS=native);
- `native torch, pinned MKL` and `pinned torch, native MKL`: one of the two pinned, which says which kernels part.

Each run's results are hashed (final policy, metrics.jsonl); its seconds are its training loop's
(train_timings.json), evaluations included, and each setting's cost is the median over rounds of its seconds over
pinned's in the same round.
Writes cpu_kernels.json and cpu_kernels.csv (benchmarks/results/cpu_kernels/ for the default --steps and
--rounds, else a temporary folder unless --out names one). Takes about 20 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import output_dir, results_dir

ROOT = Path(__file__).resolve().parent.parent
FULL = {"steps": 30, "rounds": 3}
SETTINGS: dict[str, dict[str, str]] = {
    "pinned": {},
    "pinned, AVX2-only MKL": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "native": {"RLVR_CPU_KERNELS": "native"},
    "native torch, pinned MKL": {"RLVR_CPU_KERNELS": "native", "MKL_CBWR": "AVX2"},
    "pinned torch, native MKL": {"RLVR_CPU_KERNELS": "native", "ATEN_CPU_CAPABILITY": "avx2"},
}
KERNEL_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "RLVR_CPU_KERNELS")


def base_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARS and k != "PREFECT_API_URL"}
    env.update(RLVR_ROOT=str(root), PREFECT_HOME=str(root / ".prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300", DO_NOT_TRACK="1", DVC_NO_ANALYTICS="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("RLVR_PARAMS", None)
    return env


def run(env: dict[str, str], *args: str) -> None:
    p = subprocess.run([sys.executable, "-m", *args], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=7200)
    if p.returncode != 0:
        raise SystemExit(f"cpu_kernels: {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def prepare(root: Path) -> None:
    shutil.copytree(ROOT / "artifacts", root / "artifacts")
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    for flow in ("flows.prepare", "flows.warmstart"):
        print(f"cpu_kernels: {flow}", flush=True)
        run(base_env(root), flow)


def train_once(root: Path, name: str, extra: dict[str, str], steps: int) -> dict:
    """One training run under the kernel setting ``extra``: its results' hash, the seconds of its training loop
    (train_timings.json: generation, update and evaluations; not the process's start) and of its evaluations."""
    out = root / "runs" / name
    run(dict(base_env(root), **extra), "flows.train", "--allocator", "grpo", "--steps", str(steps), "--out",
        f"runs/{name}")
    digest = hashlib.sha256()
    for f in ("final_model/model.safetensors", "metrics.jsonl"):
        digest.update((out / f).read_bytes())
    timings = json.loads((out / "train_timings.json").read_text())
    shutil.rmtree(out)
    return {"sha256": digest.hexdigest(), "train_s": round(float(timings["seconds"]), 3),
            "eval_s": round(float(timings["eval_s"]), 3)}


def summarize(runs: list[dict]) -> dict:
    """Per setting: its distinct hashes, median seconds, and the median over rounds of its seconds / pinned's."""
    out = {}
    for name in SETTINGS:
        mine = [r for r in runs if r["setting"] == name]
        ratios = [r["train_s"] / p["train_s"] for r in mine for p in runs
                  if p["setting"] == "pinned" and p["round"] == r["round"] and p["train_s"] > 0]
        out[name] = {"env": SETTINGS[name], "hashes": sorted({r["sha256"] for r in mine}),
                     "median_train_s": statistics.median(r["train_s"] for r in mine),
                     "median_ratio_to_pinned": round(statistics.median(ratios), 3) if ratios else None,
                     "ratios_to_pinned": [round(x, 3) for x in ratios]}
    pinned = out["pinned"]["hashes"]
    out["same_as_pinned"] = {n: out[n]["hashes"] == pinned for n in SETTINGS}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=FULL["steps"])
    ap.add_argument("--rounds", type=int, default=FULL["rounds"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    full = a.steps == FULL["steps"] and a.rounds == FULL["rounds"]
    dest = output_dir(results_dir(a.out, full, "cpu_kernels"), "cpu_kernels")
    runs = []
    with tempfile.TemporaryDirectory(prefix="cpu-kernels-") as tmp:
        root = Path(tmp)
        prepare(root)
        for rnd in range(a.rounds):
            for i, (name, extra) in enumerate(SETTINGS.items()):
                r = {"round": rnd, "setting": name, **train_once(root, f"r{rnd}-{i}", extra, a.steps)}
                runs.append(r)
                print(f"cpu_kernels: round {rnd + 1}/{a.rounds} {name}: {r['train_s']:.1f} s, {r['sha256'][:12]}",
                      flush=True)
    cpu = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True, env=base_env(Path(tempfile.gettempdir()))).stdout.strip()
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    result = {"steps": a.steps, "rounds": a.rounds, "allocator": "grpo", "processor": model,
              "native_capability": cpu, "summary": summarize(runs), "runs": runs}
    (dest / "cpu_kernels.json").write_text(json.dumps(result, indent=1) + "\n")
    with open(dest / "cpu_kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["round", "setting", "sha256", "train_s", "eval_s"])
        w.writeheader()
        w.writerows(runs)
    print(json.dumps(result["summary"], indent=1))
    print(f"cpu_kernels: wrote {dest / 'cpu_kernels.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
