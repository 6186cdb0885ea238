"""The allocation advisor: will rollout allocation pay on my run? (docs/advisor.md)

``advise(LOG)`` reads a run's rollout log (``rlvr_core.advise.logs``), describes its pass-rate population by
phase with the screening floor, replays every registered allocator on it with the simulated engine's
``replay`` scenario (``rlvr_core.advise.model``) and recommends one; ``python -m rlvr_core.advise LOG`` or
``rlvr-alloc advise LOG`` prints that and writes it as markdown, JSON and PNG (``rlvr_core.advise.report``).
"""

from rlvr_core.advise.core import Advice, AllocatorAdvice, advise
from rlvr_core.advise.logs import Limits, LogError, LogTooLarge, load_log

__all__ = ["Advice", "AllocatorAdvice", "Limits", "LogError", "LogTooLarge", "advise", "load_log"]
