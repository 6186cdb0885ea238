"""The fair training study: regimes x protocols x allocators x seeds, with intervals and a cost ledger.

    python -m benchmarks.study --regime hard --protocol equal-batch [--seeds 5] [--quick] [--out DIR]
    python -m benchmarks.study --summarize-only            # rebuild every output from the run files
    python -m benchmarks.study --round-price --regime hard # the price of synchronous rounds (HF engine)
    python -m benchmarks.study --regime pool --warm-start 2 --verify-policy  # accept a rebuilt warm start

Protocols (each named in every output):

- ``reference``: uniform GRPO, the regime's params; sets the target (below). Run first by every protocol.
- ``equal-batch``: every update holds B effective groups (dapo, greso, sara, sara[carry], sara+dps).
- ``equal-rollouts``: every update spends B x k rollouts (grpo, vigor, pods at B*k/n_generate prompts of
  n_generate rollouts, sara[budget]). Its grpo runs are the reference runs (the same configuration).
- ``tuned``: every allocator at its best point of one grid, batch size x lr (GRID); the point is chosen on the
  validation split (rows the test split does not hold) by the median rollouts-to-target of GRID_SEEDS seeds,
  then reported on the test split with the study's seeds.

Configurations are params.yaml plus the regime's overrides (benchmarks/study/plan.py REGIMES) plus the protocol's
settings, read through ``rlvr_core.config.load_params``. Allocator parameters are params.yaml's
``train.allocator_params`` plus the variant's (plan.py VARIANTS, the allocation benchmark's table too).

Target: after the reference runs of a regime, target = median start accuracy + 0.8 x the median gain at the
end of the budget (the mean of each run's last three evaluations), written to
``<out>/study/<regime>/target.json`` before any other allocator of that regime runs, and never recomputed.

Statistics: per run, rollouts (and seconds, tokens, updates) until the held-out greedy accuracy first reaches
the target, interpolated between evaluations. A run that never reaches it counts as infinitely late: the
median and the bootstrap bounds (95%, percentile, 5,000 resamples of the seeds) are reported as null where
they fall on such a run, and every cell says how many of its runs reached the target. Seconds are training
wall-clock (generate + verify + allocate + update), evaluations excluded.

A regime's runs start from the policy its target was frozen from (the digest in ``target.json``). A warm start
rebuilt on another machine or after a library upgrade can differ in bytes beside the weights (config.json's
transformers version, the sha256.json policy folders gained) and still train the same: ``--verify-policy`` reruns
reference seed 0 from it and, only if every evaluation equals the recorded run's (wall-clock aside), freezes
``study/<regime>/policy.json``, after which new runs of that regime may use it.

Resumable: one result file per (regime, protocol, variant, seed[, grid point]) under
``<out>/study/<regime>/<protocol>/``, skipped when present; a run killed midway resumes from its own
checkpoints in ``--work``. Every aggregate is rebuilt from whatever run files exist.

Outputs under ``--out`` (the results root, default benchmarks/results), in its ``study/`` beside the run folders:
``training_<regime>_<protocol>.{csv,md,png}``, ``training_protocols.json``, ``training_study.md``, and with
``--round-price`` ``training_round_price.{json,md}``. Every summary also rewrites the root's ``floor/``,
``study_targets/`` and ``warmstarts/`` (benchmarks/floor.py, study_targets.py, warmstarts.py), and for
benchmarks/results its INDEX.md and the tables of README.md and docs/results.md.
``--quick`` trains a short warm start, two seeds and a small budget into a temporary folder (or ``--out``),
never into benchmarks/results.

The package (docs/design.md, "The training study package"), each module importing only those above it here:

- ``plan``: the variants, protocols, regimes, comparisons and targets, as records (the only place labels live);
- ``formats``: the number formats of every table (one convention for a missing bound: ``never``);
- ``store``: ``RunStore``, the run-file layout, the shared cells, the frozen files and the run claims;
- ``data``: a regime's splits, prompt pool and warm-started policy;
- ``stats``: pure functions over runs in memory (cells, savings, rank tests, dominance, pooled savings);
- ``execute``: one run's configuration, one run trained, the frozen files, a protocol's runs;
- ``tables``: the study's markdown, one set of number formats; ``summarize``: every file, written once;
- ``round_price``: the price of synchronous rounds; ``cli``: the command line (``python -m benchmarks.study``).
"""

# what a study process sets before numpy, torch or matplotlib load (benchmarks/study/__main__.py, cli.main): one
# thread per run (runs go side by side), no display, no network for the hub. Importing the package sets nothing.
ENVIRONMENT = {"OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1"}
