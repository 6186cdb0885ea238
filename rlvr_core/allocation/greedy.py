"""Greedy filling of per-prompt rollout budgets: each rollout to the prompt whose next one gains the most.

For a separable objective whose marginal gain falls with n (a concave value to maximise, or a convex cost to
minimise, negated), under one budget and per-prompt bounds, this greedy is exactly optimal. Knapsack RL
(knapsack_rl.py) and VIP (vip.py) both allocate with it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np


def greedy_fill(gain: Callable[[int, int], float], base: np.ndarray, cap: int, budget: int) -> tuple[np.ndarray, int]:
    """(rollouts per prompt, budget left): from ``base``, each of ``budget`` rollouts goes to the prompt i whose
    ``gain(i, n_i)`` (what its (n_i + 1)-th rollout adds) is largest, ties to the lower index; no prompt goes
    beyond ``cap``. Budget is left only when every prompt is at ``cap``."""
    n = np.asarray(base, np.int64).copy()
    heap = [(-gain(i, int(n[i])), i) for i in range(len(n)) if n[i] < cap]
    heapq.heapify(heap)
    left = int(budget)
    while left > 0 and heap:
        _, i = heapq.heappop(heap)
        n[i] += 1
        left -= 1
        if n[i] < cap:
            heapq.heappush(heap, (-gain(i, int(n[i])), i))
    return n, left
