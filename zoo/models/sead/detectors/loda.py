"""LODA: sparse random projections with growing one-dimensional histograms."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from zoo.models.sead.detectors.base import StreamDetector, _generator, _positive_int


def _earlier_equal(keys: Tensor) -> Tensor:
    """For a 1-D ``keys`` in time order, how many earlier entries have the same key (one stable sort, no loop)."""
    sorted_keys, order = keys.sort(stable=True)  # stable: within a key, entries stay in time order
    idx = torch.arange(len(keys), device=keys.device)
    new = torch.ones_like(keys, dtype=torch.bool)
    new[1:] = sorted_keys[1:] != sorted_keys[:-1]
    start = torch.where(new, idx, torch.zeros_like(idx)).cummax(0).values
    return torch.empty_like(idx).index_copy_(0, order, idx - start)


class LODA(StreamDetector):
    """LODA (Pevný, 2016) as PySAD streams it: sparse random projections, one growing histogram each.

    Each projection has max(1, ⌊√d⌋) non-zero N(0, 1) weights. Its histogram has ``bins`` equal-width bins and counts
    every point learnt so far (no forgetting, like PySAD's ``LODA``). The first point sets the low edge; the first
    distinct value sets the bin width to |Δ| / (bins − 0.5); a value outside the range doubles the width towards it
    and merges adjacent pairs of bins, as often as needed, so counts stay exact and nothing is redistributed.
    Score = mean over projections of −log((count + 1) / ((n + bins) · width)) (0 for a projection whose width is
    still 0), so higher = more anomalous; a value outside the range counts as an empty bin.

    Chunks: rows that fall inside every histogram's range are scored together (the counts of the chunk's earlier
    rows come from a cumulative one-hot count); a row that must extend a range (rare once the range covers the data)
    is handled on its own, in float64 like the rest, so chunked and per-point runs give the same scores.

    Args:
        dim: stream width d.
        seed: seed of the projections.
        num_projections: number of projections (histograms).
        bins: bins per histogram, >= 2.

    Example:
        >>> det = LODA(dim=4, num_projections=8, bins=5)
        >>> for x in torch.randn(32, 4, generator=torch.Generator().manual_seed(0)):
        ...     _ = det.score_learn(x)
        >>> bool(det.score(8 * torch.ones(4)) > det.score(torch.zeros(4)))
        True
    """

    name = "loda"

    def __init__(self, dim: int, seed: int = 0, num_projections: int = 50, bins: int = 20) -> None:
        super().__init__(dim, seed)
        P = self.num_projections = _positive_int("LODA", "num_projections", num_projections)
        self.bins = _positive_int("LODA", "bins", bins, minimum=2)
        self._params = {"num_projections": P, "bins": bins}
        g = _generator(seed)
        nnz = max(1, int(math.sqrt(dim)))
        keep = torch.rand(P, dim, generator=g).argsort(1) < nnz  # nnz random features per row
        self.register_buffer("W", (torch.randn(P, dim, generator=g) * keep).double())
        self.register_buffer("hist", torch.zeros(P, bins, dtype=torch.float64))
        self.register_buffer("low", torch.zeros(P, dtype=torch.float64))
        self.register_buffer("width", torch.zeros(P, dtype=torch.float64))
        self.register_buffer("n", torch.zeros((), dtype=torch.long))

    def _bin(self, z: Tensor) -> Tensor:
        return ((z - self.low) / self.width).floor()  # NaN/inf where width is 0: never "in range"

    def _neg_log_density(self, count: Tensor, seen: Tensor, ready: Tensor) -> Tensor:
        nld = -torch.log((count + 1) / ((seen.unsqueeze(-1) + self.bins) * self.width))
        return torch.where(ready, nld, torch.zeros_like(nld)).mean(-1).float()

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        if not learn:  # score-only: run the chunk on the state, then put the state back
            saved = [t.clone() for t in (self.hist, self.low, self.width, self.n)]
            out = self._process(X, score=score, learn=True)
            for t, v in zip((self.hist, self.low, self.width, self.n), saved):
                t.copy_(v)
            return out
        Z = X.double() @ self.W.T  # (B, P)
        out = X.new_zeros(len(Z))
        i = 0
        while i < len(Z):
            ind = self._bin(Z[i:])
            ok = ((self.width > 0) & (ind >= 0) & (ind < self.bins)).all(1)
            e = int(ok.logical_not().long().argmax()) if not bool(ok.all()) else len(ok)  # first row to extend
            if e:  # rows i .. i+e-1: inside every range; counts = stored + earlier rows of this run
                cell = (ind[:e].long() + torch.arange(self.num_projections, device=Z.device) * self.bins).flatten()
                if score:
                    count = self.hist.view(-1).index_select(0, cell) + _earlier_equal(cell).to(self.hist.dtype)
                    seen = self.n + torch.arange(e, device=Z.device)
                    out[i : i + e] = self._neg_log_density(
                        count.view(e, -1), seen, torch.ones(e, self.num_projections, dtype=torch.bool)
                    )
                self.hist.view(-1).index_add_(0, cell, torch.ones_like(cell, dtype=self.hist.dtype))
                self.n += e
                i += e
            if i < len(Z):  # one row that starts or extends some histogram
                z = Z[i]
                ind = self._bin(z)
                ready = self.width > 0
                inside = ready & (ind >= 0) & (ind < self.bins)
                count = torch.where(
                    inside,
                    self.hist.gather(1, ind.nan_to_num(0).clamp(0, self.bins - 1).long().unsqueeze(1)).squeeze(1),
                    torch.zeros_like(z),
                )
                out[i] = self._neg_log_density(count, self.n, ready)
                self._extend_learn(z)
                i += 1
        return out

    def _extend_learn(self, z: Tensor) -> None:
        """Learn one row that starts or extends histograms (PySAD's rules), per projection in float64 Python maths.

        Rare after the first points (a range only grows by doubling), so a loop over the affected projections costs
        little; Python floats are IEEE doubles, so the bins agree with the batched torch path.
        """
        hist, low, width = self.hist.cpu().numpy().copy(), self.low.tolist(), self.width.tolist()
        zs, bins = z.tolist(), self.bins
        if int(self.n) == 0:
            low, hist[:, 0] = zs, 1.0
        else:
            for p, v in enumerate(zs):
                if width[p] > 0:
                    k = math.floor((v - low[p]) / width[p])
                    if 0 <= k < bins:
                        hist[p, k] += 1.0
                        continue
                elif v == low[p]:  # a single distinct value so far
                    hist[p, 0] += 1.0
                    continue
                else:  # the second distinct value sets the width; the first value's count moves to its bin
                    seen, count = low[p], hist[p, 0]
                    width[p], low[p], hist[p, 0] = abs(v - seen) / (bins - 0.5), min(v, seen), 0.0
                    hist[p, self._extend(hist, low, width, p, seen)] = count
                hist[p, self._extend(hist, low, width, p, v)] += 1.0
        self.hist.copy_(torch.from_numpy(hist))
        self.low.copy_(torch.tensor(low, dtype=torch.float64))
        self.width.copy_(torch.tensor(width, dtype=torch.float64))
        self.n += 1

    def _extend(self, hist: np.ndarray, low: list[float], width: list[float], p: int, v: float) -> int:
        """Double histogram p's width towards ``v`` (merging bin pairs) until ``v`` falls in; return its bin."""
        bins = self.bins
        while True:
            k = math.floor((v - low[p]) / width[p])
            if 0 <= k < bins:
                return k
            padded = [0.0] * bins + hist[p].tolist() if k < 0 else hist[p].tolist() + [0.0] * bins
            if k < 0:
                low[p] -= bins * width[p]
            hist[p] = [padded[2 * j] + padded[2 * j + 1] for j in range(bins)]
            width[p] *= 2.0
