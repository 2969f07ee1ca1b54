"""LODA: sparse random projections with growing one-dimensional histograms."""

from __future__ import annotations

import math

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


def _grow(row: list[float], low: float, width: float, v: float, first: bool) -> tuple[list[float], float, float]:
    """Learn ``v`` into one histogram (``row``, ``low``, ``width``) that cannot count it as it is (PySAD's rules).

    The first point sets the low edge; while the width is 0, the value seen is counted in bin 0 and the first
    distinct value sets the width to |Δ| / (bins − 0.5) (the earlier count moves to its bin); a value outside the
    range doubles the width towards it, merging bin pairs, until it falls in. Python floats are IEEE doubles, so
    the bins agree with the batched torch path.
    """
    bins = len(row)
    if first:
        return [1.0] + [0.0] * (bins - 1), v, 0.0
    if width == 0.0:
        if v == low:  # a single distinct value so far
            row[0] += 1.0
            return row, low, width
        seen, count = low, row[0]
        width, low, row = abs(v - seen) / (bins - 0.5), min(v, seen), [0.0] * bins
        row, low, width, k = _extend(row, low, width, seen)
        row[k] = count
    row, low, width, k = _extend(row, low, width, v)
    row[k] += 1.0
    return row, low, width


def _extend(row: list[float], low: float, width: float, v: float) -> tuple[list[float], float, float, int]:
    """Double the width towards ``v`` (merging bin pairs) until ``v`` falls in; return the histogram and v's bin."""
    bins = len(row)
    while True:
        k = math.floor((v - low) / width)
        if 0 <= k < bins:
            return row, low, width, k
        padded = [0.0] * bins + row if k < 0 else row + [0.0] * bins
        if k < 0:
            low -= bins * width
        row = [padded[2 * j] + padded[2 * j + 1] for j in range(bins)]
        width *= 2.0


