"""``python -m rlvr_core.advise LOG [--k 8] [--batch 32] [--out DIR]`` (rlvr_core.advise.report)."""

import sys

from rlvr_core.advise.report import main

sys.exit(main())
