"""Map plots of imputed against true trajectory windows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from zoo.datamodules.street_grid import latlon_to_km

__all__ = ["plot_imputations", "plot_reproduction"]


def plot_imputations(pred: Tensor, target: Tensor, baseline: Tensor | None = None, columns: int = 4,
                     labels: tuple[str, str, str] = ("true", "ProDiff", "linear")) -> Any:  # fmt: skip
    """One panel per window: the true path, the imputed one (and optionally a baseline's), longitude against
    latitude, endpoints marked. ``pred`` / ``target`` / ``baseline`` are [B, 3, k] raw windows. Returns the figure.

    Example:
        >>> import torch
        >>> w = torch.tensor([[[0.0, 1, 2], [35.0, 35.01, 35.02], [139.0, 139.0, 139.01]]])
        >>> fig = plot_imputations(w, w)
        >>> len(fig.axes)
        1
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    n = len(target)
    rows = (n + columns - 1) // columns
    fig, axes = plt.subplots(rows, min(columns, n), figsize=(3 * min(columns, n), 3 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.remove()
            continue
        ax.plot(target[i, 2].cpu(), target[i, 1].cpu(), "k-o", ms=3, label=labels[0])
        ax.plot(pred[i, 2].cpu(), pred[i, 1].cpu(), "C0--o", ms=3, label=labels[1])
        if baseline is not None:
            ax.plot(baseline[i, 2].cpu(), baseline[i, 1].cpu(), "C1:", label=labels[2])
        ax.plot(target[i, 2, [0, -1]].cpu(), target[i, 1, [0, -1]].cpu(), "ks", ms=6)
        ax.set_xticks([])
        ax.set_yticks([])
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_reproduction(r: Mapping[str, Any], path: Path, examples: Mapping[str, Tensor], arms: Sequence[str],
                      labels: Mapping[str, str], metrics: Sequence[str]) -> None:  # fmt: skip
    """The reproduction's figure: the first seed's example windows on the city's streets (true, ProDiff, Diff+Mask,
    linear) and a bar chart of ``metrics`` (three coverage thresholds) for every arm in ``r``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(examples["true"])
    shown = [a for a in ("prodiff", "diff_mask", "linear") if a in examples]
    fig = plt.figure(figsize=(14, 6))
    grid = fig.add_gridspec(2, n // 2 + 2)
    true = examples["true"]
    for i in range(len(true)):
        ax = fig.add_subplot(grid[i // (n // 2), i % (n // 2)])
        ax.plot(true[i, 2], true[i, 1], "k-o", ms=3, label="true")
        for j, arm in enumerate(shown):
            ax.plot(examples[arm][i, 2], examples[arm][i, 1], f"C{j}--o", ms=2.5, label=labels[arm])
        ax.plot(true[i, 2, [0, -1]], true[i, 1, [0, -1]], "ks", ms=6)
        _zoom_on_streets(ax, true[i])
        if i == 0:
            ax.legend(fontsize=6)
    ax = fig.add_subplot(grid[:, n // 2 :])
    arms = [a for a in arms if f"{a}/tc@500m" in r]
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        values = [r[f"{arm}/{m}"] for m in metrics]
        ax.bar([j + (i - (len(arms) - 1) / 2) * width for j in range(3)], values, width, label=labels[arm])
    ax.set_xticks(range(3), ["TC@250m", "TC@500m", "TC@1km"])
    ax.set_ylim(0, 1)
    ax.set_title(f"interior coverage, {r['num_seeds']} seed(s)")
    ax.legend(fontsize=7)
    fig.suptitle("ProDiff on the street-grid city: imputed against true windows (first seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _zoom_on_streets(ax: Any, window: Tensor, pad_km: float = 0.6) -> None:
    """Frame the panel on the true window (a diverging imputation leaves it) and draw the city's streets."""
    from zoo.datamodules.street_grid import CITY_CENTER, km_to_latlon

    x, y = latlon_to_km(window[1].numpy(), window[2].numpy())
    (x0, x1), (y0, y1) = (x.min() - pad_km, x.max() + pad_km), (y.min() - pad_km, y.max() + pad_km)
    for street in range(int(np.floor(min(x0, y0))), int(np.ceil(max(x1, y1))) + 1):
        lat, lon = km_to_latlon(np.array([street, street]), np.array([y0, y1]))
        ax.plot(lon, lat, color="0.85", lw=0.8, zorder=0)
        lat, lon = km_to_latlon(np.array([x0, x1]), np.array([street, street]))
        ax.plot(lon, lat, color="0.85", lw=0.8, zorder=0)
    lat, lon = km_to_latlon(np.array([x0, x1]), np.array([y0, y1]))
    ax.set_xlim(*lon)
    ax.set_ylim(*lat)
    ax.set_aspect(1 / np.cos(np.radians(CITY_CENTER[0])))  # a km as long across as up
    ax.set_xticks([])
    ax.set_yticks([])
