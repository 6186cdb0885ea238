"""Per-prompt evidence carried across steps, and a population prior (docs/allocators/sara.md).

Ours, beyond the papers. The policy drifts while it trains, so evidence about
a prompt's pass rate ages: passes and fails seen ``t`` steps ago count
``decay ** t``. The population prior Beta(a, b) is either fixed (uniform by
default) or fitted by empirical Bayes to the pass rates of recently finished
prompts. A prompt's prior for SARA's p_eff and for prompt selection is the
population prior plus its decayed evidence.

The contextual prior (``kind="context"``): prompts rarely recur within a run, so
a prompt's own history seldom helps, but prompts that share features (the
arithmetic cell ``difficulty`` x ``op``, the MATH level and subject; the key
comes from ``rlvr_core.data.context``) have similar pass rates. Per context key
a decayed record of the finished prompts' pass rates is kept, and a Beta prior
is fitted to it by method of moments and shrunk towards the population prior
while the key holds little evidence. A key never seen uses the population prior.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlvr_core.beta_moments import beta_from_moments, fit_beta_moments
from rlvr_core.errors import from_mapping, require


@dataclass(frozen=True)
class PriorConfig:
    """How SARA and prompt selection form each prompt's Beta prior.

    kind: "uniform" (Beta(a0, b0) for every prompt, the paper's setting),
          "carry" (plus each prompt's decayed evidence from earlier steps),
          "eb" (population prior fitted to recent pass rates),
          "carry+eb" (both),
          "context" (a prior per context key, fitted to the recent pass rates of the
              prompts sharing the key and shrunk towards the "eb" population prior),
          "carry+context" (the contextual prior plus each prompt's carried evidence).
    context_decay: per-step weight on a key's past observations, in (0, 1] (the policy drifts)
    context_strength: the population prior counts as this many prompts in a key's blend, > 0
    context_min_prompts: decayed prompts a key needs before its own spread is used and before a
        never-seen prompt of the key may be skipped on the key's evidence alone, > 0
    context_explore: chance that a never-seen prompt the key's prior would skip is probed anyway,
        in [0, 1] (a key whose prompts are all skipped gets no new evidence otherwise)
    """

    kind: str = "uniform"
    a0: float = 1.0  # population prior pseudo-passes (before any fitting)
    b0: float = 1.0  # population prior pseudo-fails
    decay: float = 0.9  # per-step weight on carried evidence, in (0, 1]
    max_evidence: float = 16.0  # cap on a prompt's carried pseudo-counts (a + b)
    eb_window: int = 512  # finished prompts used to fit the population prior
    eb_min_prompts: int = 32  # fit only once this many are available
    context_decay: float = 0.9
    context_strength: float = 8.0
    context_min_prompts: float = 8.0
    context_explore: float = 0.1

    def __post_init__(self) -> None:
        kinds = ("uniform", "carry", "eb", "carry+eb", "context", "carry+context")
        require(self.kind in kinds, "prior.kind", f"got {self.kind!r}; use one of {', '.join(map(repr, kinds))}")
        require(_number(self.a0) and _number(self.b0) and self.a0 > 0 and self.b0 > 0, "prior.a0/b0",
                f"got {self.a0!r}, {self.b0!r}; Beta prior pseudo-counts must be finite numbers > 0")
        require(_number(self.decay) and 0.0 < self.decay <= 1.0, "prior.decay",
                f"got {self.decay!r}; must lie in (0, 1]")
        require(_number(self.max_evidence) and self.max_evidence > 0, "prior.max_evidence",
                f"got {self.max_evidence!r}; must be a finite number > 0")
        require(self.eb_window >= 2, "prior.eb_window", "must be >= 2")
        require(self.eb_min_prompts >= 2, "prior.eb_min_prompts", "must be >= 2")
        require(_number(self.context_decay) and 0.0 < self.context_decay <= 1.0, "prior.context_decay",
                f"got {self.context_decay!r}; must lie in (0, 1]")
        require(_number(self.context_strength) and self.context_strength > 0, "prior.context_strength",
                f"got {self.context_strength!r}; must be > 0 (pseudo-prompts of the population prior)")
        require(_number(self.context_min_prompts) and self.context_min_prompts > 0, "prior.context_min_prompts",
                f"got {self.context_min_prompts!r}; must be > 0")
        require(_number(self.context_explore) and 0.0 <= self.context_explore <= 1.0, "prior.context_explore",
                f"got {self.context_explore!r}; must lie in [0, 1]")

    @property
    def carry(self) -> bool:
        return self.kind in ("carry", "carry+eb", "carry+context")

    @property
    def empirical_bayes(self) -> bool:
        return self.kind in ("eb", "carry+eb", "context", "carry+context")

    @property
    def context(self) -> bool:
        return self.kind in ("context", "carry+context")


def as_prior_config(value: Any, default_kind: str) -> PriorConfig:
    """A ``PriorConfig`` from what a Params field may hold: None (``default_kind``), a kind, a dict of fields
    (an unknown field is named, with the valid ones) or a ``PriorConfig``."""
    if value is None:
        value = PriorConfig(kind=default_kind)
    elif isinstance(value, str):
        value = PriorConfig(kind=value)
    elif isinstance(value, dict):
        value = from_mapping(PriorConfig, value, "prior")
    require(isinstance(value, PriorConfig), "prior", "give a PriorConfig, its kind or a dict of its fields")
    return value


def _number(x: Any) -> bool:
    """A finite real number (an int past a float's range is not one)."""
    if not isinstance(x, (int, float, np.integer, np.floating)) or isinstance(x, bool):
        return False
    try:
        return bool(np.isfinite(float(x)))
    except OverflowError:
        return False


class PromptPosterior:
    """Population prior, per-key contextual priors and per-prompt decayed evidence.

    ``keys`` (one context key per prompt id, any str) are used only by the
    contextual kinds; None means every prompt shares one key.
    """

    def __init__(self, config: PriorConfig) -> None:
        self.config = config
        self.step = 0
        self.a_pop, self.b_pop = config.a0, config.b0
        self._passes: dict[int, float] = {}
        self._fails: dict[int, float] = {}
        self._seen: dict[int, int] = {}
        self._recent: deque[tuple[int, int]] = deque(maxlen=config.eb_window)
        # per context key, decayed sums over finished prompts: [weight, sum r, sum r^2, sum 1/n]
        self._keys: dict[str, list[float]] = {}
        self._key_prior: dict[str, tuple[float, float]] = {}

    @staticmethod
    def _key_list(prompt_ids: np.ndarray, keys: Any) -> list[str]:
        n = len(prompt_ids)
        if keys is None:
            return [""] * n
        out = [str(k) for k in keys]
        if len(out) != n:
            raise ValueError(f"got {len(out)} context keys for {n} prompts; give one key per prompt")
        return out

    def prior(self, prompt_ids: np.ndarray, keys: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Beta(a, b) per prompt: arrays of shape (len(prompt_ids),)."""
        n = len(prompt_ids)
        a = np.full(n, self.a_pop)
        b = np.full(n, self.b_pop)
        if self.config.context:
            key_list = self._key_list(prompt_ids, keys)
            for i, key in enumerate(key_list if self._key_prior else ()):
                if key in self._key_prior:
                    a[i], b[i] = self._key_prior[key]
        if self.config.carry and self._seen:
            for i, q in enumerate(np.asarray(prompt_ids).tolist()):
                if q in self._seen:
                    w = self.config.decay ** (self.step - self._seen[q])
                    a[i] += w * self._passes[q]
                    b[i] += w * self._fails[q]
        return a, b

    def has_evidence(self, prompt_ids: np.ndarray, keys: Any = None) -> np.ndarray:
        """(len(prompt_ids),) bool: the prompt carries evidence from earlier steps, or (contextual
        kinds) its key holds at least ``context_min_prompts`` decayed prompts."""
        n = len(prompt_ids)
        out = np.zeros(n, bool)
        if self.config.carry:
            out |= np.fromiter((q in self._seen for q in np.asarray(prompt_ids).tolist()), bool, n)
        if self.config.context:
            need = self.config.context_min_prompts
            out |= np.fromiter((self._keys.get(k, (0.0,))[0] >= need for k in self._key_list(prompt_ids, keys)),
                               bool, n)
        return out

    def key_weight(self, key: str) -> float:
        """Decayed number of finished prompts behind ``key``'s prior (0 for a key never seen)."""
        return float(self._keys.get(str(key), (0.0,))[0])

    def record(self, prompt_ids: np.ndarray, passes: np.ndarray, counts: np.ndarray, keys: Any = None) -> None:
        """Add this step's evidence (passes of counts rollouts) for each prompt."""
        cap = self.config.max_evidence
        key_list = self._key_list(prompt_ids, keys) if self.config.context else None
        for i, (q, s, n) in enumerate(zip(np.asarray(prompt_ids).tolist(), np.asarray(passes).tolist(),
                                          np.asarray(counts).tolist())):
            if n <= 0:
                continue
            self._recent.append((int(s), int(n)))
            if key_list is not None:
                r = s / n
                st = self._keys.setdefault(key_list[i], [0.0, 0.0, 0.0, 0.0])
                st[0] += 1.0
                st[1] += r
                st[2] += r * r
                st[3] += 1.0 / n
            if self.config.carry:
                w = self.config.decay ** (self.step - self._seen[q]) if q in self._seen else 0.0
                ps = w * self._passes.get(q, 0.0) + s
                fs = w * self._fails.get(q, 0.0) + (n - s)
                tot = ps + fs
                if tot > cap:
                    ps, fs = ps * cap / tot, fs * cap / tot
                self._passes[q], self._fails[q], self._seen[q] = ps, fs, self.step

    def end_step(self) -> None:
        """Advance the clock one training step and refit the population prior if asked; the
        contextual kinds then decay every key's record and refit its prior."""
        self.step += 1
        if self.config.empirical_bayes and len(self._recent) >= self.config.eb_min_prompts:
            arr = np.asarray(self._recent, np.float64)
            self.a_pop, self.b_pop = fit_beta_moments(arr[:, 0] / arr[:, 1], arr[:, 1])
        if self.config.context:
            self._refit_keys()
            d = self.config.context_decay
            for st in self._keys.values():  # what this step saw counts 1, what the step before saw d, ...
                st[:] = [x * d for x in st]

    def _refit_keys(self) -> None:
        """Each key's Beta prior from its decayed record, shrunk towards the population prior.

        With weight W (decayed prompts) and c = ``context_strength``: the mean is
        (W m_key + c m_pop) / (W + c); the concentration is the population's until W
        reaches ``context_min_prompts``, then the geometric blend of the key's
        moment estimate and the population's with weights W and c.
        """
        c = self.config.context_strength
        m_pop = self.a_pop / (self.a_pop + self.b_pop)
        conc_pop = self.a_pop + self.b_pop
        self._key_prior = {}
        for key, (w, s1, s2, h) in self._keys.items():
            if w <= 0:
                continue
            m_key = s1 / w
            m = float(np.clip((w * m_key + c * m_pop) / (w + c), 1e-3, 1 - 1e-3))
            conc = conc_pop
            if w >= self.config.context_min_prompts and h / w < 1.0:
                ak, bk = beta_from_moments(m_key, max(s2 / w - m_key * m_key, 0.0), h / w)
                lam = w / (w + c)
                conc = float(np.exp(lam * np.log(ak + bk) + (1 - lam) * np.log(conc_pop)))
            self._key_prior[key] = (m * conc, (1 - m) * conc)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "a_pop": self.a_pop, "b_pop": self.b_pop,
            "passes": dict(self._passes), "fails": dict(self._fails), "seen": dict(self._seen),
            "recent": list(self._recent), "keys": {k: list(v) for k, v in self._keys.items()},
            "key_prior": {k: list(v) for k, v in self._key_prior.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.a_pop, self.b_pop = float(state["a_pop"]), float(state["b_pop"])
        self._passes = {int(k): float(v) for k, v in state["passes"].items()}
        self._fails = {int(k): float(v) for k, v in state["fails"].items()}
        self._seen = {int(k): int(v) for k, v in state["seen"].items()}
        self._recent = deque((tuple(x) for x in state["recent"]), maxlen=self.config.eb_window)
        # states written before the contextual prior existed have no keys
        self._keys = {str(k): [float(x) for x in v] for k, v in state.get("keys", {}).items()}
        self._key_prior = {str(k): (float(v[0]), float(v[1])) for k, v in state.get("key_prior", {}).items()}
