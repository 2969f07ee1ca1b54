"""Per-detector score normalisation against each detector's own past scores (SEAD, ICML 2025, §2.2).

SEAD turns every raw score into a loss in [0, 1] by comparing it with the same detector's history. The paper keeps
that history in a t-digest; here it is a bounded, sorted, weighted buffer per detector, vectorised over the M
detectors, so one ``(M, capacity)`` tensor holds all sketches and ``state_dict`` checkpoints them.

The sketch: each row keeps up to ``capacity`` sorted values with integer weights (how many raw scores each stands
for). Below ``capacity`` scores the history is exact (all weights 1). When a full row must take one more score it is
compacted: adjacent sorted pairs are merged into one of the two values (alternating which one, so the choice does not
bias the rank in one direction) carrying the pair's total weight; then the new score goes in with weight 1. Memory stays
``O(M · capacity)`` and a compaction moves the rank of any threshold by at most one pair's weight. Measured: after
10 × capacity i.i.d. scores (capacity 1024, normal and exponential streams) the rank error of ``Q(q)`` for
q ∈ {0.01, 0.1, 0.5, 0.9, 0.99} stayed below 0.004 (``tests/models/test_sead_hedge.py`` asserts < 0.01). This is
no worst-case guarantee: an adversarial order, or a drifting stream, can make the pair merges drift further. On the
card's drifting stream (6,000 points, ``zoo reproduce sead``) the 1,024-slot sketch's ``Q(0.99)`` of a kNN detector
was off, at its worst point, by 15–26 % of the exact ``Q(0.99) − Q(0.01)`` range on four seeds of five and by 99 % on
one (late in the stream, where ``Q(0.99)`` falls between the inliers and the anomalies and the compacted values, each
standing for 8 scores, jump from one to the other); SEAD's average precision moved by −0.06 to +0.03 against the
exact history. ``capacity=None`` keeps the exact history (the card's §6 prototype: a sorted buffer that grows,
``O(M · N)`` memory, exact quantiles at every step), the reference the sketch is measured against.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["QuantileNormalizer"]


class QuantileNormalizer(nn.Module):
    """Normalise M detectors' raw scores with per-detector quantile sketches (bounded memory, vectorised).

    Modes (card §2.2):

    * ``"quantile_minmax"`` (default): ``ŝ = clip((s − Q(q_lo)) / (Q(q_hi) − Q(q_lo) + eps), 0, 1)``. A good detector
      (right-skewed scores) then has mean ŝ well below 0.5; a random scorer about 0.5.
    * ``"cdf"`` (ablation): ``ŝ = F̂(s)``, the fraction of stored raw scores ≤ s. In a stationary stream every
      detector's ŝ is then ≈ Uniform(0, 1), whatever its quality, so Hedge cannot tell them apart.

    ŝ is 0.5 (review note) where s is NaN/inf, where the detector has fewer than 2 stored scores, or where its sketch
    is degenerate, ``Q(q_hi) − Q(q_lo) < degenerate_tol`` (a constant detector; ``eps`` alone would give a 0/1 switch).

    Quantiles use linear interpolation between order statistics at rank ``q · (n − 1)`` (numpy's and torch's default
    ``"linear"``), with ranks counted in raw scores through the weights, so below ``capacity`` they equal
    ``torch.quantile`` of the history exactly.

    Order of operations (card §9): call :meth:`normalize` with the sketch *before* the current score, then
    :meth:`insert` it; :meth:`forward` does both in that order.

    Args:
        num_detectors: number of detectors M (rows of the sketch).
        mode: ``"quantile_minmax"`` or ``"cdf"``.
        q_lo: lower quantile of the min–max map, ``0 <= q_lo < q_hi <= 1``.
        q_hi: upper quantile of the min–max map.
        capacity: stored values per detector; even, ``>= 4``. Exact history below it, compacted sketch above.
            ``None``: the exact history, never compacted (the buffer doubles whenever a row would overflow).
        eps: added to the denominator of the min–max map.
        degenerate_tol: ``Q(q_hi) − Q(q_lo)`` below this counts as a degenerate sketch (ŝ = 0.5).

    Attributes:
        values: ``(M, capacity)`` float64, each row sorted ascending, ``+inf`` padding after ``count`` values.
        weight: ``(M, capacity)`` float64, raw scores each stored value stands for (0 on padding).
        count: ``(M,)`` stored values per detector.
        level: ``(M,)`` compactions done per detector (0: the history is exact).

    Raises:
        ValueError: on a bad argument.

    Example:
        >>> norm = QuantileNormalizer(num_detectors=2, q_lo=0.0, q_hi=1.0)
        >>> for v in range(5):
        ...     norm.insert(torch.tensor([float(v), 3.0]))
        >>> norm.quantiles(0.5)
        tensor([2., 3.], dtype=torch.float64)
        >>> norm.normalize(torch.tensor([1.0, 3.0]))  # detector 1 is constant: degenerate -> 0.5
        tensor([0.2500, 0.5000])
    """

    values: Tensor
    weight: Tensor
    count: Tensor
    level: Tensor

    def __init__(
        self,
        num_detectors: int,
        mode: Literal["quantile_minmax", "cdf"] = "quantile_minmax",
        q_lo: float = 0.01,
        q_hi: float = 0.99,
        capacity: int | None = 1024,
        eps: float = 1e-12,
        degenerate_tol: float = 1e-9,
    ) -> None:
        super().__init__()
        if num_detectors < 1:
            raise ValueError(f"Expected `num_detectors` >= 1, got {num_detectors}.")
        if mode not in ("quantile_minmax", "cdf"):
            raise ValueError(f"Expected `mode` to be 'quantile_minmax' or 'cdf', got {mode!r}.")
        if not 0.0 <= q_lo < q_hi <= 1.0:
            raise ValueError(f"Expected 0 <= q_lo < q_hi <= 1, got q_lo={q_lo}, q_hi={q_hi}.")
        if capacity is not None and (capacity < 4 or capacity % 2):
            raise ValueError(
                f"Expected an even `capacity` >= 4 (compaction halves it), or None (exact history), got {capacity}."
            )
        if eps < 0 or degenerate_tol < 0:
            raise ValueError(
                f"Expected eps >= 0 and degenerate_tol >= 0, got eps={eps}, degenerate_tol={degenerate_tol}."
            )
        self.exact = capacity is None  # exact history: grow the buffers instead of compacting them
        capacity = 1024 if capacity is None else capacity  # the exact history's first allocation
        self.num_detectors, self.mode, self.capacity = num_detectors, mode, capacity
        self.chunk = 128  # rows per batched run of forward_chunk (its (M, e, e) tables grow with it)
        self.q_lo, self.q_hi, self.eps, self.degenerate_tol = q_lo, q_hi, eps, degenerate_tol
        # float64: raw scores of very different scales share no buffer, but a long history must not lose ties
        self.register_buffer("values", torch.full((num_detectors, capacity), math.inf, dtype=torch.float64))
        self.register_buffer("weight", torch.zeros(num_detectors, capacity, dtype=torch.float64))
        self.register_buffer("count", torch.zeros(num_detectors, dtype=torch.long))
        self.register_buffer("level", torch.zeros(num_detectors, dtype=torch.long))
        self._register_load_state_dict_pre_hook(self._fit_loaded_history)

    def _reserve(self, size: int) -> None:
        """Exact history: grow every row to at least ``size`` slots (doubling, so n inserts cost O(n) copies)."""
        if size <= self.capacity:
            return
        new = self.capacity
        while new < size:
            new *= 2
        pad = new - self.capacity
        self.values = torch.cat([self.values, self.values.new_full((self.num_detectors, pad), math.inf)], 1)
        self.weight = torch.cat([self.weight, self.weight.new_zeros(self.num_detectors, pad)], 1)
        self.capacity = new

    def _fit_loaded_history(self, state_dict: dict, prefix: str, *args: object) -> None:
        """Exact history: take a checkpoint's buffer width (it grew with the stream) before the shapes are compared."""
        values = state_dict.get(f"{prefix}values")
        if self.exact and isinstance(values, Tensor) and values.ndim == 2 and values.shape[1] != self.capacity:
            self.capacity = int(values.shape[1])
            self.values = self.values.new_full((self.num_detectors, self.capacity), math.inf)
            self.weight = self.weight.new_zeros(self.num_detectors, self.capacity)

    def _check(self, s: Tensor, name: str) -> Tensor:
        if not isinstance(s, Tensor):
            raise TypeError(
                f"QuantileNormalizer.{name} expects a Tensor of shape ({self.num_detectors},), got {type(s).__name__}."
            )
        if s.shape != (self.num_detectors,):
            raise ValueError(
                f"QuantileNormalizer.{name} expects one raw score per detector, shape "
                f"({self.num_detectors},), got {tuple(s.shape)}."
            )
        return s.to(device=self.values.device, dtype=torch.float64)

    @torch.no_grad()
    def quantiles(self, q: float) -> Tensor:
        """Return each detector's estimated ``q``-quantile, ``(M,)`` float64; NaN where nothing is stored.

        Linear interpolation at raw rank ``q · (N − 1)``, ``N`` = raw scores represented (sum of weights).
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"Expected 0 <= q <= 1, got {q}.")
        return self._quantiles([q])[:, 0]

    def _quantiles(self, qs: list[float]) -> Tensor:
        """Quantiles at several levels in one pass over the sketch, ``(M, len(qs))``."""
        cum = self.weight.cumsum(dim=1)  # (M, C): raw rank (exclusive end) of each stored value
        top = (cum[:, -1:] - 1).clamp(min=0)  # (M, 1): highest raw rank
        r = torch.tensor(qs, dtype=cum.dtype, device=cum.device).unsqueeze(0) * top  # (M, Q)
        lo = r.floor()
        hi = torch.minimum(lo + 1, top)
        last = (self.count - 1).clamp(min=0).unsqueeze(1)
        # the stored value holding raw rank x is the first slot whose cumulative weight exceeds x
        j_lo = torch.searchsorted(cum, lo, right=True).clamp(max=last)
        j_hi = torch.searchsorted(cum, hi, right=True).clamp(max=last)
        v_lo, v_hi = self.values.gather(1, j_lo), self.values.gather(1, j_hi)
        out = v_lo + (r - lo) * (v_hi - v_lo)
        return torch.where(self.count.unsqueeze(1) > 0, out, torch.full_like(out, math.nan))

    @torch.no_grad()
    def normalize(self, s: Tensor, clip: bool = True) -> Tensor:
        """Normalise one raw score per detector with the current sketch (it does not insert ``s``).

        Args:
            s: raw scores ``(M,)``; NaN/inf allowed (they map to 0.5).
            clip: clip the min–max value to [0, 1]. Keep it for the Hedge loss; ``clip=False`` gives the unclipped
                value, useful for the emitted score (review note: clipping makes many exact ties at 1, which lowers
                average precision). Ignored in ``"cdf"`` mode, which is in [0, 1] already.

        Returns:
            ``(M,)`` normalised scores, in ``s``'s floating dtype (float32 otherwise).
        """
        out_dtype = s.dtype if isinstance(s, Tensor) and s.is_floating_point() else torch.get_default_dtype()
        x = self._check(s, "normalize")
        lo, hi = self._quantiles([self.q_lo, self.q_hi]).unbind(dim=1)
        ok = torch.isfinite(x) & (self.count >= 2) & ((hi - lo) >= self.degenerate_tol)
        if self.mode == "cdf":
            cum = self.weight.cumsum(dim=1)
            j = torch.searchsorted(self.values, x.nan_to_num(0.0).unsqueeze(1), right=True)  # values <= s
            below = torch.where(j > 0, cum.gather(1, (j - 1).clamp(min=0)), torch.zeros_like(j, dtype=cum.dtype))
            out = below.squeeze(1) / cum[:, -1].clamp(min=1.0)
        else:
            out = (x - lo) / (hi - lo + self.eps)
            if clip:
                out = out.clamp(0.0, 1.0)
        return torch.where(ok, out, torch.full_like(out, 0.5)).to(out_dtype)

    @torch.no_grad()
    def insert(self, s: Tensor) -> None:
        """Insert each finite ``s_i`` into detector i's sketch, keeping rows sorted; NaN/inf are skipped.

        Args:
            s: raw scores ``(M,)``.
        """
        x = self._check(s, "insert")
        take = torch.isfinite(x)
        if not bool(take.any()):
            return
        if self.exact:
            self._reserve(int(self.count.max()) + 1)
        full = take & (self.count == self.capacity)
        if bool(full.any()):
            self._compact(full)
        # shift-insert: slot j keeps its value left of the insertion point, takes s at it, the left neighbour after it
        pos = torch.searchsorted(self.values, x.nan_to_num(0.0).unsqueeze(1), right=True)  # (M, 1)
        j = torch.arange(self.capacity, device=x.device).unsqueeze(0)
        shifted_v, shifted_w = self.values.roll(1, dims=1), self.weight.roll(1, dims=1)
        new_v = torch.where(j < pos, self.values, torch.where(j == pos, x.unsqueeze(1), shifted_v))
        new_w = torch.where(j < pos, self.weight, torch.where(j == pos, torch.ones_like(self.weight), shifted_w))
        rows = take.unsqueeze(1)
        self.values.copy_(torch.where(rows, new_v, self.values))
        self.weight.copy_(torch.where(rows, new_w, self.weight))
        self.count.add_(take.long())

    def _compact(self, rows: Tensor) -> None:
        """Halve the full ``rows``: merge sorted pairs (2i, 2i+1) into one value carrying both weights."""
        half = self.capacity // 2
        pairs_v = self.values.view(self.num_detectors, half, 2)
        pairs_w = self.weight.view(self.num_detectors, half, 2)
        # alternate the kept member (lower on even levels, upper on odd) so the rank shifts cancel over compactions
        keep = (self.level % 2).view(-1, 1, 1).expand(-1, half, 1)
        kept_v = pairs_v.gather(2, keep).squeeze(2)
        kept_w = pairs_w.sum(dim=2)
        pad_v = torch.full_like(kept_v, math.inf)
        new_v = torch.cat([kept_v, pad_v], dim=1)
        new_w = torch.cat([kept_w, torch.zeros_like(kept_w)], dim=1)
        r = rows.unsqueeze(1)
        self.values.copy_(torch.where(r, new_v, self.values))
        self.weight.copy_(torch.where(r, new_w, self.weight))
        self.count.copy_(torch.where(rows, torch.full_like(self.count, half), self.count))
        self.level.add_(rows.long())

    @torch.no_grad()
    def forward_chunk(self, S: Tensor, clip: bool = True) -> Tensor:
        """Normalise an ordered chunk of raw scores ``(B, M)``, each row with the sketch before it, inserting each row.

        The same values as ``B`` calls of :meth:`forward`, in a few batched ops per run of up to 128 rows (a row that
        meets a full sketch goes through :meth:`forward`, which compacts it).

        Returns:
            ``(B, M)`` normalised scores, in ``S``'s floating dtype (float32 otherwise).
        """
        if not isinstance(S, Tensor) or S.ndim != 2 or S.shape[1] != self.num_detectors:
            got = tuple(S.shape) if isinstance(S, Tensor) else type(S).__name__
            raise ValueError(
                f"QuantileNormalizer.forward_chunk expects raw scores of shape (B, {self.num_detectors}), got {got}."
            )
        out_dtype = S.dtype if S.is_floating_point() else torch.get_default_dtype()
        X = S.to(device=self.values.device, dtype=torch.float64)
        if self.exact:
            self._reserve(int(self.count.max()) + len(X))  # no row meets a full buffer: every run is batched
        outs, i = [], 0
        while i < len(X):
            rows = X[i : i + self.chunk]
            fin = torch.isfinite(rows).long()
            full = (fin > 0) & (self.count + fin.cumsum(0) - fin >= self.capacity)
            e = int(full.any(1).long().argmax()) if bool(full.any()) else len(rows)
            if e == 0:
                outs.append(self.forward(rows[0], clip=clip).unsqueeze(0))
                i += 1
            else:
                outs.append(self._run(rows[:e], clip))
                i += e
        return torch.cat(outs).to(out_dtype) if outs else X.new_zeros(0, self.num_detectors).to(out_dtype)

    def _run(self, R: Tensor, clip: bool) -> Tensor:
        """Normalise then insert ``R (e, M)`` float64, no compaction needed: row b sees the sketch plus rows < b.

        All rows share one stable sort of the sketch ∪ chunk per detector. Row b's quantile at raw rank x is the first
        sorted position whose weight up to it (sketch weights + the rows before b at or below it) exceeds x; the
        chunk moves ranks by at most b, so a binary search over the 2e + 1 positions after the one where the sketch
        weight alone first exceeds x − b finds it, for every row and quantile at once, with each step's earlier-row
        counts read off one ``(M, e, e + 1)`` table.
        """
        e, (M, C) = len(R), self.values.shape
        dev = R.device
        fin = torch.isfinite(R).T  # (M, e)
        union = torch.cat([self.values, torch.where(fin, R.T, torch.full_like(R.T, math.inf))], 1)  # (M, L)
        sorted_v, order = union.sort(dim=1, stable=True)  # stable: ties keep sketch first, then time order
        L = C + e
        chunk_id = torch.cat([torch.full((M, C), -1, device=dev), torch.arange(e, device=dev).expand(M, e)], 1)
        chunk_id = chunk_id.gather(1, order)  # (M, L): which chunk row sits at each sorted position (-1: sketch)
        chunk_id = torch.where(
            torch.cat([torch.zeros(M, C, dtype=torch.bool, device=dev), fin], 1).gather(1, order), chunk_id, -1
        )
        base = torch.cat([self.weight, torch.zeros(M, e, dtype=self.weight.dtype, device=dev)], 1).gather(1, order)
        cum = base.cumsum(1)  # (M, L): sketch weight up to and including each position
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(L, device=dev).expand(M, L))
        pos = torch.where(fin, rank[:, C:], L)  # (M, e): sorted position of each finite chunk row
        b = torch.arange(e, device=dev)
        earlier = b.view(1, 1, e) < b.view(1, e, 1)  # (1, e_row, e_j): row j is learnt before row b
        n_before = fin.long().cumsum(1) - fin.long()  # (M, e): finite chunk rows before row b
        total = cum[:, -1:] + n_before  # raw scores represented for row b
        count = self.count.unsqueeze(1) + n_before
        # Row b's weight up to sorted position p: cum[p] plus its earlier rows at positions <= p, read off a table
        # over the chunk's positions in sorted order: seen[m, b, k] = earlier rows of b among the k lowest.
        pos_sorted, by_pos = pos.contiguous().sort(1)
        seen = (by_pos.unsqueeze(1) < b.view(1, e, 1)).long().cumsum(2)
        seen = torch.cat([seen.new_zeros(M, e, 1), seen], 2)  # (M, e, e + 1)

        def value_at(x: Tensor) -> Tensor:  # x: (M, e, Q) raw ranks -> values
            # Binary search for the first p whose weight for row b exceeds x. Earlier rows add at most b, so p lies
            # between where cum alone first exceeds x - b and where it first exceeds x (at most 2e + 1 positions).
            Q = x.shape[2]
            lo = torch.searchsorted(cum, (x - b.view(1, e, 1)).flatten(1), right=True).clamp(max=L - 1)
            hi = torch.searchsorted(cum, x.flatten(1), right=True).clamp(max=L - 1)
            x = x.flatten(1)
            for _ in range(int((hi - lo).max()).bit_length() if lo.numel() else 0):
                mid = (lo + hi) // 2
                k = torch.searchsorted(pos_sorted, mid, right=True).view(M, e, Q)  # chunk positions <= mid
                above = cum.gather(1, mid) + seen.gather(2, k).flatten(1) > x
                hi = torch.where(above, mid, hi)
                lo = torch.where(above, lo, mid + 1)
            return sorted_v.gather(1, hi).view(M, e, Q)

        qs = torch.tensor([self.q_lo, self.q_hi], dtype=torch.float64, device=dev)
        top = (total - 1).clamp(min=0).unsqueeze(-1)
        r = qs * top
        lo_r = r.floor()
        hi_r = torch.minimum(lo_r + 1, top)
        v_lo, v_hi = value_at(torch.cat([lo_r, hi_r], -1)).chunk(2, -1)
        quant = v_lo + (r - lo_r) * (v_hi - v_lo)
        lo, hi = quant.unbind(-1)  # (M, e)
        x = R.T
        ok = fin & (count >= 2) & ((hi - lo) >= self.degenerate_tol)
        if self.mode == "cdf":
            at = torch.searchsorted(
                sorted_v, x.nan_to_num(0.0).contiguous(), right=True
            )  # union positions with value <= s
            below = torch.where(at > 0, cum.gather(1, (at - 1).clamp(min=0)), torch.zeros_like(x))
            below = below + ((pos.unsqueeze(1) < at.unsqueeze(-1)) & earlier).sum(-1)
            out = below / total.clamp(min=1.0)
        else:
            out = (x - lo) / (hi - lo + self.eps)
            if clip:
                out = out.clamp(0.0, 1.0)
        out = torch.where(ok, out, torch.full_like(out, 0.5)).T
        # insert every finite row: the sorted union with all its weights, whose finite values all fit in C slots
        weight = base + (chunk_id >= 0).to(base.dtype)
        self.values.copy_(sorted_v[:, :C])
        self.weight.copy_(weight[:, :C])
        self.count.add_(fin.long().sum(1))
        return out

    def forward(self, s: Tensor, clip: bool = True) -> Tensor:
        """Normalise ``s`` with the sketch before it, then insert it (the card's order). Returns ``(M,)``."""
        out = self.normalize(s, clip=clip)
        self.insert(s)
        return out

    def extra_repr(self) -> str:
        return (
            f"num_detectors={self.num_detectors}, mode={self.mode!r}, q=({self.q_lo}, {self.q_hi}), "
            f"capacity={'exact' if self.exact else self.capacity}"
        )
