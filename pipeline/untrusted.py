"""A flow run's parameters are untrusted where someone else chose them (docs/design.md §8.7).

A deployment's run (``prefect deployment run train/sara -p ...``, flows/serve.py, flows/deploy.py) takes its
parameters from whoever may submit flow runs to the server, and runs them with the rights of the user who
serves the deployments. Everything such a run is given is checked here, in one place, before anything is
read, generated or tracked:

- ``out_dir`` must resolve (links followed) to a folder under ``runs/deployments/`` of the project root:
  never a DVC stage's output, never a folder outside the project;
- ``params_file`` must resolve inside the project root and be a regular file of at most
  ``MAX_PARAMS_BYTES``, owned by the serving user and not writable by others: checked on the descriptor
  it is opened with, once, and read from that descriptor; the flow loads that text, never the name again;
- engine options that name a program, its environment, a file it writes, a server's URL or a token file
  (``REFUSED_ENGINE_OPTIONS``) are refused, from the overrides and from the params file alike: a run of a
  deployment starts its own engine, set up on the serving machine;
- an evaluation reads checkpoints of the project's runs only (``runs/``, ``experiment/``), and writes no
  DVC stage output (reports/evaluation.json); the checkpoint it evaluates is the folder the check resolved
  (against the project root, links followed), passed on as that absolute path.

The sizes a run may ask for (threads, batch sizes, budgets) are checked with the other params when the
params load (``rlvr_core.config``), before the MLflow run opens, for every run alike. Error messages name
the parameter and never quote the content of a file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from pipeline.paths import root
from rlvr_core.errors import ConfigError, short_repr

# engine options that choose the program a run starts, its arguments, its environment (LD_PRELOAD...) or files
# it writes: kept for local use, refused where params come from someone else
LAUNCH_OPTIONS = ("server_python", "server_script", "server_args", "server_env", "weights_dir", "log_path")
# engine options that send the run's requests (and a token) elsewhere: a listener of another user would get them
NETWORK_OPTIONS = ("url", "token_file")
REFUSED_ENGINE_OPTIONS = LAUNCH_OPTIONS + NETWORK_OPTIONS
MAX_PARAMS_BYTES = 1 << 20  # params.yaml is a few KB
DEPLOYMENT_RUNS = ("runs", "deployments")  # where a deployment's run folders go, under the project root


def deployment_id() -> str:
    """The Prefect deployment the current flow run belongs to ('' for a flow started by hand or by dvc)."""
    from prefect.runtime import deployment

    return str(deployment.id or "")


def _inside(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def check_out_dir(out_dir: Any) -> Path:
    """The run folder ``out_dir`` names, resolved; ConfigError unless it lies under runs/deployments/."""
    top = (root() / Path(*DEPLOYMENT_RUNS)).resolve()
    if not isinstance(out_dir, str) or not out_dir.strip() or "\0" in out_dir:
        raise ConfigError(f"out_dir = {short_repr(out_dir)}: give a folder name under {'/'.join(DEPLOYMENT_RUNS)}/")
    path = (root() / out_dir).resolve()  # links followed: runs/deployments/x -> /etc resolves to /etc
    if not _inside(path, top) or path == top:
        raise ConfigError(f"out_dir = {short_repr(out_dir)}: resolves to {path}, outside {top}; a run of a "
                          f"deployment writes only under {'/'.join(DEPLOYMENT_RUNS)}/ (leave out_dir out: it gets "
                          f"{'/'.join(DEPLOYMENT_RUNS)}/<flow run name>/)")
    return path


class CheckedParams(NamedTuple):
    """A deployment's params file as its checks saw it: the resolved path (for messages, and for the worker's
    check that it is committed) and the text read from the descriptor the checks ran on."""

    path: Path
    text: str


def _refuse_params(params_file: Any, why: str) -> ConfigError:
    return ConfigError(f"params_file = {short_repr(params_file)}: {why}")


def _check_params_fd(fd: int, params_file: Any) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse_params(params_file, "not a regular file")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise _refuse_params(params_file, f"must belong to the serving user and be writable by no one else (it is "
                                          f"{stat.filemode(st.st_mode)}, uid {st.st_uid})")
    if st.st_size > MAX_PARAMS_BYTES:
        raise _refuse_params(params_file, f"{st.st_size:,} bytes, more than a params file holds (at most "
                                          f"{MAX_PARAMS_BYTES:,})")


def _read_bounded(fd: int, params_file: Any) -> bytes:
    """At most MAX_PARAMS_BYTES from ``fd``; a file that grew past them since its fstat is refused."""
    chunks, size = [], 0
    while chunk := os.read(fd, MAX_PARAMS_BYTES + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_PARAMS_BYTES:
            raise _refuse_params(params_file, f"more than a params file holds (at most {MAX_PARAMS_BYTES:,} bytes)")
    return b"".join(chunks)


def check_params_file(params_file: Any) -> CheckedParams:
    """The params file ``params_file`` names, resolved against the project root and opened once; ConfigError
    unless it is a regular file inside the project root, of this user's, not writable by others and at most
    MAX_PARAMS_BYTES. The checks run on the open descriptor (``fstat``) and the text is read from that same
    descriptor, so the file checked is the file read: the flow hands the text on (``flows.common.load``) and
    never opens the name again, which the working directory, a swapped file or a link could make another
    file. Its content is never quoted."""
    if not isinstance(params_file, str) or not params_file.strip() or "\0" in params_file:
        raise ConfigError(f"params_file = {short_repr(params_file)}: give a params file inside the project")
    top = root()
    path = (top / params_file).resolve()
    if not _inside(path, top):
        raise ConfigError(f"params_file = {short_repr(params_file)}: resolves outside the project ({top}); a run of "
                          "a deployment reads params files of the project only")
    try:  # O_NOFOLLOW: a link swapped in since resolve() is refused; O_NONBLOCK: a FIFO does not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"params_file = {short_repr(params_file)}: {e.strerror}") from None
    try:
        _check_params_fd(fd, params_file)
        if os.path.isdir("/proc/self/fd"):  # a folder on the way swapped for a link since resolve(): where it went
            reached = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if reached != path:
                raise ConfigError(f"params_file = {short_repr(params_file)}: opened {reached}, not {path} (the path "
                                  "changed while it was checked); a run of a deployment reads params files of the "
                                  "project only")
        data = _read_bounded(fd, params_file)
    finally:
        os.close(fd)
    try:
        return CheckedParams(path, data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _refuse_params(params_file, f"not UTF-8 text (byte {e.start})") from None


def refuse_engine_options(engine_options: Mapping[str, Any], where: str,
                          refused: tuple[str, ...] = REFUSED_ENGINE_OPTIONS) -> None:
    """ConfigError naming every key of ``refused`` that ``engine_options`` set, in a run of ``where``."""
    given = [k for k in refused if k in engine_options]
    if given:
        raise ConfigError(f"train.engine_options.{', train.engine_options.'.join(given)}: refused in a run of {where}, "
                          "where params come from whoever runs the deployment or commits the params file; these "
                          "options choose a program to run (or its environment, or files it writes), or a server "
                          "that would receive the run's requests and token. Set up the engine on the serving "
                          "machine itself (the default .venv-vllm beside the installed project) and drop them from "
                          "the params (docs/cluster.md)")


def check_train_parameters(overrides: Any, params_file: Any,
                           out_dir: Any) -> tuple[CheckedParams | None, Path | None]:
    """A deployment's train run: ``overrides`` a mapping with no refused engine option, ``params_file`` and
    ``out_dir`` as above. Returns the checked params file (None: none given) and the checked run folder (None:
    the default runs/deployments/<name>/)."""
    where = f"deployment {deployment_id()}"
    if overrides is not None:
        if not isinstance(overrides, Mapping) or not all(isinstance(k, str) for k in overrides):
            raise ConfigError(f"overrides = {short_repr(overrides)}: give a mapping of train keys to values")
        options = overrides.get("engine_options") or {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"overrides.engine_options = {short_repr(options)}: give a mapping")
        refuse_engine_options(options, where)
    checked = check_params_file(params_file) if params_file is not None else None
    return checked, (check_out_dir(out_dir) if out_dir is not None else None)


def check_evaluate_parameters(checkpoint: Any, run: Any, nightly: Any,
                              params_file: Any) -> tuple[CheckedParams | None, Path | None]:
    """A deployment's evaluate run: the nightly pass, or a checkpoint or run of the project's runs; never the
    default pass, which writes reports/evaluation.json (a DVC stage's output). Returns the checked params file
    (None: none given) and the checkpoint folder resolved against the project root (None: none given), which
    is the folder the run then evaluates."""
    checked = check_params_file(params_file) if params_file is not None else None
    if not isinstance(nightly, bool):
        raise ConfigError(f"nightly = {short_repr(nightly)}: true or false")
    if checkpoint is not None:
        if not isinstance(checkpoint, str) or "\0" in checkpoint:
            raise ConfigError(f"checkpoint = {short_repr(checkpoint)}: give a checkpoint folder under runs/")
        path = (root() / checkpoint).resolve()
        tops = [(root() / "runs").resolve(), (root() / "experiment").resolve()]
        if not any(_inside(path, t) and path != t for t in tops):
            raise ConfigError(f"checkpoint = {short_repr(checkpoint)}: resolves to {path}, outside runs/ and "
                              "experiment/; a run of a deployment evaluates the project's checkpoints only")
        return checked, path
    elif run is not None:
        if not isinstance(run, str) or not run or "/" in run or "\0" in run or run in (".", ".."):
            raise ConfigError(f"run = {short_repr(run)}: give a run folder's name under runs/ (<allocator>-s<seed>)")
    elif not nightly:
        raise ConfigError("a run of a deployment evaluates the nightly pass (nightly: true), a checkpoint or a run; "
                          "the default pass writes reports/evaluation.json, a DVC stage's output: run it with "
                          "`python -m flows.evaluate` or `dvc repro`")
    return checked, None


__all__ = ["DEPLOYMENT_RUNS", "LAUNCH_OPTIONS", "MAX_PARAMS_BYTES", "NETWORK_OPTIONS", "REFUSED_ENGINE_OPTIONS",
           "CheckedParams", "check_evaluate_parameters", "check_out_dir", "check_params_file", "check_train_parameters",
           "deployment_id", "refuse_engine_options"]
