"""Task data: synthetic generators (arithmetic, Countdown) and split helpers.

Importing this package is cheap: ``datasets`` loads only when a split is built.
"""

from rlvr_core.data.arithmetic import make_arithmetic
from rlvr_core.data.countdown import make_countdown

__all__ = ["make_arithmetic", "make_countdown"]
