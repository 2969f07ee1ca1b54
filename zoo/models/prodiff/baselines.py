"""The training-free stand-ins ProDiff is compared with: linear interpolation between the endpoints."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linear_interpolation"]


def linear_interpolation(windows: Tensor) -> Tensor:
    """Every channel (hours, latitude, longitude) interpolated linearly in the point index between the endpoints.

    Example:
        >>> linear_interpolation(torch.tensor([[[0.0, 9, 9, 3.0]]])).round(decimals=4)
        tensor([[[0., 1., 2., 3.]]])
    """
    k = windows.shape[-1]
    frac = torch.linspace(0, 1, k, dtype=windows.dtype, device=windows.device)
    return windows[..., :1] + frac * (windows[..., -1:] - windows[..., :1])
