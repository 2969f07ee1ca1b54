"""``EvaluationStages``: one place that maps Lightning's validation/test/predict hooks to stage-aware methods."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

__all__ = ["EvaluationStages"]


class EvaluationStages(Callback):
    """Base of callbacks that do the same thing in validation, test and predict, told apart by ``stage``.

    Lightning has one hook per stage and moment (nine here); subclasses implement three methods instead, called
    with ``stage`` in ``{"val", "test", "predict"}``. The sanity-check validation is skipped.
    """

    def stage_start(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """A validation, test or predict epoch starts."""

    def stage_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, stage: str, outputs: Any, batch: Any
    ) -> None:
        """A batch of that epoch ended with the step's ``outputs``."""

    def stage_end(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """That epoch ended."""

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.stage_start(trainer, pl_module, "val")

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stage_start(trainer, pl_module, "test")

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stage_start(trainer, pl_module, "predict")

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self.stage_batch_end(trainer, pl_module, "val", outputs, batch)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.stage_batch_end(trainer, pl_module, "test", outputs, batch)

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.stage_batch_end(trainer, pl_module, "predict", outputs, batch)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self.stage_end(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stage_end(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.stage_end(trainer, pl_module, "predict")
