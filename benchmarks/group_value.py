"""What a trained group teaches: each group's first-order effect on a held-out objective, in real training.

    nice python -m benchmarks.group_value                # 8 runs: hard-ws3/4, pool-ws3/4 x grpo, sara (~30 min)
    python -m benchmarks.group_value --fit-only          # refit and redraw from the committed per-run files
    python -m benchmarks.group_value --quick --out DIR   # a short warm start and budget, a smoke run
    nice python -m benchmarks.group_value --calibration  # 4 runs: hard-ws1, pool-ws1 x grpo, sara, with groups of
                                                         # 8 split into 2 and 4 (~12 min): VALOR's constants

Every allocator here counts a group as worth one if it is mixed and zero if not. This measures what a group is
worth instead. A run of the study's configuration (benchmarks.study.execute.run_params: the regime, its
protocol's settings, seed 0) is trained with a probe around the trainer's update. Before each update, on the same
parameters, the probe computes:

- ``h``: the gradient of the held-out objective, the mean negative log-likelihood of the correct answers (the
  task's teacher, as the warm start writes them) of HELDOUT fixed rows of the validation split, which RL neither
  trains on nor reports;
- for every group the update trains, ``g``: the gradient of that group's share of the update's GRPO loss
  (rlvr_core.grpo.trainer's own loss pass over its rows, normalised as the whole batch is, so the groups'
  gradients sum to the update's);
- ``value`` = <g, h> / |h|: how much a unit step along the group's descent direction lowers the held-out NLL, to
  first order, per unit of held-out gradient. AdamW's preconditioning and the clip are left out: this is the
  plain gradient's effect, the quantity the theoretical forms below speak of.

Beside each value: n (rows), passes, p-hat, the prompt's feature cell (difficulty, op), how many times the prompt
was trained before in the run, and the group's |advantage| mass. The probe draws no random number and leaves the
gradients cleared, so the run trains exactly as without it (``same_curve``: the probed GRPO run against the study's
committed reference run of the same seed). Its cost is stated per run (``probe_s``); the study's runs never pay it.

The fit (``fit``): the mean value per p-hat bin, against four forms of the pass rate scaled by least squares over
the groups: a mixed group counts one (``mixed``: what SARA, DAPO and the rest count), GRPO's expected update
``sqrt(p(1-p))``, the reward variance ``p(1-p)``, and Knapsack RL's ``p(1-p)^2``; each with its share of the
variance explained (R^2 over groups; beside them the R^2 of the bin means themselves, the most any function of
p-hat can explain) and the rank correlation of the bin means. Then the value against times
trained (a slope with a bootstrap interval, p-hat bins held fixed) and against the |advantage| mass.

Writes benchmarks/results/group_value/: runs/<regime>_<variant>_s<seed>.parquet (one row per trained group, a
run's file kept so that a killed invocation resumes), group_value.json (the fit and each run's cost),
group_value.md and group_value.png.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmarks.common import RESULTS, output_dir, save_figure

RUNS = tuple((regime, label, protocol) for regime in ("hard-ws3", "hard-ws4", "pool-ws3", "pool-ws4")
             for label, protocol in (("grpo", "reference"), ("sara", "equal-batch")))
# --calibration: warm start 1 of both families, which no headline cell pools, measured with sub-groups; its fit
# fixes the constants of our value allocator (docs/design.md section 4.17) before any study cell of it runs
CALIBRATION = tuple((regime, label, protocol) for regime in ("hard-ws1", "pool-ws1")
                    for label, protocol in (("grpo", "reference"), ("sara", "equal-batch")))
SUBSIZES = (2, 4)  # with --calibration, each trained group of 8 is also measured split into groups of these sizes
HELDOUT = 256  # validation rows of the held-out objective
MIN_BIN = 30  # the plot of value against times trained shows counts with at least this many groups
FORMS = {"mixed": lambda p: np.ones_like(p), "sqrt(p(1-p))": lambda p: np.sqrt(p * (1 - p)),
         "p(1-p)": lambda p: p * (1 - p), "p(1-p)^2": lambda p: p * (1 - p) ** 2}


class Probe:
    """Measures every trained group's value before the update that trains it (module docstring)."""

    def __init__(self, heldout_ids: Any, heldout_mask: Any, train_rows: Sequence[Mapping[str, Any]],
                 subsizes: Sequence[int] = (), whole: int = 8) -> None:
        self.ids, self.mask, self.rows, self.subsizes = heldout_ids, heldout_mask, train_rows, tuple(subsizes)
        self.whole = whole  # the group size that is split into ``subsizes``
        self.records: list[dict[str, Any]] = []
        self.trained: Counter[int] = Counter()
        self.updates = 0
        self.seconds = 0.0

    def heldout_gradient(self, trainer: Any) -> tuple[Any, float]:
        """The held-out NLL's gradient over the trainer's parameters (flat), and the NLL."""
        import torch

        from rlvr_core.models.tiny import PAD_ID

        trainer.optimizer.zero_grad(set_to_none=False)
        ids, mask = self.ids.to(trainer.device), self.mask.to(trainer.device)
        logits = trainer.model(input_ids=ids, attention_mask=(ids != PAD_ID).long(), use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        m = mask[:, :-1].float()
        nll = -(lp * m).sum() / m.sum()
        nll.backward()
        return torch.cat([p.grad.reshape(-1).clone() for p in trainer.params]), float(nll.detach())

    def measure(self, trainer: Any, train_batch: Any) -> None:
        """Record each trained group of ``train_batch`` (nothing when the update trains nothing)."""
        from rlvr_core.grpo.loss import loss_normaliser

        t0 = time.perf_counter()
        self.updates += 1
        local, _ = trainer.prepare(train_batch)
        normaliser = loss_normaliser(local.completion_mask, trainer.config.aggregation)
        if len(local) == 0 or normaliser <= 0:
            return
        was = trainer.model.training
        trainer.model.eval()  # as the update's own passes run
        try:
            self._groups(trainer, train_batch, local, normaliser)
        finally:
            trainer.optimizer.zero_grad(set_to_none=True)  # the update starts from cleared gradients, as always
            trainer.model.train(was)
        self.seconds += time.perf_counter() - t0

    def _groups(self, trainer: Any, train_batch: Any, local: Any, normaliser: float) -> None:
        import torch

        h, nll = self.heldout_gradient(trainer)
        h_norm = float(h.norm())
        ro = train_batch.rollouts
        gid, rows = local.group_id.cpu().numpy(), local.row.cpu().numpy()
        seen = []
        for g in np.unique(gid):
            sel = np.flatnonzero(gid == g)
            trainer.optimizer.zero_grad(set_to_none=False)
            trainer._pass(local.select(sel), normaliser, grad=True)  # the update's loss over this group's rows
            flat = torch.cat([p.grad.reshape(-1) for p in trainer.params])
            pid = int(ro.prompt_id[rows[sel[0]]])
            rewards = np.asarray(ro.reward)[rows[sel]] > 0.5
            row = self.rows[pid]
            self.records.append({
                "update": self.updates, "prompt_id": pid, "n": len(sel), "passes": int(rewards.sum()),
                "p_hat": float(rewards.mean()), "difficulty": int(row.get("difficulty", -1)),
                "op": str(row.get("op", "")), "times_trained": self.trained[pid],
                "adv_abs_mass": float(local.advantages[sel].abs().sum()), "grad_norm": float(flat.norm()),
                "inner": float(flat @ h), "heldout_norm": h_norm, "heldout_nll": nll,
                "value": float(flat @ h) / h_norm if h_norm > 0 else 0.0,
                **self._subgroups(trainer, local, sel, np.asarray(ro.reward)[rows[sel]], normaliser, h, h_norm)})
            seen.append(pid)
        self.trained.update(seen)


    def _subgroups(self, trainer: Any, local: Any, sel: Any, rewards: Any, normaliser: float, h: Any,
                   h_norm: float) -> dict[str, float]:
        """For a group of ``whole`` (8) rows: ``value_n{s}``, the mean value of the group's rows split in order into
        disjoint groups of s (each with its own GRPO advantages, under the update's normaliser), and ``mixed_n{s}``, the
        share of those that are mixed. The rows are i.i.d. draws, so this is a group of s at the same prompt and
        parameters: how the value grows with n."""
        import dataclasses

        import torch

        out: dict[str, float] = {}
        if len(sel) != self.whole or h_norm <= 0:
            return out
        for s in self.subsizes:
            values, mixed = [], []
            for part in np.split(np.arange(self.whole), self.whole // s):
                r = torch.as_tensor(np.asarray(rewards, dtype=np.float32)[part])
                adv, _ = trainer.advantage_fn(r, torch.zeros(s, dtype=torch.long), eps=trainer.config.adv_eps,
                                              num_groups=1)
                sub = dataclasses.replace(local.select(sel[part]), advantages=torch.as_tensor(adv, dtype=torch.float32))
                trainer.optimizer.zero_grad(set_to_none=False)
                trainer._pass(sub, normaliser, grad=True)
                values.append(float(torch.cat([p.grad.reshape(-1) for p in trainer.params]) @ h) / h_norm)
                mixed.append(float(0 < float(r.sum()) < s))
            out[f"value_n{s}"], out[f"mixed_n{s}"] = float(np.mean(values)), float(np.mean(mixed))
        return out


@contextmanager
def probing(probe: Probe) -> Iterator[None]:
    """Every GRPOTrainer update inside the block is measured by ``probe`` first (the class's method is restored
    on the way out: only this benchmark's run pays for it)."""
    from rlvr_core.grpo.trainer import GRPOTrainer

    original = GRPOTrainer.step

    def step(self: Any, train_batch: Any) -> dict[str, float]:
        probe.measure(self, train_batch)
        return original(self, train_batch)

    GRPOTrainer.step = step
    try:
        yield
    finally:
        GRPOTrainer.step = original


def heldout_targets(rows: Sequence[Mapping[str, Any]], policy: Path, task: str) -> tuple[Any, Any]:
    """The correct answers of ``rows`` encoded as the warm start trains on them: (ids, mask)."""
    from rlvr_core.models.policy import load_any_policy
    from rlvr_core.models.tokenizer import encode_prompts
    from rlvr_core.models.warmstart import _encode_targets
    from rlvr_core.tasks import warm_start_teacher

    _, tok = load_any_policy(policy, device="cpu")
    targets = warm_start_teacher(task)(list(rows))
    return _encode_targets(encode_prompts(tok, targets.prompts), targets.clean, tok)


def run_one(regime: str, label: str, protocol: str, seed: int, *, work: Path, quick: bool,
            subsizes: Sequence[int] = ()) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One probed run of the study's configuration: its groups, and what it cost and reached."""
    from benchmarks.study import data as D
    from benchmarks.study.execute import run_params
    from rlvr_core.training import check_and_train

    data = D.load_data(regime, work, quick)
    params = run_params(regime, label, seed, quick=quick, protocol=protocol)
    ids, mask = heldout_targets(data["validation"][:HELDOUT], data["policy"], params.prepare.task)
    probe = Probe(ids, mask, data["train"], subsizes)
    run_dir = work / "group_value" / f"{regime}_{label}_s{seed}"
    t0 = time.perf_counter()
    with probing(probe):
        res = check_and_train(params.train, policy_dir=data["policy"], train_rows=data["train"],
                              test_rows=data["test"], run_dir=run_dir, resume=False, task=params.prepare.task)
    curve = [{"step": r["step"], "greedy_acc": r["eval/greedy_acc"]} for r in res.metrics if "eval/greedy_acc" in r]
    info = {"regime": regime, "variant": label, "protocol": protocol, "seed": seed, "wall_s": time.perf_counter() - t0,
            "probe_s": probe.seconds, "updates": probe.updates, "groups": len(probe.records), "curve": curve,
            "policy_sha256": data["policy_sha256"]}
    return pd.DataFrame(probe.records).assign(regime=regime, variant=label, seed=seed), info


def same_curve(info: Mapping[str, Any], results: Path) -> bool | None:
    """Whether the probed run's evaluations equal the study's committed run of the same configuration and seed
    (None: the study has no such run)."""
    from benchmarks.study.store import RunStore

    path = RunStore(results).run_file(info["regime"], info["protocol"], info["variant"], info["seed"])
    if not path.exists():
        return None
    recorded = [(c["step"], c["greedy_acc"]) for c in json.loads(path.read_text())["curve"]]
    return recorded == [(c["step"], c["greedy_acc"]) for c in info["curve"]]


# ----- the fit ---------------------------------------------------------------------------------------------------
def form_fit(groups: pd.DataFrame, name: str) -> dict[str, Any]:
    """``value ~ a * form(p_hat)`` by least squares over the groups: the scale, R^2 (against the mean), and the
    rank correlation of the p-hat bins' mean values with the form."""
    from scipy import stats as sps

    v, f = groups["value"].to_numpy(float), FORMS[name](groups["p_hat"].to_numpy(float))
    a = float(f @ v / (f @ f))
    sst = float(((v - v.mean()) ** 2).sum())
    r2 = 1.0 - float(((v - a * f) ** 2).sum()) / sst if sst > 0 else None
    bins = groups.groupby("p_hat")["value"].mean()
    fb = FORMS[name](bins.index.to_numpy(float))
    rho = sps.spearmanr(bins.to_numpy(), fb).statistic if len(bins) > 2 and np.ptp(fb) > 0 else None
    return {"form": name, "scale": a, "r2": r2, "bin_rank_correlation": None if rho is None or np.isnan(rho)
            else float(rho)}


def bin_means(groups: pd.DataFrame, column: str = "p_hat", seed: int = 0, draws: int = 2000) -> list[dict[str, Any]]:
    """Mean value per value of ``column`` (p-hat, or the prompt's difficulty), with a 95% bootstrap interval
    (groups resampled within the bin)."""
    rng = np.random.default_rng(seed)
    out = []
    for p, sub in groups.groupby(column):
        v = sub["value"].to_numpy(float)
        boots = v[rng.integers(0, len(v), size=(draws, len(v)))].mean(axis=1)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        out.append({column: float(p), "groups": len(v), "mean": float(v.mean()), "lo": float(lo), "hi": float(hi)})
    return out


def history_slope(groups: pd.DataFrame, seed: int = 0, draws: int = 2000) -> dict[str, Any]:
    """The value's slope per earlier training of the prompt, within p-hat bins (each bin's mean removed), with a
    95% bootstrap interval over groups."""
    x = groups["times_trained"].to_numpy(float)
    v = groups["value"].to_numpy(float) - groups.groupby("p_hat")["value"].transform("mean").to_numpy(float)
    x = x - groups.assign(x=x).groupby("p_hat")["x"].transform("mean").to_numpy(float)
    if not (x ** 2).sum():
        return {"slope": None, "lo": None, "hi": None, "max_times_trained": int(groups["times_trained"].max())}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(draws, len(v)))
    boots = (x[idx] * v[idx]).sum(1) / np.maximum((x[idx] ** 2).sum(1), 1e-12)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"slope": float(x @ v / (x @ x)), "lo": float(lo), "hi": float(hi),
            "max_times_trained": int(groups["times_trained"].max())}


