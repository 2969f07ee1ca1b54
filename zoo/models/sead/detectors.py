"""Streaming anomaly detectors for the SEAD pool (card §2, §5, §6): plain torch, vectorised over chunks of the stream.

Every detector follows the prequential order of SEAD (card §2.4, §9): ``score(x)`` uses only the points learned
so far, then ``learn(x)`` inserts x. ``score_learn_chunk(X)`` runs that order over an ordered chunk ``(B, d)`` in a
few batched tensor ops: row b is scored by the state that has learnt rows 0..b-1 of the chunk (band masks over the
window, prefix sums and counts within the chunk), so its scores equal ``B`` calls of ``score_learn`` (tested), only
without per-point overhead. Each detector has one implementation, ``_process(X, score, learn)``; the per-point
methods are its chunk of one row. The *entire* state of a detector is registered buffers (windows, counters,
histograms, trees, sums), so ``state_dict`` / safetensors checkpoint and restore a warmed-up detector exactly; the
only Python attributes are constants of the config.

The paper used the PySAD implementations (card §5); these are re-implementations from the algorithms'
descriptions, not ports, and their scores are raw (SEAD's normaliser maps them to [0, 1]).
"""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "DETECTORS",
    "HalfSpaceTrees",
    "LODA",
    "MADScorer",
    "RSHash",
    "RandomScorer",
    "StreamDetector",
    "WindowKNN",
    "build_detector",
    "build_pool",
    "default_pool",
    "paper_pool",
]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


class StreamDetector(nn.Module):
    """Base of the pool: prequential ``score(x)`` then ``learn(x)`` on one point ``x`` of shape ``(dim,)``.

    Subclasses implement ``_score`` and ``_learn`` on a checked float32 row and keep all state in buffers.

    Args:
        dim: width d of the stream's rows.
        seed: seed of the detector's random structure (projections, hashes, trees, random scores).

    Raises:
        ValueError: ``dim < 1``; at ``score``/``learn`` a row of the wrong shape or with NaN/inf (raised before
            any state changes, so the detector stays usable).
    """

    name: str = ""

    def __init__(self, dim: int, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"{type(self).__name__} expects dim >= 1 (the stream's width), got {dim!r}.")
        self.dim = dim
        self._params: dict[str, Any] = {}
        # The seed travels in the state too, so load_state_dict restores seeded behaviour that is still to come
        # (RandomScorer's stream, HalfSpaceTrees' trees) even into a copy built with another seed.
        self.register_buffer("rng_seed", torch.tensor(int(seed), dtype=torch.long))

    @property
    def seed(self) -> int:
        """The detector's seed (read from the ``rng_seed`` buffer, so it follows ``load_state_dict``)."""
        return int(self.rng_seed)

    @property
    def config(self) -> dict[str, Any]:
        """``{"name": ..., "params": {...}}``, JSON-serialisable; ``build_detector(config, dim, seed)`` rebuilds it."""
        return {"name": self.name, "params": dict(self._params)}

    @property
    def max_chunk(self) -> int:
        """Most rows ``_process`` takes at once (bounds its ``(B, window + B, ...)`` work tensors)."""
        return 256

    def _check(self, x: Tensor, where: str, rows: bool = False) -> Tensor:
        shape = f"(B, {self.dim})" if rows else f"({self.dim},)"
        if not isinstance(x, Tensor):
            raise TypeError(
                f"{type(self).__name__}.{where} expects a torch.Tensor of shape {shape}, got {type(x).__name__}."
            )
        if (x.ndim != 2 or x.shape[1] != self.dim) if rows else x.shape != (self.dim,):
            what = "an ordered chunk" if rows else "one point"
            raise ValueError(
                f"{type(self).__name__}.{where} expects {what} of shape {shape}, got {tuple(x.shape)}. "
                "Feed rows with the width the pool was built for."
            )
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            if rows:
                row = int((~finite.all(1)).nonzero()[0])
                where, finite = f"{where} (row {row})", finite[row]
            bad = (~finite).nonzero().flatten().tolist()
            raise ValueError(
                f"{type(self).__name__}.{where} got NaN/inf at features {bad} of a row of width "
                f"{self.dim}. Impute or drop the row first; the detector state was not changed."
            )
        return x.to(dtype=torch.float32, device=self.rng_seed.device)

    def score(self, x: Tensor) -> Tensor:
        """Raw anomaly score of ``x`` (0-d, higher = more anomalous), computed from the state before learning x."""
        return self._process(self._check(x, "score").unsqueeze(0), learn=False)[0]

    def learn(self, x: Tensor) -> None:
        """Insert ``x`` into the detector's state."""
        self._process(self._check(x, "learn").unsqueeze(0), score=False)

    def score_learn(self, x: Tensor) -> Tensor:
        """One prequential step: score ``x``, then learn it; returns the score."""
        return self._process(self._check(x, "score_learn").unsqueeze(0))[0]

    def score_learn_chunk(self, X: Tensor) -> Tensor:
        """Prequential steps over an ordered chunk ``(B, dim)``: the same scores ``(B,)`` as B ``score_learn`` calls.

        Every row is checked before any state changes, so a rejected chunk leaves the detector as it was.
        """
        X = self._check(X, "score_learn_chunk", rows=True)
        step = self.max_chunk
        return torch.cat([self._process(X[i : i + step]) for i in range(0, len(X), step)] or [X.new_zeros(0)])

    def forward(self, x: Tensor) -> Tensor:
        """``score_learn`` for one point ``(dim,)``, ``score_learn_chunk`` for a chunk ``(B, dim)``."""
        return self.score_learn_chunk(x) if isinstance(x, Tensor) and x.ndim == 2 else self.score_learn(x)

    def extra_repr(self) -> str:
        return ", ".join([f"dim={self.dim}", f"seed={self.seed}"] + [f"{k}={v}" for k, v in self._params.items()])

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:  # pragma: no cover - abstract
        """Score each row of ``X (B, d)`` by the state that has learnt the rows before it; then (``learn``) learn all.

        ``B <= max_chunk``. Returns ``(B,)`` (unspecified values where ``score=False``).
        """
        raise NotImplementedError


