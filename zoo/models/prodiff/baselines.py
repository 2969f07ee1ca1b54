"""What ProDiff is compared with, besides its own ablations: linear interpolation between the endpoints; an MLP
regressor on the endpoints (what a learned imputer reduces to when only the endpoints are observed); a lookup of the
training windows with the nearest endpoints; a shortest path along the synthetic city's streets; and a
nearest-prototype lookup that replaces the diffusion model by the mean shape of the training windows matched to the
same prototype."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.datamodules.street_grid import latlon_to_km

if TYPE_CHECKING:
    from zoo.models.prodiff.module import ProDiff

__all__ = ["EndpointNeighbours", "EndpointRegressor", "PrototypeLookup", "linear_interpolation", "street_path"]


def linear_interpolation(windows: Tensor) -> Tensor:
    """Every channel (hours, latitude, longitude) interpolated linearly in the point index between the endpoints.

    Example:
        >>> linear_interpolation(torch.tensor([[[0.0, 9, 9, 3.0]]])).round(decimals=4)
        tensor([[[0., 1., 2., 3.]]])
    """
    k = windows.shape[-1]
    frac = torch.linspace(0, 1, k, dtype=windows.dtype, device=windows.device)
    return windows[..., :1] + frac * (windows[..., -1:] - windows[..., :1])


class PrototypeLookup:
    """Impute by the matched prototype alone: the linear path plus the mean offset from their own linear paths of
    the training windows whose endpoints match the same prototype (scaled space).

    The match is the trained model's own: the prototype extractor on the window with its interior zeroed, and the
    prototype of highest cosine (the hard version of ProDiff's soft match). What it leaves out is the diffusion
    model, so it is the stand-in for "the prototype, not the denoiser, does the imputing".

    Args:
        model: a trained :class:`~zoo.models.prodiff.ProDiff` with its prototype path (``prototypes=True``).
        train_windows: raw training windows [N, 3, k] the per-prototype offsets are averaged over.
        batch_size: windows per extractor pass.

    Example:
        >>> from zoo.models.prodiff import ProDiff
        >>> model = ProDiff(k=4, ch=16, groups=4, d_model=16, pce_layers=1, pce_heads=2, pce_ff=32, n_prototypes=2)
        >>> train = torch.rand(32, 3, 4).double() * 0.01 + torch.tensor([0.0, 35.68, 139.76]).double()[:, None]
        >>> _ = model.data_min.copy_(train.amin((0, 2))), model.data_max.copy_(train.amax((0, 2)))
        >>> lookup = PrototypeLookup(model.eval(), train)
        >>> out = lookup(train[:3])
        >>> out.shape, bool(torch.equal(out[..., [0, -1]], train[:3, :, [0, -1]]))
        (torch.Size([3, 3, 4]), True)
    """

    def __init__(self, model: ProDiff, train_windows: Tensor, batch_size: int = 4096) -> None:
        if model.pce is None:
            raise ValueError("the prototype lookup needs a model with its prototype path (prototypes=True)")
        self.model, self.batch_size = model, batch_size
        labels, offsets = self._match(train_windows)
        n = model.pce.prototypes.shape[0]
        counts = torch.bincount(labels, minlength=n).clamp_min(1).to(offsets.dtype)
        sums = torch.zeros(n, *offsets.shape[1:], dtype=offsets.dtype).index_add_(0, labels, offsets)
        self.offsets = sums / counts.view(-1, 1, 1)  # [N, 3, k]; zero for a prototype no window matched
        self.counts = torch.bincount(labels, minlength=n)

    @torch.no_grad()
    def _match(self, raw: Tensor) -> tuple[Tensor, Tensor]:
        """Each window's hard-matched prototype and its scaled offset from its linear path."""
        labels, offsets = [], []
        for chunk in raw.split(self.batch_size):
            x0, _ = self.model.scale(chunk.to(self.model.device))
            masked = torch.zeros_like(x0)
            masked[..., 0], masked[..., -1] = x0[..., 0], x0[..., -1]
            prototypes, query = self.model.pce(masked)
            cos = F.normalize(query, dim=-1) @ F.normalize(prototypes, dim=-1).T
            labels.append(cos.argmax(-1).cpu())
            offsets.append((x0 - linear_interpolation(x0)).cpu())
        return torch.cat(labels), torch.cat(offsets)

    @torch.no_grad()
    def __call__(self, windows: Tensor) -> Tensor:
        """Imputed raw windows [B, 3, k] (float64), endpoints equal to the given ones."""
        from zoo.models.prodiff.diffusion import hold_endpoints

        labels, _ = self._match(windows)
        x0, bounds = self.model.scale(windows.to(self.model.device))
        out = self.model.unscale(linear_interpolation(x0) + self.offsets[labels].to(x0), bounds)
        return hold_endpoints(out, windows.to(out))


def _check_windows(windows: Tensor, k: int) -> None:
    """Refuse windows that are not [B, 3, k] (hours, latitude, longitude) or whose endpoints are not finite."""
    if windows.ndim != 3 or windows.shape[1] != 3 or windows.shape[2] != k:
        raise ValueError(f"windows must be [B, 3, {k}] (the training k = {k}), got {list(windows.shape)}")
    if not torch.isfinite(windows[..., [0, -1]]).all():
        raise ValueError("windows: the endpoints hold NaN or infinite values")


def _endpoint_features(windows: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """The two endpoints' (hours, latitude, longitude), min-max scaled per channel: [B, 6]."""
    ends = (windows[..., [0, -1]].double() - lo.view(1, 3, 1)) / (hi - lo).clamp_min(1e-12).view(1, 3, 1)
    return ends.flatten(1)


class EndpointNeighbours:
    """Impute by the training windows whose endpoints are nearest: the linear path plus the mean offset from their own
    linear paths of the ``n_neighbours`` training windows nearest in the endpoints' six numbers (hours, latitude,
    longitude of both ends, min-max scaled with the training windows' ranges). ``n_neighbours=1`` copies one
    neighbour's shape (a sample of a route, not an average of several).

    Args:
        train_windows: raw training windows [N, 3, k].
        n_neighbours: how many neighbours are averaged.

    Example:
        >>> train = torch.tensor([[[0.0, 1, 2], [0.0, 5, 0], [0.0, 0, 0]], [[0.0, 1, 2], [9.0, 9, 9], [9.0, 9, 9]]])
        >>> EndpointNeighbours(train, n_neighbours=1)(torch.tensor([[[0.0, 0, 2], [0.0, 0, 0], [0.0, 0, 1]]]))
        tensor([[[0.0000, 1.0000, 2.0000],
                 [0.0000, 5.0000, 0.0000],
                 [0.0000, 0.5000, 1.0000]]], dtype=torch.float64)
    """

    def __init__(self, train_windows: Tensor, n_neighbours: int = 5) -> None:
        from sklearn.neighbors import NearestNeighbors

        if not 1 <= n_neighbours <= len(train_windows):
            raise ValueError(
                f"n_neighbours must be in [1, {len(train_windows)}] (the training windows), got {n_neighbours}"
            )
        train = train_windows.double()
        self.k = train.shape[-1]
        self.lo, self.hi = train.amin((0, 2)), train.amax((0, 2))
        self.offsets = (train - linear_interpolation(train)).numpy()
        self.index = NearestNeighbors(n_neighbors=n_neighbours).fit(_endpoint_features(train, self.lo, self.hi).numpy())

    def __call__(self, windows: Tensor) -> Tensor:
        """Imputed raw windows [B, 3, k] (float64), endpoints equal to the given ones."""
        _check_windows(windows, self.k)
        raw = windows.double().cpu()
        _, idx = self.index.kneighbors(_endpoint_features(raw, self.lo, self.hi).numpy())
        return linear_interpolation(raw) + torch.from_numpy(self.offsets[idx].mean(1))


def street_path(windows: Tensor, block_km: float = 1.0) -> Tensor:
    """Impute along a shortest path on the synthetic city's street grid (streets every ``block_km``), a map's answer.

    Each endpoint is put on the street it lies nearest (east-west when it is nearer an east-west street than a
    north-south one). Endpoints on perpendicular streets meet at the corner of those two streets; on the same street,
    straight along it; on parallel streets, across the street halfway between (a shortest path, one of several). The
    interior points are spaced along the path by their linearly interpolated times; hours are linear too.

    Example:
        >>> from zoo.datamodules.street_grid import km_to_latlon
        >>> lat, lon = km_to_latlon(np.array([1.0, 0, 0, 2.0]), np.array([3.0, 0, 0, 5.0]))  # (1, 3) to (2, 5) km
        >>> w = torch.tensor(np.stack([[0.0, 0, 0, 3.0], lat, lon]))[None]
        >>> x, y = latlon_to_km(*street_path(w)[0, 1:].numpy())  # along y = 3 to x = 2, then up x = 2
        >>> x.round(3).tolist(), y.round(3).tolist()
        ([1.0, 2.0, 2.0, 2.0], [3.0, 3.0, 4.0, 5.0])
    """
    from zoo.datamodules.street_grid import km_to_latlon, latlon_to_km

    raw = windows.double().cpu().numpy()
    k = raw.shape[-1]
    x, y = latlon_to_km(raw[:, 1, [0, -1]], raw[:, 2, [0, -1]])
    s, e = np.stack([x[:, 0], y[:, 0]], 1) / block_km, np.stack([x[:, 1], y[:, 1]], 1) / block_km
    # along an east-west street: the y coordinate is the one nearest a whole block
    s_ew = np.abs(s[:, 1] - s[:, 1].round()) <= np.abs(s[:, 0] - s[:, 0].round())
    e_ew = np.abs(e[:, 1] - e[:, 1].round()) <= np.abs(e[:, 0] - e[:, 0].round())
    p1, p2 = s.copy(), e.copy()
    corner = s_ew != e_ew  # perpendicular streets: one corner
    p1[corner & s_ew] = np.stack([e[:, 0], s[:, 1]], 1)[corner & s_ew]
    p1[corner & ~s_ew] = np.stack([s[:, 0], e[:, 1]], 1)[corner & ~s_ew]
    p2[corner] = p1[corner]
    both_ew, both_ns = ~corner & s_ew, ~corner & ~s_ew  # parallel (or the same) streets: cross halfway
    mid_x, mid_y = ((s[:, 0] + e[:, 0]) / 2).round(), ((s[:, 1] + e[:, 1]) / 2).round()
    p1[both_ew] = np.stack([mid_x, s[:, 1]], 1)[both_ew]
    p2[both_ew] = np.stack([mid_x, e[:, 1]], 1)[both_ew]
    p1[both_ns] = np.stack([s[:, 0], mid_y], 1)[both_ns]
    p2[both_ns] = np.stack([e[:, 0], mid_y], 1)[both_ns]
    vertices = np.stack([s, p1, p2, e], 1) * block_km  # [B, 4, 2]
    legs = np.linalg.norm(np.diff(vertices, axis=1), axis=-1)  # [B, 3]
    cum = np.concatenate([np.zeros((len(raw), 1)), legs.cumsum(1)], 1)  # [B, 4]
    hours = raw[:, 0]
    span = (hours[:, -1] - hours[:, 0])[:, None]
    frac = np.where(
        span > 0,
        (linear_interpolation(torch.from_numpy(hours)).numpy() - hours[:, :1]) / np.where(span > 0, span, 1),
        np.linspace(0, 1, k),
    )
    arc = frac * cum[:, -1:]  # [B, k]
    leg = np.clip((arc[:, :, None] > cum[:, None, 1:3]).sum(-1), 0, 2)  # which of the 3 legs each point is on
    rows = np.arange(len(raw))[:, None]
    start, length = vertices[rows, leg], legs[rows, leg]
    along = np.where(length > 0, (arc - cum[rows, leg]) / np.where(length > 0, length, 1), 0.0)
    xy = start + along[..., None] * (vertices[rows, leg + 1] - start)
    lat, lon = km_to_latlon(xy[..., 0], xy[..., 1])
    out = torch.from_numpy(np.stack([linear_interpolation(torch.from_numpy(hours)).numpy(), lat, lon], 1))
    out[..., [0, -1]] = torch.from_numpy(raw[..., [0, -1]])
    return out


class EndpointRegressor(nn.Module):
    """An MLP from the two endpoints (six min-max scaled numbers) to the interior's offsets from the linear path,
    trained with an L1 loss (a median: a coverage metric rewards the typical route, not the mean of several). What a
    learned imputer (SAITS, TimesNet, a sequence model) reduces to when only the endpoints are observed, and the
    deterministic counterpart of ProDiff's conditional denoiser.

    Args:
        k: window length.
        width: hidden width; ``depth`` hidden layers.

    Example:
        >>> train = torch.rand(64, 3, 5).double()
        >>> model = EndpointRegressor(k=5, width=16).fit(train, steps=5)
        >>> out = model.impute(train[:2])
        >>> out.shape, bool(torch.equal(out[..., [0, -1]], train[:2, :, [0, -1]]))
        (torch.Size([2, 3, 5]), True)
    """

    def __init__(self, k: int = 6, width: int = 256, depth: int = 3) -> None:
        super().__init__()
        if k < 3 or width < 1 or depth < 1:
            raise ValueError(f"need k >= 3, width >= 1 and depth >= 1, got k={k}, width={width}, depth={depth}")
        self.k = k
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(6 if i == 0 else width, width), nn.SiLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 3 * (k - 2)))
        self.register_buffer("lo", torch.zeros(3, dtype=torch.float64))
        self.register_buffer("hi", torch.ones(3, dtype=torch.float64))

    def forward(self, features: Tensor) -> Tensor:
        """Scaled endpoint features [B, 6] → scaled interior offsets [B, 3, k − 2]."""
        return self.net(features).view(-1, 3, self.k - 2)

    def _scaled_offsets(self, windows: Tensor) -> Tensor:
        unit = (windows.double() - self.lo.view(1, 3, 1)) / (self.hi - self.lo).view(1, 3, 1)
        return (unit - linear_interpolation(unit))[..., 1:-1].float()

    def fit(self, train_windows: Tensor, steps: int = 3000, batch_size: int = 256, lr: float = 1e-3,
            seed: int = 0) -> EndpointRegressor:  # fmt: skip
        """Train on raw windows [N, 3, k] with AdamW and a cosine schedule; returns ``self`` in eval mode."""
        train = train_windows.double()
        self.lo.copy_(train.amin((0, 2)))
        self.hi.copy_(train.amax((0, 2)).clamp_min(self.lo + 1e-12))
        features = _endpoint_features(train, self.lo, self.hi).float()
        targets = self._scaled_offsets(train)
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(self.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        self.train()
        for _ in range(steps):
            idx = torch.randint(len(train), (batch_size,), generator=g)
            loss = (self(features[idx]) - targets[idx]).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        return self.eval()

    @torch.no_grad()
    def impute(self, windows: Tensor) -> Tensor:
        """Imputed raw windows [B, 3, k] (float64), endpoints equal to the given ones."""
        _check_windows(windows, self.k)
        raw = windows.double().cpu()
        unit = (raw - self.lo.view(1, 3, 1)) / (self.hi - self.lo).view(1, 3, 1)
        out = linear_interpolation(unit)
        out[..., 1:-1] += self(_endpoint_features(raw, self.lo, self.hi).float()).double()
        out = out * (self.hi - self.lo).view(1, 3, 1) + self.lo.view(1, 3, 1)
        out[..., [0, -1]] = raw[..., [0, -1]]
        return out
