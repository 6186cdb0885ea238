"""Flows on work-pool workers: inputs come from the DVC remote, outputs go back to it.

Off unless $RLVR_DVC_REMOTE names a DVC remote (a name from `dvc remote list`, or a URL, added to the
clone's .dvc/config.local), so `make run` and local flows behave as before; inside `dvc repro` (DVC sets
DVC_STAGE) it is off too, since DVC itself records the stage there.

On a worker (a fresh clone made by the Prefect pull step):
  setup()      before anything is computed: the clone is a DVC repo, the remote exists, has credentials
               and answers, MLFLOW_TRACKING_URI is a tracking server that answers, the params file is
               in the repository; each failure is a ConfigError naming what is missing
  pull(...)    `dvc pull` of what a stage needs: the outputs of the stages it depends on (data, warm
               start) and its own outputs (the checkpoints of a run it resumes)
  publish(...) `dvc commit` of the stage + `dvc push`, then dvc.lock and the run's small git-tracked files
               (the summary metric, tracking.json) committed and pushed to the branch the worker cloned
               ($RLVR_GIT_BRANCH overrides it; a clone at a detached HEAD, a deployment of a tag, needs it),
               so the next clone (another worker, a laptop) pulls exactly these outputs and resumes or
               evaluates them; `dvc status` there is clean. When another worker pushed first, this one
               fetches the branch, puts its stage's entry into that dvc.lock and pushes again (bounded retries)
$RLVR_GIT_PUSH=0 leaves the git commit local (then push dvc.lock yourself).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlparse

from pipeline.paths import params_path, root
from rlvr_core.errors import ConfigError
from rlvr_core.safefs import write_atomic, write_text_atomic

ENV = "RLVR_DVC_REMOTE"
BRANCH_ENV = "RLVR_GIT_BRANCH"  # the branch workers publish dvc.lock to (default: the branch the clone is on)
PUSH_TRIES = 6
URL_REMOTE = "rlvr-worker"  # the name a URL given in $RLVR_DVC_REMOTE is registered under
PROBE_TIMEOUT_S = 20.0


def remote_name() -> str | None:
    """$RLVR_DVC_REMOTE, or None (local mode, or inside `dvc repro`)."""
    if os.environ.get("DVC_STAGE"):
        return None
    return os.environ.get(ENV) or None


def _run(cmd: list[str], cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed in {cwd} (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return p


def dvc(*args: str, cwd: Path | None = None, timeout: float = 1800) -> str:
    """Run the dvc CLI of this interpreter's environment in ``cwd`` (default the root)."""
    return _run([sys.executable, "-m", "dvc", *args], cwd or root(), timeout).stdout


def git(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["git", *args], cwd or root(), 120, check)


# ------------------------------------------------------------------ checks before compute

def _credentials_missing(scheme: str, conf: dict[str, Any]) -> str | None:
    """What is missing for the remote's credentials, or None when some credentials are there."""
    env, home = os.environ, Path(os.environ.get("HOME", "~")).expanduser()
    if scheme == "s3":
        if conf.get("access_key_id") and conf.get("secret_access_key"):
            return None
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            return None
        if conf.get("profile") or env.get("AWS_PROFILE") or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") \
                or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
            return None
        creds = conf.get("credentialpath") or env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"
        if Path(creds).expanduser().is_file():
            return None
        return ("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or "
                f"`dvc remote modify --local <remote> access_key_id/secret_access_key`), or write {creds}")
    if scheme == "ssh":
        if conf.get("password") or conf.get("ask_password") or env.get("SSH_AUTH_SOCK"):
            return None
        keys = [conf["keyfile"]] if conf.get("keyfile") else [home / ".ssh" / n for n in
                                                              ("id_ed25519", "id_rsa", "id_ecdsa")]
        if any(Path(k).expanduser().is_file() for k in keys):
            return None
        return ("no SSH credentials: no ssh-agent (SSH_AUTH_SOCK), no key file (" + ", ".join(map(str, keys)) +
                "), no password (`dvc remote modify --local <remote> keyfile|password ...`)")
    return None


