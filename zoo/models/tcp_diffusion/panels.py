"""Forecast panels: the last observed frame, then truth and forecasts of each lead time, case by case."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["forecast_panels"]


def forecast_panels(past: Tensor, truth: Tensor, forecasts: Tensor | Mapping[str, Tensor], title: str = "",
                    hours_per_frame: int = 3) -> Figure:  # fmt: skip
    """A matplotlib figure: for each case (rows, at most 4), the last observed frame, then for each lead time the
    truth and each forecast (``forecasts``: one tensor or ``{name: tensor}``), all ``(N, T, H, W)`` in mm, on one
    colour scale per case.

    Example:
        >>> fig = forecast_panels(torch.rand(2, 4, 8, 8), torch.rand(2, 4, 8, 8), {"ARP": torch.rand(2, 4, 8, 8)})
        >>> len(fig.axes)
        20
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(forecasts, Tensor):
        forecasts = {"forecast": forecasts}
    cases, frames = min(len(truth), 4), truth.shape[1]
    sources = {"truth": truth, **forecasts}
    cols = 1 + frames * len(sources)
    fig, axes = plt.subplots(cases, cols, figsize=(1.1 * cols, 1.2 * cases + 0.4), squeeze=False)
    for i in range(cases):
        vmax = float(torch.stack([past[i, -1].max(), *(s[i].max() for s in sources.values())]).max()) or 1.0
        axes[i, 0].imshow(past[i, -1].cpu(), cmap="Blues", vmin=0, vmax=vmax)
        axes[i, 0].set_title("t = 0" if i == 0 else "", fontsize=6)
        for k in range(frames):
            for j, (name, source) in enumerate(sources.items()):
                ax = axes[i, 1 + k * len(sources) + j]
                image = ax.imshow(source[i, k].detach().cpu().float(), cmap="Blues", vmin=0, vmax=vmax)
                if i == 0:
                    ax.set_title(f"{name} +{hours_per_frame * (k + 1)}h", fontsize=6)
        fig.colorbar(image, ax=axes[i, -1], fraction=0.046, pad=0.04).ax.tick_params(labelsize=5)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title or "TC rain (mm per 3 h): last observation, then truth and forecasts by lead time", fontsize=8)
    return fig
