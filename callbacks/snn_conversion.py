"""``SNNConversion``: convert the module to a spiking network and measure it at every time-step budget T."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor
from torch.utils.data import DataLoader
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from zoo.callbacks.images import log_figure
from zoo.callbacks.stages import EvaluationStages

__all__ = ["SNNConversion"]


class SNNConversion(EvaluationStages):
    """Evaluate ``pl_module.to_snn(...)`` at every T in ``steps``: one simulation of max(T) steps per batch.

    Requires ``pl_module.to_snn(**convert_kwargs)`` returning a spiking network with ``predict(x, steps, chunk)``
    (the running mean of the output after every step, ``(steps, B, C)``) and, for ``firing_rates``,
    ``firing_rates() -> {layer: spikes per neuron per step}``: :class:`zoo.models.snn_ecl.SpikingNetwork` is one,
    made for any ReLU or clip network by :func:`zoo.models.snn_ecl.convert`. A module whose ``snn_needs_calibration``
    is true (a ReLU network: no learned thresholds) also gets ``calibration=<training batches>``. Batches are
    ``(x, y, ...)``.

    The network is converted once per validation / test epoch (from the current weights and thresholds), run in eval
    mode whatever mode the module is in, and each batch is simulated once; the accuracy after t steps is read from the
    same run for every t. Logged: ``{stage}/snn_acc_T{t}`` (torchmetrics accuracies, synchronised across processes),
    optionally ``{stage}/firing_rate/{layer}``, and a plot of accuracy against T (``{stage}/snn_accuracy``, through
    :func:`callbacks.images.log_figure`). With ``naive=True`` the same network is also converted naively (the module's
    ``to_snn(calibration=<training batches>, percentile=p, v0_ratio=0, dual=False)``) and logged as
    ``{stage}/naive_acc_T{t}``.

    Args:
        steps: the time-step budgets T to report (positive integers).
        convert_kwargs: keyword arguments of ``to_snn`` (``v0_ratio``, ``dual``, ``neg_threshold``...).
        naive: also evaluate the naive conversion.
        percentile: calibration percentile of the naive arm.
        calibration_batches: training batches the naive arm calibrates its thresholds on.
        firing_rates: log every spiking layer's firing rate.
        chunk: time steps simulated per pass (memory ∝ chunk × batch; default all at once).
        stages: the stages to run in, among ``"val"`` and ``"test"``.
        plot: log the accuracy-against-T figure.

    Attributes:
        results: ``{stage: {arm: {T: accuracy}}}`` of the last epoch of each stage.

    Example:
        >>> cb = SNNConversion(steps=[1, 2, 4, 8], naive=True)
        >>> cb.steps
        [1, 2, 4, 8]
    """

    def __init__(
        self,
        steps: list[int] = [1, 2, 4, 8, 16, 32],  # noqa: B006 - jsonargparse needs a plain list
        convert_kwargs: dict[str, Any] | None = None,
        naive: bool = False,
        percentile: float = 99.9,
        calibration_batches: int = 8,
        firing_rates: bool = False,
        chunk: int | None = None,
        stages: list[str] = ["val", "test"],  # noqa: B006
        plot: bool = True,
    ) -> None:
        bad = [t for t in steps if isinstance(t, bool) or not isinstance(t, int) or t < 1]
        if not steps or bad:
            raise ValueError(f"steps must be positive integers (time-step budgets T), got {list(steps)}")
        if not set(stages) <= {"val", "test"}:
            raise ValueError(f"stages must be among 'val' and 'test', got {stages}")
        if calibration_batches < 1:
            raise ValueError(f"calibration_batches must be ≥ 1, got {calibration_batches}")
        self.steps = sorted(set(steps))
        self.convert_kwargs = dict(convert_kwargs or {})
        self.naive, self.percentile, self.calibration_batches = naive, percentile, calibration_batches
        self.log_firing_rates, self.chunk, self.stages, self.plot = firing_rates, chunk, list(stages), plot
        self.results: dict[str, dict[str, dict[int, float]]] = {}
        self._arms: dict[str, Any] = {}
        self._metrics: dict[str, MetricCollection] = {}
        self._rates: dict[str, Tensor] = {}
        self._seen = 0

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not callable(getattr(pl_module, "to_snn", None)):
            raise TypeError(
                f"SNNConversion needs `{type(pl_module).__name__}.to_snn(**kwargs)` returning a spiking network "
                "(e.g. zoo.models.snn_ecl.convert(self.net)); add that method, or remove the callback."
            )

    def stage_start(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._arms, self._metrics, self._rates, self._seen = {}, {}, {}, 0
        if stage not in self.stages:
            return
        with torch.no_grad():
            calibration = None
            if self.naive or getattr(pl_module, "snn_needs_calibration", False):
                calibration = self._calibration(trainer, pl_module)
            kwargs = dict(self.convert_kwargs)
            if getattr(pl_module, "snn_needs_calibration", False):
                kwargs.setdefault("calibration", calibration)
            self._arms["snn"] = pl_module.to_snn(**kwargs).to(pl_module.device).eval()
            if self.naive:
                arm = pl_module.to_snn(calibration=calibration, percentile=self.percentile, v0_ratio=0.0, dual=False)
                self._arms["naive"] = arm.to(pl_module.device).eval()

    def stage_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, stage: str, outputs: Any, batch: Any
    ) -> None:
        if not self._arms:
            return
        x, y = batch[0], batch[1]
        index = torch.tensor(self.steps, device=x.device) - 1
        with torch.no_grad():
            for arm, snn in self._arms.items():
                curve = snn.predict(x, self.steps[-1], self.chunk)[index]  # (len(steps), B, C)
                if arm not in self._metrics:
                    self._metrics[arm] = self._collection(curve.shape[-1]).to(x.device)
                for t, logits in zip(self.steps, curve):
                    self._metrics[arm][f"T{t}"].update(logits, y)
                if self.log_firing_rates and arm == "snn":
                    rates = torch.tensor(list(snn.firing_rates().values()), dtype=torch.float64)
                    self._rates["sum"] = self._rates.get("sum", 0) + rates * len(x)
        self._seen += len(x)

    def stage_end(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self._metrics:
            return
        prefix = {"snn": "snn_acc", "naive": "naive_acc"}
        results: dict[str, dict[int, float]] = {}
        for arm, collection in self._metrics.items():
            values = collection.compute()
            results[arm] = {}
            for t in self.steps:
                value = values[f"T{t}"]
                pl_module.log(f"{stage}/{prefix[arm]}_T{t}", value)
                results[arm][t] = float(value)
            collection.reset()
        if self.log_firing_rates and "sum" in self._rates:
            names = list(self._arms["snn"].firing_rates())
            for name, total in zip(names, self._rates["sum"]):
                pl_module.log(f"{stage}/firing_rate/{name}", float(total) / self._seen, sync_dist=True)
        self.results[stage] = results
        if self.plot and trainer.loggers:
            log_figure(trainer, f"{stage}/snn_accuracy", self._figure(results, stage))
        self._arms = {}

    # ------------------------------------------------------------------------------------------------ internals
    def _collection(self, num_classes: int) -> MetricCollection:
        return MetricCollection({f"T{t}": MulticlassAccuracy(num_classes, average="micro") for t in self.steps})

    def _calibration(self, trainer: Trainer, pl_module: LightningModule) -> list[Tensor]:
        dm = trainer.datamodule
        if dm is None:
            raise RuntimeError(
                "SNNConversion(naive=True) calibrates on training batches: fit or test with a DataModule"
            )
        dm.setup("fit")
        loader = dm.train_dataloader()
        # The first batches in the set's own order: the same thresholds every time (a shuffled loader would not).
        ordered = DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=False, collate_fn=loader.collate_fn)
        batches = []
        for batch in ordered:
            batches.append(batch[0].to(pl_module.device))
            if len(batches) == self.calibration_batches:
                break
        return batches

    def _figure(self, results: dict[str, dict[int, float]], stage: str) -> Any:
        from matplotlib.figure import Figure

        figure = Figure(figsize=(5, 3.2), layout="constrained")
        ax = figure.subplots()
        for arm, curve in results.items():
            ax.plot(
                list(curve), list(curve.values()), marker="o", label={"snn": "SNN", "naive": "naive conversion"}[arm]
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("time steps T")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{stage}: spiking network accuracy")
        ax.legend()
        return figure