def fit(groups: pd.DataFrame) -> dict[str, Any]:
    """Every figure of the fit, over all groups and per regime family (hard, pool)."""
    scopes = {"all": groups, **{fam: g for fam, g in groups.groupby(groups["regime"].str.split("-ws").str[0])}}
    out: dict[str, Any] = {}
    for scope, g in scopes.items():
        vary = len(g) > 2 and g["value"].std() > 0 and g["adv_abs_mass"].std() > 0
        corr = np.corrcoef(g["value"], g["adv_abs_mass"])[0, 1] if vary else None
        v = g["value"].to_numpy(float)
        sst = float(((v - v.mean()) ** 2).sum())
        resid = v - g.groupby("p_hat")["value"].transform("mean").to_numpy(float)
        out[scope] = {"groups": len(g), "runs": int(g.groupby(["regime", "variant", "seed"]).ngroups),
                      "r2_any_function_of_p_hat": 1.0 - float((resid ** 2).sum()) / sst if sst > 0 else None,
                      "positive_share": float((g["value"] > 0).mean()), "mean_value": float(g["value"].mean()),
                      "n_counts": {str(int(k)): int(c) for k, c in g["n"].value_counts().sort_index().items()},
                      "forms": [form_fit(g, name) for name in FORMS], "bins": bin_means(g),
                      "by_difficulty": bin_means(g, "difficulty") if "difficulty" in g else [],
                      "history": history_slope(g), "value_vs_adv_abs_mass_correlation":
                      None if corr is None or np.isnan(corr) else float(corr)}
    if "difficulty" in groups:  # the pass rate's effect within each feature cell's difficulty
        t = groups.groupby(["p_hat", "difficulty"])["value"].agg(["mean", "count"])
        out["all"]["by_p_hat_within_difficulty"] = [
            {"p_hat": float(p), "difficulty": int(d), "mean": float(r["mean"]), "groups": int(r["count"])}
            for (p, d), r in t.iterrows()]
    return out


