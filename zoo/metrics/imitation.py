"""Imitation of a goal sequence: W_min (the closest the agent's occupancy came to the demonstration's) and the
ordered-goal fraction (ZILOT's ``task.py`` / ``evaluation.py``).

* :func:`w_min`: at every step the exact EMD (POT's ``ot.emd2``, uniform weights, L2 ground metric) between the
  demonstration's goals and the achieved goals so far; the minimum over the episode.
* :func:`goal_fraction`: a goal counts as hit at a step when the achieved goal is within ``threshold`` of it; the
  longest strictly increasing subsequence of hit indices over the episode (patience sorting), over the number of goals.
  Goals hit at one step enter in decreasing index order, so one step never counts two goals.
* :class:`ImitationMetrics`: their means over episodes, and the success rate (every goal hit in order), as a
  torchmetrics ``Metric`` (sum states, so it syncs across processes).

Example:
    >>> goals = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    >>> path = torch.tensor([[0.0, 0.0], [0.5, 0.0], [1.0, 0.0]])
    >>> round(w_min(path, goals), 3), goal_fraction(path, goals, threshold=0.05)
    (0.167, 1.0)
    >>> longest_increasing([3, 3, 3, 1, 2, 4, 5, 3, 4, 5])
    5
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["ImitationMetrics", "goal_fraction", "longest_increasing", "w_min"]


def longest_increasing(sequence: Iterable[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting, O(n log n))."""
    tails: list[int] = []
    for x in sequence:
        i = bisect.bisect_left(tails, x)
        if i == len(tails):
            tails.append(x)
        else:
            tails[i] = x
    return len(tails)


def _check(achieved: Tensor, goals: Tensor) -> None:
    if achieved.ndim != 2 or goals.ndim != 2 or achieved.shape[1] != goals.shape[1]:
        raise ValueError(f"achieved [T, d] and goals [N, d] must share d, got {tuple(achieved.shape)} and "
                         f"{tuple(goals.shape)}")  # fmt: skip
    if len(goals) == 0 or len(achieved) == 0:
        raise ValueError("an empty demonstration or episode has no imitation score")


def w_min(achieved: Tensor, goals: Tensor) -> float:
    """min over t of EMD(achieved[: t + 1], goals), uniform weights, Euclidean ground cost."""
    import ot

    _check(achieved, goals)
    x, g = achieved.detach().double().cpu().numpy(), goals.detach().double().cpu().numpy()
    dist = np.linalg.norm(x[:, None] - g[None], axis=-1)
    b = np.full(len(g), 1.0 / len(g))
    return min(float(ot.emd2(np.full(t, 1.0 / t), b, dist[:t])) for t in range(1, len(x) + 1))


def goal_fraction(achieved: Tensor, goals: Tensor, threshold: float) -> float:
    """|LIS of the hit goal indices| / N over the episode."""
    _check(achieved, goals)
    hit = torch.cdist(achieved.detach().double(), goals.detach().double()) <= threshold
    order = [j for row in hit.cpu().numpy() for j in np.flatnonzero(row)[::-1]]
    return longest_increasing(order) / len(goals)


class ImitationMetrics(Metric):
    """Means over episodes of W_min and GoalFraction, and the success rate (GoalFraction = 1).

    Example:
        >>> metric = ImitationMetrics(threshold=0.05)
        >>> metric.update(torch.tensor([[0.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
        >>> {k: round(float(v), 3) for k, v in metric.compute().items()}
        {'w_min': 0.0, 'goal_fraction': 1.0, 'success': 1.0}
    """

    full_state_update = False

    def __init__(self, threshold: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threshold = threshold
        for name in ("w_min", "goal_fraction", "success", "episodes"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, achieved: Tensor, goals: Tensor) -> None:
        fraction = goal_fraction(achieved, goals, self.threshold)
        self.w_min += w_min(achieved, goals)
        self.goal_fraction += fraction
        self.success += float(fraction == 1.0)
        self.episodes += 1

    def compute(self) -> dict[str, Tensor]:
        n = self.episodes.clamp_min(1)
        return {"w_min": self.w_min / n, "goal_fraction": self.goal_fraction / n, "success": self.success / n}