def _probe(fn: Callable[[], Any], timeout: float) -> BaseException | None:
    """Run ``fn`` in a thread; its exception, a TimeoutError after ``timeout``, or None."""
    box: list[BaseException | None] = [TimeoutError(f"no answer in {timeout:.0f} s")]

    def target() -> None:
        try:
            fn()
            box[0] = None
        except BaseException as e:  # noqa: BLE001
            box[0] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return box[0]


def check_remote(name: str, top: Path) -> str:
    """Resolve ``name`` to a configured remote of the DVC repo at ``top``, with credentials, that answers;
    returns the remote name. ConfigError names what is missing."""
    if not (top / ".dvc").is_dir():
        raise ConfigError(f"{ENV}={name}: {top} is not a DVC repository (no .dvc/); commit the .dvc/ folder "
                          "(`dvc init`, `dvc remote add -d <name> <url>`) to the repository the workers clone")
    from dvc.repo import Repo

    if "://" in name or name.startswith("/"):
        dvc("remote", "add", "--local", "--force", URL_REMOTE, name, cwd=top)
        name = URL_REMOTE
    with Repo(str(top)) as repo:
        remotes = repo.config.get("remote", {})
        if name not in remotes:
            raise ConfigError(f"{ENV}={name}: no DVC remote of that name in {top / '.dvc' / 'config'} "
                              f"(configured: {', '.join(sorted(remotes)) or 'none'}); `dvc remote add {name} <url>` "
                              "or set the variable to the remote's URL")
        conf = dict(remotes[name])
        url = str(conf.get("url", ""))
        scheme = urlparse(url).scheme if "://" in url else ""
        if scheme in ("", "file"):  # a directory: a shared/NFS mount on every worker
            path = Path(urlparse(url).path if scheme else url)
            path = path if path.is_absolute() else (top / ".dvc" / path).resolve()
            if not path.is_dir():
                raise ConfigError(f"DVC remote {name!r} ({url}) is unreachable from this worker: {path} is not a "
                                  "directory (mount the shared storage here, or fix the remote's url)")
            if not os.access(path, os.W_OK):
                raise ConfigError(f"DVC remote {name!r} ({url}): {path} is not writable by this worker")
            return name
        if (missing := _credentials_missing(scheme, conf)) is not None:
            raise ConfigError(f"DVC remote {name!r} ({url}): {missing}")
        try:
            remote = repo.cloud.get_remote(name)
        except Exception as e:  # noqa: BLE001 - e.g. the dvc-s3 / dvc-ssh plugin is not installed
            raise ConfigError(f"DVC remote {name!r} ({url}) cannot be opened on this worker: {e}") from None
        if (err := _probe(lambda: remote.fs.exists(remote.path), PROBE_TIMEOUT_S)) is not None:
            raise ConfigError(f"DVC remote {name!r} ({url}) is unreachable from this worker "
                              f"({err.__class__.__name__}: {str(err)[:300]})") from None
    return name


def check_tracking_server(uri: str) -> None:
    """A worker logs to one MLflow server: ``uri`` must be http(s) and answer /health."""
    if not uri.startswith(("http://", "https://")):
        raise ConfigError(f"{ENV} is set (a worker) but the MLflow tracking URI is {uri}: its runs would stay in "
                          "this temporary clone; set MLFLOW_TRACKING_URI=http://<tracking server>:<port> "
                          "(see docs/cluster.md)")
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10) as r:
            if r.status == 200:
                return
            err = f"HTTP {r.status}"
    except (OSError, urllib.error.URLError) as e:
        err = f"{e.__class__.__name__}: {e}"
    raise ConfigError(f"MLflow tracking server {uri} is unreachable ({err}); a worker does not start without it, "
                      "since its spool (<run folder>/mlflow_spool.jsonl) would stay in this temporary clone. "
                      "Once a run has started, an outage is still spooled there and replayed when the server is back")


