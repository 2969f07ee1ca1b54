"""``TrainingDynamics``: record every training sample's predictions per epoch, by sample index (DUAL, Dyn-Unc, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

__all__ = ["TrainingDynamics"]


def _labels_and_indices(callback: Callback, batch: Any) -> tuple[Tensor, Tensor]:
    if isinstance(batch, dict) and "index" in batch and "y" in batch:
        return batch["y"], batch["index"]
    if isinstance(batch, (tuple, list)) and len(batch) == 3:
        return batch[1], batch[2]
    raise TypeError(
        f"{type(callback).__name__} needs training batches that carry sample indices: (x, y, index) tuples or dicts "
        f"with 'y' and 'index' (e.g. PrunableImageDataModule); got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


class TrainingDynamics(Callback):
    """Record, at every training step, the softmax of the logits the step trained on, scattered by sample index.

    The module's ``training_step`` returns ``{"loss": ..., "logits": (B, C)}``; batches carry ``(x, y, index)``
    (train mode, augmentation and batch-norm statistics as in training: the official DUAL code records the same
    forward pass). The record lives on the module's device (``target_probs`` is ``epochs × N`` floats) so a step
    adds no host sync; under DDP each step's rows are gathered from all processes first. After ``epochs`` epochs the
    record is saved (``save_dir``: ``dynamics.npz`` with ``target_probs``, ``labels`` and, if recorded, ``probs`` and
    ``loss``) and, with ``stop=True``, training stops: the learning-rate schedule stays built for the full run, as in
    the paper, but only the first T epochs are spent.

    Args:
        epochs: epochs to record (DUAL: T = 30 on CIFAR).
        num_samples: N; default the datamodule's ``num_train`` (the full set, e.g. ``PrunableImageDataModule``),
            else ``len(trainer.train_dataloader.dataset)``.
        record_probs: also keep the full softmax ``(epochs, N, C)`` (EL2N, forgetting, AUM, TDDS need it).
        record_loss: also keep the per-sample cross-entropy ``(epochs, N)``.
        stop: stop training after ``epochs`` epochs.
        save_dir: folder for ``dynamics.npz`` (default: the trainer's ``log_dir``, else ``default_root_dir``).

    Example:
        >>> cb = TrainingDynamics(epochs=30)
        >>> cb.epochs, cb.recorded_epochs
        (30, 0)
    """

    def __init__(
        self,
        epochs: int = 30,
        num_samples: int | None = None,
        record_probs: bool = False,
        record_loss: bool = False,
        stop: bool = True,
        save_dir: str | None = None,
    ) -> None:
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.epochs, self.num_samples = epochs, num_samples
        self.record_probs, self.record_loss, self.stop, self.save_dir = record_probs, record_loss, stop, save_dir
        self.target_probs: Tensor | None = None
        self.labels: Tensor | None = None
        self.probs: Tensor | None = None
        self.loss: Tensor | None = None
        self.recorded_epochs = 0
        self.path: Path | None = None
        self._restored: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        # The record so far goes into checkpoints: a resumed fit (`--ckpt_path last`) continues it instead of starting
        # over with the epochs before the resume missing (NaN).
        if self.target_probs is None:
            return {}
        tensors = {"target_probs": self.target_probs, "labels": self.labels, "probs": self.probs, "loss": self.loss}
        return {"recorded_epochs": self.recorded_epochs, **{k: v for k, v in tensors.items() if v is not None}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict) or None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._restored is not None:
            restored, self._restored = self._restored, None
            device = pl_module.device
            self.recorded_epochs = int(restored.pop("recorded_epochs"))
            self.target_probs, self.labels = (restored.pop(k).to(device) for k in ("target_probs", "labels"))
            self.probs, self.loss = (restored[k].to(device) if k in restored else None for k in ("probs", "loss"))
            return
        n = self.num_samples
        if n is None:  # indices are positions in the full training set, also when a subset is kept
            full = getattr(trainer.datamodule, "num_train", None) if trainer.datamodule is not None else None
            n = full if isinstance(full, int) else len(trainer.train_dataloader.dataset)
        device = pl_module.device
        self.target_probs = torch.full((self.epochs, n), float("nan"), device=device)
        self.labels = torch.full((n,), -1, dtype=torch.long, device=device)
        self.loss = torch.full((self.epochs, n), float("nan"), device=device) if self.record_loss else None
        self.probs = None  # allocated at the first batch, when the number of classes is known
        self.recorded_epochs = 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        epoch = trainer.current_epoch
        if self.target_probs is None or epoch >= self.epochs:
            return
        logits = outputs.get("logits") if isinstance(outputs, dict) else None
        if not isinstance(logits, Tensor) or logits.ndim != 2:
            raise TypeError(
                f"{type(self).__name__} needs `{type(pl_module).__name__}.training_step` to return a dict with "
                f"'logits' of shape (batch, classes); got {type(logits).__name__ if logits is None else logits.shape}"
            )
        y, index = _labels_and_indices(self, batch)
        logits, y, index = logits.detach().float(), y.long(), index.long()
        if trainer.world_size > 1:  # DistributedSampler pads every rank to the same batch shapes
            logits, y, index = (pl_module.all_gather(t).flatten(0, 1) for t in (logits, y, index))
        probs = logits.softmax(dim=-1)
        self.target_probs[epoch, index] = probs.gather(1, y[:, None]).squeeze(1)
        self.labels[index] = y
        if self.record_loss:
            self.loss[epoch, index] = torch.nn.functional.cross_entropy(logits, y, reduction="none")
        if self.record_probs:
            if self.probs is None:
                self.probs = torch.full(
                    (self.epochs, len(self.labels), probs.shape[1]), float("nan"), device=probs.device
                )
            self.probs[epoch, index] = probs

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.target_probs is None or trainer.current_epoch >= self.epochs:
            return
        missing = int(torch.isnan(self.target_probs[trainer.current_epoch]).sum())  # one host sync per epoch
        if missing:
            rank_zero_warn(
                f"{type(self).__name__}: {missing} of {self.target_probs.shape[1]} samples got no record in epoch "
                f"{trainer.current_epoch} (drop_last, limit_train_batches, a kept subset or a sampler that skips "
                "samples); their entries stay NaN and so will their scores."
            )
        self.recorded_epochs = trainer.current_epoch + 1
        if self.recorded_epochs == self.epochs:
            self.save(trainer)
            if self.stop:
                trainer.should_stop = True

    def record(self) -> dict[str, Tensor]:
        """The recorded tensors on the CPU: ``target_probs`` ``(E, N)``, ``labels`` and, if kept, ``probs``, ``loss``."""
        if self.target_probs is None:
            raise RuntimeError(f"{type(self).__name__} has recorded nothing yet: fit a model with it first")
        out = {"target_probs": self.target_probs[: max(self.recorded_epochs, 1)], "labels": self.labels}
        if self.probs is not None:
            out["probs"] = self.probs[: max(self.recorded_epochs, 1)]
        if self.loss is not None:
            out["loss"] = self.loss[: max(self.recorded_epochs, 1)]
        return {k: v.cpu() for k, v in out.items()}

    def save(self, trainer: Trainer) -> Path | None:
        """Write ``dynamics.npz`` (rank zero only, through a temporary file renamed into place)."""
        if not trainer.is_global_zero:
            return None
        folder = Path(self.save_dir or (trainer.log_dir if trainer.logger is not None else trainer.default_root_dir))
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "dynamics.tmp.npz"
        np.savez(tmp, **{k: v.numpy() for k, v in self.record().items()})
        self.path = tmp.replace(folder / "dynamics.npz")
        return self.path
