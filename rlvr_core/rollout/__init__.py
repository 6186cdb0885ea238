"""Rollout engines, looked up by name; heavy ones are imported lazily."""

from rlvr_core.rollout.base import ENGINES, RolloutEngine, make_engine

ENGINES.register_lazy("simulated", "rlvr_core.rollout.simulated:SimulatedEngine")
ENGINES.register_lazy("hf", "rlvr_core.rollout.hf:HFEngine")
ENGINES.register_lazy("vllm", "rlvr_core.rollout.vllm:VLLMEngine")

__all__ = ["ENGINES", "RolloutEngine", "make_engine"]