def check_params_file(params_file: str | None, top: Path) -> Path:
    """The params file the flow reads must be a file committed to the repository at ``top``."""
    path = params_path(params_file)
    path = path if path.is_absolute() else (top / path)
    rel = path.resolve().relative_to(top.resolve()) if path.resolve().is_relative_to(top.resolve()) else None
    tracked = rel is not None and git("ls-files", "--error-unmatch", str(rel), cwd=top, check=False).returncode == 0
    if not path.is_file() or not tracked:
        raise ConfigError(f"params file {params_file or path}: not in the repository this worker cloned "
                          f"({top}); commit it and deploy again (flows.deploy --params <path inside the repository>)")
    return path


# ------------------------------------------------------------------ the stage graph

def _stages(top: Path) -> list[tuple[str, list[str], list[str]]]:
    """(addressing, output paths, dependency paths) of every dvc.yaml stage (params excluded)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    with Repo(str(top)) as repo:
        return [(st.name, [str(o.def_path) for o in st.outs],
                 [str(d.def_path) for d in st.deps if not isinstance(d, ParamsDependency)])
                for st in repo.index.stages]


@dataclass
class Remote:
    """A worker's link to the DVC remote ``name`` for the clone at ``top``."""

    name: str
    top: Path

    def stage_of(self, run: Path) -> str | None:
        """The dvc.yaml stage whose outputs include run folder ``run``'s checkpoints."""
        rel = str((run / "checkpoints").resolve().relative_to(self.top.resolve()))
        return next((a for a, outs, _ in _stages(self.top) if rel in outs), None)

    def needs(self, stages: Iterable[str]) -> list[str]:
        """Every stage of ``stages`` plus the stages producing their dependencies (transitively)."""
        graph = _stages(self.top)
        producer = {o: a for a, outs, _ in graph for o in outs}
        deps = {a: d for a, _, d in graph}
        todo, seen = list(stages), []
        while todo:
            st = todo.pop()
            if st in seen:
                continue
            seen.append(st)
            todo += [producer[d] for d in deps.get(st, []) if d in producer]
        return seen

    def pull(self, stages: Iterable[str], upstream_required: bool = True) -> None:
        """`dvc pull` the outputs of ``stages`` and of everything they depend on; outputs dvc.lock does not
        record yet (a stage never run) are skipped, except (``upstream_required``) those of the stages
        ``stages`` depend on, whose absence is a ConfigError naming them."""
        stages = list(stages)
        targets = self.needs(stages)
        if not targets:
            return
        try:
            out = dvc("pull", "--remote", self.name, "--allow-missing", *targets, cwd=self.top)
        except RuntimeError as e:
            raise ConfigError(f"dvc pull from remote {self.name!r} failed (were the outputs `dvc push`ed by the "
                              f"machine that made them?): {str(e)[-1500:]}") from None
        print(f"remote: pulled {', '.join(sorted(targets))} from {self.name}: {out.strip().splitlines()[-1:]}")
        if upstream_required:
            outs = {a: o for a, o, _ in _stages(self.top)}
            missing = [f"{p} ({a})" for a in targets if a not in stages for p in outs[a] if not (self.top / p).exists()]
            if missing:
                raise ConfigError(f"not in dvc.lock or not in DVC remote {self.name!r}: {', '.join(missing)}; on the "
                                  "machine that has them: `dvc repro <stage> && dvc push`, "
                                  "then commit and push dvc.lock")

    def training_stages(self) -> list[str]:
        """Every stage with a checkpoints output (train@<allocator>-<seed>, experiment)."""
        return [a for a, outs, _ in _stages(self.top) if any(o.endswith("/checkpoints") for o in outs)]

    def publish(self, stage: str, files: Iterable[Path] = ()) -> str:
        """Record ``stage`` in dvc.lock, push its outputs, commit dvc.lock + ``files`` to git and push the
        commit to the publish branch (publish_branch); returns the commit."""
        dvc("commit", "--force", stage, cwd=self.top)
        dvc("push", "--remote", self.name, stage, cwd=self.top)
        rels = ["dvc.lock"] + [str(Path(f).resolve().relative_to(self.top.resolve()))
                               for f in files if Path(f).is_file()]
        self._commit(stage, rels)
        if os.environ.get("RLVR_GIT_PUSH", "1") != "0":
            self._git_push(stage, rels, publish_branch(self.top))
        return git("rev-parse", "HEAD", cwd=self.top).stdout.strip()

    def _commit(self, stage: str, rels: list[str]) -> None:
        git("add", "--force", *rels, cwd=self.top)
        if git("diff", "--cached", "--quiet", cwd=self.top, check=False).returncode != 0:
            who = [] if git("config", "user.email", cwd=self.top, check=False).stdout.strip() else \
                ["-c", "user.name=rlvr-worker", "-c", "user.email=rlvr-worker@localhost"]
            git(*who, "commit", "-q", "-m", f"{stage}: outputs pushed to DVC remote {self.name}", cwd=self.top)

    def _git_push(self, stage: str, rels: list[str], branch: str, tries: int = PUSH_TRIES) -> None:
        """Push HEAD to origin/``branch``; when another worker pushed first, fetch theirs, put this worker's
        ``stage`` entry into their dvc.lock and ``rels`` over their files, commit and push again."""
        said = ""
        for attempt in range(tries):
            pushed = git("push", "-q", "origin", f"HEAD:refs/heads/{branch}", cwd=self.top, check=False)
            if pushed.returncode == 0:
                return
            said = (pushed.stdout + pushed.stderr).strip()[-1000:]
            if git("fetch", "-q", "origin", branch, cwd=self.top, check=False).returncode != 0:
                continue  # e.g. the branch does not exist yet: the next push creates it
            self._onto_fetched(stage, rels)
            time.sleep(random.uniform(0.0, 0.5 * (attempt + 1)))  # two workers retrying do not collide again
        raise RuntimeError(f"git push of dvc.lock to origin/{branch} failed {tries} times (another worker kept "
                           f"pushing first, or the push is refused); the outputs are in DVC remote {self.name}: "
                           f"`dvc commit {stage}` there is what is missing; the last `git push` said: {said}")

    def _onto_fetched(self, stage: str, rels: list[str]) -> None:
        """Move this clone to FETCH_HEAD, keeping this worker's ``stage`` entry of dvc.lock (merged into the
        fetched dvc.lock with DVC's own YAML reader and writer) and its other ``rels``; commit them."""
        from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

        ours = parse_yaml_for_update(git("show", "HEAD:dvc.lock", cwd=self.top).stdout, "dvc.lock")
        if stage not in ours.get("stages", {}):
            raise RuntimeError(f"dvc.lock of this worker has no entry for stage {stage}; nothing to publish")
        shown = git("show", "FETCH_HEAD:dvc.lock", cwd=self.top, check=False)
        theirs = parse_yaml_for_update(shown.stdout, "dvc.lock") if shown.returncode == 0 else {}
        theirs = theirs or {"schema": ours.get("schema", "2.0")}
        theirs.setdefault("stages", {})[stage] = ours["stages"][stage]
        kept = {r: (self.top / r).read_bytes() for r in rels[1:] if (self.top / r).is_file()}
        git("reset", "-q", "--hard", "FETCH_HEAD", cwd=self.top)
        # the fetched tree is another worker's: a link it holds at one of these names is replaced, never written
        # through (rlvr_core.safefs)
        for r, data in kept.items():
            write_atomic(self.top / r, data)
        write_text_atomic(self.top / "dvc.lock", dumps_yaml(theirs))
        self._commit(stage, rels)


