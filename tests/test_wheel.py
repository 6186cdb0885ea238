"""A light library install: the wheel, with only its base dependencies, runs the README's example.

The wheel is built offline from a copy of the sources (``pip wheel --no-deps --no-build-isolation
--no-index``) and installed into a fresh venv that sees nothing of this environment but the distributions
the wheel's base requirements need (its ``Requires-Dist`` without extras, followed through their own
requirements): a directory of links to them, named by a .pth file. Prefect, MLflow, DVC and TRL are
outside it, so the test fails if rlvr_core needs one of them, or anything its base requirements leave out.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "rlvr_core", "flows", "tasks")
PIPELINE_ONLY = ("prefect", "mlflow", "dvc", "trl")

pytestmark = pytest.mark.slow


def _build_wheel(tmp: Path) -> Path:
    """The project's wheel, built from a copy of its sources (the checkout is left untouched); skips when
    this environment cannot build one offline (no setuptools)."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    try:
        md.version("setuptools")
    except md.PackageNotFoundError:
        pytest.skip("building the wheel offline (--no-build-isolation) needs setuptools in this environment")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return next((tmp / "dist").glob("rlvr_alloc-*.whl"))


def _base_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines()
            if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _closure(reqs: list[Requirement]) -> dict[str, md.Distribution]:
    """{name: distribution} of this environment needed by ``reqs``, their extras and their own requirements."""
    found: dict[str, md.Distribution] = {}
    todo = [(r, "") for r in reqs]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        dist = md.distribution(req.name)  # PackageNotFoundError: a base requirement this environment lacks
        key = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        wanted = [""] + sorted(req.extras)
        if key in found and not req.extras:
            continue
        found[key] = dist
        for sub in dist.requires or []:
            todo += [(Requirement(sub), e) for e in wanted]
    return found


def _link_distributions(dists: dict[str, md.Distribution], into: Path) -> None:
    """Links in ``into`` to each distribution's top-level files and folders (its modules and its .dist-info)."""
    into.mkdir()
    for name, dist in dists.items():
        assert dist.files is not None, f"{name}: installed without a RECORD; cannot tell its files"
        for top in sorted({f.parts[0] for f in dist.files}):
            if top in ("..", "__pycache__") or top.endswith(".pth") or (into / top).exists():
                continue
            (into / top).symlink_to(Path(dist.locate_file(top)))


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and links to its base dependencies only; its python."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(tmp)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True, timeout=360)
    py = tmp / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=900)
    assert inst.returncode == 0, inst.stderr[-3000:]
    dists = _closure(_base_requirements(wheel))
    assert not set(PIPELINE_ONLY) & set(dists), f"a base requirement pulls in {set(PIPELINE_ONLY) & set(dists)}"
    _link_distributions(dists, tmp / "deps")
    (site / "base_deps.pth").write_text(str(tmp / "deps") + "\n")
    return py


def _run(py: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([str(py), "-I", "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


def test_base_dependencies_leave_the_pipeline_out() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    base = text.split("dependencies = [", 1)[1].split("]\n", 1)[0]
    assert not [p for p in PIPELINE_ONLY if re.search(rf'"{p}\b', base)], base
    assert re.search(r'^pipeline = \[.*"prefect.*"mlflow.*"dvc', text, re.M)
    assert ".[dev,trl,pipeline]" in (ROOT / "Makefile").read_text()  # make install keeps the whole stack


def test_the_readme_example_runs_on_the_light_install(light_venv: Path, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "SimulatedEngine" in b)
    code = ("import rlvr_core, sys\n"
            f"assert not rlvr_core.__file__.startswith({str(ROOT)!r}), rlvr_core.__file__\n"
            + block +
            "import rlvr_core.config, rlvr_core.training, rlvr_core.cli  # the CPU default path's imports\n"
            f"assert not [m for m in {PIPELINE_ONLY!r} if m in sys.modules]\n")
    out = _run(light_venv, code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rollouts, effective, abandoned = (int(x) for x in out.stdout.split())
    assert rollouts > 0 and 0 < effective <= 32 and abandoned >= 0


def test_the_pipeline_and_trl_are_absent_and_the_trl_integration_names_its_extra(light_venv: Path,
                                                                                 tmp_path: Path) -> None:
    for mod in PIPELINE_ONLY:
        out = _run(light_venv, f"import {mod}", tmp_path)
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, (mod, out.stderr[-500:])
    out = _run(light_venv, "import rlvr_core.integrations.trl", tmp_path)
    assert out.returncode != 0
    assert "ImportError: rlvr_core.integrations.trl needs TRL" in out.stderr, out.stderr[-1500:]
    assert "pip install 'rlvr-alloc[trl]'" in out.stderr
