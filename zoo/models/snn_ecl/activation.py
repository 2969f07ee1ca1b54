"""The ANN side of ECL: a clipping activation with a learnable threshold λ, quantised to L levels (QCFS-style)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ClipQuantActivation", "floor_ste"]


class _FloorSTE(torch.autograd.Function):
    """``⌊x⌋`` forward, identity backward: the straight-through estimator of the quantiser."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001 - autograd's signature
        return torch.floor(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: ANN001
        return grad


def floor_ste(x: Tensor) -> Tensor:
    """``⌊x⌋`` whose gradient is passed straight through (∂/∂x = 1).

    Example:
        >>> x = torch.tensor([0.4, 1.7], requires_grad=True)
        >>> y = floor_ste(x); y.sum().backward()
        >>> y.tolist(), x.grad.tolist()
        ([0.0, 1.0], [1.0, 1.0])
    """
    return _FloorSTE.apply(x)


class ClipQuantActivation(nn.Module):
    """``h(z) = λ · clip(⌊z·L/λ + φ⌋ / L, 0, 1)``, λ a learned scalar; with ``levels=None``, ``clip(z, 0, λ)``.

    The ECL / QCFS replacement for ReLU, trained with the weights so the network absorbs the conversion error: λ
    becomes the spiking neuron's threshold, L the number of levels T steps can express, and the shift φ = ½ matches a
    membrane potential started at θ/2. Gradients are those of the straight-through floor: ∂h/∂z = 1 inside the
    un-clipped range (0 outside); ∂h/∂λ = ⌊u⌋/L − z/λ inside (u = zL/λ + φ), 1 when clipped at the top, 0 at the
    bottom. λ is an ``nn.Parameter`` so the optimiser's weight decay applies to it (as QCFS trains it).

    Args:
        lambda_init: initial λ (QCFS: 8.0).
        levels: quantisation levels L (QCFS practice 4 for CIFAR at low T, 8 for ImageNet), or None for the pure clip.
        shift: φ (½: rounding, matched by v(0) = θ/2).

    Example:
        >>> act = ClipQuantActivation(lambda_init=2.0, levels=4)
        >>> act(torch.tensor([-1.0, 0.2, 0.3, 1.1, 5.0])).tolist()
        [0.0, 0.0, 0.5, 1.0, 2.0]
    """

    def __init__(self, lambda_init: float = 8.0, levels: int | None = 4, shift: float = 0.5) -> None:
        super().__init__()
        if lambda_init <= 0:
            raise ValueError(f"lambda_init must be > 0, got {lambda_init}")
        if levels is not None and levels < 1:
            raise ValueError(f"levels must be a positive integer or None (pure clip), got {levels}")
        self.threshold = nn.Parameter(torch.tensor(float(lambda_init)))
        self.levels, self.shift = levels, shift

    def forward(self, z: Tensor) -> Tensor:
        lam = self.threshold
        if self.levels is None:
            return torch.minimum(z.clamp(min=0), lam)
        q = floor_ste(z * (self.levels / lam) + self.shift) / self.levels
        # clip(q, 0, 1) passing the gradient on the closed range 0 ≤ q ≤ 1. The floor puts q exactly on 0 or 1 over
        # whole intervals of z, where torch.clamp's boundary subgradient would decide: 1 in older torch (QCFS's STE,
        # the card's formulas), 0 in recent releases (2.14). Select explicitly so the gradients do not depend on it.
        return lam * torch.where(q < 0, 0.0, torch.where(q > 1, 1.0, q))

    def extra_repr(self) -> str:
        return f"threshold={float(self.threshold.detach()):.4g}, levels={self.levels}, shift={self.shift}"
