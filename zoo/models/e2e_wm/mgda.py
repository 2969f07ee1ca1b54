"""Two-task MGDA (multiple-gradient descent) as the official E2E code combines the encoder's two gradients."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mgda_combine", "mgda_two_task"]


def mgda_two_task(g_d: Tensor, g_s: Tensor, cap: float | None = 0.01) -> Tensor:
    """The min-norm weight α of ``α·g_d + (1 − α)·g_s`` for two flat gradients, capped at ``cap``.

    α = 1 if ``g_d·g_s ≥ g_d·g_d``, 0 if ``g_d·g_s ≥ g_s·g_s``, else ``((g_s − g_d)·g_s) / ‖g_s − g_d‖²``; then
    ``min(α, cap)`` (the official cap 0.01; ``None`` or 1.0 for plain MGDA).

    Example:
        >>> g_d, g_s = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
        >>> float(mgda_two_task(g_d, g_s, cap=None)), float(mgda_two_task(g_d, g_s))
        (0.5, 0.009999999776482582)
    """
    dd, ds, ss = g_d @ g_d, g_d @ g_s, g_s @ g_s
    diff = (g_s - g_d).pow(2).sum().clamp_min(1e-20)
    alpha = torch.where(ds >= dd, torch.ones_like(dd), torch.where(ds >= ss, torch.zeros_like(dd), (ss - ds) / diff))
    return alpha if cap is None else alpha.clamp(max=cap)


def mgda_combine(g_d: Tensor, g_s: Tensor, cap: float | None = 0.01) -> tuple[Tensor, Tensor]:
    """The encoder's gradient ``α·g_d + (1 − α)·g_s`` with α from :func:`mgda_two_task`, and α.

    Example:
        >>> g, alpha = mgda_combine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]), cap=None)
        >>> g.tolist(), round(float(alpha), 6)  # α = (4 − 0) / 5: the min-norm point of the segment
        ([0.800000011920929, 0.3999999761581421], 0.8)
    """
    alpha = mgda_two_task(g_d, g_s, cap)
    return alpha * g_d + (1 - alpha) * g_s, alpha
