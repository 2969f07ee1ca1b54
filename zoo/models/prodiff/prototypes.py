"""ProDiff's Prototype Condition Extractor: a trajectory transformer with learned prototypes, its matching, the
iterative K-means that labels its features, and the two prototype losses (cluster cross-entropy, triplet hinge)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

__all__ = [
    "IterativeKMeans",
    "TrajectoryTransformer",
    "cluster_consistency_loss",
    "match_prototypes",
    "prototype_triplet_loss",
]


class TrajectoryTransformer(nn.Module):
    """Feature f ∈ R^D of a window and N free prototypes P ∈ R^{N×D} (the official ``TrajectoryTransformer``).

    Linear(3 → D), LayerNorm, a learned positional embedding, a post-LN ``nn.TransformerEncoder``, LayerNorm, a sum
    over time and a last LayerNorm. The prototypes are a Xavier-uniform ``nn.Parameter``.

    Args:
        k: window length.
        d_model: D (512 in the paper, 64 in the card's CPU reproduction).
        n_layers: encoder layers.
        n_heads: attention heads.
        d_ff: feed-forward width.
        dropout: encoder dropout.
        n_prototypes: N.

    Example:
        >>> pce = TrajectoryTransformer(k=6, d_model=16, n_layers=1, n_heads=2, d_ff=32, n_prototypes=4)
        >>> prototypes, f = pce(torch.rand(5, 3, 6))
        >>> prototypes.shape, f.shape
        (torch.Size([4, 16]), torch.Size([5, 16]))
    """

    def __init__(self, k: int = 6, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, d_ff: int = 128,
                 dropout: float = 0.1, n_prototypes: int = 8) -> None:  # fmt: skip
        super().__init__()
        self.k = k
        self.embed = nn.Linear(3, d_model)
        self.embed_norm = nn.LayerNorm(d_model)
        self.pos = nn.Parameter(torch.zeros(1, k, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.out_norm = nn.LayerNorm(d_model)
        self.pool_norm = nn.LayerNorm(d_model)
        self.prototypes = nn.Parameter(torch.empty(n_prototypes, d_model))
        nn.init.xavier_uniform_(self.prototypes)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x`` [B, 3, k] (channel-first, scaled) → (prototypes [N, D], features [B, D])."""
        if x.ndim != 3 or x.shape[1] != 3 or x.shape[2] != self.k:
            raise ValueError(f"TrajectoryTransformer takes windows [B, 3, {self.k}], got {list(x.shape)}")
        h = self.embed_norm(self.embed(x.transpose(1, 2))) + self.pos
        h = self.out_norm(self.encoder(h))
        return self.prototypes, self.pool_norm(h.sum(1))


def match_prototypes(query: Tensor, prototypes: Tensor, temperature: float | None = None) -> Tensor:
    """P_c = Σ_j softmax_j(cos(q, P_j) / τ) P_j, with τ = √D by default (the official choice).

    With cosines in [−1, 1] and τ = √D the weights are nearly uniform, so P_c is close to the mean prototype (card
    §8); a smaller ``temperature`` makes the match sharper. Gradients reach the prototypes.

    Example:
        >>> P = torch.eye(3)
        >>> match_prototypes(torch.tensor([[1.0, 0, 0]]), P, temperature=0.01).round(decimals=3)
        tensor([[1., 0., 0.]])
    """
    tau = math.sqrt(prototypes.shape[1]) if temperature is None else temperature
    cos = F.normalize(query, dim=-1) @ F.normalize(prototypes, dim=-1).T
    return torch.softmax(cos / tau, dim=-1) @ prototypes


class IterativeKMeans:
    """Lloyd's K-means warm-started across batches over a FIFO memory of recent features (the official
    ``IterativeKMeans``), on the features' device.

    Written here rather than taken from scikit-learn because it refits at every training step on the accelerator's
    features: a host round trip per step would cost more than the fit. ``reset`` starts an epoch (the official code
    re-creates it every epoch): the next ``update`` initialises the centres from random points of its batch.

    Args:
        n_clusters: K (the number of prototypes).
        memory: batches of features kept besides the current one.
        iterations: most Lloyd iterations per update.
        tol: stop when the centres move less than this (largest squared shift).

    Example:
        >>> km = IterativeKMeans(2, memory=2)
        >>> labels = km.update(torch.tensor([[0.0], [0.1], [5.0], [5.1]]), generator=torch.Generator().manual_seed(0))
        >>> bool(labels[0] == labels[1]) and bool(labels[2] == labels[3]) and bool(labels[0] != labels[2])
        True
    """

    def __init__(self, n_clusters: int, memory: int = 10, iterations: int = 100, tol: float = 1e-4) -> None:
        self.n_clusters, self.memory, self.iterations, self.tol = n_clusters, memory, iterations, tol
        self.reset()

    def reset(self) -> None:
        self.centers: Tensor | None = None
        self._bank: list[Tensor] = []

    @torch.no_grad()
    def update(self, features: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Refit on the memory plus ``features`` [B, D]; return the labels of ``features`` [B]."""
        features = features.detach().float()
        data = torch.cat([*self._bank, features])
        if self.centers is None:
            if len(features) < self.n_clusters:
                raise ValueError(
                    f"K-means needs at least {self.n_clusters} features in its first batch, got {len(features)}"
                )
            pick = torch.randperm(len(features), generator=generator)[: self.n_clusters].to(features.device)
            self.centers = features[pick].clone()
        centers = self.centers
        for _ in range(self.iterations):
            labels = torch.cdist(data, centers).argmin(1)
            one_hot = F.one_hot(labels, self.n_clusters).to(data.dtype)
            counts = one_hot.sum(0)[:, None]
            new = torch.where(counts > 0, one_hot.T @ data / counts.clamp_min(1), centers)  # empty clusters stay
            shift = (new - centers).pow(2).sum(1).max()
            centers = new
            if shift < self.tol:
                break
        self.centers = centers
        self._bank = [*self._bank, features][-self.memory :]
        return torch.cdist(features, centers).argmin(1)


def cluster_consistency_loss(features: Tensor, prototypes: Tensor, labels: Tensor,
                             centers: Tensor | None = None) -> Tensor:  # fmt: skip
    """L_C1: cross-entropy of the logits f · normalize(P_j) (P detached) against K-means labels.

    The official code takes the K-means ids as prototype ids, although nothing ties cluster j to prototype j. Give
    ``centers`` to relabel the clusters first by the assignment (Hungarian, ``scipy.optimize.linear_sum_assignment``)
    that minimises the centre-to-prototype distances: the matched variant the card suggests.

    Example:
        >>> f = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> float(cluster_consistency_loss(f * 10, torch.eye(2), torch.tensor([0, 1]))) < 1e-3
        True
    """
    if centers is not None:
        cost = torch.cdist(centers.float(), prototypes.detach().float()).cpu().numpy()
        rows, cols = linear_sum_assignment(cost)
        mapping = torch.empty(len(rows), dtype=torch.long)
        mapping[torch.as_tensor(rows)] = torch.as_tensor(cols)
        labels = mapping.to(labels.device)[labels]
    logits = features @ F.normalize(prototypes.detach(), dim=-1).T
    return F.cross_entropy(logits, labels)


def prototype_triplet_loss(features: Tensor, prototypes: Tensor, margin: float = 1.0) -> Tensor:
    """L_C2 = mean max(0, ‖f − p⁺‖ − ‖f − p⁻‖ + margin), p⁺ / p⁻ the nearest / farthest prototype (Euclidean).

    Example:
        >>> float(prototype_triplet_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 0.0], [3.0, 4.0]])))
        0.0
    """
    d = torch.cdist(features, prototypes)
    return F.relu(d.min(1).values - d.max(1).values + margin).mean()
