"""``python -m benchmarks.study``: the command line (benchmarks/study/cli.py)."""

import sys

from benchmarks.study.cli import main

sys.exit(main())
