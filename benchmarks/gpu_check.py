"""The GPU check's record: scripts/gpu_check.sh run on a GPU machine, its measurements kept with the machine.

    python -m benchmarks.gpu_check              # on the GPU machine: writes benchmarks/results/gpu_check/
    python -m benchmarks.gpu_check --out DIR    # DIR/gpu_check/ (the results root, as every benchmark takes it)
    python -m benchmarks.gpu_check --allow-cpu  # a dry run of the script's logic; writes a temporary folder

Writes gpu_check.json (the script's own --out: rollouts/s of the HF engine, s/step of the training loop and of
TRL's trainers, peak memory) and gpu_check.txt (nvidia-smi's name, memory and driver, the torch, transformers and
TRL versions, and the script's [gpu-check] lines). A failed check writes nothing and exits with the script's code.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, output_dir

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
VERSIONS = ("import importlib.metadata as m\n"
            "for n in ('torch', 'transformers', 'trl'):\n"
            "    try: print(n, m.version(n))\n"
            "    except m.PackageNotFoundError: print(n, 'not installed')\n")


def machine_lines(python: str) -> list[str]:
    """The GPU's name, memory and driver (nvidia-smi, where it exists) and the packages' versions."""
    lines = []
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"],
                             capture_output=True, text=True, timeout=60)
        lines += smi.stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as e:
        lines.append(f"nvidia-smi: not run ({e.__class__.__name__})")
    got = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, timeout=120)
    return lines + got.stdout.strip().splitlines()


def run(out_root: Path, python: str, extra: list[str]) -> int:
    """Run the check into a scratch folder; on success write gpu_check.json and gpu_check.txt under out_root."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        got = Path(tmp) / "gpu_check.json"
        proc = subprocess.Popen(["bash", str(SCRIPT), "--out", str(got), *extra], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHON": python} if python else None)
        lines = []
        for line in proc.stdout:  # progress as it comes
            sys.stdout.write(line)
            if line.startswith("[gpu-check]"):
                lines.append(line.rstrip("\n"))
        if proc.wait() != 0 or not got.is_file():
            print(f"gpu_check: the check failed (exit {proc.returncode}); nothing written", file=sys.stderr)
            return proc.returncode or 1
        folder = output_dir(out_root, "gpu_check")
        (folder / "gpu_check.json").write_text(got.read_text())
    (folder / "gpu_check.txt").write_text("\n".join(machine_lines(python or sys.executable) + lines) + "\n")
    print(f"wrote {folder / 'gpu_check.json'} and {folder / 'gpu_check.txt'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="the results root (default benchmarks/results/)")
    ap.add_argument("--allow-cpu", action="store_true", help="dry run on a CPU; writes a temporary folder")
    ap.add_argument("--python", default="", help="the interpreter the check runs under (default: the script's)")
    args = ap.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu-check-dry-")) if args.allow_cpu else RESULTS)
    return run(out, args.python, ["--allow-cpu"] if args.allow_cpu else [])


if __name__ == "__main__":
    sys.exit(main())
