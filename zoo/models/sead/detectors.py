"""Streaming anomaly detectors for the SEAD pool (card §2, §5, §6): plain torch, one point at a time.

Every detector follows the prequential order of SEAD (card §2.4, §9): ``score(x)`` uses only the points learned
so far, then ``learn(x)`` inserts x. The *entire* state of a detector is registered buffers (windows, counters,
histograms, trees, sketches), so ``state_dict`` / safetensors checkpoint and restore a warmed-up detector exactly;
the only Python attributes are constants of the config. Each detector is vectorised over its window, projections,
components or trees (only HalfSpaceTrees loops over the ``depth`` levels of a traversal).

The paper used the PySAD implementations (card §5); these are re-implementations from the algorithms'
descriptions, not ports, and their scores are raw (SEAD's normaliser maps them to [0, 1]).
"""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Any

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

    def _check(self, x: Tensor, where: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(
                f"{type(self).__name__}.{where} expects a torch.Tensor of shape ({self.dim},), got {type(x).__name__}."
            )
        if x.shape != (self.dim,):
            raise ValueError(
                f"{type(self).__name__}.{where} expects one point of shape ({self.dim},), got "
                f"{tuple(x.shape)}. Feed rows one at a time, with the width the pool was built for."
            )
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            bad = (~finite).nonzero().flatten().tolist()
            raise ValueError(
                f"{type(self).__name__}.{where} got NaN/inf at features {bad} of a row of width "
                f"{self.dim}. Impute or drop the row first; the detector state was not changed."
            )
        return x.to(dtype=torch.float32, device=self.rng_seed.device)

    def score(self, x: Tensor) -> Tensor:
        """Raw anomaly score of ``x`` (0-d, higher = more anomalous), computed from the state before learning x."""
        return self._score(self._check(x, "score"))

    def learn(self, x: Tensor) -> None:
        """Insert ``x`` into the detector's state."""
        self._learn(self._check(x, "learn"))

    def score_learn(self, x: Tensor) -> Tensor:
        """One prequential step: score ``x``, then learn it; returns the score."""
        x = self._check(x, "score_learn")
        s = self._score(x)
        self._learn(x)
        return s

    def forward(self, x: Tensor) -> Tensor:
        """Same as ``score_learn``."""
        return self.score_learn(x)

    def extra_repr(self) -> str:
        return ", ".join([f"dim={self.dim}", f"seed={self.seed}"] + [f"{k}={v}" for k, v in self._params.items()])

    def _score(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _learn(self, x: Tensor) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


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

    def _score(self, x: Tensor) -> Tensor:
        xs = x if self.dims is None else x[self.index]
        d = (self.buf - xs).pow(2).sum(-1).sqrt().nan_to_num(nan=float("inf"))
        kth = d.topk(self.k, largest=False).values[-1]
        return torch.where(self.n >= self.k, kth, torch.zeros_like(kth))

    def _learn(self, x: Tensor) -> None:
        self.buf[self.n % self.window] = x if self.dims is None else x[self.index]
        self.n += 1


class RandomScorer(StreamDetector):
    """Uniform(0, 1) scores independent of x (the paper's robustness test, card §4): a pool member to be ignored.

    The score at step t comes from a generator seeded with ``seed * 1_000_003 + t``, so the state is the counter t
    alone; ``score`` twice without ``learn`` repeats the same value.

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

    def _score(self, x: Tensor) -> Tensor:
        g = _generator(int(self.rng_seed) * 1_000_003 + int(self.n))
        return torch.rand((), generator=g).to(self.n.device)

    def _learn(self, x: Tensor) -> None:
        self.n += 1


class LODA(StreamDetector):
    """LODA (Pevný, 2016): sparse random projections, one histogram each over a sliding window.

    Score = -mean over projections of log density, density = (count + 1) / (n + bins) / bin width (Laplace
    smoothing), with ``bins`` equal-width bins spanning the window's projected range (recomputed per point,
    vectorised; a point outside that range gets count 0). Each projection has round(√d) non-zero N(0, 1) weights.

    Args:
        dim: stream width d.
        seed: seed of the projections.
        num_projections: number of projections (histograms).
        bins: bins per histogram.
        window: sliding-window length. With an empty window the score is 0.

    Example:
        >>> det = LODA(dim=4, num_projections=8, bins=5, window=32)
        >>> for x in torch.randn(32, 4, generator=torch.Generator().manual_seed(0)):
        ...     _ = det.score_learn(x)
        >>> bool(det.score(8 * torch.ones(4)) > det.score(torch.zeros(4)))
        True
    """

    name = "loda"

    def __init__(self, dim: int, seed: int = 0, num_projections: int = 50, bins: int = 20, window: int = 256) -> None:
        super().__init__(dim, seed)
        self.num_projections = _positive_int("LODA", "num_projections", num_projections)
        self.bins = _positive_int("LODA", "bins", bins)
        self.window = _positive_int("LODA", "window", window)
        self._params = {"num_projections": num_projections, "bins": bins, "window": window}
        g = _generator(seed)
        nnz = max(1, round(math.sqrt(dim)))
        keep = torch.rand(num_projections, dim, generator=g).argsort(1) < nnz  # nnz random features per row
        W = torch.randn(num_projections, dim, generator=g) * keep
        self.register_buffer("W", W)
        self.register_buffer("proj", torch.zeros(window, num_projections))  # ring buffer of projected points
        self.register_buffer("n", torch.zeros((), dtype=torch.long))
        self.register_buffer("slot", torch.arange(window), persistent=False)

    def _score(self, x: Tensor) -> Tensor:
        z = self.W @ x  # (P,)
        valid = (self.slot < self.n).unsqueeze(1)  # (window, 1)
        lo = torch.where(valid, self.proj, float("inf")).amin(0)
        hi = torch.where(valid, self.proj, float("-inf")).amax(0)
        width = ((hi - lo) / self.bins).clamp_min(1e-6)
        b_win = ((self.proj - lo) / width).floor().clamp(max=self.bins - 1)
        b_x = ((z - lo) / width).floor().clamp(max=self.bins - 1)
        inside = (z >= lo) & (z <= hi)
        count = ((b_win == b_x) & valid).sum(0) * inside
        m = valid.sum()
        p = (count + 1) / (m + self.bins)
        s = (width.log() - p.log()).mean()
        return torch.where(m > 0, s, torch.zeros_like(s))

    def _learn(self, x: Tensor) -> None:
        self.proj[self.n % self.window] = self.W @ x
        self.n += 1


class RSHash(StreamDetector):
    """RS-Hash (Sathe & Aggarwal, 2016): random subspace grids counted in count-min sketches over a sliding window.

    Each component r draws a cell width f_r ~ U(1/√s, 1 - 1/√s) (s = ``sample_size``), a random subspace of
    features (the original's size rule, clipped to [1, d]) and shifts α ~ U(0, f_r). A point is standardised with
    running mean/std (the original min-max scales by an initial sample; a running standardisation needs no
    warm-up), mapped to u = z / 4 + 1/2, and its cell ⌊(u + α) / f_r⌋ on the subspace is hashed by ``hashes``
    hash functions into tables of ``table_size`` counters. Inserted table slots are kept in a ring buffer so the
    point leaving the window is decremented exactly, even though the standardisation moved meanwhile.
    Score = -mean over components of log(1 + min over hashes of the count).

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
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("m2", torch.zeros(dim))

    def _slots(self, x: Tensor) -> Tensor:
        std = (self.m2 / (self.n - 1).clamp_min(1)).sqrt()
        std = torch.where(self.n >= 2, std.clamp_min(1e-6), torch.ones_like(std))
        u = (x - self.mean) / (4.0 * std) + 0.5
        cell = ((u + self.alpha) / self.f).floor().clamp(-(2**20), 2**20).long() * self.mask  # (R, d)
        h = torch.remainder((cell * self.A).sum(-1) + self.B, self.table_size)  # (H, R); |product| < 2**52
        return (h + self.offset).flatten()

    def _score(self, x: Tensor) -> Tensor:
        c = self.counts[self._slots(x)].view(self.hashes, self.num_components).amin(0)
        return -torch.log1p(c).mean()

    def _learn(self, x: Tensor) -> None:
        slots = self._slots(x)
        pos = self.n % self.sample_size
        # The slot leaving the window is decremented only once the window is full (weight 0 before that).
        leaving = (self.n >= self.sample_size).float().neg().expand(slots.numel())
        self.counts.index_add_(0, self.ring[pos], leaving)
        self.counts.index_add_(0, slots, torch.ones_like(leaving))
        self.ring[pos] = slots
        # Welford update of the running standardisation, after x was hashed with the old one (as in score).
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)


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

    def _score(self, x: Tensor) -> Tensor:
        path = self._paths(x.unsqueeze(0))[0]  # (T, depth + 1)
        mass = self.ref_mass.gather(1, path)
        stop = torch.where(mass <= self.size_limit, self.level, self.depth).amin(1, keepdim=True)
        return -(mass.gather(1, stop) * torch.pow(2.0, stop)).sum()

    def _learn(self, x: Tensor) -> None:
        n = int(self.n)
        if n < self.window:
            self.first[n] = x
            self.n += 1
            if n + 1 == self.window:
                self._build()
            return
        path = self._paths(x.unsqueeze(0))[0]
        self.latest_mass.scatter_add_(1, path, torch.ones_like(path, dtype=self.latest_mass.dtype))
        self.n += 1
        if (n + 1) % self.window == 0:  # window boundary: latest profile becomes the reference
            self.ref_mass.copy_(self.latest_mass)
            self.latest_mass.zero_()


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

    def _score(self, x: Tensor) -> Tensor:
        med = self.buf.nanmedian(0).values
        mad = (self.buf - med).abs().nanmedian(0).values
        z = ((x - med).abs() / (1.4826 * mad).clamp_min(1e-6)).amax()
        return torch.where(self.n > 0, z, torch.zeros_like(z))

    def _learn(self, x: Tensor) -> None:
        self.buf[self.n % self.window] = x
        self.n += 1


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
    loda = [(25, 10, 128), (50, 20, 256), (100, 20, 256), (50, 30, 512)]
    rshash = [(25, 128, 2), (50, 256, 4), (100, 256, 4), (50, 512, 6)]
    hst = [(25, 6, 128), (25, 8, 250), (50, 8, 250), (25, 10, 500)]
    return (
        [{"name": "loda", "params": {"num_projections": p, "bins": b, "window": w}} for p, b, w in loda]
        + [{"name": "rshash", "params": {"num_components": r, "sample_size": s, "hashes": h}} for r, s, h in rshash]
        + [{"name": "hst", "params": {"num_trees": t, "depth": dp, "window": w}} for t, dp, w in hst]
        + [{"name": "mad", "params": {"window": 256}}]
    )
