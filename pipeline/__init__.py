"""The pipeline's support code, shared by flows/ and tasks/: no Prefect task or flow lives here.

- ``paths``     where the pipeline's files live (one root, one params file, run-folder names)
- ``lineage``   git commit and DVC content hashes recorded with a run
- ``curves``    a run's held-out accuracy curve (curve.csv, the report's input)
- ``tracking``  every MLflow call of the project
- ``remote``    flows on work-pool workers: inputs from the DVC remote, outputs and dvc.lock back to it

Layers: flows/ -> tasks/ -> pipeline/ -> rlvr_core/ (the library never imports any of them).
"""
