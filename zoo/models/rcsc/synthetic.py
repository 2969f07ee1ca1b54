"""The card's synthetic views (section 5): two Gaussian-cluster views, 10 % gross corruption in view 1, and a pure
noise view (200-d by default)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["synthetic_views"]


def synthetic_views(n_per: int = 300, n_clusters: int = 5, dims: tuple[int, ...] = (10, 15), noise_dim: int = 200,
                    corrupt: float = 0.1, seed: int = 0) -> tuple[list[Tensor], Tensor]:
    """Views ``[n, d_v]`` and labels ``[n]``: means N(0, 1.2^2 I), unit noise, a ``corrupt`` fraction of view 1 gets
    +4 N(0, I), and a ``noise_dim``-d pure-noise view (omitted when 0).

    Example:
        >>> views, y = synthetic_views(n_per=10, seed=0)
        >>> [v.shape[1] for v in views], y.shape
        ([10, 15, 200], torch.Size([50]))
    """
    g = torch.Generator().manual_seed(seed)
    n = n_per * n_clusters
    y = torch.arange(n_clusters).repeat_interleave(n_per)
    views = []
    for d in dims:
        mu = 1.2 * torch.randn(n_clusters, d, generator=g)
        views.append(mu[y] + torch.randn(n, d, generator=g))
    bad = torch.randperm(n, generator=g)[: int(corrupt * n)]
    views[0][bad] += 4 * torch.randn(len(bad), dims[0], generator=g)
    if noise_dim:
        views.append(torch.randn(n, noise_dim, generator=g))
    return views, y
