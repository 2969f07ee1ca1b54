"""Batched log-domain Sinkhorn with masked zero-mass entries and an unbalanced option (ZILOT's planner inner loop).

POT's ``ot.sinkhorn_log`` / ``ot.sinkhorn_unbalanced`` solve one problem at a time and cannot drop zero-mass rows from
the dual updates; the planner solves one problem per iCEM candidate (hundreds at once, on the GPU where there is one),
with marginals that give zero mass to the goals outside the window and the imagined states past the truncated
horizon. So it is written here once, in torch, and tested against POT (``tests/nn/test_sinkhorn.py``).

For costs ``C [..., n, m]`` and marginals ``a [..., n]``, ``b [..., m]`` (zeros allowed), with
ρ = (τ / (1 - τ)) / (τ / (1 - τ) + ε) (ρ = 1 for τ = 1, balanced):

    log u ← ρ_a (log a − LSE_j(−C_ij / ε + log v_j)),   log v ← ρ_b (log b − LSE_i(−C_ij / ε + log u_i)),

on the entries of positive mass only (the rest keep log u = −∞ and are never updated), and P = exp(log u − C / ε +
log v). The returned cost is the transport cost ⟨P, C⟩ without the entropy term (the official ``ot_util``).

Example:
    >>> C = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    >>> a = b = torch.tensor([0.5, 0.5])
    >>> cost, plan = sinkhorn(C, a, b, eps=0.01, iterations=200)
    >>> round(float(cost), 4), plan.sum(-1).tolist()
    (0.0, [0.5, 0.5])
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sinkhorn"]


def _rho(tau: float, eps: float) -> float:
    if not 0 < tau <= 1:
        raise ValueError(f"the marginal relaxation tau is in (0, 1] (1: balanced), got {tau}")
    if tau == 1:
        return 1.0
    ratio = tau / (1 - tau)
    return ratio / (ratio + eps)


def sinkhorn(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    eps: float = 0.02,
    iterations: int = 500,
    tau_a: float = 1.0,
    tau_b: float = 1.0,
    tol: float | None = None,
    check_every: int = 10,
) -> tuple[Tensor, Tensor]:
    """Entropic OT between ``a`` and ``b`` for every leading index: returns (``⟨P, C⟩ [...]``, ``P [..., n, m]``).

    Args:
        cost: ``[..., n, m]``, finite.
        a / b: ``[..., n]`` / ``[..., m]`` non-negative masses (each sums to 1 for the balanced problem); entries of zero
            mass are left out of the updates and get zero rows / columns in the plan.
        eps: the entropic regularisation (relative to the cost's scale).
        iterations: the most Sinkhorn iterations (the official planner runs 500 with no convergence check).
        tau_a / tau_b: the marginal relaxations (1: balanced).
        tol: stop early once the largest violation of the ``a`` marginal (balanced ``b`` holds after every ``v``
            update) is below ``tol``, checked every ``check_every`` iterations; ``None`` runs all iterations.
    """
    if cost.shape[-2:] != (a.shape[-1], b.shape[-1]):
        raise ValueError(f"sinkhorn: cost {tuple(cost.shape)} does not match a {tuple(a.shape)} and b {tuple(b.shape)}")
    if eps <= 0:
        raise ValueError(f"sinkhorn: eps must be positive, got {eps}")
    rho_a, rho_b = _rho(tau_a, eps), _rho(tau_b, eps)
    a, b = torch.broadcast_to(a, cost.shape[:-1]), torch.broadcast_to(b, (*cost.shape[:-2], cost.shape[-1]))
    mask_a, mask_b = a > 0, b > 0
    log_a = torch.where(mask_a, a.clamp_min(1e-38).log(), torch.zeros_like(a))
    log_b = torch.where(mask_b, b.clamp_min(1e-38).log(), torch.zeros_like(b))
    neg_inf = torch.finfo(cost.dtype).min
    kernel = -cost / eps
    # masked rows and columns sit at -inf in the kernel, so they add nothing to the other side's log-sum-exp
    kernel = kernel.masked_fill(~mask_a[..., :, None] | ~mask_b[..., None, :], neg_inf)
    log_u = torch.zeros_like(a)
    log_v = torch.zeros_like(b)
    for it in range(iterations):
        log_u = torch.where(mask_a, rho_a * (log_a - torch.logsumexp(kernel + log_v[..., None, :], dim=-1)), log_u)
        log_v = torch.where(mask_b, rho_b * (log_b - torch.logsumexp(kernel + log_u[..., :, None], dim=-2)), log_v)
        if tol is not None and (it + 1) % check_every == 0:
            row = torch.exp(kernel + log_u[..., :, None] + log_v[..., None, :]).sum(-1)
            if float((row - a).abs().max()) < tol:
                break
    plan = torch.exp(kernel + log_u[..., :, None] + log_v[..., None, :])
    plan = plan * (mask_a[..., :, None] & mask_b[..., None, :])
    return (plan * cost).sum((-2, -1)), plan
