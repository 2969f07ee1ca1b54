"""``DiffusionSamples``: a grid of generated images after each validation epoch, sent to the active loggers."""

from __future__ import annotations

import math

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from zoo.callbacks.images import log_figure

__all__ = ["DiffusionSamples"]


class DiffusionSamples(Callback):
    """Draw ``num_images`` samples with the module's ``sample(n, steps, generator)`` after validation (every
    ``every_n_epochs``) and log them as a grid (``samples``) through :func:`callbacks.log_figure`. The generator is
    seeded with ``seed`` each time, so successive grids show how the same noise is denoised as training goes on.

    Example:
        >>> DiffusionSamples(num_images=16).num_images
        16
    """

    def __init__(self, num_images: int = 16, steps: int = 50, every_n_epochs: int = 1, seed: int = 0) -> None:
        self.num_images, self.steps, self.every_n_epochs, self.seed = num_images, steps, every_n_epochs, seed

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        images = pl_module.sample(self.num_images, self.steps, torch.Generator().manual_seed(self.seed)).cpu()
        side = math.ceil(math.sqrt(len(images)))
        fig, axes = plt.subplots(side, side, figsize=(side, side))
        for ax, image in zip(axes.flat, images):
            ax.imshow(image.permute(1, 2, 0).squeeze(-1).add(1).div(2).clamp(0, 1), cmap="gray", vmin=0, vmax=1)
        for ax in axes.flat:
            ax.axis("off")
        fig.suptitle(f"samples, step {trainer.global_step}", fontsize=8)
        log_figure(trainer, "samples", fig)
