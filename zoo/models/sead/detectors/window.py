"""Sliding-window detectors: kNN distance over a window (on all or some features) and the MAD rule."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from zoo.models.sead.detectors.base import StreamDetector, _band, _ordered, _positive_int, _write_ring


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
