"""``StreamingAveragePrecision``: APS of a streaming anomaly detector's scores after the warm-up (SEAD card §4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torchmetrics.classification import BinaryAveragePrecision

from zoo.callbacks.stages import EvaluationStages
from zoo.metrics.anomaly import anomaly_ap_metric

__all__ = ["StreamingAveragePrecision"]

_METHODS = {"val": "validation_step", "test": "test_step", "predict": "predict_step"}


def _metric() -> BinaryAveragePrecision:
    # Exact AP on the scores as given (zoo.metrics.anomaly); warm-up rows get target -1 and are ignored.
    return anomaly_ap_metric(ignore_index=-1)


class StreamingAveragePrecision(EvaluationStages):
    """Average precision (APS) of a stream's anomaly scores against its labels, leaving out the warm-up.

    Works with any module whose ``validation_step``/``test_step``/``predict_step`` returns a dict with
    ``"score"``: ``(B,)`` anomaly scores (higher = more anomalous), on batches that are dicts holding ``"y"``:
    ``(B,)`` 0/1 labels and optionally ``"evaluate"``: ``(B,)`` bool (rows with ``False`` are warm-up and not
    scored), as :class:`datamodules.streams.StreamDataModule` serves them. The scores are accumulated into a
    torchmetrics ``BinaryAveragePrecision`` (exact, equal to sklearn's ``average_precision_score``) and, at the
    end of the epoch, logged as ``{stage}/aps`` (``stage`` is ``val`` or ``test``) through ``pl_module.log``. Predict
    cannot log: its values go to ``results["predict"]`` (every stage's do).

    With ``per_detector=True`` and outputs that also hold ``"detector_scores"``: ``(B, M)`` (an ensemble's base
    detectors), each detector's APS is logged as ``{stage}/aps_detector{i}``, the best of them (best in hindsight,
    an oracle that uses labels) as ``{stage}/aps_best_detector``, and the ensemble's rank among the M + 1 scorers
    (1 = best; the card's ranking, §4) as ``{stage}/aps_rank``.

    Cost: one small copy of the scores per batch, kept on the module's device (``cat`` state; 8 bytes per point
    and detector). Validation in the sanity check is skipped.

    Args:
        per_detector: also score ``outputs["detector_scores"]`` column by column.

    Attributes:
        results: ``{stage: {"aps": float, ...}}`` after each epoch end; with detectors also ``"aps_detector{i}"``,
            ``"aps_best_detector"``, ``"best_detector"`` (its index) and ``"aps_rank"``.

    Raises:
        TypeError: at the first batch of a stage, when the step's outputs are not a dict with ``"score"``, or the
            batch is not a dict with ``"y"``.
        ValueError: ``score`` and ``y`` (or ``detector_scores``) have different lengths.

    Example:
        >>> cb = StreamingAveragePrecision(per_detector=True)
        >>> cb.results
        {}
    """

    def __init__(self, per_detector: bool = False) -> None:
        if not isinstance(per_detector, bool):
            raise TypeError(f"Expected argument `per_detector` to be a bool but got {per_detector!r}.")
        self.per_detector = per_detector
        self.results: dict[str, dict[str, float]] = {}
        self._metrics: dict[str, BinaryAveragePrecision] = {}
        self._detector_metrics: dict[str, list[BinaryAveragePrecision]] = {}
        self._checked: set[str] = set()
        self._warned: set[str] = set()

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Nothing to check before the first batch: the outputs' keys are only known then (checked once per stage).
        self._checked.clear()

    def stage_start(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._reset(stage)

    def stage_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, stage: str, outputs: Any, batch: Any
    ) -> None:
        self._update(stage, pl_module, outputs, batch)

    def stage_end(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._finish(stage, pl_module, log=stage != "predict")  # predict has no self.log: see results["predict"]

    # ------------------------------------------------------------------------------------------------ internals
    def _reset(self, stage: str) -> None:
        self._metrics.pop(stage, None)
        self._detector_metrics.pop(stage, None)

    def _check(self, stage: str, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        method = f"{type(pl_module).__name__}.{_METHODS[stage]}"
        if not isinstance(outputs, Mapping) or not isinstance(outputs.get("score"), Tensor):
            got = f"a dict with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else type(outputs).__name__
            raise TypeError(
                f"StreamingAveragePrecision needs `{method}` to return a dict with 'score', a (B,) tensor of "
                f"anomaly scores, got {got}. Change {method} to return {{'score': scores, ...}}, or remove the "
                "callback."
            )
        if not isinstance(batch, Mapping) or not isinstance(batch.get("y"), Tensor):
            got = f"a dict with keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__
            raise TypeError(
                f"StreamingAveragePrecision needs batches that are dicts with 'y', a (B,) tensor of 0/1 labels, "
                f"got {got}. Use datamodules.streams.StreamDataModule, or a DataModule whose batches hold 'y'."
            )
        self._checked.add(stage)

    def _update(self, stage: str, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        if stage not in self._checked:
            self._check(stage, pl_module, outputs, batch)
        score, y = outputs["score"].detach(), batch["y"]
        if score.shape != y.shape:
            raise ValueError(
                f"StreamingAveragePrecision expects `{_METHODS[stage]}`'s 'score' to have the shape of batch['y'], "
                f"got {tuple(score.shape)} and {tuple(y.shape)}. Return one score per row."
            )
        target = y.to(score.device, torch.long)
        evaluate = batch.get("evaluate")
        if evaluate is not None:
            target = torch.where(evaluate.to(score.device), target, -1)  # warm-up rows: ignore_index
        if stage not in self._metrics:
            self._metrics[stage] = _metric().to(score.device)
        self._metrics[stage].update(score.float(), target)

        if not self.per_detector:
            return
        detector_scores = outputs.get("detector_scores")
        if detector_scores is None:
            if stage not in self._warned:
                self._warned.add(stage)
                rank_zero_warn(
                    f"StreamingAveragePrecision(per_detector=True): `{type(pl_module).__name__}.{_METHODS[stage]}` "
                    "returns no 'detector_scores' (B, M); only the ensemble's APS is logged.",
                    stacklevel=2,
                )
            return
        detector_scores = detector_scores.detach()
        if detector_scores.ndim != 2 or detector_scores.shape[0] != score.shape[0]:
            raise ValueError(
                f"StreamingAveragePrecision expects 'detector_scores' of shape (B, M) with B = {score.shape[0]}, "
                f"got {tuple(detector_scores.shape)}."
            )
        metrics = self._detector_metrics.setdefault(
            stage, [_metric().to(score.device) for _ in range(detector_scores.shape[1])]
        )
        for i, metric in enumerate(metrics):
            metric.update(detector_scores[:, i].float(), target)

    def _finish(self, stage: str, pl_module: LightningModule, log: bool) -> None:
        metric = self._metrics.get(stage)
        if metric is None or sum(p.numel() for p in metric.preds) == 0:
            if metric is not None or stage in self._checked:
                rank_zero_warn(
                    f"StreamingAveragePrecision saw no evaluated rows in {stage} (all warm-up?); no "
                    f"{stage}/aps. Lower the DataModule's warmup or stream more points.",
                    stacklevel=2,
                )
            return
        values: dict[str, Tensor] = {"aps": metric.compute()}
        detectors = self._detector_metrics.get(stage, [])
        if detectors:
            per = torch.stack([m.compute() for m in detectors])
            for i, value in enumerate(per):
                values[f"aps_detector{i}"] = value
            values["aps_best_detector"] = per.max()
            values["aps_rank"] = 1 + (per > values["aps"]).sum().float()
        if log:
            for name, value in values.items():
                pl_module.log(f"{stage}/{name}", value, sync_dist=False)  # compute() already synced the states
        self.results[stage] = {name: float(value) for name, value in values.items()}
        if detectors:
            self.results[stage]["best_detector"] = int(per.argmax())
        self._reset(stage)