# ----- the calibration of VALOR's constants (--calibration) -------------------------------------------------------
EXPONENTS_A = (0.0, 0.5, 1.0, 1.5, 2.0)
EXPONENTS_B = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)


def size_ratio(groups: pd.DataFrame, s: int, seed: int = 0, draws: int = 2000) -> dict[str, Any]:
    """How a mixed group's value grows with its size: sum of the value of the groups of s split from groups of 8,
    over the sum of (their mixed share x the whole group's value). Under V(n) = (n/8)^gamma V(8) per mixed group
    this is (s/8)^gamma; gamma with a bootstrap interval over groups."""
    col = f"value_n{s}"
    g = groups[groups["n"] == 8].dropna(subset=[col]) if col in groups else groups.iloc[:0]
    if g.empty:
        return {"size": s, "groups": 0, "ratio": None, "gamma": None, "lo": None, "hi": None}
    num, den = g[col].to_numpy(float), (g[f"mixed_n{s}"] * g["value"]).to_numpy(float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(g), size=(draws, len(g)))

    def gamma(r: Any) -> Any:
        return np.log(np.clip(r, 1e-9, None)) / np.log(s / 8)

    ratio = float(num.sum() / den.sum()) if den.sum() > 0 else None
    boots = gamma(num[idx].sum(1) / np.where(den[idx].sum(1) > 0, den[idx].sum(1), np.nan))
    lo, hi = np.nanpercentile(boots, [2.5, 97.5])
    return {"size": s, "groups": len(g), "ratio": ratio, "gamma": None if ratio is None else float(gamma(ratio)),
            "lo": float(min(lo, hi)), "hi": float(max(lo, hi))}


