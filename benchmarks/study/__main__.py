"""``python -m benchmarks.study``: the command line (benchmarks/study/cli.py).

A study process sets its environment (benchmarks.study.ENVIRONMENT) here, before numpy, torch or matplotlib
load; importing the package sets nothing.
"""

import os
import sys

from benchmarks.study import ENVIRONMENT

for _key, _value in ENVIRONMENT.items():
    os.environ.setdefault(_key, _value)

from benchmarks.study.cli import main  # noqa: E402  (after the environment: numpy reads OMP_NUM_THREADS on load)

sys.exit(main())
