"""Where the field is regressed: points x̃ = (x, z) between and around the plates (EFM card §2.3)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["PlatePointSampler", "SamplerKind"]

SamplerKind = Literal["segment", "uniform", "uniform_mixing", "mesh"]


class PlatePointSampler:
    """Draws field points from one batch of source (z = 0) and target (z = L) samples.

    Kinds:

    * ``"segment"`` (default; the paper's Algorithm 1 with the card's proposal): z ~ U(ε, L−ε) on the segment
      between a random source and a random target sample, x = (1 − z/L)x⁺ + (z/L)x⁻ + ``noise``·n, n ~ N(0, I);
      plus a fraction ``outer_fraction`` of points with z ~ U(−a, L+a), a = ``outer_margin``, and
      x ~ U([−``outer_box``, ``outer_box``]^D): lines that leave the capacitor need the field out there too.
    * ``"uniform"`` (official ``Uniform``): the segment without noise or outer points.
    * ``"uniform_mixing"`` (official, used for images): PFGM's z = |N(0, σ_end²)|·(1+τ)^m, m ~ U[0, M], then
      x = (1 − z/L)x⁺ + (z/L)x⁻, which extrapolates past the target plate when z > L.
    * ``"mesh"`` (official toy): a regular grid of ``mesh_size`` points per axis over x ∈ [−box, box]^D,
      z ∈ [1e-5, L + outer_margin] (the same grid every call; only for small D).

    Example:
        >>> sampler = PlatePointSampler(L=6.0)
        >>> pts = sampler(torch.randn(64, 2), torch.randn(64, 2) + 4, num_points=100)
        >>> pts.shape, bool((pts[:85, 2] > 0).all() and (pts[:85, 2] < 6).all())
        (torch.Size([100, 3]), True)
    """

    def __init__(
        self,
        kind: SamplerKind = "segment",
        L: float = 6.0,
        eps: float = 1e-3,
        noise: float = 0.5,
        outer_fraction: float = 0.15,
        outer_margin: float = 1.0,
        outer_box: float = 6.0,
        sigma_end: float = 0.1,
        tau: float = 0.03,
        max_power: int = 291,
        mesh_size: int = 7,
    ) -> None:
        if kind not in ("segment", "uniform", "uniform_mixing", "mesh"):
            raise ValueError(f"unknown sampler {kind!r}; choose 'segment', 'uniform', 'uniform_mixing' or 'mesh'")
        if L <= 0:
            raise ValueError(f"the plate distance L must be > 0, got {L}")
        if not 0 <= outer_fraction < 1:
            raise ValueError(f"outer_fraction must be in [0, 1), got {outer_fraction}")
        self.kind, self.L, self.eps, self.noise = kind, float(L), eps, noise
        self.outer_fraction, self.outer_margin, self.outer_box = outer_fraction, outer_margin, outer_box
        self.sigma_end, self.tau, self.max_power, self.mesh_size = sigma_end, tau, max_power, mesh_size

    def __call__(
        self, source: Tensor, target: Tensor, num_points: int, generator: torch.Generator | None = None
    ) -> Tensor:
        """``num_points`` field points ``(num_points, D+1)`` from ``source`` ``(N, D)`` and ``target`` ``(M, D)``.

        ``generator`` (on the samples' device) makes the draw reproducible, e.g. for a validation loss.
        """
        source, target = source.reshape(len(source), -1), target.reshape(len(target), -1)
        dev, g = source.device, generator

        def rand(*size: int) -> Tensor:
            return torch.rand(*size, device=dev, generator=g, dtype=source.dtype)

        if self.kind == "mesh":
            return self._mesh(source)
        n_outer = int(round(self.outer_fraction * num_points)) if self.kind == "segment" else 0
        n_inner = num_points - n_outer
        i = torch.randint(len(source), (n_inner,), device=dev, generator=g)
        j = torch.randint(len(target), (n_inner,), device=dev, generator=g)
        if self.kind == "uniform_mixing":
            normal = torch.randn(n_inner, device=dev, generator=g, dtype=source.dtype)
            z = (normal * self.sigma_end).abs() * (1 + self.tau) ** (rand(n_inner) * self.max_power)
        else:
            z = self.eps + (self.L - 2 * self.eps) * rand(n_inner)
        t = (z / self.L)[:, None]
        x = (1 - t) * source[i] + t * target[j]
        if self.kind == "segment" and self.noise > 0:
            x = x + self.noise * torch.randn(x.shape, device=dev, generator=g, dtype=x.dtype)
        points = torch.cat([x, z[:, None]], dim=1)
        if n_outer == 0:
            return points
        a = self.outer_margin
        z_out = -a + (self.L + 2 * a) * rand(n_outer, 1)
        x_out = self.outer_box * (2 * rand(n_outer, x.shape[1]) - 1)
        return torch.cat([points, torch.cat([x_out, z_out], dim=1)])

    def _mesh(self, source: Tensor) -> Tensor:
        dim = source.shape[1]
        if dim > 3:
            raise ValueError(f"the mesh sampler grows as mesh_size^(D+1); it is for D <= 3, got D = {dim}")
        axes = [torch.linspace(-self.outer_box, self.outer_box, self.mesh_size, dtype=source.dtype)] * dim
        axes.append(torch.linspace(1e-5, self.L + self.outer_margin, self.mesh_size, dtype=source.dtype))
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, dim + 1)
        return grid.to(source.device)

    def __repr__(self) -> str:
        return f"PlatePointSampler(kind={self.kind!r}, L={self.L}, noise={self.noise}, outer={self.outer_fraction})"