def exponent_fit(groups: pd.DataFrame) -> dict[str, Any]:
    """value ~ c p^a (1-p)^b by least squares over the groups, on a grid of (a, b): the best and its R^2, beside
    Knapsack RL's (1, 2)."""
    v, p = groups["value"].to_numpy(float), groups["p_hat"].to_numpy(float)
    sst = float(((v - v.mean()) ** 2).sum())
    grid = []
    for a in EXPONENTS_A:
        for b in EXPONENTS_B:
            f = p**a * (1 - p) ** b
            c = float(f @ v / (f @ f))
            grid.append({"a": a, "b": b, "scale": c, "r2": 1.0 - float(((v - c * f) ** 2).sum()) / sst})
    best = max(grid, key=lambda x: x["r2"])
    return {"best": best, "knapsack": next(x for x in grid if (x["a"], x["b"]) == (1.0, 2.0)), "grid": grid}


def calibrate(groups: pd.DataFrame) -> dict[str, Any]:
    """VALOR's constants from the calibration runs (docs/design.md section 4.17): the pass-rate exponents of the
    best grid fit, gamma pooled over the sub-sizes in log space (clipped to [0, 1]), and a novelty discount only
    where the value falls with earlier trainings (the slope's interval below zero): -slope / the mean value."""
    sizes = [size_ratio(groups, s) for s in SUBSIZES]
    ok = [x for x in sizes if x["ratio"] is not None and x["ratio"] > 0]
    x = np.log([t["size"] / 8 for t in ok])
    y = np.log([t["ratio"] for t in ok])
    gamma = float(np.clip(x @ y / (x @ x), 0.0, 1.0)) if ok else 1.0
    expo = exponent_fit(groups)
    hist = history_slope(groups)
    mean = float(groups["value"].mean())
    novelty = -hist["slope"] / mean if hist["hi"] is not None and hist["hi"] < 0 and mean > 0 else 0.0
    return {"sizes": sizes, "exponents": expo, "history": hist, "mean_value": mean,
            "declared": {"value_a": expo["best"]["a"], "value_b": expo["best"]["b"],
                         "size_exponent": round(gamma, 2), "novelty": round(float(novelty), 3)}}


