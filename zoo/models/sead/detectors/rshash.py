"""RS-Hash: random subspace grids counted in count-min sketches over a sliding window."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zoo.models.sead.detectors.base import StreamDetector, _generator, _positive_int


class RSHash(StreamDetector):
    """RS-Hash (Sathe & Aggarwal, 2016): random subspace grids counted in count-min sketches over a sliding window.

    Each component r draws a cell width f_r ~ U(1/√s, 1 - 1/√s) (s = ``sample_size``), a random subspace of
    features (the original's size rule, clipped to [1, d]) and shifts α ~ U(0, f_r). A point is standardised with
    the running mean/std of the points learnt before it (the original min-max scales by an initial sample; a running
    standardisation needs no warm-up; sums are kept in float64 around the first point, so the variance does not
    cancel), mapped to u = z / 4 + 1/2, and its cell ⌊(u + α) / f_r⌋ on the subspace is hashed by ``hashes`` hash
    functions into tables of ``table_size`` counters. Inserted table slots are kept in a ring buffer so the point
    leaving the window is decremented exactly, even though the standardisation moved meanwhile.
    Score = -mean over components of log(1 + min over hashes of the count).

    Chunks (at most ``sample_size`` rows): each row's counts are the stored counts plus the chunk's earlier inserts
    minus its earlier departures, read off one sort of the chunk's (slot, time) events.

    Args:
        dim: stream width d.
        seed: seed of subspaces, shifts and hashes.
        num_components: number of random grids R.
        sample_size: sliding-window length s.
        hashes: count-min rows per component.
        table_size: counters per count-min row.

    Example:
        >>> det = RSHash(dim=4, num_components=8, sample_size=64)
        >>> for x in torch.randn(64, 4, generator=torch.Generator().manual_seed(0)):
        ...     _ = det.score_learn(x)
        >>> bool(det.score(8 * torch.ones(4)) > det.score(torch.zeros(4)))
        True
    """

    name = "rshash"

    def __init__(
        self,
        dim: int,
        seed: int = 0,
        num_components: int = 50,
        sample_size: int = 256,
        hashes: int = 4,
        table_size: int = 1024,
    ) -> None:
        super().__init__(dim, seed)
        R = self.num_components = _positive_int("RSHash", "num_components", num_components)
        self.sample_size = _positive_int("RSHash", "sample_size", sample_size, minimum=2)
        H = self.hashes = _positive_int("RSHash", "hashes", hashes)
        self.table_size = _positive_int("RSHash", "table_size", table_size)
        self._params = {"num_components": R, "sample_size": sample_size, "hashes": H, "table_size": table_size}
        g = _generator(seed)
        lo_f = 1.0 / math.sqrt(sample_size)
        f = lo_f + torch.rand(R, generator=g) * (1.0 - 2.0 * lo_f)
        # Original subspace size: r ~ U-int[1 + 0.5 log_b s, log_b s] with b = max(2, 1/f).
        log_s = math.log(sample_size) / torch.log(torch.clamp(1.0 / f, min=2.0))
        r = (1 + 0.5 * log_s + torch.rand(R, generator=g) * (0.5 * log_s)).floor().clamp(1, dim)
        mask = torch.rand(R, dim, generator=g).argsort(1).argsort(1) < r.unsqueeze(1)
        self.register_buffer("f", f.unsqueeze(1))  # (R, 1)
        self.register_buffer("alpha", torch.rand(R, dim, generator=g) * f.unsqueeze(1))
        self.register_buffer("mask", mask)
        self.register_buffer("A", torch.randint(1, 2**31 - 1, (H, R, dim), generator=g))
        self.register_buffer("B", torch.randint(0, 2**31 - 1, (H, R), generator=g))
        # Flat offset of table (r, h) in `counts`, so one index_add_ updates every table.
        self.register_buffer(
            "offset", (torch.arange(R).unsqueeze(0) * H + torch.arange(H).unsqueeze(1)) * table_size, persistent=False
        )
        self.register_buffer("counts", torch.zeros(R * H * table_size))
        self.register_buffer("ring", torch.zeros(sample_size, H * R, dtype=torch.long))
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("shift", torch.zeros(dim, dtype=torch.float64))  # the first point: sums are around it
        self.register_buffer("s1", torch.zeros(dim, dtype=torch.float64))  # Σ (x - shift)
        self.register_buffer("s2", torch.zeros(dim, dtype=torch.float64))  # Σ (x - shift)²

    @property
    def max_chunk(self) -> int:
        return min(256, self.sample_size)  # departures must come from the ring as it was before the chunk

    def _slots(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Table slots ``(B, hashes · R)`` of each row under the standardisation before it; the sums after the chunk."""
        B = len(X)
        X = X.double()
        shift = torch.where(self.n > 0, self.shift, X[0])
        dx = X - shift
        s1 = torch.cat([self.s1.unsqueeze(0), dx]).cumsum(0)  # (B + 1, d): sums before each row, then after all
        s2 = torch.cat([self.s2.unsqueeze(0), dx * dx]).cumsum(0)
        cnt = (self.n + torch.arange(B, device=X.device)).unsqueeze(1).double()
        mean = s1[:-1] / cnt.clamp_min(1)
        std = ((s2[:-1] - s1[:-1] * mean) / (cnt - 1).clamp_min(1)).clamp_min(0).sqrt()
        std = torch.where(cnt >= 2, std.clamp_min(1e-6), torch.ones_like(std))
        u = torch.where(cnt > 0, dx - mean, X) / (4.0 * std) + 0.5
        cell = ((u.unsqueeze(1) + self.alpha) / self.f).floor().clamp(-(2**20), 2**20).long() * self.mask  # (B, R, d)
        h = torch.remainder((cell.unsqueeze(1) * self.A).sum(-1) + self.B, self.table_size)  # (B, H, R); < 2**52
        return (h + self.offset).flatten(1), shift, s1[-1], s2[-1]

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        B = len(X)
        slots, shift, s1, s2 = self._slots(X)
        step = self.n + torch.arange(B, device=X.device)
        pos = step % self.sample_size
        leaving = self.ring[pos]  # (B, K): slots of the points that leave the window as row b is learnt
        full = step >= self.sample_size  # before the window is full nothing leaves
        out = X.new_zeros(B)
        if score:
            # Events (slot, time, ±1): the departure of step j sorts before the insert of step j, so within a slot's
            # group of the sorted events, the sum before a row's own insert is the chunk's earlier effect on that
            # counter. One sort, prefix sums and a group-start cummax; no per-row search.
            j = torch.arange(B, device=X.device).unsqueeze(1)
            keys = torch.cat([(slots * (2 * B) + 2 * j + 1).flatten(), (leaving * (2 * B) + 2 * j).flatten()])
            if len(self.counts) * 2 * B < 2**31:
                keys = keys.int()  # a 32-bit sort is faster
            vals = torch.cat(
                [
                    torch.ones(slots.numel(), dtype=torch.long, device=X.device),
                    (-full.long()).repeat_interleave(slots.shape[1]),
                ]
            )
            sorted_keys, order = keys.sort()
            v = vals.index_select(0, order)
            before = v.cumsum(0) - v
            group = sorted_keys // (2 * B)
            idx = torch.arange(len(v), device=X.device)
            new = torch.ones_like(group, dtype=torch.bool)
            new[1:] = group[1:] != group[:-1]
            start = torch.where(new, idx, torch.zeros_like(idx)).cummax(0).values
            earlier = torch.empty_like(before).index_copy_(0, order, before - before.index_select(0, start))
            c = self.counts.index_select(0, slots.flatten()) + earlier[: slots.numel()].to(self.counts.dtype)
            c = c.view(B, self.hashes, self.num_components).amin(1)
            out = -torch.log1p(c).mean(-1)
        if learn:
            self.counts.index_add_(
                0, leaving[full].flatten(), self.counts.new_full((int(full.sum()) * leaving.shape[1],), -1.0)
            )
            self.counts.index_add_(0, slots.flatten(), self.counts.new_ones(slots.numel()))
            self.ring[pos] = slots
            self.shift.copy_(shift)
            self.s1.copy_(s1)
            self.s2.copy_(s2)
            self.n += B
        return out
