"""Flow Matching with independent coupling, the EFM card's baseline, on the same field network.

x_t = (1 − t)x₀ + t x₁ with x₀ ~ P, x₁ ~ Q drawn independently; the network regresses the velocity x₁ − x₀ and
samples follow dx/dt = v(x, t) from t = 0 to 1 (Lipman et al., 2023; torchcfm's ``ConditionalFlowMatcher`` with
σ = 0). It reuses EFM's field networks: time t enters as the height z = t·L, the first D outputs are the velocity
and the extra z-output is unused. torchcfm is not a dependency; the objective is two lines.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["flow_matching_loss", "flow_matching_transport"]


def flow_matching_loss(net: nn.Module, x0: Tensor, x1: Tensor, L: float) -> Tensor:
    """E_t ‖v_θ(x_t, t) − (x₁ − x₀)‖² over one batch of independent pairs ``(x0[i], x1[i])``.

    Example:
        >>> from zoo.models.efm.networks import MLPFieldNet
        >>> net = MLPFieldNet(dim=2, L=1.0, hidden=16)
        >>> float(flow_matching_loss(net, torch.randn(8, 2), torch.randn(8, 2), L=1.0)) > 0
        True
    """
    t = torch.rand(len(x0), device=x0.device, dtype=x0.dtype)
    tt = t.reshape(-1, *([1] * (x0.ndim - 1)))
    v, _ = net((1 - tt) * x0 + tt * x1, t * L)
    return (v - (x1 - x0)).reshape(len(x0), -1).square().sum(dim=1).mean()


@torch.no_grad()
def flow_matching_transport(net: nn.Module, x0: Tensor, L: float, steps: int = 100) -> Tensor:
    """Euler integration of dx/dt = v_θ(x, t) from t = 0 to 1 in ``steps`` steps."""
    x, dt = x0, 1.0 / steps
    for k in range(steps):
        v, _ = net(x, torch.full((len(x),), k * dt * L, dtype=x.dtype, device=x.device))
        x = x + dt * v
    return x