def check_branch_name(branch: str, source: str, top: Path | None = None) -> str:
    """``branch`` when git accepts it as a branch name (`git check-ref-format --branch`: no "..", no space,
    no leading "-", no ".lock" ending, ...); otherwise a ConfigError naming ``source`` (the variable or option
    that gave it). A name git refuses would only fail at the push, after the training."""
    ok = "@{" not in branch and subprocess.run(  # "@{-1}" would be resolved to a previous branch, not checked
        ["git", "check-ref-format", "--branch", branch], cwd=top, capture_output=True, text=True,
        timeout=60).returncode == 0
    if not ok:
        raise ConfigError(f"{source}={branch!r}: not a valid git branch name (`git check-ref-format --branch` "
                          "refuses it: no '..', '@{', spaces, control characters, '~^:?*[\\', leading '-' or "
                          "'/', trailing '/', '.' or '.lock'); set it to the branch the workers publish dvc.lock to")
    return branch


def publish_branch(top: Path) -> str:
    """The branch a worker publishes dvc.lock to: $RLVR_GIT_BRANCH, else the branch the clone is on. A clone at a
    detached HEAD (a deployment of a tag or a commit: flows.deploy --ref) has none, and a ConfigError says so;
    a $RLVR_GIT_BRANCH git refuses as a branch name is a ConfigError too (check_branch_name)."""
    if branch := os.environ.get(BRANCH_ENV, "").strip():
        return check_branch_name(branch, BRANCH_ENV, top)
    head = git("symbolic-ref", "-q", "--short", "HEAD", cwd=top, check=False)
    if head.returncode != 0:
        raise ConfigError(f"this clone ({top}) is at a detached HEAD (a deployment of a tag or a commit, "
                          "flows.deploy --ref <tag>), so there is no branch to publish dvc.lock to: set "
                          f"{BRANCH_ENV}=<branch> in the worker's environment (flows.deploy --publish-branch), "
                          "or RLVR_GIT_PUSH=0 to keep the commit local")
    return head.stdout.strip()