def calibration_md(cal: Mapping[str, Any]) -> list[str]:
    d, e = cal["declared"], cal["exponents"]
    lines = ["", "## VALOR's constants (docs/design.md section 4.17)", "",
             "| sub-group size s | groups of 8 split | value ratio to the whole group's, per mixed sub-group | "
             "gamma in (s/8)^gamma [95% CI] |", "|---|---|---|---|"]
    lines += [f"| {t['size']} | {t['groups']} | {_num(t['ratio'])} | {_num(t['gamma'], '.2f')} "
              f"[{_num(t['lo'], '.2f')}, {_num(t['hi'], '.2f')}] |" for t in cal["sizes"]]
    h = cal["history"]
    lines += ["", f"Best pass-rate form on the grid: p^{e['best']['a']:g} (1-p)^{e['best']['b']:g}, R^2 "
              f"{e['best']['r2']:.4f} (Knapsack RL's p (1-p)^2: {e['knapsack']['r2']:.4f}). Value per earlier "
              f"training: slope {_num(h['slope'], '.4g')} [{_num(h['lo'], '.4g')}, {_num(h['hi'], '.4g')}] against a "
              f"mean value of {cal['mean_value']:.4g}.", "",
             f"**Declared:** value_a = {d['value_a']:g}, value_b = {d['value_b']:g}, size_exponent = "
             f"{d['size_exponent']:g}, novelty = {d['novelty']:g}."]
    return lines

