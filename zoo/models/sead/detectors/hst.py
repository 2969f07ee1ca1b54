"""Half-Space Trees: random mid-point trees scored by reference-window mass."""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.models.sead.detectors.base import StreamDetector, _generator, _positive_int


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
        self.register_buffer("pow2", 2.0 ** torch.arange(depth + 1), persistent=False)  # 2^level of each node

    def _paths(self, X: Tensor) -> Tensor:
        """Nodes visited by each row of ``X (B, d)`` in every tree, ``(B, depth + 1, T)``, as flat indices into
        ``ref_mass.view(-1)`` (tree t's nodes start at ``t · (2**(depth + 1) - 1)``)."""
        T, internal = self.num_trees, 2**self.depth - 1
        tree = torch.arange(T, device=X.device)
        # node = t · internal + (heap index in tree t), the flat index into split_dim/split_val; a child is
        # 2 · heap + 1 + right, so node -> 2 · node + (1 - t · internal) + right, updated in place level by level.
        node = (tree * internal).expand(len(X), T).clone()
        step = 1 - tree * internal
        dims, vals = self.split_dim.view(-1), self.split_val.view(-1)
        path = [node.clone()]
        for _ in range(self.depth):  # a loop over levels; trees and rows are vectorised
            right = X.gather(1, dims.take(node)) > vals.take(node)
            node.mul_(2).add_(step).add_(right)
            path.append(node.clone())
        # in ref_mass.view(-1), tree t's nodes start at t · 2**(depth + 1) - t: heap index + t · (2**depth)
        return torch.stack(path, 1).add_(tree * 2**self.depth)

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
        paths = self._paths(self.first).flatten()
        self.ref_mass.zero_().view(-1).index_add_(0, paths, torch.ones_like(paths, dtype=self.ref_mass.dtype))

    def _process(self, X: Tensor, score: bool = True, learn: bool = True) -> Tensor:
        if not learn and len(X) > 1:  # later rows may need a window swap first: run, then put the state back
            saved = {k: v.clone() for k, v in self.state_dict().items()}
            out = self._process(X, score=score)
            self.load_state_dict(saved)
            return out
        out = X.new_zeros(len(X))
        paths, i = None, 0  # the trees never change once built: every later row's path is found in one pass
        while i < len(X):  # segments end at window boundaries, where the reference profile changes
            n = int(self.n)
            e = min(self.window - n % self.window, len(X) - i)
            if n >= self.window and paths is None:
                paths, p0 = self._paths(X[i:]), i  # (rows, depth + 1, T)
            path = paths[i - p0 : i - p0 + e] if paths is not None else None
            if score and path is not None:  # before the first window completes there are no trees: score 0
                mass = self.ref_mass.view(-1).take(path)  # (e, depth + 1, T)
                # A node's mass counts the points through it, so masses never grow along a path: the first node
                # at or below size_limit is the count of nodes above it (the leaf if none).
                stop = (mass > self.size_limit).sum(1, keepdim=True).clamp(max=self.depth)
                out[i : i + e] = -(mass.gather(1, stop) * self.pow2.take(stop)).sum((1, 2))
            if not learn:
                break
            if path is None:
                self.first[n : n + e] = X[i : i + e]
            else:
                flat = path.flatten()
                self.latest_mass.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=self.latest_mass.dtype))
            self.n += e
            if n + e == self.window:
                self._build()
            elif n >= self.window and (n + e) % self.window == 0:  # latest profile becomes the reference
                self.ref_mass.copy_(self.latest_mass)
                self.latest_mass.zero_()
            i += e
        return out

    @property
    def max_chunk(self) -> int:
        return max(1, min(2048, 2**21 // (self.num_trees * (self.depth + 1))))  # bounds the (B, depth + 1, T) paths