def _ordered(ring: Tensor, n: Tensor) -> Tensor:
    """A ring buffer's rows oldest first: slots ``n % W, ..., W - 1, 0, ..., n % W - 1`` (unfilled slots lead)."""
    W = ring.shape[0]
    return ring[(n + torch.arange(W, device=ring.device)) % W]


def _write_ring(ring: Tensor, n: Tensor, X: Tensor) -> None:
    """Write rows ``X`` at ring positions ``n, n + 1, ...`` (only the last W rows matter when ``len(X) > W``)."""
    W = ring.shape[0]
    tail = X[-W:]
    ring[(n + len(X) - len(tail) + torch.arange(len(tail), device=ring.device)) % W] = tail


def _band(B: int, W: int, device: torch.device) -> Tensor:
    """``(B, W + B)`` mask: row b of a chunk sees positions ``b .. b + W - 1`` of ``[ordered window; chunk]``."""
    pos = torch.arange(W + B, device=device)
    b = torch.arange(B, device=device).unsqueeze(1)
    return (pos >= b) & (pos < b + W)


def _positive_int(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner} expects {name} to be an int >= {minimum}, got {value!r}.")
    return value


class WindowKNN(StreamDetector):
    """Distance to the k-th nearest neighbour among the last ``window`` points (card §6 pool), on ``dims`` only.

    Args:
        dim: stream width d.
        seed: unused (deterministic), kept for a uniform signature.
        k: neighbour rank, ``1 <= k <= window``. Until k points are stored the score is 0.
        window: ring-buffer length.
        dims: feature indices the distance uses (``None``: all).

    Example:
        >>> det = WindowKNN(dim=2, k=1, window=4)
        >>> _ = det.score_learn(torch.zeros(2))
        >>> det.score(torch.tensor([3.0, 4.0]))
        tensor(5.)
    """

    name = "knn"

    def __init__(self, dim: int, seed: int = 0, k: int = 5, window: int = 256, dims: list[int] | None = None) -> None:
        super().__init__(dim, seed)
        k = _positive_int("WindowKNN", "k", k)
        window = _positive_int("WindowKNN", "window", window, minimum=k)
        if dims is not None:
            dims = [int(i) for i in dims]
            if not dims or len(set(dims)) != len(dims) or min(dims) < 0 or max(dims) >= dim:
                raise ValueError(f"WindowKNN expects dims to be distinct indices in [0, {dim}), got {dims}.")
        self.k, self.window, self.dims = k, window, dims
        self._params = {"k": k, "window": window, "dims": dims}
        width = dim if dims is None else len(dims)
        # NaN marks an empty slot: its distance becomes +inf, so no mask is needed on the hot path.
        self.register_buffer("buf", torch.full((window, width), float("nan")))
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("index", torch.tensor(dims if dims is not None else list(range(dim))), persistent=False)

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        xs = X if self.dims is None else X[:, self.index]
        B, W = len(xs), self.window
        out = xs.new_zeros(B)
        if score:
            history = torch.cat([_ordered(self.buf, self.n), xs])  # (W + B, w): window oldest first, then the chunk
            d = (history.unsqueeze(0) - xs.unsqueeze(1)).pow(2).sum(-1).sqrt()  # (B, W + B)
            d = d.masked_fill(~_band(B, W, xs.device), float("inf")).nan_to_num(nan=float("inf"))
            kth = d.topk(self.k, largest=False, dim=1).values[:, -1]
            seen = self.n + torch.arange(B, device=xs.device)
            out = torch.where(seen >= self.k, kth, torch.zeros_like(kth))
        if learn:
            _write_ring(self.buf, self.n, xs)
            self.n += B
        return out


