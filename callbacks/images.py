"""``log_figure``: the one helper through which zoo callbacks log images, whatever loggers the Trainer has."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from matplotlib.figure import Figure

__all__ = ["figure_to_array", "log_figure"]


def figure_to_array(figure: Figure) -> np.ndarray:
    """Render ``figure`` with the Agg backend to an ``(H, W, 3)`` uint8 RGB array.

    Example:
        >>> from matplotlib.figure import Figure
        >>> figure_to_array(Figure(figsize=(2, 1), dpi=50)).shape
        (50, 100, 3)
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _image_dir(logger: Any) -> Path | None:
    for name in ("log_dir", "save_dir"):
        folder = getattr(logger, name, None)
        if folder:
            return Path(folder)
    return None


def log_figure(trainer: Trainer, key: str, figure: Figure) -> Path | None:
    """Log a matplotlib figure to every logger of ``trainer`` that can hold an image, then close the figure.

    - ``TensorBoardLogger``: ``experiment.add_figure(key, figure, global_step)``;
    - ``WandbLogger``: ``log_image(key, [RGB array], step)``;
    - any other logger with a ``log_dir`` or ``save_dir`` (``CSVLogger``...): a PNG at
      ``<log_dir>/images/<key, "/" replaced by "_">_step<global_step>.png``.

    Only global rank zero logs. Neither tensorboard nor wandb is imported here: a logger that exists already
    imported what it needs.

    Args:
        trainer: the running Trainer (its ``loggers`` and ``global_step``).
        key: the image's name, e.g. ``"test/weights"``.
        figure: a ``matplotlib.figure.Figure``; closed afterwards, also when a logger fails.

    Returns:
        The path of the last PNG written, or ``None`` when no logger wanted a file.

    Example:
        >>> import tempfile
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.loggers import CSVLogger
        >>> from matplotlib.figure import Figure
        >>> trainer = Trainer(logger=CSVLogger(tempfile.mkdtemp()), enable_progress_bar=False)
        >>> figure = Figure(figsize=(2, 2))
        >>> _ = figure.subplots().plot([0, 1], [1, 0])
        >>> log_figure(trainer, "test/curve", figure).name
        'test_curve_step0.png'
    """
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    written: Path | None = None
    try:
        if not trainer.is_global_zero:
            return None
        step = trainer.global_step
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(key, figure, global_step=step, close=False)
            elif isinstance(logger, WandbLogger):
                logger.log_image(key=key, images=[figure_to_array(figure)], step=step)
            elif (folder := _image_dir(logger)) is not None:
                path = folder / "images" / f"{key.replace('/', '_')}_step{step}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                figure.savefig(path, format="png")
                written = path
    finally:
        if "matplotlib.pyplot" in sys.modules:  # only pyplot keeps a reference; a bare Figure is freed by GC
            sys.modules["matplotlib.pyplot"].close(figure)
    return written
