"""rlvr_core: adaptive rollout allocation for GRPO-style RL with verifiable rewards.

Pure library: no orchestration (prefect, mlflow, dvc) imports; heavy backends
(vllm) are imported lazily by name.
"""

__version__ = "0.1.0"
