"""Map plots of imputed against true trajectory windows."""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["plot_imputations"]


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