def _signed(c: int) -> int:
    return c - 2**64 if c >= 2**63 else c


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic on negative values)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _uniform_hash(key: Tensor) -> Tensor:
    """Counter-based U[0, 1) draws: the SplitMix64 finaliser of each int64 ``key``, top 24 bits (float32-exact).

    int64 products wrap modulo 2**64 in torch, which is the arithmetic SplitMix64 needs; a batch of keys is hashed
    in a few tensor ops, so a chunk of the stream gets its random scores without a generator per point.
    """
    z = key + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 40).to(torch.float32) / float(1 << 24)


class RandomScorer(StreamDetector):
    """Uniform(0, 1) scores independent of x (the paper's robustness test, card §4): a pool member to be ignored.

    The score at step t is a counter-based hash of ``(seed, t)`` (SplitMix64), so the state is the counter t alone;
    ``score`` twice without ``learn`` repeats the same value, and a chunk draws all its scores at once.

    Example:
        >>> det = RandomScorer(dim=3, seed=7)
        >>> a = det.score_learn(torch.zeros(3)); b = det.score_learn(torch.zeros(3))
        >>> bool(0 <= a < 1), bool(a != b)
        (True, True)
    """

    name = "random"

    def __init__(self, dim: int, seed: int = 0) -> None:
        super().__init__(dim, seed)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        t = self.n + torch.arange(len(X), device=X.device)
        out = _uniform_hash(self.rng_seed * 1_000_003 + t) if score else X.new_zeros(len(X))
        if learn:
            self.n += len(X)
        return out


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


