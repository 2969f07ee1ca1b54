"""The stand-ins ProDiff is compared with: linear interpolation between the endpoints, and a nearest-prototype
lookup that replaces the diffusion model by the mean shape of the training windows matched to the same prototype."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from zoo.models.prodiff.module import ProDiff

__all__ = ["PrototypeLookup", "linear_interpolation"]


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
