"""Reconstruction R² of a sparse autoencoder, as the RA-SAE paper computes it (official ``r2_score``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["ReconstructionR2"]

_EPS = 1e-6  # official constant, added to the per-entry variance of x


class ReconstructionR2(Metric):
    """R² of a reconstruction with one scalar mean: ``1 - mean((x - x_hat)²) / (mean((x - mean(x))²) + 1e-6)``.

    RA-SAE (Fel et al., ICML 2025, §3) and its official ``overcomplete.metrics.r2_score`` take ``mean(x)`` over
    *all* entries, one scalar, not per column. ``torchmetrics.R2Score`` centres every column on its own mean,
    and averages per-column scores, which gives a different (typically lower) number on activations with large
    per-dimension offsets, so it is not used.

    The states are fixed-size sums: squared error ``Σ(x - x_hat)²``, ``Σx``, ``Σx²`` and the entry count ``n``,
    so the result is exact over batches and under DDP, with ``SST = Σx² - (Σx)² / n``. They are float64 because
    that difference cancels badly in float32 when the mean is large next to the spread (float64 is not
    available on MPS; keep this metric on cpu or cuda there).

    ``update(x_hat, x)`` takes the torchmetrics order (preds, target), both ``(N, d)``.

    Args:
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: ``x_hat`` and ``x`` differ in shape or are not 2-D.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(32, 8, generator=g)
        >>> m = ReconstructionR2()
        >>> m.update(x + 0.1 * torch.randn(32, 8, generator=g), x)
        >>> round(float(m.compute()), 2)
        0.99
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    sum_squared_error: Tensor
    sum_target: Tensor
    sum_squared_target: Tensor
    num_entries: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("sum_squared_error", "sum_target", "sum_squared_target"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_entries", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, x_hat: Tensor, x: Tensor) -> None:
        """Add a batch: reconstruction ``x_hat`` and activations ``x``, both ``(N, d)``."""
        if x_hat.shape != x.shape or x.ndim != 2:
            raise ValueError(
                f"Expected x_hat and x of the same shape (N, d), got {tuple(x_hat.shape)} and {tuple(x.shape)}. "
                "Pass the reconstruction first, then the activations it reconstructs."
            )
        x64 = x.detach().double()
        self.sum_squared_error += (x_hat.detach().double() - x64).square().sum()
        self.sum_target += x64.sum()
        self.sum_squared_target += x64.square().sum()
        self.num_entries += x.numel()

    def compute(self) -> Tensor:
        """R² (float32); 1 is a perfect reconstruction, 0 is as good as predicting the scalar mean of ``x``."""
        n = self.num_entries.double()
        mse = self.sum_squared_error / n
        # Both terms are per-entry means, as in the official code, so eps acts on the variance, not on a sum.
        variance = (self.sum_squared_target - self.sum_target.square() / n) / n
        return (1.0 - mse / (variance.clamp_min(0.0) + _EPS)).float()
