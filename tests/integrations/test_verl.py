"""rlvr_core.integrations.verl against verl 0.9.1's own code, in verl's environment (.venv-verl).

verl pins transformers<5.11 and tensordict<=0.10, so it cannot live in this suite's environment; `make verl-env`
builds .venv-verl (CI does, in .ci/run) and this test runs tests/integrations/verl_cases.py there with
`.venv-verl/bin/python -m pytest`. Without that environment it is skipped with the reason. In this environment:
the module imports without verl, and its public helpers refuse what they should.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = Path(os.environ.get("RLVR_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))


def test_module_imports_without_verl():
    code = ("import sys, rlvr_core.integrations.verl as v; "
            "assert 'verl' not in sys.modules and 'transfer_queue' not in sys.modules; print(v.STATE_DIR)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "allocator_state"


def test_check_state_names_the_field():
    from rlvr_core.integrations.verl import TOTALS, check_state

    totals = {k: 3 for k in TOTALS}
    good = {"allocator": "sara", "params": {}, "state": {}, "source": {}, "history": [{"rollouts": 3}],
            "totals": totals}
    check_state(good, "x")
    with pytest.raises(ValueError, match="field 'source' is missing"):
        check_state({k: v for k, v in good.items() if k != "source"}, "x")
    with pytest.raises(ValueError, match="non-negative"):
        check_state(good | {"totals": totals | {"rollouts": -1}}, "x")
    with pytest.raises(ValueError, match="non-negative integer rollouts"):  # the keys it keeps, as TRL's check
        check_state(good | {"totals": {"rollouts": 3}}, "x")
    with pytest.raises(ValueError, match="history': entry 0 is not a dict of numbers"):
        check_state(good | {"history": [{"rollouts": "3"}]}, "x")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not VERL_PYTHON.exists(),
                    reason=f"no verl environment at {VERL_PYTHON}: run `make verl-env` (or set RLVR_VERL_PYTHON) "
                           "to test the verl integration against verl 0.9.1")
def test_verl_cases_in_verl_env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", PYTHONWARNINGS="ignore")
    out = subprocess.run([str(VERL_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          "tests/integrations/verl_cases.py"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=850)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-3000:]