class LODA(StreamDetector):
    """LODA (Pevný, 2016) as PySAD streams it: sparse random projections, one growing histogram each.

    Each projection has max(1, ⌊√d⌋) non-zero N(0, 1) weights. Its histogram has ``bins`` equal-width bins and counts
    every point learnt so far (no forgetting, like PySAD's ``LODA``). The first point sets the low edge; the first
    distinct value sets the bin width to |Δ| / (bins − 0.5); a value outside the range doubles the width towards it
    and merges adjacent pairs of bins, as often as needed, so counts stay exact and nothing is redistributed.
    Score = mean over projections of −log((count + 1) / ((n + bins) · width)) (0 for a projection whose width is
    still 0), so higher = more anomalous; a value outside the range counts as an empty bin.

    Chunks: every projection scores and learns its rows up to the first value its histogram must extend for, in
    batched ops (the counts of the chunk's earlier rows come from one stable sort of their cells); that value is
    learnt on its own, in float64 like the rest, and the pass repeats for the projections that extended, so chunked
    and per-point runs give the same scores. A pool's LODA settings run as one bank of projections.

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

    @property
    def max_chunk(self) -> int:
        return max(1, min(256, 2**20 // self.num_projections))  # bounds the (B, P) work tensors

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        return self._process_many([self], X, score, learn)[:, 0]

    @classmethod
    def _process_many(
        cls, detectors: list[StreamDetector], X: Tensor, score: bool = True, learn: bool = True
    ) -> Tensor:
        """All settings at once, as one bank of projections; each projection's histogram is independent of the rest.

        Each pass takes, for every projection, its rows up to the first one its histogram cannot count (a value out
        of range, or no width yet), scores and learns them in batched ops (a row's count = stored count + earlier
        rows of the chunk in the same bin), then learns each projection's blocking value on its own (``_grow``).
        Passes repeat until every row is learnt, so their number is the most range extensions any one projection
        needs in the chunk, not the number of rows that extend some histogram.
        """
        B, dev = len(X), X.device
        wide = max(det.bins for det in detectors)
        W = torch.cat([det.W for det in detectors])  # (P, d)
        P = len(W)
        bins = torch.cat([torch.full((det.num_projections,), det.bins, device=dev) for det in detectors])
        seen0 = torch.cat([det.n.expand(det.num_projections) for det in detectors])  # points learnt before the chunk
        hist = torch.cat([torch.nn.functional.pad(det.hist, (0, wide - det.bins)) for det in detectors])  # (P, wide)
        low, width = torch.cat([det.low for det in detectors]), torch.cat([det.width for det in detectors])
        Z = X.double() @ W.T  # (B, P)
        nld = Z.new_zeros(B, P)  # −log density of each row under each projection (0 while a width is 0)
        start = torch.zeros(P, dtype=torch.long, device=dev)  # first row each projection has still to learn
        act, r0 = torch.arange(P, device=dev), 0  # projections with rows still to learn; their first such row
        while True:
            t = torch.arange(r0, B, device=dev).unsqueeze(1)
            ind = ((Z[r0:, act] - low[act]) / width[act]).floor()  # NaN/inf where the width is 0: never in range
            todo = t >= start[act]
            inside = (width[act] > 0) & (ind >= 0) & (ind < bins[act])
            blocked = todo & ~inside
            stop = torch.where(blocked.any(0), blocked.long().argmax(0) + r0, B)  # first blocked row
            run = todo & (t < stop)  # (rows, projections) learnt in this pass; cells below are in time-major order
            if r0 == 0 and len(act) == P:  # the first pass, where nearly every element runs: dense ops
                # elements that do not run get distinct negative keys, so they match nothing
                cell = torch.where(run, act * wide + torch.where(inside, ind, 0).long(), -1 - act - P * t).flatten()
                count = hist.view(-1).take(cell.clamp(min=0)) + _earlier_equal(cell).to(hist.dtype)
                dens = -torch.log((count.view_as(ind) + 1) / ((seen0 + t + bins) * width))
                nld.copy_(torch.where(run, dens, nld))
                hist.view(-1).index_add_(0, cell.clamp(min=0), run.flatten().to(hist.dtype))
            else:  # a few projections after a range extension: only their elements that run
                b, j = run.nonzero(as_tuple=True)
                p, b = act[j], b + r0
                cell = p * wide + ind[b - r0, j].long()
                count = hist.view(-1).index_select(0, cell) + _earlier_equal(cell).to(hist.dtype)
                nld[b, p] = -torch.log((count + 1) / ((seen0[p] + b + bins[p]) * width[p]))
                hist.view(-1).index_add_(0, cell, torch.ones_like(count))
            blocked_at = (stop < B).nonzero().flatten()
            if not len(blocked_at):
                break
            grow, rows = act[blocked_at], stop[blocked_at]
            w = width[grow]
            nld[rows, grow] = torch.where(w > 0, -torch.log(1 / ((seen0[grow] + rows + bins[grow]) * w)), 0.0)
            learnt = [
                _grow(h[:k], lo, wd, v, first=n == 0)
                for h, k, lo, wd, v, n in zip(
                    hist[grow].tolist(),
                    bins[grow].tolist(),
                    low[grow].tolist(),
                    w.tolist(),
                    Z[rows, grow].tolist(),
                    (seen0[grow] + rows).tolist(),
                )
            ]
            hist[grow] = torch.tensor([h + [0.0] * (wide - len(h)) for h, _, _ in learnt], dtype=hist.dtype)
            low[grow] = torch.tensor([lo for _, lo, _ in learnt], dtype=low.dtype)
            width[grow] = torch.tensor([wd for _, _, wd in learnt], dtype=width.dtype)
            start[grow] = rows + 1
            act, r0 = grow, int(rows.min()) + 1
            if r0 == B:
                break
        out = X.new_zeros(B, len(detectors))
        col = 0
        for i, det in enumerate(detectors):
            P_i = det.num_projections
            if score:
                out[:, i] = nld[:, col : col + P_i].mean(-1).float()
            if learn:
                det.hist.copy_(hist[col : col + P_i, : det.bins])
                det.low.copy_(low[col : col + P_i])
                det.width.copy_(width[col : col + P_i])
                det.n += B
            col += P_i
        return out
