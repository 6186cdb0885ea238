"""Shared flow helpers: params loading with overrides, --set parsing, JSON writing, Prefect run id, torch's
threads and kernels, and tie_children (every process this one starts, servers included, ends with it, also after
SIGKILL)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline import untrusted
from pipeline.paths import params_path
from rlvr_core.config import Params, load_params
from rlvr_core.config import parse_set as _parse_set
from rlvr_core.safefs import write_text_atomic


def load(params_file: str | None = None, overrides: Mapping[str, Mapping[str, Any]] | None = None,
         checked: untrusted.CheckedParams | None = None) -> Params:
    """Validated params (file from ``params_file`` / $RLVR_PARAMS / params.yaml); raises ConfigError on bad values.

    ``checked``: a deployment's params file as pipeline.untrusted read it; its text is loaded, and no file is
    opened again (the name could reach another file from here: another working directory, a swapped file)."""
    if checked is not None:
        return load_params(checked.path, overrides=overrides, text=checked.text)
    return load_params(params_path(params_file), overrides=overrides)


# The CPU kernels every stage runs, whatever the processor offers (docs/design.md, "Replication"): torch's vectorised
# kernels (softmax, norms, reductions) at AVX2 width and MKL's AVX2 code path (conditional numerical
# reproducibility). On an AVX-512 machine either native choice changes a training run's bytes (measured:
# benchmarks/results/cpu_kernels.json), so without these a lock written on one x86 machine is not replicated on
# another. Any x86-64 machine with AVX2 runs the same code paths.
CPU_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def fix_cpu(threads: int) -> None:
    """Run torch's CPU work on ``threads`` threads (params ``train.threads``), whatever $OMP_NUM_THREADS says, and
    on the kernels of ``CPU_KERNELS``, whatever the processor offers: float sums depend on both, so a stage's
    results must not depend on the environment or the machine. Torch and MKL read their kernel choice once, at
    their first kernel, so this runs before any tensor is computed: a stage's process (`python -m flows.<name>`)
    always starts with it. Where it comes too late (a flow called inside a process that has computed already)
    or the processor has no AVX2, it warns that the results may differ from a dvc.lock written elsewhere.
    ``RLVR_CPU_KERNELS=native`` keeps the processor's own choice (faster on AVX-512; results then replicate on
    that kind of machine only)."""
    import torch

    if os.environ.get("RLVR_CPU_KERNELS") == "native":  # the processor's fastest kernels; results stay on it
        torch.set_num_threads(threads)
        return
    os.environ.update(CPU_KERNELS)
    torch.set_num_threads(threads)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX2":
        why = ("this processor has no AVX2" if capability == "DEFAULT" else
               f"torch chose its {capability} kernels before this process pinned them")
        print(f"warning: {why}, so these results may differ from a dvc.lock written on another machine",
              file=sys.stderr)


def parse_set(items: Sequence[str], params_file: str | None = None) -> dict[str, Any]:
    """``--set`` items ['lr=5e-5', 'k=4'] -> {'lr': 5e-05, 'k': 4}, values read as params.yaml reads them;
    ConfigError names the params file and ``train.<key>`` and says the value came from --set."""
    return _parse_set(items, params_path(params_file))


def refuse_launch_options(engine_options: Mapping[str, Any], worker: bool = False) -> None:
    """ConfigError when ``engine_options`` (the loaded params: file and overrides) set a key of
    pipeline.untrusted.REFUSED_ENGINE_OPTIONS in a run whose params come from elsewhere: a deployment run (its
    parameters come from whoever may run deployments, its params file from the deployed commit) or a worker
    ($RLVR_DVC_REMOTE). A params file could otherwise make the worker run any program, or send its requests and
    a token to another user's listener."""
    dep = untrusted.deployment_id()
    where = f"deployment {dep}" if dep else ("a worker ($RLVR_DVC_REMOTE)" if worker else "")
    if where:
        untrusted.refuse_engine_options(engine_options, where)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as sorted, indented JSON atomically, never through a link planted at ``path``
    (rlvr_core.safefs: a fresh O_EXCL | O_NOFOLLOW name in a folder of this user's, renamed over it)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=float) + "\n")


def flow_run_id() -> str:
    """The current Prefect flow run id ('' outside a flow run)."""
    from prefect.runtime import flow_run

    return str(flow_run.id or "")


_watchdog: subprocess.Popen | None = None
LIFELINE = "RLVR_LIFELINE"  # the tokens of the watchdogs a process's ancestors started, ':'-separated

# The watchdog: waits for its parent (argv[1]) to end, however it ends, then ends every process whose
# environment carries its token (argv[2]): SIGTERM, and SIGKILL to those still there after 5 s.
_WATCHDOG = r"""
import os, signal, sys, time
parent, token = int(sys.argv[1]), sys.argv[2]
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
while os.getppid() == parent:
    time.sleep(0.5)
def holders():
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            val = next((e.split(b"=", 1)[1] for e in env if e.startswith(b"RLVR_LIFELINE=")), b"")
            if token.encode() in val.split(b":"):
                found.append(int(d))
    return found
t0 = time.monotonic()
while (pids := holders()) and time.monotonic() - t0 < 30:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM if time.monotonic() - t0 < 5 else signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.5)
"""


def tie_children() -> None:
    """Make every process this one starts from now on (and their children, in any session or process group)
    end when this process ends, also on SIGKILL: a watchdog child waits for this process and then ends each
    process whose environment carries its token ($RLVR_LIFELINE, inherited through os.environ and through
    env dicts copied from it). Servers that outlive a killed flow or test run (a temporary Prefect server,
    an MLflow server) are what it is for. Needs /proc (Linux); elsewhere it does nothing. Once per process."""
    if os.environ.get("RLVR_LIFELINE_PID") == str(os.getpid()) or not os.path.isdir("/proc/self"):
        return
    global _watchdog
    token = secrets.token_hex(8)
    _watchdog = subprocess.Popen([sys.executable, "-I", "-c", _WATCHDOG, str(os.getpid()), token],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    os.environ[LIFELINE] = ":".join(filter(None, [os.environ.get(LIFELINE), token]))
    os.environ["RLVR_LIFELINE_PID"] = str(os.getpid())


def tied(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus this process's lifeline tokens (tie_children first): a child started with an environment of
    its own then ends with this process too."""
    tie_children()
    tokens = f"{env.get(LIFELINE, '')}:{os.environ.get(LIFELINE, '')}".split(":")
    return {**env, LIFELINE: ":".join(dict.fromkeys(t for t in tokens if t))}
