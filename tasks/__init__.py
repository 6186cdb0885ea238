"""The pipeline's Prefect tasks, one module per kind (data, training, evaluation, report), which the flows in flows/
chain. Not the task registry: ``rlvr_core.tasks`` registers the RL tasks (arithmetic, countdown, math, code), a
task there being a problem family with its verifier; and ``tasks/training.py`` is the Prefect task around
``rlvr_core/training.py`` (the training loop), not ``benchmarks/training.py`` (the superseded training benchmark)."""
