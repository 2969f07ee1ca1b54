"""``TransportSamples``: log a picture of where a transport model sends held-out source samples."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor

from zoo.callbacks.images import log_figure
from zoo.callbacks.stages import EvaluationStages

__all__ = ["TransportSamples", "transport_figure"]


def transport_figure(source: Tensor, moved: Tensor, target: Tensor, title: str = "") -> Any:
    """A matplotlib ``Figure``: 2-D samples as scatter plots, images as grids (source / transported / target rows).

    Example:
        >>> fig = transport_figure(torch.randn(50, 2), torch.randn(50, 2), torch.randn(50, 2) + 3)
        >>> len(fig.axes)
        3
    """
    from matplotlib.figure import Figure

    panels = (("source", source), ("transported", moved), ("target", target))
    if source.ndim == 2 and source.shape[1] == 2:
        fig = Figure(figsize=(12, 4))
        axes = fig.subplots(1, 3, sharex=True, sharey=True)
        for ax, (name, x) in zip(axes, panels):
            ax.scatter(target[:, 0], target[:, 1], s=2, c="0.8")
            ax.scatter(x[:, 0], x[:, 1], s=2, c="C0")
            ax.set_title(name)
    elif source.ndim == 4:
        n = min(len(source), len(target), 16)
        fig = Figure(figsize=(n * 0.8, 2.6))
        axes = fig.subplots(3, n, squeeze=False)
        for row, (name, x) in enumerate(panels):
            images = ((x[:n].float().clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1).cpu()
            for col in range(n):
                ax = axes[row, col]
                ax.imshow(images[col].squeeze(-1), cmap="gray" if images.shape[-1] == 1 else None, vmin=0, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
            axes[row, 0].set_ylabel(name, fontsize=7)
    else:
        raise ValueError(f"can only draw 2-D points or images (n, C, H, W); got samples of shape {tuple(source.shape)}")
    fig.suptitle(title)
    return fig


class TransportSamples(EvaluationStages):
    """After each validation/test epoch, transport the first batch's first ``num_samples`` sources and log a figure.

    Works with any module whose batches are ``(source, target)`` pairs and that offers ``transport(x)`` returning the
    transported samples (a tensor, or an object with ``.x`` such as EFM's ``Transport``). Logged as
    ``<stage>/transport`` through :func:`callbacks.log_figure` (a PNG beside CSV logs, an image in TensorBoard/W&B).

    Args:
        num_samples: source samples transported and drawn.

    Example:
        >>> TransportSamples(num_samples=256).num_samples
        256
    """

    def __init__(self, num_samples: int = 512) -> None:
        self.num_samples = num_samples
        self._batch: tuple[Tensor, Tensor] | None = None

    def stage_start(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._batch = None

    def stage_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, stage: str, outputs: Any, batch: Any
    ) -> None:
        if self._batch is None and stage != "predict":
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise TypeError(f"{type(self).__name__} needs (source, target) batches, got {type(batch).__name__}")
            self._batch = (batch[0][: self.num_samples], batch[1][: self.num_samples])

    def stage_end(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._batch is None:
            return
        move = getattr(pl_module, "transport", None)
        if not callable(move):
            raise TypeError(
                f"{type(self).__name__} needs `{type(pl_module).__name__}.transport(x)`; add it or remove the callback."
            )
        source, target = self._batch
        with torch.no_grad():
            moved = move(source)
        moved = getattr(moved, "x", moved)
        title = f"{stage}, step {trainer.global_step}"
        log_figure(trainer, f"{stage}/transport", transport_figure(source.cpu(), moved.cpu(), target.cpu(), title))
        self._batch = None
