"""The study's plan as data: its variants, protocols, regimes and comparisons, and nothing that reads a file.

This module is the one place labels and per-regime rules live (docs/design.md, "The training study package"):

- ``Variant``: a label, its allocator, parameters and train settings, and the protocols it runs in (``runs``:
  protocol -> the regimes it runs there, by ``Scope``). ``VARIANTS`` is in table order: every table of the study
  lists cells in this order. The allocation benchmark reads the same records.
- ``Protocol``: what a protocol fixes, its baseline (the cell its rank tests are against), the cells it shares
  with another protocol (equal-rollouts' grpo is the reference runs), and the run order of its variants.
- ``Regime``: overrides on params.yaml, the rollout budget, the evaluation grid, the prompt pool, the criteria
  its reference runs are pre-registered against and the protocols it runs. A regime declared without its budget,
  grid or criteria is refused, naming the field.
- ``Comparison``: two cells (ours, baseline) under one protocol, and the tables that show it.

Adding a variant to the study is one ``Variant`` record here with its ``runs``; adding a regime is one ``Regime``.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rlvr_core.config import Params, load_params

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = ROOT / "params.yaml"
# the confirmatory replication's declaration (benchmarks/study/replication.py reads and checks all of it)
HYPOTHESES_FILE = Path(__file__).with_name("hypotheses.json")


@functools.cache
def replication_candidates() -> frozenset[int]:
    """The warm-start seeds the replication may admit (its declaration's admission.candidates): they stay out of the
    exploratory families (RunStore.family), whether admitted or not."""
    try:
        got = json.loads(HYPOTHESES_FILE.read_text())["admission"]["candidates"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{HYPOTHESES_FILE.name}: admission.candidates unreadable ({e!r})") from None
    if not isinstance(got, list) or not all(isinstance(j, int) and not isinstance(j, bool) for j in got):
        raise ValueError(f"{HYPOTHESES_FILE.name}: admission.candidates must be a list of integers, got {got!r}")
    return frozenset(got)
RECORDED = ROOT / "artifacts" / "warmstart"  # the recorded policies (rlvr_core.models.recorded)

Overrides = dict[str, dict[str, Any]]

# ----- scopes: which regimes a variant runs in under a protocol ---------------------------------------------
ALL = "all"
STEP_GRID = "step-grid"  # the regimes evaluated every n steps (Regime.grid == "steps": easy, hard)
ROLLOUT_GRID = "rollout-grid"  # every other regime, warm-start variants included
Scope = str | tuple[str, ...]  # ALL, STEP_GRID, ROLLOUT_GRID, or the names of regime families


@dataclass(frozen=True)
class Variant:
    """One benchmarked configuration: a label, an allocator name, its parameters (on top of params.yaml's
    ``train.allocator_params[allocator]`` in the study) and train settings (on top of the regime's); ``runs``:
    protocol -> the regimes the study runs it in there (a ``Scope``); ``ours``: one of this project's
    allocators (the targets' "our best" picks among them); ``published``: a published allocator the targets
    report ours against; ``simulated``: the allocation benchmark (benchmarks/allocation.py) runs it;
    ``round_priced``: the price of synchronous rounds (benchmarks/study/round_price.py) measures it; ``history``:
    it carries a prompt's evidence across steps, so the screening floor (benchmarks/floor.py) does not bind it;
    ``small_groups``: its effective groups hold fewer than k rows, so the floor's unit (a group of k) is not
    theirs. The other benchmarks list their variants in this table's order."""

    label: str
    allocator: str
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    train: dict[str, Any] = field(default_factory=dict)
    runs: Mapping[str, Scope] = field(default_factory=dict)
    ours: bool = False
    published: bool = False
    headline: tuple[str, ...] = ()
    simulated: bool = False
    round_priced: bool = False
    history: bool = False
    small_groups: bool = False


# the group-size protocol's grid: uniform GRPO at each k with B = ROLLOUTS_PER_UPDATE // k (k = 8 is params.yaml's,
# B = 32: the reference runs), declared before its runs; the best k of a warm start is chosen on the validation split
K_GRID = (2, 4, 8, 16)
ROLLOUTS_PER_UPDATE = 256
# the tuned uniform GRPO (issue 54, item 3), declared before its runs: uniform GRPO over k x lr at
# ROLLOUTS_PER_UPDATE rollouts per update, then a second optimizer pass per batch (train.epochs, TRL's
# num_iterations) at the (k, lr) chosen; chosen per warm start on the validation split by the headline's own
# statistic, the fitted reach (stats.reach, fit=True), median over TUNE_SEEDS, against a validation target set by
# the target rule (rlvr_core.stats.gain_target, TARGET_FRACTION) from the validation runs of k = 8, lr 1e-4, one
# pass (the reference configuration); fewer median rollouts wins, ties (unreached ones included) go to the higher
# mean validation accuracy; the second pass is kept only when its median reach is strictly lower. The test cells of
# every configuration (seeds 0-4) give the oracle bound (the test-best configuration) beside the choice.
TUNE_K = (2, 4, 8)
TUNE_LR = (5e-5, 1e-4, 2e-4)
TUNE_LR_DEFAULT = 1e-4  # params.yaml's train.lr: the reference configuration's
TUNE_EPOCHS = (1, 2)
TUNE_SEEDS = (100, 101, 102)  # validation seeds of every configuration (100, 101: the group-size grid's own runs)
TUNE_WARM_STARTS = ("hard-ws2", "hard-ws3", "hard-ws4", "pool-ws2", "pool-ws3", "pool-ws4")  # the conditioned ones
TUNE_FAMILIES = ("hard", "pool")
TUNE_CONFIGS = tuple((k, lr, e) for e in TUNE_EPOCHS for k in TUNE_K for lr in TUNE_LR)


def tune_label(k: int, lr: float, epochs: int) -> str:
    """The variant label of one configuration of the tuned uniform GRPO: ``grpo`` for k = 8, lr 1e-4, one pass
    (the reference runs), ``grpo[k2]`` and ``grpo[k4]`` at lr 1e-4, one pass (the group-size grid's cells), else
    ``grpo[k2_lr5e-5_e2]`` naming what differs from the reference configuration (lr in short scientific form)."""
    short = f"{lr:.0e}".replace("e-0", "e-").replace("e+0", "e")
    parts = ([f"k{k}"] if k != 8 else []) + ([f"lr{short}"] if lr != TUNE_LR_DEFAULT else []) + \
        ([f"e{epochs}"] if epochs != 1 else [])
    return f"grpo[{'_'.join(parts)}]" if parts else "grpo"


def tune_train(k: int, lr: float, epochs: int) -> dict[str, Any]:
    """The train settings of one configuration: B = ROLLOUTS_PER_UPDATE // k, and lr and epochs where they differ
    from params.yaml's."""
    t: dict[str, Any] = {"k": k, "batch_size": ROLLOUTS_PER_UPDATE // k} if k != 8 else {}
    return {**t, **({"lr": lr} if lr != TUNE_LR_DEFAULT else {}), **({"epochs": epochs} if epochs != 1 else {})}


_PROBES = {"probe_schedule": (0.25, 0.5, 1.0), "max_rounds": 8}
_EB_ALL = {"equal-batch": ALL, "matched-updates-small": ALL}

# In the study's order (its tables list cells in this order). vigor[screen] follows VIGOR's source: every prompt
# starts small (m0 = 2 instead of k // 2), so the same step budget screens about twice GRPO's batch of prompts (51
# instead of 25 at B=32, k=8); [prompt] gives every trained group the same loss weight (train.group_weight).
# pilot-commit, reinforce-ada and ar3po were added after the step-grid regimes' warm starts were lost (check_policy
# refuses new runs there): they run on the rollout-grid regimes only.
VARIANTS: dict[str, Variant] = {v.label: v for v in (
    Variant("grpo", "grpo", {}, "B prompts x k, train on all",
            runs={"reference": ALL, "equal-rollouts": ALL, "tuned": ALL, "matched-updates": ALL,
                  "group-size": ROLLOUT_GRID, "null-dapo": ("pool",)},
            headline=("reference", "matched-updates"), simulated=True, round_priced=True),
    Variant("dapo", "dapo", {}, "G = B per generation batch, until B mixed groups (cap 8 batches)",
            runs={**_EB_ALL, "tuned": ALL, "null-dapo": ("pool",)}, headline=("equal-batch",), simulated=True,
            round_priced=True),
    Variant("greso", "greso", {}, "DAPO + pre-rollout skipping", runs={**_EB_ALL, "tuned": ALL},
            simulated=True, history=True),
    Variant("sara", "sara", {}, "uniform prior, B committed groups per step", runs={**_EB_ALL, "tuned": ALL},
            ours=True, headline=("equal-batch", "matched-updates-small"), simulated=True, round_priced=True),
    Variant("sara[carry]", "sara", {"prior": "carry+eb", **_PROBES},
            "carried per-prompt evidence + empirical-Bayes prior, probes k/4, k/2, k", runs={**_EB_ALL, "tuned": ALL},
            ours=True, simulated=True, round_priced=True, history=True),
    Variant("sara[budget]", "sara", {"mode": "rollouts"}, "fixed budget B*k per step (empirical-Bayes prior)",
            runs={"equal-rollouts": ALL, "tuned": ALL}, ours=True, headline=("equal-rollouts",),
            simulated=True, round_priced=True),
    Variant("sara+dps", "sara+dps", {}, "SARA + Thompson-sampled prompt selection", runs={**_EB_ALL, "tuned": ALL},
            ours=True, simulated=True, round_priced=True, history=True),
    Variant("vigor", "vigor", {}, "budget B*k, m0=k/2, T=3, alpha=0.5, gamma=2",
            runs={"equal-rollouts": ALL, "tuned": ALL}, ours=True, headline=("equal-rollouts",),
            simulated=True, round_priced=True),
    Variant("pods", "pods", {}, "n = 2k generated, k kept per prompt", runs={"equal-rollouts": ALL, "tuned": ALL},
            simulated=True),
    Variant("vigor[screen]", "vigor", {"m0": 2}, "every prompt starts with 2 rollouts",
            runs={"equal-rollouts": ALL}, ours=True),
    Variant("vigor[prompt]", "vigor", {}, "every trained group the same loss weight", {"group_weight": "prompt"},
            runs={"equal-rollouts": ALL}, ours=True),
    Variant("vigor[screen+prompt]", "vigor", {"m0": 2}, "vigor[screen] and vigor[prompt] together",
            {"group_weight": "prompt"}, runs={"equal-rollouts": ALL}, ours=True),
    Variant("sara[context]", "sara", {"prior": "context", **_PROBES}, "the contextual prior (docs/allocators/sara.md)",
            runs={"equal-batch": STEP_GRID}, ours=True),
    # sara+dps[context] joined tuned after the equal-batch study named it our strongest candidate
    Variant("sara+dps[context]", "sara+dps", {"prior": "carry+context"}, "sara+dps with the contextual prior",
            runs={**_EB_ALL, "tuned": ALL}, ours=True, headline=("equal-batch", "matched-updates-small"), history=True),
    # the screening floor's stop rule (docs/design.md §4.10) in place of tau_low, with the empirical-Bayes
    # population it prices effective groups by
    Variant("sara[floor]", "sara", {"prior": "eb", "stop_rule": "floor", **_PROBES},
            "the screening floor's stop rule, empirical-Bayes prior", runs={"equal-batch": STEP_GRID}, ours=True,
            simulated=True),
    Variant("sara+dps[context+floor]", "sara+dps", {"prior": "carry+context", "stop_rule": "floor"},
            "sara+dps[context] with the floor's stop rule", runs={"equal-batch": STEP_GRID}, ours=True, history=True),
    # the strongest published allocators, at their defaults (docs/allocators/pilot-commit.md, ar3po.md and
    # reinforce-ada.md)
    Variant("pilot-commit", "pilot-commit", {},
            "pilots of k/4 on 3B prompts; survivors (pilot pass rate in [1/8, 3/4]) completed to k, up to B",
            runs={"equal-batch": ROLLOUT_GRID, "matched-updates-small": ROLLOUT_GRID}, published=True,
            headline=("equal-batch",), simulated=True, history=True),
    # the port decision of the measurement issue (36), declared before its runs: at k = 8 the source's pilot of k/4
    # is 2 rollouts, whose band [1/8, 3/4] keeps only a 1-of-2 pilot and evicts every 2-of-2 prompt for good; at
    # its source's k (64-128) a 40,000-rollout budget lasts under 20 steps. So at small k the pilot is k/2 = 4, the
    # smallest whose band keeps more than one pass count (1, 2 or 3 of 4) and evicts only at 4 of 4 (1/16 at p = 1/2,
    # against 1/4 with 2); against uniform GRPO at matched updates, on the conditioned warm starts 2-4 of both
    Variant("pilot-commit[n4]", "pilot-commit", {"n_pilot": 4},
            "pilots of k/2 = 4 on 3B prompts; survivors (1-3 passes of 4) completed to k, up to B; evicted at 4 of 4",
            runs={"matched-updates-small": ("hard", "pool")}, published=True, history=True),
    Variant("reinforce-ada", "reinforce-ada", {},
            "rounds of k until k/2 passes and k/2 fails (at most 4); groups of k",
            runs={"equal-batch": ROLLOUT_GRID, "matched-updates-small": ROLLOUT_GRID}, published=True,
            headline=("equal-batch",), simulated=True),
    Variant("reinforce-ada[pos]", "reinforce-ada", {"rule": "positive"},
            "rounds of k until a first pass (Reinforce-Ada-pos)"),
    # the value-based baselines of issue 37, at their sources' defaults (docs/allocators/knapsack-rl.md, vip.md and
    # mopps.md), at equal rollouts on pool's warm starts only: on fresh prompts (hard) a prompt has no history, so
    # knapsack-rl and vip allocate exactly as grpo does and mopps draws its B prompts at random, as grpo does
    # (docs/training-study.md, "The value-based baselines")
    Variant("knapsack-rl", "knapsack-rl", {}, "B x k shared by a knapsack over P(mixed) p(1-p)^2; leftover to p = 0",
            runs={"equal-rollouts": ("pool",)}, published=True, simulated=True, history=True),
    Variant("vip", "vip", {}, "B x k shared to minimise the expected gradient variance, n in [4, 32]",
            runs={"equal-rollouts": ("pool",)}, published=True, simulated=True, history=True),
    Variant("mopps", "mopps", {}, "the B of 8B candidates whose Thompson draws lie nearest 0.5, k each",
            runs={"equal-rollouts": ("pool",)}, published=True, simulated=True, history=True),
    # CurES from its code (docs/allocators/cures.md), declared after the others had run and before any run of its own
    Variant("cures", "cures", {}, "B prompts by CurES's weights; B x k shared by sqrt(p(1-p)) of a pass counter",
            runs={"equal-rollouts": ("pool",)}, published=True, simulated=True, history=True),
    # ours, priced by what a group teaches (issue 37; docs/allocators/valor.md): its constants were fixed on warm
    # start 1 of hard and pool (design.md section 4.17) before any of its runs; at equal rollouts on the conditioned
    # warm starts 2-4 of both families (docs/training-study.md, "VALOR"); [reuse] where prompts recur (pool)
    Variant("valor", "valor", {}, "value-priced rounds: pilots of 2, grown while the expected value per rollout "
            "beats a fresh prompt's; B x k", runs={"equal-rollouts": ("hard", "pool", "steps-fine")}, ours=True,
            simulated=True, history=True),
    Variant("valor[reuse]", "valor", {"reuse": True}, "valor + AR3PO's reuse of a buffered pass",
            runs={"equal-rollouts": ("pool",)}, ours=True, simulated=True, history=True),
    # issue 37's token target on the worked-answer regime (steps-fine), declared with the regime before any of its
    # runs: a live prompt's rollouts priced at its prefix's tokens per rollout over the step's mean
    Variant("valor[tokens]", "valor", {"price": "tokens"}, "valor priced in generated tokens; B x k rollouts",
            runs={"equal-rollouts": ("steps-fine",)}, ours=True, history=True),
    # ar3po trains small groups (rollouts until the first pass), so it is held to B x k rollouts per update
    Variant("ar3po", "ar3po", {}, "stages of k/4 until a first pass (at most 4) + reuse of a buffered pass",
            runs={"equal-rollouts": ROLLOUT_GRID}, headline=("equal-rollouts",),
            simulated=True, history=True, small_groups=True),
    Variant("ar3po[no-reuse]", "ar3po", {"reuse": False}, "AR3PO's adaptive rollout alone",
            runs={"equal-rollouts": ROLLOUT_GRID}, simulated=True, small_groups=True),
    # AR3PO's reuse without its first-pass stop: one stage of 4 rollouts per prompt, B = 64 (grpo[k4]'s 256
    # rollouts per update); with grpo[k2], grpo[k4] and ar3po[no-reuse] it splits AR3PO's saving into small
    # groups, the stop and reuse (docs/training-study.md, "The group-size grid")
    Variant("ar3po[no-stop]", "ar3po", {"stage_size": 4, "max_stages": 1}, "AR3PO's reuse on fixed groups of 4",
            {"batch_size": 64}, runs={"equal-rollouts": ROLLOUT_GRID}, history=True, small_groups=True),
    # uniform GRPO at other group sizes, B x k = ROLLOUTS_PER_UPDATE (docs/training-study.md, "The group-size
    # grid"): a saving against grpo at k = 8 may be the choice of k, not allocation
    *(Variant(f"grpo[k{k}]", "grpo", {}, f"uniform GRPO at k = {k}, B = {ROLLOUTS_PER_UPDATE // k}",
              {"k": k, "batch_size": ROLLOUTS_PER_UPDATE // k}, runs={"group-size": ROLLOUT_GRID}, small_groups=k < 8)
      for k in K_GRID if k != 8),
    # uniform GRPO at AR3PO's rollouts per update (161-177 measured on hard and pool; 22 x 8 = 176), so AR3PO is
    # also read at about its own update count (docs/training-study.md, "The group-size grid")
    Variant("grpo[b22]", "grpo", {}, "uniform GRPO at B = 22: 176 rollouts per update, about AR3PO's",
            {"batch_size": 22}, runs={"equal-rollouts": ROLLOUT_GRID}),
    # the A/A null control (docs/training-study.md, "Null controls"): the reference configuration itself on seeds
    # disjoint from the reference runs', read against them through the same pooling and tests
    Variant("grpo[aa]", "grpo", {}, "uniform GRPO, the reference runs' configuration, on seeds 5-9",
            runs={"null-aa": ROLLOUT_GRID}),
    # the length-aware candidate of the worked-answer issue (declared before its runs; regime steps only):
    # tau_low scaled per prompt by its prefix's tokens per rollout over the step's, so a long all-fail prefix is
    # abandoned after k/4 rollouts (under the uniform prior the k/4 probe alone changes no decision)
    Variant("sara[tokens]", "sara", {"price": "tokens", **_PROBES},
            "sara priced in tokens: tau_low x (prefix tokens per rollout / step's), probes k/4, k/2, k",
            runs={"equal-batch": ("steps",)}, ours=True),
    # the tuned uniform GRPO (docs/training-study.md, "The tuned uniform GRPO"): the k x lr grid and the second pass
    # per batch beside the group-size grid's cells (k at lr 1e-4, one pass), which its protocol shares
    *(Variant(tune_label(k, lr, e), "grpo", {}, f"uniform GRPO at k = {k}, B = {ROLLOUTS_PER_UPDATE // k}, lr {lr:g}, "
              f"{e} pass{'es' if e > 1 else ''} per batch", tune_train(k, lr, e), runs={"grpo-tuning": TUNE_FAMILIES},
              small_groups=k < 8)
      for k, lr, e in TUNE_CONFIGS if (lr, e) != (TUNE_LR_DEFAULT, 1)),
)}


@dataclass(frozen=True)
class Protocol:
    """A protocol of the study: ``baseline``, the variant its cells are rank-tested against; ``shares``: (protocol,
    labels or None for the variants of ``shares_variants_of``) whose runs this protocol's cells hold too;
    ``order``: the run order of its variants (the rest follow in table order); ``note``: what it fixes;
    ``first_seed``: its runs' seeds start here (the reference runs' stay 0, 1, ...); ``matched``: (label, entry of
    the regime's matched.json) for a variant run at that entry's prompt batch (execute.matched_sizes), as the
    matched-updates protocols run all of theirs."""

    name: str
    baseline: str
    note: str
    order: tuple[str, ...] = ()
    shares: tuple[tuple[str, tuple[str, ...] | None], ...] = ()
    shares_variants_of: str = ""
    first_seed: int = 0
    matched: tuple[tuple[str, str], ...] = ()


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("reference", "grpo", "uniform GRPO, the regime's params; sets the target"),
    Protocol("equal-batch", "dapo", "every update holds B effective groups",
             order=("dapo", "sara", "sara+dps", "sara[carry]", "greso", "sara[context]", "sara+dps[context]",
                    "sara[floor]", "sara+dps[context+floor]", "pilot-commit", "reinforce-ada")),
    Protocol("equal-rollouts", "grpo", "every update spends B x k rollouts; its grpo runs are the reference runs",
             order=("grpo", "vigor", "pods", "sara[budget]"), shares=(("reference", ("grpo",)),)),
    Protocol("tuned", "grpo", "every allocator at its best point of one grid (GRID), chosen on the validation split",
             order=("grpo", "dapo", "greso", "sara", "sara[carry]", "sara+dps", "vigor", "pods", "sara[budget]")),
    Protocol("group-size", "grpo", f"uniform GRPO at k in {K_GRID}, B x k = {ROLLOUTS_PER_UPDATE} rollouts per "
             "update; the best k chosen on the validation split (its grpo runs are the reference runs)",
             order=tuple(f"grpo[k{k}]" if k != 8 else "grpo" for k in K_GRID), shares=(("reference", ("grpo",)),)),
    Protocol("grpo-tuning", "grpo", f"uniform GRPO tuned as users tune it: k in {TUNE_K} x lr in {TUNE_LR} at "
             f"{ROLLOUTS_PER_UPDATE} rollouts per update, then passes per batch in {TUNE_EPOCHS}, chosen on the "
             "validation split by the fitted reach (its lr 1e-4, one-pass cells are the group-size grid's)",
             shares=(("reference", ("grpo",)), ("group-size", ("grpo[k2]", "grpo[k4]")))),
    Protocol("null-aa", "grpo", "uniform GRPO against itself on disjoint seeds (5-9 against the reference runs' "
             "0-4): a null control", shares=(("reference", ("grpo",)),), first_seed=5),
    # the DAPO control replicated on fresh seeds (docs/training-study.md, "Null controls"), declared before its runs:
    # on pool its reading failed, and the diagnosis at equal updates put DAPO half a point below matched GRPO, about
    # 2.5 A/A standard deviations; the same two configurations (DAPO at B, GRPO at the matched-updates batch) on
    # seeds 5-9 of the warm starts it was read on, so that the gap either recurs on new seeds or does not
    Protocol("null-dapo", "grpo", "DAPO against GRPO at the matched-updates prompt batch on seeds 5-9 (the DAPO "
             "control's 0-4): its replication", order=("dapo", "grpo"), first_seed=5,
             matched=(("grpo", "matched-updates"),)),
    # equal effective groups per update against uniform GRPO at the same lr and schedule (matched_sizes): grpo with
    # a prompt batch whose expected effective groups equal the equal-batch allocators' B, compared with the
    # regime's equal-batch cells; and the converse, the equal-batch variants at B = GRPO-B's effective groups per
    # update, compared with the reference grpo runs
    Protocol("matched-updates", "grpo", "grpo at the prompt batch whose effective groups equal B",
             shares=(("equal-batch", None),), shares_variants_of="matched-updates-small"),
    Protocol("matched-updates-small", "grpo", "B = GRPO-B's effective groups per update",
             order=("dapo", "greso", "sara", "sara[carry]", "sara+dps", "sara+dps[context]"),
             shares=(("reference", ("grpo",)),)),
)}


def baseline_of(protocol: str) -> str:
    """The allocator each protocol's cells are tested against: dapo at equal batch (the same B effective groups
    per update), uniform grpo elsewhere."""
    return PROTOCOLS[protocol].baseline


def matched_entry(protocol: str, label: str) -> str | None:
    """The entry of a regime's matched.json whose prompt batch a run of ``label`` under ``protocol`` trains at
    (None: the regime's own): every run of a matched-updates protocol, and the variants a protocol names in
    ``matched``."""
    return protocol if protocol.startswith("matched-updates") else dict(PROTOCOLS[protocol].matched).get(label)


def shared_sources(protocol: str) -> tuple[tuple[str, frozenset[str] | None], ...]:
    """(protocol of the runs, labels or None: all) whose runs a cell of ``protocol`` holds besides its own."""
    p = PROTOCOLS[protocol]
    return tuple((src, frozenset(labs) if labs is not None else
                  frozenset(lab for lab, v in VARIANTS.items() if p.shares_variants_of in v.runs)
                  if p.shares_variants_of else None) for src, labs in p.shares)


@dataclass(frozen=True)
class Comparison:
    """Ours against a baseline under one protocol, read across a regime family's warm starts; ``readme``: one of the
    rows of the table of savings (warmstarts/training_summary.md, pasted into docs/results.md); ``front``: one of the
    README's opening rows, shown in each regime marked Regime.headline (benchmarks/readme.py evidence_headline: at
    most eight rows in all); ``value``: one of the README's rows of the allocators that price what a group teaches
    (issue 37: the value-based baselines and ours, benchmarks/readme.py value_headline)."""

    protocol: str
    ours: str
    baseline: str
    readme: bool = False
    front: bool = False
    value: bool = False


# the measurement issue's headline cells, then the other allocators of ours and the published baselines, each
# against its protocol's baseline, read on the families of hard and pool (a row appears where some warm start ran
# both cells; every row: warmstarts/training_warmstarts.md)
COMPARISONS: tuple[Comparison, ...] = (
    Comparison("equal-batch", "sara", "dapo", readme=True),
    Comparison("equal-batch", "sara+dps[context]", "dapo", readme=True),
    Comparison("equal-rollouts", "sara[budget]", "grpo", readme=True, front=True),
    Comparison("matched-updates", "sara", "grpo", readme=True),
    Comparison("matched-updates", "sara+dps[context]", "grpo", readme=True, front=True),
    Comparison("matched-updates-small", "sara", "grpo", readme=True),
    Comparison("matched-updates-small", "sara+dps[context]", "grpo", readme=True),
    Comparison("equal-batch", "sara+dps", "dapo"),
    Comparison("equal-batch", "sara[carry]", "dapo"),
    Comparison("equal-batch", "greso", "dapo"),
    Comparison("equal-rollouts", "vigor", "grpo", readme=True),
    Comparison("equal-batch", "pilot-commit", "dapo", readme=True),
    Comparison("matched-updates-small", "pilot-commit[n4]", "grpo", readme=True),
    Comparison("equal-batch", "reinforce-ada", "dapo", readme=True),
    # the published baselines of the equal-batch cells, and PODS, against uniform GRPO (the measurement issue: every
    # published baseline against what users run), on the runs they have: matched-updates reads an equal-batch cell
    # against GRPO at the prompt batch that carries B effective groups, matched-updates-small reads the cell at
    # GRPO-B's effective groups against the reference runs; outside the table of savings, so Holm's family stays
    # the declared one
    *(Comparison(p, lab, "grpo") for p, labs in (
        ("matched-updates", ("dapo", "greso", "pilot-commit", "reinforce-ada")),
        ("matched-updates-small", ("dapo", "pilot-commit", "reinforce-ada")), ("equal-rollouts", ("pods",)))
      for lab in labs),
    Comparison("equal-rollouts", "ar3po", "grpo", readme=True, front=True),
    Comparison("equal-rollouts", "ar3po", "grpo[b22]"),
    Comparison("equal-rollouts", "knapsack-rl", "grpo", readme=True, value=True),
    Comparison("equal-rollouts", "vip", "grpo", readme=True, value=True),
    Comparison("equal-rollouts", "mopps", "grpo", readme=True, value=True),
    Comparison("equal-rollouts", "cures", "grpo", readme=True, value=True),
    Comparison("equal-rollouts", "valor", "grpo", readme=True, front=True, value=True),
    Comparison("equal-rollouts", "valor[reuse]", "grpo", readme=True, value=True),
    # issue 37's second target: ours against the best published baseline of the same cells (AR3PO, the best of them
    # against uniform GRPO on both families), paired in the same warm starts
    Comparison("equal-rollouts", "valor", "ar3po"),
    Comparison("equal-rollouts", "valor[reuse]", "ar3po"),
)
COMPARISON_FAMILIES = ("hard", "pool")
# uniform GRPO at the k its warm start chose on the validation split (the group-size protocol): the baseline of
# BEST_K_COMPARISONS, each also read against grpo at k = 8 (benchmarks/group_size.py); ``front``: the README's
# opening table shows the row's saving against the best k beside its saving against k = 8
BEST_K = "grpo[best k]"
BEST_K_COMPARISONS: tuple[Comparison, ...] = (
    *(Comparison("group-size", f"grpo[k{k}]", BEST_K) for k in K_GRID if k != 8),
    Comparison("equal-rollouts", "ar3po[no-stop]", BEST_K),
    Comparison("equal-rollouts", "ar3po[no-reuse]", BEST_K),
    Comparison("equal-rollouts", "ar3po", BEST_K, front=True),
    Comparison("equal-rollouts", "sara[budget]", BEST_K, front=True),
    Comparison("equal-rollouts", "vigor", BEST_K),
    Comparison("matched-updates", "sara+dps[context]", BEST_K, front=True),
    Comparison("equal-batch", "sara", BEST_K),
    Comparison("equal-batch", "sara+dps[context]", BEST_K),
    *(Comparison("equal-rollouts", lab, BEST_K) for lab in ("knapsack-rl", "vip", "mopps", "cures")),
    Comparison("equal-rollouts", "valor", BEST_K, front=True),
    Comparison("equal-rollouts", "valor[reuse]", BEST_K),
)
# the reference runs (uniform GRPO at the regime's own batch, k = 8) named as a baseline: every matched-updates row
# against grpo is also read against them, beside its matched grpo, over the same warm starts (issue 54)
REFERENCE = "grpo[reference]"
# the best uniform GRPO (issue 54, item 3): the test cell of the configuration (k, lr, passes per batch) each warm
# start chose on its validation split (benchmarks/study/tuning.py, protocol grpo-tuning); and beside it the test-best
# configuration of that grid, a bound (chosen on the split it is read on), never a baseline. A row the README shows
# beside the best uniform GRPO is read against both, over the same warm starts as its own saving.
TUNED = "grpo[tuned]"
ORACLE = "grpo[oracle]"


def row_baselines(c: Comparison) -> tuple[str, ...]:
    """The baselines one row of ``c`` is read against, all over one set of warm starts: its own, the reference runs
    where its protocol matches updates, and TUNED with ORACLE beside it where the README shows the row beside the
    best uniform GRPO (Comparison.front or .value against grpo, with a BEST_K_COMPARISONS row of the same protocol
    and allocator)."""
    if c.baseline != "grpo":
        return (c.baseline,)
    best = (c.front or c.value) and any((b.protocol, b.ours) == (c.protocol, c.ours) for b in BEST_K_COMPARISONS)
    return ("grpo", *((REFERENCE,) if c.protocol == "matched-updates" else ()), *((TUNED, ORACLE) if best else ()))


AXIS_WORDS = {"cum_rollouts": "rollouts", "cum_tokens": "generated tokens", "seconds": "seconds"}


@dataclass(frozen=True)
class Target:
    """A saving target, declared before its cells ran: ``ours`` spends at least ``saving`` fewer rollouts to the
    target than ``baseline`` under ``protocol``, pooled over the warm starts of ``regime``'s family; with ``p``, the
    rank test's p-value lies below it too; ``ceiling``: its row gives the screening floor's ceiling (the floor reads
    the replay log of this regime's GRPO run). Every other allocator of ours in the cell is a candidate row."""

    regime: str
    protocol: str
    ours: str
    baseline: str
    saving: float
    p: float | None = None
    ceiling: bool = False
    axis: str = "cum_rollouts"

    @property
    def text(self) -> str:
        word = AXIS_WORDS[self.axis]
        share = f">= {self.saving:.0%} fewer" if self.saving > 0 else "fewer"  # saving 0: any saving above zero
        return (f"{self.regime}, {self.protocol}: {self.ours} spends {share} {word} to target "
                f"than {self.baseline}" + (f", rank test p < {self.p:g}" if self.p is not None else ""))


@dataclass(frozen=True)
class RatioTarget:
    """Our best allocator reaches the target with at most ``ratio`` x the ``axis`` cost of ``baseline`` under
    ``protocol`` in ``regime``'s family; ``pick``: how "our best" is chosen, on the validation split ("validation":
    the tuned protocol's choice.json) or as the highest saving of the reported cells ("reported", optimistic)."""

    regime: str
    protocol: str
    baseline: str
    ratio: float
    pick: str
    axis: str = "cum_rollouts"

    @property
    def text(self) -> str:
        word = AXIS_WORDS[self.axis]
        of = f"tuned {self.baseline}" if self.protocol == "tuned" else self.baseline
        return (f"{self.regime}, {self.protocol}: our best allocator reaches the target with <= {self.ratio}x the "
                f"{word} of {of}")


@dataclass(frozen=True)
class DominanceTarget:
    """``ours``' median accuracy is at least ``baseline``'s at every update count after the first 10% of the run,
    under ``protocol`` in ``regime`` (read on the warm starts whose runs used the latest allocator settings)."""

    regime: str
    protocol: str
    ours: str
    baseline: str

    @property
    def text(self) -> str:
        return f"{self.regime}, {self.protocol}: {self.ours}'s accuracy >= {self.baseline}'s at every update count " \
               "after the first 10% of the run"


# the targets of the measurement issue, declared before their cells ran (benchmarks/study_targets.py measures them;
# the simulator target and the sources' token claim are rows of their own kinds there)
RATIO_TARGETS: tuple[RatioTarget, ...] = (
    *(RatioTarget(regime, proto, "grpo", 0.5, pick="reported") for regime in ("pool", "hard")
      for proto in ("matched-updates", "matched-updates-small")),
    RatioTarget("hard", "tuned", "grpo", 0.5, pick="validation"),
    RatioTarget("hard", "tuned", "grpo", 0.7, pick="validation", axis="seconds"),
)
DOMINANCE_TARGETS: tuple[DominanceTarget, ...] = (
    DominanceTarget("hard", "equal-rollouts", "vigor", "grpo"),
    DominanceTarget("easy", "equal-rollouts", "vigor", "grpo"),
)
SAVING_TARGETS: tuple[Target, ...] = (
    Target("hard", "equal-batch", "sara", "dapo", 0.22, p=0.05, ceiling=True),
    Target("hard", "equal-batch", "sara+dps", "dapo", 0.50, ceiling=True),
    Target("pool", "equal-batch", "sara+dps", "dapo", 0.5),
    # issue 37's targets for our value allocator, declared with it (at most 0.6x uniform GRPO's rollouts)
    Target("hard", "equal-rollouts", "valor", "grpo", 0.4, p=0.05),
    Target("pool", "equal-rollouts", "valor", "grpo", 0.4, p=0.05),
    # and fewer rollouts than the best published baseline of the same cells, AR3PO (declared with valor's cells in
    # docs/training-study.md, "VALOR", before its runs; rows of the targets table since 2026-12-05)
    Target("hard", "equal-rollouts", "valor", "ar3po", 0.0),
    Target("pool", "equal-rollouts", "valor", "ar3po", 0.0),
    # and on the worked-answer regime, in generated tokens (at most 0.6x uniform GRPO's), declared with steps-fine
    Target("steps-fine", "equal-rollouts", "valor[tokens]", "grpo", 0.4, p=0.05, axis="cum_tokens"),
)


@dataclass(frozen=True)
class Candidates:
    """Rows without a target of their own beside the declared ones (benchmarks/study_targets.py): each allocator of
    ours that ``protocol`` runs in ``regime`` and no saving target there names (with ``published``, the published
    ones too), against ``baseline``, pooled over the family where several warm starts ran and per warm start;
    ``best_published``: also each of ours against the cell's best published allocator; ``of``: instead, the
    allocators the targets and candidates of regime ``of`` name, read in this regime's own cell (an
    out-of-regime check of what ``of`` chose)."""

    regime: str
    protocol: str
    baseline: str
    published: bool = False
    best_published: bool = False
    of: str = ""


CANDIDATES: tuple[Candidates, ...] = (
    Candidates("hard", "equal-batch", "dapo"),
    Candidates("easy", "equal-batch", "dapo", of="hard"),
    Candidates("pool", "equal-batch", "dapo", published=True, best_published=True),
    Candidates("steps-fine", "equal-rollouts", "grpo"),
)
# the worked-answer family (steps): what each allocator buys in rollouts, generated tokens and training seconds
COST_COMPARISONS: tuple[Comparison, ...] = (
    Comparison("equal-batch", "sara", "dapo"),
    Comparison("equal-batch", "sara+dps[context]", "dapo"),
    Comparison("equal-batch", "sara[tokens]", "dapo"),
    Comparison("equal-batch", "sara[tokens]", "sara"),
    Comparison("equal-rollouts", "vigor", "grpo"),
    Comparison("matched-updates", "sara", "grpo"),
)
COST_FAMILY = "steps"
# the sources' claim read on COST_FAMILY: this comparison saves more in generated tokens than in rollouts
TOKEN_CLAIM = Comparison("equal-batch", "sara", "dapo")
COST_AXES = ("cum_rollouts", "cum_tokens", "seconds")


# ----- regimes -------------------------------------------------------------------------------------------
# Held-out rows of every regime: the first TEST_ROWS rows of the prepared test split are the reported
# test split, the rest the validation split the tuned protocol selects on (disjoint from test and train).
TEST_ROWS = 2000
VALIDATION_ROWS = 1000
_HELDOUT: Overrides = {"prepare": {"n_test": TEST_ROWS + VALIDATION_ROWS}}


def split_rows(split: str) -> int:
    """The held-out rows of a split: VALIDATION_ROWS for ``validation``, else TEST_ROWS. An evaluation on the split
    covers at most these (rlvr_core.training draws min(eval_size, rows) of them), so a run records no more."""
    return VALIDATION_ROWS if split == "validation" else TEST_ROWS

# Regime ``easy`` on top of params.yaml (whose prepare and warmstart sections are regime ``hard``).
EASY: Overrides = {"prepare": {"digits": [1, 2, 3]}, "warmstart": {"noise": 0.6, "noisy_difficulties": [2, 3]}}
# ``steps``: hard's problems with worked answers (task arithmetic-steps, rlvr_core/data/arithmetic_steps.py), so
# that generation dominates a step and failing completions run longer than passing ones, as in real RLVR; a
# shorter warm start (its sequences are about 4x longer) and completions of up to 64 tokens. params-steps.yaml
# is params.yaml with these overrides (tests/benchmarks/test_regimes_default.py). One alternative was tried on
# uniform GRPO alone before any other allocator ran, and dropped (docs/training-study.md): lr 2e-5 over 40k
# rollouts with max_new_tokens 96 (benchmarks/results/regimes_steps_lr2e-5_s0.json) missed the same criteria
# at three times the wall-clock.
STEPS: Overrides = {"prepare": {"task": "arithmetic-steps"},
                    "warmstart": {"steps": 1500, "batch_size": 32, "lr": 1e-3},
                    "train": {"max_new_tokens": 64}, "evaluate": {"max_new_tokens": 64}}

# The hard regime's criteria, fixed before any candidate ran (benchmarks/regimes.py, docs/training-study.md).
CRITERIA = {"min_zero_variance_share": 0.5, "min_evals_below_target": 10, "min_rise_rollouts": 20000,
            "target_fraction": 0.8}
# Conditioning (the measurement issue, 36), declared before the warm starts built after it and checked on uniform
# GRPO alone (benchmarks.study.stats.conditioning): the reference runs' slope at their median fitted reach (a line
# through their raw evaluations within CONDITIONING_WINDOW evaluations either side), their median headroom above
# the target at the end of the budget and their median evaluations before the reach. A warm start that misses is
# reported and named, not dropped.
CONDITIONING = {"min_slope_points_per_1k": 0.1, "min_headroom_points": 1.0, "min_evals_before_target": 10}
CONDITIONING_WINDOW = 3
# ``steps`` must also have the cost structure of real RLVR: generation at least 65% of a GRPO step's training
# wall-clock (median over the reference runs of generate_s / (generate + verify + allocate + update)), and at the
# start of RL failing completions at least 1.5x as long as passing ones in median tokens (data.start_lengths).
STEPS_CRITERIA = {"min_generate_share": 0.65, "min_fail_pass_length_ratio": 1.5}

# ``steps-fine`` (issue 36: "make steps harder, or its evaluation grid finer, until its reach spans at least 10
# evaluations"): steps' data, warm start and settings, evaluated every 256 rollouts (one GRPO step) over half its
# budget, 12,288 rollouts. steps' uniform GRPO reaches its target after 1-4 evaluations of EVAL_GRID, at about
# 4,400 rollouts, and its curve is flat after about 10,000; a grid six times finer over the rising half puts about
# 12 evaluations before a reach near 3,000 rollouts at the same cost per run (48 evaluations). Declared before its
# reference runs; its target comes from them alone. The rise criterion (20,000 rollouts) cannot hold on a budget of
# 12,288 and is the one the measurement issue replaces by CONDITIONING, so it is 0 here; the rest is CRITERIA.
STEPS_FINE_CRITERIA = {**CRITERIA, "min_rise_rollouts": 0}

EVAL_GRID = 1536  # rollouts between evaluations of every rollout-grid regime (6 GRPO steps at B=32, k=8)
STEP_GRID_PROTOCOLS = ("equal-batch", "equal-rollouts", "tuned")
ROLLOUT_GRID_PROTOCOLS = ("reference", "equal-batch", "equal-rollouts", "matched-updates", "matched-updates-small",
                          "group-size", "null-aa", "null-dapo")
WS_SEP = "-ws"  # "<regime>-ws<J>": the regime from warm start seed J (warmstart.seed = J)


@dataclass(frozen=True)
class Regime:
    """A training regime: ``overrides`` on params.yaml; ``budget``: rollouts per run; ``grid``: "steps" (an
    evaluation every ``eval_every`` steps: the regimes whose runs predate the rollout grid, their warm starts built
    on another machine) or "rollouts" (every EVAL_GRID rollouts); ``criteria``: what its uniform GRPO runs must
    show, fixed before they ran (``extra_criteria`` beside them); ``pool``: RL draws from this many training prompts
    only (0: all); ``headline``: the README's headline table shows its cells (the regimes the targets are declared
    on; every regime's cells: training_study.md); ``eval_rollouts``: a rollout-grid regime's own evaluation interval
    in rollouts (0: EVAL_GRID)."""

    name: str
    overrides: Overrides = field(default_factory=dict)
    budget: int | None = None
    grid: str | None = None
    criteria: Mapping[str, float] | None = None
    eval_every: int = 0
    pool: int = 0
    extra_criteria: Mapping[str, float] | None = None
    headline: bool = False
    eval_rollouts: int = 0

    @property
    def eval_grid(self) -> int:
        """Rollouts between evaluations of a rollout-grid regime (its own ``eval_rollouts``, else EVAL_GRID)."""
        return self.eval_rollouts or EVAL_GRID

    def __post_init__(self) -> None:
        for name in ("budget", "grid", "criteria"):
            if getattr(self, name) is None:
                raise ValueError(f"regime {self.name!r}: no {name} declared (Regime.{name}: budget = rollouts per "
                                 "run, grid = 'steps' or 'rollouts', criteria = what its reference runs must show)")
        if self.grid not in ("steps", "rollouts"):
            raise ValueError(f"regime {self.name!r}: grid must be 'steps' or 'rollouts', got {self.grid!r}")
        if self.grid == "steps" and self.eval_every <= 0:
            raise ValueError(f"regime {self.name!r}: a step-grid regime needs eval_every (steps between evaluations)")
        if not isinstance(self.budget, int) or self.budget <= 0:
            raise ValueError(f"regime {self.name!r}: budget must be a positive number of rollouts, got {self.budget!r}")
        if not isinstance(self.eval_rollouts, int) or self.eval_rollouts < 0 or \
                (self.eval_rollouts and self.grid != "rollouts"):
            raise ValueError(f"regime {self.name!r}: eval_rollouts must be a number of rollouts >= 0 (0: EVAL_GRID) "
                             f"on a rollout-grid regime, got {self.eval_rollouts!r} on grid {self.grid!r}")


# ``hard`` is the candidate the regime search chose (benchmarks/results/regimes/regimes.md), params.yaml as it is.
# ``pool`` is hard's data and warm start, RL drawing from a finite pool of 1,000 training prompts (stratified by
# digits x op) that recurs: GRPO sees each prompt about 5 times in 40k rollouts, as real RLVR trains many epochs
# over MATH (7.5k) or DAPO-Math-17k. ``pool-k16``: half the pool, k = 16, B = 16. Sizing: one (regime, protocol)
# of 5 seeds in about two hours on one core; ``steps``: 96 GRPO steps, about 5 minutes a run.
REGIMES: dict[str, Regime] = {r.name: r for r in (
    Regime("easy", EASY, budget=30000, grid="steps", eval_every=6, criteria=CRITERIA),
    Regime("hard", {}, budget=40000, grid="steps", eval_every=6, criteria=CRITERIA, headline=True),
    Regime("pool", {}, budget=40000, grid="rollouts", pool=1000, criteria=CRITERIA, headline=True),
    Regime("pool-k16", {"train": {"k": 16, "batch_size": 16}}, budget=40000, grid="rollouts", pool=500,
           criteria=CRITERIA),
    Regime("steps", STEPS, budget=24576, grid="rollouts", criteria=CRITERIA, extra_criteria=STEPS_CRITERIA),
    Regime("steps-fine", STEPS, budget=12288, grid="rollouts", eval_rollouts=256, criteria=STEPS_FINE_CRITERIA),
)}


def base_regime(name: str, regimes: Mapping[str, Regime] | None = None) -> tuple[str, int | None]:
    """(regime, warm-start seed) of a regime name such as ``hard-ws2`` (seed None: the regime's own)."""
    regimes = REGIMES if regimes is None else regimes
    base, sep, ws = name.rpartition(WS_SEP)
    if sep and base in regimes and ws.isdigit():
        return base, int(ws)
    if name not in regimes:
        raise ValueError(f"unknown regime {name!r}; regimes: {sorted(regimes)}, each also as <regime>{WS_SEP}<J>")
    return name, None


def regime(name: str) -> Regime:
    """The Regime record of a regime name (a warm-start variant ``<regime>-ws<J>`` is its base's)."""
    return REGIMES[base_regime(name)[0]]


def step_grid(name: str) -> bool:
    """Whether ``name``'s runs evaluate every n steps: the step-grid regimes themselves, not their warm starts
    (a warm-start variant has its own policy, runs and target, all on the rollout grid). These are the legacy
    regimes, whose runs predate the rollout grid; the rule decides their protocols, vigor's fill, their
    preregistration, their evaluation schedule and the store's sort order."""
    return name in REGIMES and REGIMES[name].grid == "steps"


def reported_protocols(name: str) -> tuple[str, ...]:
    """The protocols of a regime's plan (training_study.md counts their runs): those with a variant to run there
    (null-dapo runs on pool's warm starts only), and the reference runs."""
    return tuple(p for p in (STEP_GRID_PROTOCOLS if step_grid(name) else ROLLOUT_GRID_PROTOCOLS)
                 if p == "reference" or labels(p, name))


def budget_of(name: str) -> int | None:
    """The declared rollout budget of a regime itself (None for a warm-start variant: its target's)."""
    return REGIMES[name].budget if name in REGIMES else None


def merge(*layers: Mapping[str, Mapping[str, Any]]) -> Overrides:
    """Section-wise merge of override layers (later wins)."""
    out: Overrides = {}
    for layer in layers:
        for sec, vals in layer.items():
            out.setdefault(sec, {}).update(copy.deepcopy(dict(vals)))
    return out


def regime_params(name: str | Mapping[str, Mapping[str, Any]], extra: Mapping[str, Mapping[str, Any]] | None = None,
                  params_file: Path = PARAMS_FILE) -> Params:
    """params.yaml + the held-out split sizes + the regime's overrides (+ ``extra``), validated. A name
    ``<regime>-ws<J>`` sets warmstart.seed = J on top of the regime."""
    if isinstance(name, str):
        base, ws = base_regime(name)
        over = merge(REGIMES[base].overrides, {} if ws is None else {"warmstart": {"seed": ws}})
    else:
        over = name
    return load_params(params_file, merge(_HELDOUT, over, extra or {}))


def in_scope(scope: Scope, regime_name: str) -> bool:
    """Whether a variant whose ``runs`` give ``scope`` runs in regime ``regime_name``."""
    if scope == ALL:
        return True
    if scope == STEP_GRID:
        return step_grid(regime_name)
    if scope == ROLLOUT_GRID:
        return not step_grid(regime_name)
    return base_regime(regime_name)[0] in scope


def labels(protocol: str, regime_name: str, variants: Mapping[str, Variant] | None = None) -> tuple[str, ...]:
    """The variants ``protocol`` runs in ``regime_name``, in its run order (Protocol.order, then table order)."""
    variants = VARIANTS if variants is None else variants
    mine = [lab for lab, v in variants.items() if protocol in v.runs and in_scope(v.runs[protocol], regime_name)]
    order = PROTOCOLS[protocol].order
    return tuple(sorted(mine, key=lambda lab: (order.index(lab) if lab in order else len(order),
                                               list(variants).index(lab))))


def table_order(labs: Any) -> tuple[str, ...]:
    """``labs`` in the study's table order (VARIANTS)."""
    order = list(VARIANTS)
    return tuple(sorted(labs, key=order.index))


def ours_in(protocol: str, regime_name: str) -> tuple[str, ...]:
    """The variants of ours (Variant.ours) that ``protocol`` runs in ``regime_name``, in table order."""
    return table_order(lab for lab in labels(protocol, regime_name) if VARIANTS[lab].ours)


def published_in(protocol: str, regime_name: str) -> tuple[str, ...]:
    """The published allocators (Variant.published) that ``protocol`` runs in ``regime_name``, in table order."""
    return table_order(lab for lab in labels(protocol, regime_name) if VARIANTS[lab].published)


def flagged(flag: str) -> tuple[str, ...]:
    """The variants whose boolean field ``flag`` is set (``simulated``, ``round_priced``, ``history``,
    ``small_groups``), in table order."""
    if not isinstance(getattr(Variant, flag, None), bool):
        raise ValueError(f"Variant has no flag {flag!r}")
    return tuple(lab for lab, v in VARIANTS.items() if getattr(v, flag))


# ----- the tuned protocol's grid, the quick path, the cells' fixed points -----------------------------------
GRID: tuple[tuple[int, float], ...] = tuple((b, lr) for b in (16, 32, 64) for lr in (1e-4, 2e-4))
GRID_SEEDS = (100, 101)  # tuned: seeds of the selection runs on the validation split (not the reported seeds)
QUICK = {"rollouts": 512, "eval_every": 1, "eval_size": 100, "seeds": 2, "variants": 1}
BUDGETS = (10000, 20000, 30000, 40000)  # accuracy at fixed rollout budgets (the isotonic fit's)
FRACTIONS = (0.6, 0.7, 0.8)  # reach at these fractions of the reference's gain (the fitted statistic)


def grid_tag(grid: tuple[int, float] | None) -> str:
    return "" if grid is None else f"-b{grid[0]}-lr{grid[1]:g}"


def grid_points(quick: bool) -> tuple[tuple[int, float], ...]:
    return GRID[:2] if quick else GRID


def grid_seeds(quick: bool) -> tuple[int, ...]:
    return GRID_SEEDS[:1] if quick else GRID_SEEDS


def sizing(regime_name: str, quick: bool) -> dict[str, int]:
    """Budget and evaluation schedule of a regime: the step-grid regimes (whose runs predate the rollout grid)
    evaluate every ``eval_every`` steps, every other regime (warm-start variants included) each ``eval_grid``
    rollouts (EVAL_GRID unless the regime declares its own)."""
    r = regime(regime_name)
    b = {"eval_every_rollouts": 0, "rollouts": r.budget, "eval_every": r.eval_every}
    if not step_grid(regime_name):
        b.update(eval_every=0, eval_every_rollouts=r.eval_grid)
    b["eval_size"] = TEST_ROWS
    if quick:
        b.update({k: QUICK[k] for k in ("rollouts", "eval_every", "eval_size")}, eval_every_rollouts=0)
    return b


def select(protocol: str, regime_name: str, quick: bool, variants: tuple[str, ...] | list[str] | None = None
           ) -> tuple[str, ...]:
    """The variants a run of the study trains: ``labels``, or ``variants`` of them in the order given; the first
    only with ``quick``."""
    labs = labels(protocol, regime_name)
    if variants:
        unknown = sorted(set(variants) - set(labs))
        if unknown:
            raise ValueError(f"protocol {protocol!r} has no allocator(s) {unknown}; it has {list(labs)}")
        labs = tuple(dict.fromkeys(variants))  # the order given, each once
    return labs[: QUICK["variants"]] if quick else labs


def expected_runs(protocol: str, regime_name: str, seeds: int = 5) -> int:
    """Runs of the full plan of a (regime, protocol), reference included (tuned: grid plus the chosen points)."""
    labs = labels(protocol, regime_name)
    n = len(labs) * seeds
    if protocol == "tuned":
        n += len(labs) * len(GRID) * len(GRID_SEEDS)
    if protocol == "group-size":
        return n + len(labs) * len(GRID_SEEDS)  # every k's validation runs; k = 8's test runs are the reference
    return n + (0 if protocol in ("reference", "equal-rollouts") else seeds)
