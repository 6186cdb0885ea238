"""Adapters that run rlvr_core's allocators inside other training engines.

Each submodule imports its engine (TRL, ...) at import time, so nothing here is
imported by ``import rlvr_core``; import the submodule you need, e.g.
``from rlvr_core.integrations.trl import AllocatedGRPOTrainer``.
"""
