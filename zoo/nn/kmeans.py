"""k-means centroids, in scikit-learn: the candidate points C of archetypal dictionaries (and other papers' anchors)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["kmeans_centroids"]


def kmeans_centroids(x: Tensor | np.ndarray, num_candidates: int, seed: int = 0, max_points: int = 200_000) -> Tensor:
    """Return ``num_candidates`` k-means centroids of ``x`` ``(N, d)`` as a float32 ``(num_candidates, d)`` tensor.

    The paper distils the data into C with k-means (official docs and the critique). scikit-learn's KMeans
    (k-means++ init, one run) does the work; above ``max_points`` rows a seeded random subset is clustered, and
    beyond a million points scikit-learn's MiniBatchKMeans is used, so that GPU-scale caches stay tractable.

    Example:
        >>> x = torch.cat([torch.zeros(50, 2), torch.ones(50, 2) * 5])
        >>> C = kmeans_centroids(x, 2, seed=0)
        >>> sorted(C[:, 0].round().tolist())
        [0.0, 5.0]
    """
    from sklearn.cluster import KMeans, MiniBatchKMeans

    data = x.detach().cpu().float().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=np.float32)
    if data.ndim != 2:
        raise ValueError(f"Expected activations of shape (N, d), got {data.shape}.")
    if data.shape[0] < num_candidates:
        raise ValueError(f"k-means needs at least num_candidates={num_candidates} points, got {data.shape[0]}.")
    rng = np.random.default_rng(seed)
    if data.shape[0] > max_points:
        data = data[np.sort(rng.choice(data.shape[0], max_points, replace=False))]
    if data.shape[0] > 1_000_000:  # pragma: no cover - only reached with max_points raised for real caches
        km = MiniBatchKMeans(num_candidates, random_state=seed, n_init=1, batch_size=4096)
    else:
        km = KMeans(num_candidates, random_state=seed, n_init=1)
    km.fit(data)
    return torch.from_numpy(km.cluster_centers_.astype(np.float32))