class HalfSpaceTrees(StreamDetector):
    """Half-Space Trees (Tan, Ting & Liu, 2011): random mid-point trees with reference/latest window masses.

    Trees are complete binary trees in heap order, stored as ``(num_trees, 2**depth - 1)`` split features and
    values and traversed for all trees at once. The work space follows the original: per tree and feature,
    s ~ U(lo, hi) and the range is s ± 2·max(s - lo, hi - s); each node splits a random feature at the mid-point
    of its range. ``(lo, hi)`` is ``feature_range`` if given (the same for every feature), otherwise the per-feature
    min/max of the first ``window`` points, which are buffered, so trees are built when that window completes.
    The first window then becomes the reference mass profile; after that, every ``window`` points the latest
    profile replaces the reference one. Score = -Σ_trees mass(node)·2^level(node) at the first node of the path
    whose reference mass is <= ``size_limit`` (else the leaf), so higher = more anomalous. The default
    ``size_limit=0`` is the leaf rule (a zero-mass node's descendants have zero mass); the original uses
    0.1·window. During the first window the score is constantly 0 (SEAD's normaliser maps a constant to 0.5).

    Args:
        dim: stream width d.
        seed: seed of the trees.
        num_trees: number of trees T.
        depth: tree depth (leaves = 2**depth); keep it small (<= 12).
        window: reference/latest window length.
        size_limit: mass at or below which traversal stops early (see above).
        feature_range: ``(lo, hi)`` used for every feature instead of estimating it from the first window.

    Example:
        >>> det = HalfSpaceTrees(dim=2, num_trees=10, depth=4, window=50)
        >>> for x in torch.randn(100, 2, generator=torch.Generator().manual_seed(0)):
        ...     _ = det.score_learn(x)
        >>> bool(det.score(8 * torch.ones(2)) > det.score(torch.zeros(2)))
        True
    """

    name = "hst"

    def __init__(
        self,
        dim: int,
        seed: int = 0,
        num_trees: int = 25,
        depth: int = 8,
        window: int = 250,
        size_limit: float = 0.0,
        feature_range: list[float] | None = None,
    ) -> None:
        super().__init__(dim, seed)
        T = self.num_trees = _positive_int("HalfSpaceTrees", "num_trees", num_trees)
        self.depth = _positive_int("HalfSpaceTrees", "depth", depth)
        if depth > 16:
            raise ValueError(f"HalfSpaceTrees expects depth <= 16 (2**depth leaves per tree), got {depth}.")
        self.window = _positive_int("HalfSpaceTrees", "window", window)
        if size_limit < 0:
            raise ValueError(f"HalfSpaceTrees expects size_limit >= 0, got {size_limit}.")
        if feature_range is not None:
            feature_range = [float(v) for v in feature_range]
            if len(feature_range) != 2 or not feature_range[0] < feature_range[1]:
                raise ValueError(f"HalfSpaceTrees expects feature_range=(lo, hi) with lo < hi, got {feature_range}.")
        self.size_limit, self.feature_range = float(size_limit), feature_range
        self._params = {
            "num_trees": T,
            "depth": depth,
            "window": window,
            "size_limit": self.size_limit,
            "feature_range": feature_range,
        }
        self.register_buffer("split_dim", torch.zeros(T, 2**depth - 1, dtype=torch.long))
        self.register_buffer("split_val", torch.zeros(T, 2**depth - 1))
        self.register_buffer("ref_mass", torch.zeros(T, 2 ** (depth + 1) - 1))
        self.register_buffer("latest_mass", torch.zeros(T, 2 ** (depth + 1) - 1))
        self.register_buffer("first", torch.zeros(window, dim))  # the first window, kept to size the trees
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("level", torch.arange(depth + 1), persistent=False)

    def _paths(self, X: Tensor) -> Tensor:
        """Node indices visited by each row of ``X (B, d)`` in every tree: ``(B, T, depth + 1)``."""
        B, T = X.shape[0], self.num_trees
        idx = torch.zeros(B, T, dtype=torch.long, device=X.device)
        dims, vals = self.split_dim.expand(B, -1, -1), self.split_val.expand(B, -1, -1)
        path = [idx]
        for _ in range(self.depth):  # a loop over levels; trees and rows are vectorised
            q = dims.gather(2, idx.unsqueeze(-1)).squeeze(-1)
            right = X.gather(1, q) > vals.gather(2, idx.unsqueeze(-1)).squeeze(-1)
            idx = 2 * idx + 1 + right
            path.append(idx)
        return torch.stack(path, -1)

    def _build(self) -> None:
        T, d = self.num_trees, self.dim
        if self.feature_range is None:
            lo, hi = self.first.amin(0), self.first.amax(0)
        else:
            lo, hi = (torch.full((d,), v, device=self.first.device) for v in self.feature_range)
        g = _generator(int(self.rng_seed))
        s = lo + torch.rand(T, d, generator=g).to(lo.device) * (hi - lo)
        wr = 2 * torch.maximum(s - lo, hi - s)
        node_lo, node_hi = (s - wr).unsqueeze(1), (s + wr).unsqueeze(1)  # (T, nodes at this level, d)
        split_dims, split_vals = [], []
        for level in range(self.depth):  # build-time only, once per detector
            q = torch.randint(0, d, (T, 2**level), generator=g).to(lo.device).unsqueeze(-1)
            mid = (node_lo.gather(2, q) + node_hi.gather(2, q)) / 2
            split_dims.append(q.squeeze(-1))
            split_vals.append(mid.squeeze(-1))
            left_hi, right_lo = node_hi.scatter(2, q, mid), node_lo.scatter(2, q, mid)
            # Children of level-local node j are 2j (left, x <= mid) and 2j + 1 (right) on the next level.
            node_lo = torch.stack([node_lo, right_lo], 2).flatten(1, 2)
            node_hi = torch.stack([left_hi, node_hi], 2).flatten(1, 2)
        self.split_dim.copy_(torch.cat(split_dims, 1))
        self.split_val.copy_(torch.cat(split_vals, 1))
        paths = self._paths(self.first).permute(1, 0, 2).flatten(1)  # (T, window * (depth + 1))
        self.ref_mass.zero_().scatter_add_(1, paths, torch.ones_like(paths, dtype=self.ref_mass.dtype))

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        if not learn and len(X) > 1:  # later rows may need a window swap first: run, then put the state back
            saved = {k: v.clone() for k, v in self.state_dict().items()}
            out = self._process(X, score=score)
            self.load_state_dict(saved)
            return out
        out = X.new_zeros(len(X))
        i = 0
        while i < len(X):  # segments end at window boundaries, where the reference profile changes
            n = int(self.n)
            seg = X[i : i + self.window - n % self.window]
            path = self._paths(seg) if n >= self.window else None  # (e, T, depth + 1)
            if score and path is not None:  # before the first window completes there are no trees: score 0
                mass = self.ref_mass.expand(len(seg), -1, -1).gather(2, path)
                stop = torch.where(mass <= self.size_limit, self.level, self.depth).amin(2, keepdim=True)
                out[i : i + len(seg)] = -(mass.gather(2, stop) * torch.pow(2.0, stop)).sum((1, 2))
            if not learn:
                break
            if path is None:
                self.first[n : n + len(seg)] = seg
            else:
                path = path.transpose(0, 1).flatten(1)  # (T, e · (depth + 1))
                self.latest_mass.scatter_add_(1, path, torch.ones_like(path, dtype=self.latest_mass.dtype))
            self.n += len(seg)
            if n + len(seg) == self.window:
                self._build()
            elif n >= self.window and (n + len(seg)) % self.window == 0:  # latest profile becomes the reference
                self.ref_mass.copy_(self.latest_mass)
                self.latest_mass.zero_()
            i += len(seg)
        return out


