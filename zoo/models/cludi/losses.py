"""CLUDI's clustering loss (row/column-normalised cross-entropy between copies) and the student's feature views."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import normalize

__all__ = ["perturb_features", "row_column_ce"]


def _log_row(logits: Tensor, tau_row: float) -> Tensor:
    """log((B/K) · colnorm_B(softmax_K(ℓ/τ_r)) + 1e-8): the prediction side, with a uniform prior over clusters."""
    b, k = logits.shape[-2:]
    return torch.log(b / k * normalize((logits / tau_row).softmax(-1), p=1, dim=-2, eps=1e-8) + 1e-8)


def _target(logits: Tensor, tau_col: float) -> Tensor:
    """rownorm_K(softmax_B(ℓ/τ_c)): the target side, a softmax over the batch then L1 over clusters."""
    return normalize((logits / tau_col).softmax(-2), p=1, dim=-1, eps=1e-8)


def row_column_ce(
    teacher: Tensor,
    student: Tensor,
    weights: Tensor | None = None,
    tau_row: float = 0.1,
    tau_col: float = 0.05,
) -> Tensor:
    """Self-Classifier-style loss between every teacher copy i and student copy j (the official
    ``extended_new_loss_newnew``).

    l1_ij = −mean_b Σ_k tgt(P_i) log_row(Q_j), l2_ij = −mean_b Σ_k tgt(Q_j) log_row(P_i), and the loss is
    ½ [mean_ij(l1_ij w_i) + mean_ij(l2_ij w_j)]. The column normalisation over the batch is what keeps every
    cluster in use, so the batch must be much larger than K.

    Args:
        teacher: logits P ``(S, B, K)``.
        student: logits Q ``(S, B, K)``.
        weights: ``(S,)`` per-copy weights (the student's min-SNR weights); None: 1.
        tau_row: temperature of the prediction side.
        tau_col: temperature of the target side.

    Example:
        >>> p = torch.randn(2, 64, 4)
        >>> bool(row_column_ce(p, p) < row_column_ce(p, p.roll(1, dims=-1)))
        True
    """
    if teacher.shape != student.shape or teacher.dim() != 3:
        raise ValueError(f"teacher and student logits must both be (S, B, K), got {teacher.shape}, {student.shape}")
    log_p, log_q = _log_row(teacher, tau_row)[:, None], _log_row(student, tau_row)[None]
    tgt_p, tgt_q = _target(teacher, tau_col)[:, None], _target(student, tau_col)[None]
    l1 = -(tgt_p * log_q).sum(-1).mean(-1)  # (S_teacher, S_student)
    l2 = -(tgt_q * log_p).sum(-1).mean(-1)
    if weights is None:
        return (l1.mean() + l2.mean()) / 2
    return ((l1 * weights[:, None]).mean() + (l2 * weights[None, :]).mean()) / 2


def perturb_features(
    x: Tensor,
    noise: tuple[float, float] = (0.2, 1.0),
    drop: tuple[float, float] = (0.05, 0.10),
    generator: torch.Generator | None = None,
) -> Tensor:
    """The student's view of ``x`` ``(S, B, F)``: x + s·u/‖u‖ then a Bernoulli feature mask, one s and one drop rate
    per copy (official ``add_random_noise`` and ``feature_dropout``).

    The mask keeps the surviving features as they are (no 1/(1−p) rescale, unlike ``nn.Dropout``).

    Example:
        >>> x = torch.nn.functional.normalize(torch.randn(3, 100, 16), dim=-1)
        >>> y = perturb_features(x, generator=torch.Generator().manual_seed(0))
        >>> y.shape, 0.02 < float((y == 0).float().mean()) < 0.15
        (torch.Size([3, 100, 16]), True)
    """
    s = x.shape[0]
    device = x.device

    def uniform(bounds: tuple[float, float]) -> Tensor:
        u = torch.rand(s, 1, 1, generator=generator, device="cpu" if generator else device).to(device)
        return bounds[0] + (bounds[1] - bounds[0]) * u

    u = torch.randn(x.shape, generator=generator, device="cpu" if generator else device).to(device)
    noisy = x + uniform(noise) * normalize(u, dim=-1)
    keep = torch.rand(x.shape, generator=generator, device="cpu" if generator else device).to(device) >= uniform(drop)
    return noisy * keep