def setup(params_file: str | None = None) -> Remote | None:
    """None in local mode; on a worker, every check of this module before compute, then the Remote."""
    name = remote_name()
    if name is None:
        return None
    from pipeline.tracking import tracking_uri

    top = root()
    name = check_remote(name, top)
    check_tracking_server(tracking_uri())
    check_params_file(params_file, top)
    if os.environ.get("RLVR_GIT_PUSH", "1") != "0":
        publish_branch(top)  # a detached HEAD with no $RLVR_GIT_BRANCH, or a bad branch name, is refused here
    return Remote(name, top)


def prepare_training(sync: Remote, out: Path, params: Any) -> str:
    """The stage training into ``out``, after checking dvc.lock can record this run honestly and pulling its
    inputs and the checkpoints it resumes."""
    from rlvr_core.config import load_params

    stage = sync.stage_of(out)
    if stage is None:
        raise ConfigError(f"{ENV} is set but no dvc.yaml stage writes {out / 'checkpoints'}: only a stage's outputs "
                          "can be pushed; add the allocator to train.allocators and the seed to train.seeds in "
                          "params.yaml")
    committed = load_params(sync.top / "params.yaml")
    for sec in ("prepare", "train"):
        ours, theirs = vars(getattr(params, sec)), vars(getattr(committed, sec))
        skip = {"allocator", "seed"} if stage.startswith("train@") else set()  # its cmd passes --allocator, --seed
        if diff := {k: v for k, v in ours.items() if k not in skip and theirs.get(k) != v}:
            raise ConfigError(f"{ENV} is set: dvc.lock records stage {stage} with the params of params.yaml, but this "
                              f"run's {sec} differs ({diff}); commit the change to params.yaml and deploy that commit "
                              "instead of passing it as a flow parameter")
    sync.pull([stage])
    return stage