class MADScorer(StreamDetector):
    """Rule-based detector: robust z-score max_j |x_j - median_j| / (1.4826·MAD_j) over a sliding window.

    1.4826 makes MAD a consistent estimate of σ for Gaussian data, so the score reads as a z-score. The median is
    torch's lower median for an even count; MAD is floored at 1e-6. With an empty window the score is 0.

    Args:
        dim: stream width d.
        seed: unused (deterministic).
        window: sliding-window length.

    Example:
        >>> det = MADScorer(dim=1, window=8)
        >>> for v in [1.0, 2.0, 3.0]:
        ...     _ = det.score_learn(torch.tensor([v]))
        >>> det.score(torch.tensor([5.0]))
        tensor(2.0235)
    """

    name = "mad"

    def __init__(self, dim: int, seed: int = 0, window: int = 256) -> None:
        super().__init__(dim, seed)
        self.window = _positive_int("MADScorer", "window", window)
        self._params = {"window": window}
        self.register_buffer("buf", torch.full((window, dim), float("nan")))  # NaN = empty slot (nanmedian skips)
        self.register_buffer("n", torch.zeros((), dtype=torch.long))

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        B, W = len(X), self.window
        out = X.new_zeros(B)
        if score:
            history = torch.cat([_ordered(self.buf, self.n), X])  # (W + B, d), oldest first
            win = history.unfold(0, W, 1)[:B]  # (B, d, W): the window each row is scored against
            if int(self.n) >= W:  # full windows: the lower median is order statistic (W - 1) // 2
                # numpy's introselect is ~10x faster than torch's median here and picks the same element
                k = (W - 1) // 2
                w = win.cpu().numpy()
                med_np = np.partition(w, k, axis=-1)[..., k]
                mad_np = np.partition(np.abs(w - med_np[..., None]), k, axis=-1)[..., k]
                med, mad = (torch.from_numpy(v).to(X.device) for v in (med_np, mad_np))
            else:  # NaN marks the empty slots of a filling window; nanmedian skips them
                med = win.nanmedian(-1).values
                mad = (win - med.unsqueeze(-1)).abs().nanmedian(-1).values
            z = ((X - med).abs() / (1.4826 * mad).clamp_min(1e-6)).amax(-1)
            seen = self.n + torch.arange(B, device=X.device)
            out = torch.where(seen > 0, z, torch.zeros_like(z))
        if learn:
            _write_ring(self.buf, self.n, X)
            self.n += B
        return out


