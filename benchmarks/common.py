"""What more than one benchmark needs: where results go, the allocator variants, figures and run-file names.

Each benchmark stays a script (``python -m benchmarks.<name>``) and imports what it shares from here:

- ``RESULTS``, ``results_dir``, ``default_out``: the results root a run writes under (benchmarks/results/ holds
  full-protocol runs only; a smoke or reduced run goes to a temporary folder unless ``--out`` names one)
- ``output_dir``: a benchmark's own folder under a results root, named after its module (benchmarks/results/
  INDEX.md lists each folder with the command that writes it)
- ``Variant``, ``VARIANTS``: every benchmarked configuration (label -> allocator, its parameters, train
  settings), one table for the allocation benchmark and the training study alike
- ``PROTOCOLS``, ``MATCHED``: the training study's protocols and the variants each runs
- ``slug`` (rlvr_core.registry's), ``study_cell_dir``: the name of a variant's run folder of the training study
- ``save_figure``: a matplotlib figure written the one way every benchmark writes them
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_core.registry import slug

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = ["MATCHED", "PROTOCOLS", "RESULTS", "VARIANTS", "Variant", "default_out", "output_dir", "results_dir",
           "save_figure", "slug", "study_cell_dir"]


def results_dir(out: Path | None, full: bool, name: str) -> Path:
    """The results root a benchmark run writes under (into its ``output_dir``), created: ``out`` when given, else
    benchmarks/results/ for a run of the full protocol, else a fresh temporary folder (printed).

    A smoke or reduced run (``--quick``, fewer seeds or steps, a subset of variants) thus never
    replaces the committed results unless ``--out`` names that folder on purpose.
    """
    if out is None:
        if full:
            out = RESULTS
        else:
            out = Path(tempfile.mkdtemp(prefix=f"rlvr-{name}-"))
            print(f"{name}: not the full protocol, writing to {out} (pass --out DIR to choose)", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def default_out(out: Path | None, quick: bool, name: str, full: Path = RESULTS) -> Path:
    """``out`` when given, else a fresh temporary folder for --quick (a quick run never overwrites
    benchmarks/results), else ``full`` (the benchmark's folder of committed results). Not created."""
    if out is not None:
        return out
    return Path(tempfile.mkdtemp(prefix=f"{name}-quick-")) if quick else full


def output_dir(root: Path, generator: str) -> Path:
    """The folder of one benchmark's files under the results root ``root``, created: ``root/generator``, where
    ``generator`` is the writing module's name (benchmarks/<generator>.py). ``--out`` names the root, so a run
    with ``--out DIR`` writes DIR/<generator>/ and reads another benchmark's files from DIR/<that module>/."""
    if not generator.isidentifier() or not (Path(__file__).resolve().parent / f"{generator}.py").is_file():
        raise ValueError(f"output_dir: {generator!r} names no benchmark module (benchmarks/{generator}.py)")
    path = root / generator
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Lay out, write and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def study_cell_dir(out: Path, regime: str, protocol_dir: str, label: str) -> Path:
    """The training study's folder of one variant's run files: <out>/study/<regime>/<protocol_dir>/<slug(label)>
    (a tuned run's folder adds its grid point and split to the name: benchmarks/study.py run_file)."""
    return out / "study" / regime / protocol_dir / slug(label)


@dataclass(frozen=True)
class Variant:
    """One benchmarked configuration: a label, an allocator name, its parameters (on top of params.yaml's
    ``train.allocator_params[allocator]`` in the study) and train settings (on top of the regime's)."""

    label: str
    allocator: str
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    train: dict[str, Any] = field(default_factory=dict)


_PROBES = {"probe_schedule": (0.25, 0.5, 1.0), "max_rounds": 8}

# In the study's order (its tables list cells in this order). vigor[screen] follows VIGOR's source: every prompt
# starts small (m0 = 2 instead of k // 2), so the same step budget screens about twice GRPO's batch of prompts (51
# instead of 25 at B=32, k=8); [prompt] gives every trained group the same loss weight (train.group_weight).
VARIANTS: dict[str, Variant] = {v.label: v for v in (
    Variant("grpo", "grpo", {}, "B prompts x k, train on all"),
    Variant("dapo", "dapo", {}, "G = B per generation batch, until B mixed groups (cap 8 batches)"),
    Variant("greso", "greso", {}, "DAPO + pre-rollout skipping"),
    Variant("sara", "sara", {}, "uniform prior, B committed groups per step"),
    Variant("sara[carry]", "sara", {"prior": "carry+eb", **_PROBES},
            "carried per-prompt evidence + empirical-Bayes prior, probes k/4, k/2, k"),
    Variant("sara[budget]", "sara", {"mode": "rollouts"}, "fixed budget B*k per step (empirical-Bayes prior)"),
    Variant("sara+dps", "sara+dps", {}, "SARA + Thompson-sampled prompt selection"),
    Variant("vigor", "vigor", {}, "budget B*k, m0=k/2, T=3, alpha=0.5, gamma=2"),
    Variant("pods", "pods", {}, "n = 2k generated, k kept per prompt"),
    Variant("vigor[screen]", "vigor", {"m0": 2}, "every prompt starts with 2 rollouts"),
    Variant("vigor[prompt]", "vigor", {}, "every trained group the same loss weight", {"group_weight": "prompt"}),
    Variant("vigor[screen+prompt]", "vigor", {"m0": 2}, "vigor[screen] and vigor[prompt] together",
            {"group_weight": "prompt"}),
    Variant("sara[context]", "sara", {"prior": "context", **_PROBES}, "the contextual prior (docs/design.md §4.6)"),
    Variant("sara+dps[context]", "sara+dps", {"prior": "carry+context"}, "sara+dps with the contextual prior"),
    # the screening floor's stop rule (docs/design.md §4.10) in place of tau_low, with the empirical-Bayes
    # population it prices effective groups by
    Variant("sara[floor]", "sara", {"prior": "eb", "stop_rule": "floor", **_PROBES},
            "the screening floor's stop rule, empirical-Bayes prior"),
    Variant("sara+dps[context+floor]", "sara+dps", {"prior": "carry+context", "stop_rule": "floor"},
            "sara+dps[context] with the floor's stop rule"),
    # the strongest published allocators (docs/design.md §4.11-§4.13), at their defaults
    Variant("pilot-commit", "pilot-commit", {},
            "pilots of k/4 on 3B prompts; survivors (pilot pass rate in [1/8, 3/4]) completed to k, up to B"),
    Variant("reinforce-ada", "reinforce-ada", {},
            "rounds of k until k/2 passes and k/2 fails (at most 4); groups of k"),
    Variant("reinforce-ada[pos]", "reinforce-ada", {"rule": "positive"},
            "rounds of k until a first pass (Reinforce-Ada-pos)"),
    Variant("ar3po", "ar3po", {}, "stages of k/4 until a first pass (at most 4) + reuse of a buffered pass"),
    Variant("ar3po[no-reuse]", "ar3po", {"reuse": False}, "AR3PO's adaptive rollout alone"),
    # the length-aware candidate of the worked-answer issue (declared before its runs; regime steps only):
    # tau_low scaled per prompt by its prefix's tokens per rollout over the step's, so a long all-fail prefix is
    # abandoned after k/4 rollouts (under the uniform prior the k/4 probe alone changes no decision)
    Variant("sara[tokens]", "sara", {"price": "tokens", **_PROBES},
            "sara priced in tokens: tau_low x (prefix tokens per rollout / step's), probes k/4, k/2, k"),
)}

# ----- the training study's protocols (benchmarks/study.py runs them; benchmarks/floor.py reads the cells) -----
# The allocators of the pool regimes and of the matched-updates protocols (the measurement issue's list)
# the worked-answer regimes (steps and its warm starts) add the length-aware candidate at equal batch
LENGTH_AWARE = ("sara[tokens]",)
MATCHED = ("dapo", "greso", "sara", "sara[carry]", "sara+dps", "sara+dps[context]", "pilot-commit", "reinforce-ada")
PROTOCOLS: dict[str, tuple[str, ...]] = {
    "reference": ("grpo",),
    "equal-batch": ("dapo", "sara", "sara+dps", "sara[carry]", "greso", "sara[context]",  # in this order: value first
                    "sara+dps[context]", "sara[floor]", "sara+dps[context+floor]", "pilot-commit", "reinforce-ada"),
    # ar3po trains small groups (rollouts until the first pass), so it is held to B x k rollouts per update
    "equal-rollouts": ("grpo", "vigor", "pods", "sara[budget]", "vigor[screen]", "vigor[prompt]",
                       "vigor[screen+prompt]", "ar3po", "ar3po[no-reuse]"),
    # sara+dps[context] joined after the equal-batch study named it our strongest candidate (training_candidates.md)
    "tuned": ("grpo", "dapo", "greso", "sara", "sara[carry]", "sara+dps", "vigor", "pods", "sara[budget]",
              "sara+dps[context]"),
    # equal effective groups per update against uniform GRPO at the same lr and schedule (matched_sizes):
    # grpo with a prompt batch whose expected effective groups equal the equal-batch allocators' B, compared with
    # the regime's equal-batch cells; and the converse, MATCHED at B = GRPO-B's effective groups per update,
    # compared with the reference grpo runs
    "matched-updates": ("grpo",),
    "matched-updates-small": MATCHED,
}
