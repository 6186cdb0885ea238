"""Verifiers: ``get_verifier(name)`` -> callable ``(completion: str, example: Mapping) -> float``.

Registered lazily by dotted path so optional dependencies (math-verify) load on use.
"""

from __future__ import annotations

from typing import Callable, Mapping

from rlvr_core.registry import Registry

Verifier = Callable[[str, Mapping], float]

VERIFIERS: Registry[Verifier] = Registry("verifier")
VERIFIERS.register_lazy("arithmetic", "rlvr_core.rewards.arithmetic:verify_arithmetic")
VERIFIERS.register_lazy("arithmetic-steps", "rlvr_core.rewards.arithmetic_steps:verify_arithmetic_steps")
VERIFIERS.register_lazy("countdown", "rlvr_core.rewards.countdown:verify_countdown")
VERIFIERS.register_lazy("math", "rlvr_core.rewards.math:verify_math")
VERIFIERS.register_lazy("code", "rlvr_core.rewards.code:verify_code")


def get_verifier(name: str) -> Verifier:
    """Return the verifier registered as ``name`` (unknown names list the valid ones).

    A verifier with a ``preflight`` attribute has it called first, so one that cannot
    work here (the code verifier without bubblewrap) refuses at setup.
    """
    verifier = VERIFIERS.get(name)
    preflight = getattr(verifier, "preflight", None)
    if preflight is not None:
        preflight()
    return verifier