DETECTORS: dict[str, type[StreamDetector]] = {
    cls.name: cls for cls in (WindowKNN, RandomScorer, LODA, RSHash, HalfSpaceTrees, MADScorer)
}


def build_detector(config: dict[str, Any], dim: int, seed: int = 0) -> StreamDetector:
    """Build one detector from ``{"name": ..., "params": {...}}`` (``params`` optional).

    Raises:
        ValueError: unknown name (with close matches and every known name) or unknown parameter names.

    Example:
        >>> build_detector({"name": "knn", "params": {"k": 3, "window": 64}}, dim=4).config
        {'name': 'knn', 'params': {'k': 3, 'window': 64, 'dims': None}}
    """
    if not isinstance(config, dict) or "name" not in config:
        raise ValueError(f"A detector config is a dict {{'name': ..., 'params': {{...}}}}, got {config!r}.")
    name, params = config["name"], dict(config.get("params") or {})
    if name not in DETECTORS:
        close = difflib.get_close_matches(str(name), DETECTORS, n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown detector {name!r}.{hint} Known detectors: {', '.join(sorted(DETECTORS))}.")
    cls = DETECTORS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "dim", "seed")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"Detector {name!r} got unknown params {unknown}; it accepts {accepted}.")
    return cls(dim, seed, **params)


def build_pool(configs: list[dict[str, Any]], dim: int, seed: int = 0) -> nn.ModuleList:
    """Build the pool; detector i gets seed ``seed + i``.

    Raises:
        ValueError: an empty ``configs`` list, or a bad config (see ``build_detector``).

    Example:
        >>> len(build_pool(default_pool(4), dim=4))
        7
    """
    if not configs:
        raise ValueError("SEAD needs a non-empty pool of detectors, got an empty pool. Try default_pool(dim).")
    return nn.ModuleList([build_detector(c, dim, seed + i) for i, c in enumerate(configs)])


def default_pool(dim: int, num_random: int = 4) -> list[dict[str, Any]]:
    """The card's §6 pool: kNN (k=5, window=256) on the first half of the features, on the second half and on all,
    plus ``num_random`` random scorers. For ``dim=4`` the halves are dims [0, 1] and [2, 3].

    Example:
        >>> [c["params"].get("dims") for c in default_pool(4, num_random=1)]
        [[0, 1], [2, 3], None, None]
    """
    if dim < 2:
        raise ValueError(f"default_pool splits the features in two halves and needs dim >= 2, got {dim}.")
    if num_random < 0:
        raise ValueError(f"default_pool expects num_random >= 0, got {num_random}.")
    half = dim // 2
    knn = [
        {"name": "knn", "params": {"k": 5, "window": 256, "dims": dims}}
        for dims in (list(range(half)), list(range(half, dim)), None)
    ]
    return knn + [{"name": "random", "params": {}} for _ in range(num_random)]


def paper_pool(dim: int) -> list[dict[str, Any]]:
    """The paper's pool shape (card §3, §5 proposal): 3 algorithms × 4 settings + 1 rule = 13 detectors.

    LODA stands in for xStream (both are random-projection density estimators); the settings below are this
    reconstruction's choice (the paper's Table 11 values were not retrieved).

    Example:
        >>> [c["name"] for c in paper_pool(4)].count("hst"), len(paper_pool(4))
        (4, 13)
    """
    if dim < 1:
        raise ValueError(f"paper_pool expects dim >= 1, got {dim}.")
    loda = [(25, 10), (50, 20), (100, 20), (50, 30)]
    rshash = [(25, 128, 2), (50, 256, 4), (100, 256, 4), (50, 512, 6)]
    hst = [(25, 6, 128), (25, 8, 250), (50, 8, 250), (25, 10, 500)]
    return (
        [{"name": "loda", "params": {"num_projections": p, "bins": b}} for p, b in loda]
        + [{"name": "rshash", "params": {"num_components": r, "sample_size": s, "hashes": h}} for r, s, h in rshash]
        + [{"name": "hst", "params": {"num_trees": t, "depth": dp, "window": w}} for t, dp, w in hst]
        + [{"name": "mad", "params": {"window": 256}}]
    )