def _within_md(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    diffs = sorted({c["difficulty"] for c in cells})
    by = {(c["p_hat"], c["difficulty"]): c for c in cells}
    lines = ["", "## all, by p-hat within each difficulty", "",
             "Mean value (groups in brackets): the pass rate's effect where the feature cell is held fixed.", "",
             "| p-hat | " + " | ".join(f"difficulty {d}" for d in diffs) + " |", "|---|" + "---|" * len(diffs)]
    for p in sorted({c["p_hat"] for c in cells}):
        lines.append(f"| {p:.3f} | " + " | ".join(f"{by[(p, d)]['mean']:.3f} ({by[(p, d)]['groups']})"
                                                 if (p, d) in by else "-" for d in diffs) + " |")
    return lines


# ----- output ----------------------------------------------------------------------------------------------------
def _num(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def markdown(result: Mapping[str, Any]) -> str:
    lines = ["# What a trained group teaches (written by `python -m benchmarks.group_value`)", "",
             "value = <gradient of the group's GRPO loss, gradient of the held-out NLL> / |held-out gradient|, "
             "measured before the update on the same parameters (the module docstring gives the rules).", "",
             "| run | updates | trained groups | probe seconds / run seconds | same curve as the study's run |",
             "|---|---|---|---|---|"]
    for r in result["runs"]:
        same = {True: "yes", False: "NO", None: "no study run"}[r["same_curve"]]
        lines.append(f"| {r['regime']} {r['variant']} s{r['seed']} | {r['updates']} | {r['groups']} | "
                     f"{r['probe_s']:.0f} / {r['wall_s']:.0f} | {same} |")
    for scope, f in result["fit"].items():
        lines += ["", f"## {scope}: {f['groups']} groups of {f['runs']} runs; value > 0 in {f['positive_share']:.0%}; "
                  f"group sizes {f['n_counts']}", "", "| form of the pass rate | scale | R^2 over groups | "
                  "rank correlation of the bin means |", "|---|---|---|---|"]
        lines += [f"| {x['form']} | {x['scale']:.4g} | {_num(x['r2'])} | {_num(x['bin_rank_correlation'], '.2f')} |"
                  for x in f["forms"]]
        lines.append(f"| any function of p-hat (the bin means: the most a form of p-hat can explain) | - | "
                     f"{_num(f['r2_any_function_of_p_hat'])} | - |")
        lines += ["", "| p-hat | groups | mean value [95% CI] |", "|---|---|---|"]
        lines += [f"| {b['p_hat']:.3f} | {b['groups']} | {b['mean']:.4g} [{b['lo']:.4g}, {b['hi']:.4g}] |"
                  for b in f["bins"]]
        lines += ["", "| difficulty (operand digits) | groups | mean value [95% CI] |", "|---|---|---|"]
        lines += [f"| {b['difficulty']:.0f} | {b['groups']} | {b['mean']:.4g} [{b['lo']:.4g}, {b['hi']:.4g}] |"
                  for b in f["by_difficulty"]]
        h = f["history"]
        lines += ["", f"Per earlier training of the prompt (p-hat bins held fixed): slope {_num(h['slope'], '.4g')} "
                  f"[{_num(h['lo'], '.4g')}, {_num(h['hi'], '.4g')}], up to {h['max_times_trained']} earlier "
                  f"trainings. Correlation of value with the group's |advantage| mass: "
                  f"{_num(f['value_vs_adv_abs_mass_correlation'], '.2f')}."]
    lines += _within_md(result["fit"]["all"].get("by_p_hat_within_difficulty", []))
    if "calibration" in result:
        lines += calibration_md(result["calibration"])
    return "\n".join(lines) + "\n"


def plot(result: Mapping[str, Any], groups: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    fams = [s for s in result["fit"] if s != "all"]
    cal = result.get("calibration")
    fig, axes = plt.subplots(1, 3 if cal else 2, figsize=(19 if cal else 13, 4.6))
    for i, fam in enumerate(fams):
        f = result["fit"][fam]
        p = np.array([b["p_hat"] for b in f["bins"]])
        m = np.array([b["mean"] for b in f["bins"]])
        err = np.array([[b["mean"] - b["lo"] for b in f["bins"]], [b["hi"] - b["mean"] for b in f["bins"]]])
        axes[0].errorbar(p, m, yerr=err, fmt="o", color=f"C{i}", label=f"{fam} (measured, 95% CI)")
        grid = np.linspace(0.02, 0.98, 97)
        for j, x in enumerate(f["forms"]):
            if x["form"] != "mixed":
                axes[0].plot(grid, x["scale"] * FORMS[x["form"]](grid), color=f"C{i}", ls=("-", "--", ":")[j - 1],
                             lw=1, label=f"{fam}: {x['form']} (R^2 {_num(x['r2'], '.2f')})")
        sub = groups[groups["regime"].str.startswith(fam)]
        by = sub.groupby("times_trained")["value"].agg(["mean", "count"])
        by = by[by["count"] >= MIN_BIN]
        axes[1].plot(by.index, by["mean"].to_numpy(), "o-", color=f"C{i}", label=fam)
    axes[0].set_xlabel("the group's pass rate p-hat")
    axes[0].set_ylabel("value: first-order held-out gain per unit step")
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel(f"times the prompt was trained before in the run (counts of {MIN_BIN}+ groups)")
    axes[1].set_ylabel("mean value")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.axhline(0, color="k", lw=0.6)
    if cal:
        _size_panel(axes[2], cal)
    fig.suptitle("What a trained group teaches (benchmarks/group_value.py)")
    save_figure(fig, path)


def _size_panel(ax: Any, cal: Mapping[str, Any]) -> None:
    """A mixed group's value against its size, relative to the group of 8 it was split from, with the fit."""
    pts = [t for t in cal["sizes"] if t["ratio"] is not None]
    x = np.array([t["size"] for t in pts] + [8])
    y = np.array([t["ratio"] for t in pts] + [1.0])
    ax.plot(x, y, "o", color="C3", label="measured (groups of 8 split in order)")
    grid = np.linspace(1, 8, 50)
    g = cal["declared"]["size_exponent"]
    ax.plot(grid, (grid / 8) ** g, "-", color="C3", lw=1, label=f"(n/8)^{g:g} (declared)")
    ax.plot(grid, grid / 8, ":", color="k", lw=1, label="n/8 (linear)")
    ax.set_xlabel("rollouts in the group, n")
    ax.set_ylabel("value per mixed group / the group of 8's")
    ax.legend(fontsize=8)


def collect(folder: Path, results: Path, *, work: Path, quick: bool, log: Any = print, plan: Sequence[tuple[str, str,
            str]] = RUNS, subsizes: Sequence[int] = ()) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Every run of ``plan`` (each trained unless its files exist under ``folder``/runs), its groups and info."""
    runs = folder / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    frames, infos = [], []
    for i, (regime, label, protocol) in enumerate(plan[:2] if quick else plan):
        stem = runs / f"{regime}_{label}_s0"
        if not stem.with_suffix(".json").exists():
            log(f"[{i + 1}/{len(plan)}] {regime} {label}: training with the probe")
            groups, info = run_one(regime, label, protocol, 0, work=work, quick=quick, subsizes=subsizes)
            info["same_curve"] = None if quick else same_curve(info, results)
            groups.to_parquet(stem.with_suffix(".parquet"), index=False)
            stem.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
            log(f"[{i + 1}/{len(plan)}] {regime} {label}: {info['groups']} groups over {info['updates']} updates; "
                f"probe {info['probe_s']:.0f} of {info['wall_s']:.0f} s; same curve as the study: {info['same_curve']}")
        frames.append(pd.read_parquet(stem.with_suffix(".parquet")))
        infos.append(json.loads(stem.with_suffix(".json").read_text()))
    return pd.concat(frames, ignore_index=True), infos


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import default_out

    ap = argparse.ArgumentParser(prog="python -m benchmarks.group_value", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short warm start and budget, two runs, temporary --out")
    ap.add_argument("--fit-only", action="store_true", help="refit from the run files, train nothing")
    ap.add_argument("--calibration", action="store_true",
                    help="the calibration set instead (hard-ws1, pool-ws1; groups of 8 also split into 2 and 4) "
                         "into group_value/calibration/")
    ap.add_argument("--out", type=Path, default=None, help="results root (default benchmarks/results)")
    ap.add_argument("--work", type=Path, default=Path("runs/group_value"), help="run folders and policies")
    args = ap.parse_args(argv)
    out = default_out(args.out, args.quick, "group_value")
    folder = output_dir(out, "group_value") / ("calibration" if args.calibration else "")
    plan, subsizes = (CALIBRATION, SUBSIZES) if args.calibration else (RUNS, ())
    if args.fit_only and not any((folder / "runs").glob("*.json")):
        ap.error(f"--fit-only: no run files under {folder / 'runs'}; run without --fit-only first")
    groups, infos = collect(folder, RESULTS, work=args.work, quick=args.quick, plan=plan, subsizes=subsizes,
                            log=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True)) \
        if not args.fit_only else _read(folder)
    if groups.empty:
        ap.exit(1, "group_value: no trained group in these runs (a quick warm start scores 0: nothing is mixed)\n")
    result = {"runs": [{k: v for k, v in i.items() if k != "curve"} for i in infos], "fit": fit(groups),
              "heldout_rows": HELDOUT, **({"calibration": calibrate(groups)} if args.calibration else {})}
    (folder / "group_value.json").write_text(json.dumps(result, indent=1) + "\n")
    (folder / "group_value.md").write_text(markdown(result))
    plot(result, groups, folder / "group_value.png")
    print(markdown(result))
    return 0


def _read(folder: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    infos = [json.loads(p.read_text()) for p in sorted((folder / "runs").glob("*.json"))]
    frames = [pd.read_parquet(p.with_suffix(".parquet")) for p in sorted((folder / "runs").glob("*.json"))]
    return pd.concat(frames, ignore_index=True), infos


if __name__ == "__main__":
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    raise SystemExit(main())
