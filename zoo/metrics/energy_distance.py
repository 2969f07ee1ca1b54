"""Energy distance between two samples: 2E‖X−Y‖ − E‖X−X'‖ − E‖Y−Y'‖ (0 iff the distributions agree)."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

__all__ = ["EnergyDistance", "energy_distance"]


def _mean_distance(a: Tensor, b: Tensor, same: bool, chunk: int = 4096) -> Tensor:
    total = a.new_zeros((), dtype=torch.float64)
    for start in range(0, len(a), chunk):  # bounded memory: chunk x len(b) distances at a time
        total += torch.cdist(a[start : start + chunk], b).double().sum()
    # U-statistic for the within-sample terms: the zero diagonal is left out of the average.
    pairs = len(a) * (len(b) - 1) if same else len(a) * len(b)
    return total / pairs


def energy_distance(x: Tensor, y: Tensor) -> Tensor:
    """Unbiased (U-statistic) energy distance between samples ``x`` ``(n, ...)`` and ``y`` ``(m, ...)``, flattened.

    torchmetrics has no two-sample distance of this kind, so it is written here (chunked ``cdist``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> near = energy_distance(torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g))
        >>> far = energy_distance(torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g) + 3)
        >>> bool(abs(near) < 0.05 and far > 3)
        True
    """
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"samples of different dimension: {tuple(x.shape)} vs {tuple(y.shape)}")
    if len(x) < 2 or len(y) < 2:
        raise ValueError("the energy distance needs at least two points in each sample")
    # cdist's fast form ‖a‖² + ‖b‖² − 2ab cancels badly far from the origin: centre on the joint mean, in float64.
    x, y = x.double(), y.double()
    centre = torch.cat([x, y]).mean(dim=0)
    x, y = x - centre, y - centre
    return 2 * _mean_distance(x, y, False) - _mean_distance(x, x, True) - _mean_distance(y, y, True)


class EnergyDistance(Metric):
    """Energy distance between everything passed as ``update(x, y)``; samples are gathered across processes.

    Example:
        >>> metric = EnergyDistance()
        >>> metric.update(torch.zeros(3, 2), torch.ones(3, 2))
        >>> round(float(metric.compute()), 4)   # 2·√2 − 0 − 0
        2.8284
    """

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("x", default=[], dist_reduce_fx="cat")
        self.add_state("y", default=[], dist_reduce_fx="cat")

    def update(self, x: Tensor, y: Tensor) -> None:
        self.x.append(x.reshape(len(x), -1).detach().float())
        self.y.append(y.reshape(len(y), -1).detach().float())

    def compute(self) -> Tensor:
        return energy_distance(dim_zero_cat(self.x), dim_zero_cat(self.y)).float()
