"""The electrostatic field of two charged plates, estimated from charge samples (EFM card §2.1–2.2).

Source samples x⁺ ~ P sit on the plate z = 0 as positive charges, target samples x⁻ ~ Q on the plate z = L as
negative charges, in the augmented space x̃ = (x, z) ∈ R^{D+1} (z is the *last* coordinate here). The Monte-Carlo
Coulomb field in D+1 dimensions is

    Ê(x̃) = (1/N) Σ_i (x̃ − x̃_i⁺)/‖x̃ − x̃_i⁺‖^{D+1} − (1/M) Σ_j (x̃ − x̃_j⁻)/‖x̃ − x̃_j⁻‖^{D+1}.

The power D+1 under- and overflows for images (D+1 = 3073), so every sum is kept in log space with a running
max-shift, one chunk of charges at a time: memory is ``points × chunk_size`` whatever the number of charges.
No library computes this (it is neither a kernel density nor a softmax attention with a value offset), hence the
hand-written streaming log-sum-exp.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

__all__ = ["FieldTarget", "PlateSums", "plate_sums", "coulomb_field", "lift", "TargetKind"]

TargetKind = Literal["paper", "code_per_plate"]


def lift(x: Tensor, z: float | Tensor) -> Tensor:
    """Augmented points ``(n, D+1)``: the flattened ``x`` ``(n, ...)`` with ``z`` appended as the last coordinate."""
    flat = x.reshape(len(x), -1)
    z = torch.as_tensor(z, dtype=flat.dtype, device=flat.device).expand(len(flat))
    return torch.cat([flat, z[:, None]], dim=1)


class PlateSums(NamedTuple):
    """Σ_i r_i^{-(D+1)} (x̃ − x̃_i) = e^{log_scale} · (x̃ · s0 − s1) for one plate, with r_i = ‖x̃ − x̃_i‖.

    ``log_scale`` ``(n,)`` is the max-shift, ``s0`` ``(n,)`` the shifted weight sum, ``s1`` ``(n, D+1)`` the shifted
    weighted sum of the charges. Splitting the difference this way turns the sum into one matmul per chunk.
    """

    log_scale: Tensor
    s0: Tensor
    s1: Tensor


def _distances(points: Tensor, charges: Tensor) -> Tensor:
    # The matmul form ‖a‖² + ‖b‖² − 2ab loses the small distances that dominate r^{-(D+1)} in low dimension;
    # the direct form is exact and cheap there. In high dimension distances are large and the matmul form is fine.
    mode = "donot_use_mm_for_euclid_dist" if points.shape[1] <= 32 else "use_mm_for_euclid_dist"
    return torch.cdist(points, charges, compute_mode=mode)


def plate_sums(points: Tensor, charges: Tensor, chunk_size: int = 2048) -> PlateSums:
    """Streaming log-space sums of one plate's Coulomb terms at ``points`` ``(n, D+1)``, ``chunk_size`` charges at once.

    Example:
        >>> pts, q = torch.randn(5, 3), torch.randn(100, 3)
        >>> a, b = plate_sums(pts, q, chunk_size=7), plate_sums(pts, q, chunk_size=100)
        >>> torch.allclose(a.s0 * a.log_scale.exp(), b.s0 * b.log_scale.exp())
        True
    """
    if points.ndim != 2 or charges.ndim != 2 or points.shape[1] != charges.shape[1]:
        raise ValueError(
            f"points {tuple(points.shape)} and charges {tuple(charges.shape)} must be (n, D+1) and (m, D+1)"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    power = points.shape[1]  # D + 1
    n = len(points)
    log_scale = torch.full((n,), -torch.inf, dtype=points.dtype, device=points.device)
    s0 = points.new_zeros(n)
    s1 = points.new_zeros(n, power)
    for start in range(0, len(charges), chunk_size):
        chunk = charges[start : start + chunk_size]
        log_w = -power * torch.log(_distances(points, chunk) + 1e-12)  # (n, c)
        new_scale = torch.maximum(log_scale, log_w.amax(dim=1))
        rescale = torch.exp(log_scale - new_scale)  # 0 on the first chunk (exp(-inf))
        w = torch.exp(log_w - new_scale[:, None])
        s0 = s0 * rescale + w.sum(dim=1)
        s1 = s1 * rescale[:, None] + w @ chunk
        log_scale = new_scale
    return PlateSums(log_scale, s0, s1)


def coulomb_field(points: Tensor, positive: Tensor, negative: Tensor, chunk_size: int = 2048) -> Tensor:
    """The Monte-Carlo field Ê at ``points``, divided by a positive per-point factor (its direction is exact).

    The common factor e^{max log-weight} is dropped: it cancels in every normalised target and in f_x / f_z.

    Example:
        >>> e = coulomb_field(torch.tensor([[0.0, 0.5]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 1.0]]))
        >>> e / e.norm()   # on the axis of a dipole the field points from + to -
        tensor([[0., 1.]])
    """
    plus = plate_sums(points, positive, chunk_size)
    minus = plate_sums(points, negative, chunk_size)
    shift = torch.maximum(plus.log_scale, minus.log_scale)
    a = torch.exp(plus.log_scale - shift) / len(positive)
    b = torch.exp(minus.log_scale - shift) / len(negative)
    return (a[:, None] * (points * plus.s0[:, None] - plus.s1)) - (b[:, None] * (points * minus.s0[:, None] - minus.s1))


class FieldTarget:
    """The regression target of EFM at field points, from one batch of charges per plate.

    ``kind="paper"`` (default, the poster's Algorithm 1): the normalised total field Ê/‖Ê‖.
    ``kind="code_per_plate"`` (the official ``GroundTruth``): √(D+1)·[d⁺/(‖d⁺‖+γ) + d⁻/(‖d⁻‖+γ)] with
    d⁺ = Σ_i w_i⁺(x̃ − x̃_i⁺), d⁻ = Σ_j w_j⁻(x̃_j⁻ − x̃) and per-plate softmax weights w ∝ r^{-(D+1)}: each plate's
    field is unit-normalised on its own, so the sum is *not* parallel to Ê in general (the card's check: transport
    with it is about twice as far from Q). Always computed in float32 or wider, without gradients.

    Args:
        kind: ``"paper"`` or ``"code_per_plate"``.
        gamma: γ of the code target (1e-7 toy, 5 images); unused by the paper target.
        chunk_size: charges per chunk (memory is ``points × chunk_size``).

    Example:
        >>> target = FieldTarget()
        >>> pts = torch.tensor([[0.0, 0.0, 0.5]])
        >>> target(pts, torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]))
        tensor([[0., 0., 1.]])
    """

    def __init__(self, kind: TargetKind = "paper", gamma: float = 1e-7, chunk_size: int = 2048) -> None:
        if kind not in ("paper", "code_per_plate"):
            raise ValueError(f"unknown target kind {kind!r}; choose 'paper' or 'code_per_plate'")
        self.kind, self.gamma, self.chunk_size = kind, gamma, chunk_size

    @torch.no_grad()
    def __call__(self, points: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        dtype = torch.promote_types(points.dtype, torch.float32)  # never fp16/bf16: r^{-(D+1)} needs the range
        points, positive, negative = points.to(dtype), positive.to(dtype), negative.to(dtype)
        if self.kind == "paper":
            field = coulomb_field(points, positive, negative, self.chunk_size)
            return field / field.norm(dim=1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        plus = plate_sums(points, positive, self.chunk_size)
        minus = plate_sums(points, negative, self.chunk_size)
        d_plus = points - plus.s1 / plus.s0[:, None]
        d_minus = minus.s1 / minus.s0[:, None] - points
        scale = points.shape[1] ** 0.5
        return scale * (
            d_plus / (d_plus.norm(dim=1, keepdim=True) + self.gamma)
            + d_minus / (d_minus.norm(dim=1, keepdim=True) + self.gamma)
        )

    def __repr__(self) -> str:
        return f"FieldTarget(kind={self.kind!r}, gamma={self.gamma}, chunk_size={self.chunk_size})"
