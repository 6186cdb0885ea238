"""Group-relative advantage estimators over ragged groups (docs/design.md §5.2).

Every estimator is a pure function

    fn(rewards (R,), group_id (R,), *, eps=1e-6, num_groups=None) -> (advantages (R,), metrics)

taking numpy arrays or torch tensors (1-D) and returning the advantages in the
same kind (numpy float64 for numpy input, the reward tensor's floating dtype
and device for torch input). Groups are whatever rows share a ``group_id``;
sizes may differ (SARA, VIGOR), so statistics are gathered with
``index_add_`` / ``scatter_reduce``, never with ``reshape(-1, k)``.

A group whose rewards are all equal (including every group of size 1) gets an
advantage of exactly 0 under every estimator: it carries no learning signal,
and rounding in the mean must not be amplified by ``1 / (std + eps)``.

Estimators (looked up by name in ``ADVANTAGES``):

- ``grpo``: ``(r - mean_g) / (std_g + eps)`` with the *unbiased* (Bessel,
  n - 1) group standard deviation, as in DeepSeekMath's GRPO implementations
  (Shao et al., 2024). For a 0/1 group of 2 the advantages are +-0.707.
- ``dr_grpo``: ``r - mean_g`` (Dr. GRPO, Liu et al., 2025: no std division).
- ``rloo``: ``r - mean of the other rows of the group`` (REINFORCE leave-one-out,
  Ahmadian et al., 2024), which equals ``n / (n - 1) * (r - mean_g)``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from rlvr_core.registry import Registry

Metrics = dict[str, float]


class AdvantageFn(Protocol):
    def __call__(
        self, rewards: Any, group_id: Any, *, eps: float = 1e-6, num_groups: int | None = None
    ) -> tuple[Any, Metrics]: ...


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def get_advantage_fn(name: str) -> AdvantageFn:
    """Return the estimator registered as ``name`` (``grpo``, ``dr_grpo``, ``rloo``)."""
    return ADVANTAGES.get(name)


class _Groups:
    """Per-group sums of a ragged batch, as float tensors.

    r:      (R,) rewards
    gid:    (R,) int64 group index
    n:      (G,) group sizes (float)
    mean:   (G,) group means (0 for empty groups)
    const:  (R,) bool, the row's group has all-equal rewards (size-1 groups included)
    """

    def __init__(self, rewards: Any, group_id: Any, num_groups: int | None) -> None:
        self.is_numpy = not isinstance(rewards, torch.Tensor)
        r = torch.as_tensor(np.asarray(rewards, dtype=np.float64)) if self.is_numpy else rewards
        if not r.is_floating_point():
            r = r.to(torch.float64)
        gid = torch.as_tensor(np.asarray(group_id) if not isinstance(group_id, torch.Tensor) else group_id)
        gid = gid.to(device=r.device, dtype=torch.int64)
        if r.dim() != 1 or gid.dim() != 1:
            raise ValueError(f"rewards and group_id must be 1-D, got shapes {tuple(r.shape)} and {tuple(gid.shape)}")
        if len(r) != len(gid):
            raise ValueError(f"rewards has {len(r)} rows but group_id has {len(gid)}; pass one group id per reward")
        if len(gid) and int(gid.min()) < 0:
            raise ValueError(f"group_id must be >= 0, found {int(gid.min())} at row {int(gid.argmin())}")
        g = int(gid.max()) + 1 if len(gid) else 0
        if num_groups is not None:
            if num_groups < g:
                raise ValueError(f"group_id holds {g - 1} but num_groups={num_groups}; ids must lie in [0, num_groups)")
            g = num_groups
        self.r, self.gid, self.G = r, gid, g
        zeros = torch.zeros(g, dtype=r.dtype, device=r.device)
        self.n = zeros.index_add(0, gid, torch.ones_like(r))
        self.sum = zeros.index_add(0, gid, r)
        self.mean = self.sum / self.n.clamp(min=1)
        gmax = zeros.scatter_reduce(0, gid, r, reduce="amax", include_self=False)
        gmin = zeros.scatter_reduce(0, gid, r, reduce="amin", include_self=False)
        self.group_const = gmax == gmin
        self.const = self.group_const[gid]
        self.centered = r - self.mean[gid]

    def out(self, adv: torch.Tensor) -> Any:
        return adv.numpy() if self.is_numpy else adv

    def metrics(self, adv: torch.Tensor) -> Metrics:
        n = self.n
        present = n > 0
        const_groups = int((self.group_const & present).sum())
        return {
            "groups": float(int(present.sum())),
            "size1_groups": float(int((n == 1).sum())),
            "constant_groups": float(const_groups),
            "reward_mean": float(self.r.mean()) if len(self.r) else 0.0,
            "adv_mean": float(adv.mean()) if len(adv) else 0.0,
            "adv_abs_mean": float(adv.abs().mean()) if len(adv) else 0.0,
            "adv_abs_max": float(adv.abs().max()) if len(adv) else 0.0,
            "nonzero_adv_frac": float((adv != 0).to(torch.float64).mean()) if len(adv) else 0.0,
        }


def _finish(groups: _Groups, adv: torch.Tensor) -> tuple[Any, Metrics]:
    adv = torch.where(groups.const, torch.zeros_like(adv), adv)
    return groups.out(adv), groups.metrics(adv)


@ADVANTAGES.register("grpo")
def grpo_advantages(
    rewards: Any, group_id: Any, *, eps: float = 1e-6, num_groups: int | None = None
) -> tuple[Any, Metrics]:
    """(r - mean_g) / (std_g + eps), std unbiased (n - 1); constant/size-1 groups get 0.

    rewards: (R,) float, group_id: (R,) int in [0, G) -> advantages (R,), metrics.
    """
    g = _Groups(rewards, group_id, num_groups)
    sq = torch.zeros(g.G, dtype=g.r.dtype, device=g.r.device).index_add(0, g.gid, g.centered**2)
    std = torch.sqrt(sq / (g.n - 1).clamp(min=1))
    return _finish(g, g.centered / (std[g.gid] + eps))


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(
    rewards: Any, group_id: Any, *, eps: float = 1e-6, num_groups: int | None = None
) -> tuple[Any, Metrics]:
    """r - mean_g (no std division; ``eps`` is accepted and unused). Shapes as ``grpo``."""
    g = _Groups(rewards, group_id, num_groups)
    return _finish(g, g.centered.clone())


@ADVANTAGES.register("rloo")
def rloo_advantages(
    rewards: Any, group_id: Any, *, eps: float = 1e-6, num_groups: int | None = None
) -> tuple[Any, Metrics]:
    """r_i - mean_{j != i, j in g} r_j = n/(n-1) (r_i - mean_g); size-1 groups get 0. Shapes as ``grpo``."""
    g = _Groups(rewards, group_id, num_groups)
    n = g.n[g.gid]
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    return _finish(g, g.centered * scale)


__all__: list[str] = [
    "ADVANTAGES",
    "AdvantageFn",
    "get_advantage_fn",
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
]
