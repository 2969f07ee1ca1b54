"""``WeightTrace``: record an ensemble's detector weights over a stream and log them as a heat-map (SEAD card §8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor

from zoo.callbacks.images import log_figure
from zoo.callbacks.interface import required_tensor
from zoo.callbacks.stages import EvaluationStages

__all__ = ["WeightTrace"]


class WeightTrace(EvaluationStages):
    """Trace ``pl_module.weights`` after every batch of a pass and log the trace as a heat-map image.

    Requires ``pl_module.weights``: an ``(M,)`` tensor (a property), e.g. the detector weights of an ensemble
    such as SEAD's Hedge weights.

    After every validation, test and predict batch (not in the sanity check) the weights are copied, one small
    on-device copy, no host sync. With chunked batches (``StreamDataModule(chunk_size=50)``) the trace has one
    column per chunk, holding the weights after the chunk's last point. At the epoch end the trace becomes
    ``trace`` ``(T, M)`` (cpu, float32) and a heat-map (detectors × time) is logged through
    :func:`callbacks.images.log_figure` under ``{stage}/weights`` (``stage`` is ``val``, ``test`` or ``predict``):
    an image for TensorBoard/W&B, a PNG under the log dir for CSVLogger.

    Args:
        log_scale: colour the heat-map on a log scale (weights near 0 are clamped to ``1e-12``); shows how far
            losing detectors fall, e.g. to a fixed-share floor.
        cmap: matplotlib colour map.

    Attributes:
        trace: the last pass's ``(T, M)`` weights, or ``None`` before any epoch end.
        traces: ``{stage: (T, M) tensor}`` of every stage run.
        paths: ``{stage: Path}`` of the PNG written by the last epoch end of each stage (file loggers only).

    Raises:
        TypeError: ``pl_module.weights`` is missing or not a 1-D tensor (in ``setup``).

    Example:
        >>> cb = WeightTrace(log_scale=True)
        >>> cb.trace is None
        True
    """

    def __init__(self, log_scale: bool = False, cmap: str = "viridis") -> None:
        if not isinstance(log_scale, bool):
            raise TypeError(f"Expected argument `log_scale` to be a bool but got {log_scale!r}.")
        from matplotlib import colormaps

        if cmap not in colormaps:
            raise ValueError(f"Expected argument `cmap` to be a matplotlib colour map ('viridis'...) but got {cmap!r}.")
        self.log_scale = log_scale
        self.cmap = cmap
        self.trace: Tensor | None = None
        self.traces: dict[str, Tensor] = {}
        self.paths: dict[str, Path] = {}
        self._columns: list[Tensor] = []

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._weights(pl_module)

    def stage_start(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._columns = []

    def stage_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, stage: str, outputs: Any, batch: Any
    ) -> None:
        self._record(pl_module)

    def stage_end(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._finish(trainer, stage)

    # ------------------------------------------------------------------------------------------------ internals
    def _weights(self, pl_module: LightningModule) -> Tensor:
        return required_tensor(self, pl_module, "weights", 1, "an (M,) tensor of detector weights")

    def _record(self, pl_module: LightningModule) -> None:
        # Stay on the device: no host sync per batch; the columns are stacked and moved once at the epoch end.
        self._columns.append(self._weights(pl_module).detach().to(torch.float32).clone())

    def _finish(self, trainer: Trainer, stage: str) -> None:
        if not self._columns:
            return
        if len({c.shape for c in self._columns}) != 1:
            raise ValueError(
                f"WeightTrace saw weights of several sizes in {stage}: "
                f"{sorted({tuple(c.shape) for c in self._columns})}. Keep M fixed during a pass."
            )
        self.trace = torch.stack(self._columns).cpu()
        self.traces[stage] = self.trace
        self._columns = []
        path = log_figure(trainer, f"{stage}/weights", self._heatmap(self.trace, stage))
        if path is not None:
            self.paths[stage] = path

    def _heatmap(self, trace: Tensor, stage: str) -> Any:
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure

        T, M = trace.shape
        figure = Figure(figsize=(8, 1.2 + 0.3 * M), layout="constrained")
        ax = figure.subplots()
        values = trace.T.numpy()
        norm = None
        if self.log_scale:
            values = values.clip(min=1e-12)
            norm = LogNorm(vmin=float(values.min()), vmax=max(float(values.max()), float(values.min()) * 10))
        image = ax.imshow(
            values,
            aspect="auto",
            interpolation="nearest",
            cmap=self.cmap,
            norm=norm,
            extent=(-0.5, T - 0.5, M - 0.5, -0.5),
        )
        ax.set_xlabel("batch (one column per chunk)")
        ax.set_ylabel("detector")
        if M <= 20:  # otherwise matplotlib's own integer ticks
            ax.set_yticks(range(M))
        ax.set_title(f"{stage}: weights over the stream" + (" (log scale)" if self.log_scale else ""))
        figure.colorbar(image, ax=ax, label="weight")
        return figure
