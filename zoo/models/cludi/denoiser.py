"""CLUDI's denoiser: an MLP that predicts a clean cluster-assignment embedding from a noisy one and the features.

The official network is named ``UViTLin`` but has no attention: a feature path, an assignment path with
self-conditioning, a sinusoidal time embedding added to their concatenation, and an MLP trunk down to the
embedding width. A linear head turns the predicted embedding into cluster logits; fixed random cluster codes μ map
probabilities back to embeddings (``embed``).
"""

from __future__ import annotations

import math

import torch
from diffusers.models.embeddings import get_timestep_embedding
from torch import Tensor, nn

__all__ = ["AssignmentDenoiser", "MPSiLU"]


class MPSiLU(nn.Module):
    """Magnitude-preserving SiLU, ``silu(x) / 0.596`` (EDM2), the official network's activation.

    torch has no such module; it is the plain SiLU rescaled so that unit-variance inputs keep unit variance.
    """

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.silu(x) / 0.596


class AssignmentDenoiser(nn.Module):
    """``f(z_t, x, t, z_sc) -> ẑ_0``, CLUDI's x0-predicting denoiser over assignment embeddings.

    Shapes follow the official layout ``[S, B, ·]``: S diffusion copies of a batch of B features. The feature path
    L2-normalises its input first (so a noisy, masked student view is re-normalised inside the network) and applies
    its dropout twice, as the official forward does.

    Args:
        feat_dim: feature width F.
        num_clusters: K.
        emb_dim: assignment embedding width E.
        assign_dim: output width of the assignment path (the official F/2); the trunk is ``feat_dim + assign_dim``
            wide (576 for F = 384).
        depth: square ``Linear → MPSiLU`` layers of the trunk (4 in the official network).
        dropout: dropout of both paths (0.15).
        seed: seed of the fixed random cluster codes μ (they are a buffer, never trained).

    Example:
        >>> net = AssignmentDenoiser(feat_dim=64, num_clusters=10, emb_dim=16, assign_dim=32)
        >>> z, x = torch.randn(4, 8, 16), torch.randn(4, 8, 64)
        >>> z0 = net(z, x, torch.full((4,), 999))
        >>> z0.shape, net.head(z0).shape, round(float(net.embed(torch.eye(10)[:1]).norm()), 3)
        (torch.Size([4, 8, 16]), torch.Size([4, 8, 10]), 4.0)
    """

    def __init__(
        self,
        feat_dim: int = 384,
        num_clusters: int = 50,
        emb_dim: int = 64,
        assign_dim: int | None = None,
        depth: int = 4,
        dropout: float = 0.15,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if num_clusters < 2:
            raise ValueError(f"num_clusters must be at least 2, got {num_clusters}")
        assign_dim = assign_dim or feat_dim // 2
        width = feat_dim + assign_dim
        self.feat_dim, self.num_clusters, self.emb_dim, self.width = feat_dim, num_clusters, emb_dim, width
        self.features = nn.Sequential(
            nn.Linear(feat_dim, feat_dim),
            MPSiLU(),
            nn.Linear(feat_dim, feat_dim),
            nn.LayerNorm(feat_dim, elementwise_affine=False, eps=1e-6),
            nn.Linear(feat_dim, feat_dim),
        )
        self.assignments = nn.Sequential(  # input: [z_sc ; z_t] (self-conditioning)
            nn.Linear(2 * emb_dim, 2 * emb_dim),
            MPSiLU(),
            nn.Linear(2 * emb_dim, assign_dim),
            nn.LayerNorm(assign_dim, eps=1e-6),
            nn.Linear(assign_dim, assign_dim),
        )
        self.dropout = nn.Dropout(dropout)
        self.time = nn.Sequential(nn.Linear(width, 4 * width), MPSiLU(), nn.Linear(4 * width, width))
        trunk: list[nn.Module] = []
        for _ in range(depth + 1):
            trunk += [nn.Linear(width, width), MPSiLU()]
        trunk += [nn.Linear(width, emb_dim), MPSiLU(), nn.Linear(emb_dim, emb_dim), nn.LayerNorm(emb_dim)]
        trunk += [nn.Linear(emb_dim, emb_dim)]
        self.trunk = nn.Sequential(*trunk)
        self.head = nn.Linear(emb_dim, num_clusters)
        codes = torch.randn(num_clusters, emb_dim, generator=torch.Generator().manual_seed(seed))
        self.register_buffer("codes", nn.functional.normalize(codes, dim=-1))

    def embed(self, probs: Tensor) -> Tensor:
        """Emb(p) = √E · normalize(p μ̂): cluster probabilities ``(..., K)`` to embeddings ``(..., E)`` of norm √E."""
        return nn.functional.normalize(probs @ self.codes.to(probs.dtype), dim=-1) * math.sqrt(self.emb_dim)

    def forward(self, z_t: Tensor, x: Tensor, t: Tensor, z_sc: Tensor | None = None) -> Tensor:
        """``z_t`` ``(S, B, E)``, ``x`` ``(S, B, F)``, ``t`` ``(S,)`` (one timestep per copy), ``z_sc`` like ``z_t``."""
        if x.shape[-1] != self.feat_dim:
            raise ValueError(f"features are {x.shape[-1]} wide but this denoiser expects {self.feat_dim}")
        if z_t.shape[-1] != self.emb_dim or z_t.shape[:-1] != x.shape[:-1]:
            raise ValueError(f"z_t {tuple(z_t.shape)} does not match features {tuple(x.shape)} and E={self.emb_dim}")
        z_sc = torch.zeros_like(z_t) if z_sc is None else z_sc
        h_x = self.dropout(self.dropout(self.features(nn.functional.normalize(x, dim=-1))))
        h_z = self.dropout(self.assignments(torch.cat([z_sc, z_t], dim=-1)))
        # diffusers' sinusoidal embedding in the official order (cos first, base 10,000, no frequency shift).
        t_emb = get_timestep_embedding(t.reshape(-1), self.width, flip_sin_to_cos=True, downscale_freq_shift=0)
        h = torch.cat([h_x, h_z], dim=-1) + self.time(t_emb.to(h_x.dtype)).unsqueeze(-2)
        return self.trunk(h)
