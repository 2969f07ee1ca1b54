"""``ZooModule``: the LightningModule base every paper subclasses, giving hub I/O and a NaN guard; ``ImageClassifier``:
the evaluation steps of the image classifiers built on it."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import PyTorchModelHubMixin
from lightning import LightningModule
from torch import Tensor, nn

__all__ = ["ImageClassifier", "ZooModule"]


_RNG_KEY = "zoo_rng_states"


def _rng_states() -> dict[str, Any]:
    """The global random states of torch (CPU and, once initialised, CUDA), numpy and Python, in types that a
    ``weights_only`` ``torch.load`` reads back (numpy's key array as a tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }


def _set_rng_states(states: dict[str, Any]) -> None:
    """Restore what ``_rng_states`` collected; CUDA states only onto as many devices as were saved."""
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda") or []
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    n = states["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


class ZooModule(LightningModule, PyTorchModelHubMixin, library_name="zoo", tags=["zoo"]):
    """LightningModule with safe hub I/O (``save_pretrained`` / ``from_pretrained``) and a NaN-loss stop.

    ``PyTorchModelHubMixin`` records the JSON-serialisable ``__init__`` arguments as ``config.json`` and the
    weights as ``model.safetensors``; local folders and Hugging Face Hub repos work alike. The zoo tightens
    its loading: ``config.json`` is required, every weight file's sha256 (recorded under ``config["zoo"]``)
    is checked before use, the state dict must match exactly, and a pickle file is never read.

    Subclasses call ``self.save_hyperparameters()`` and take JSON-serialisable init arguments only.
    A ``training_step`` returning a non-finite loss stops training with the step number. Checkpoints also hold the
    global random states (torch, CUDA, numpy, Python), restored when a fit resumes, so that a resumed fit draws the
    same data orders and noise as an uninterrupted one; subclasses overriding ``on_save_checkpoint`` call ``super()``.
    """

    @classmethod
    def _from_pretrained(
        cls,
        *,
        model_id: str,
        revision: str | None,
        cache_dir: str | Path | None,
        force_download: bool,
        local_files_only: bool,
        token: str | bool | None,
        map_location: str = "cpu",
        strict: bool = True,
        **model_kwargs: Any,
    ) -> "ZooModule":
        from zoo import hub

        folder = hub.materialize(
            model_id,
            revision=revision,
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
            token=token,
        )
        config = hub.read_config(folder)
        hub.check_init_args(cls, config, folder)  # huggingface_hub silently drops keys the class does not take
        hub.verify_checksums(folder, config)
        model = cls(**model_kwargs)
        hub.load_weights(model, folder, map_location=map_location, strict=strict)
        return model.eval()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning keeps no RNG state in checkpoints, yet the shuffled order of every epoch (RandomSampler draws its
        # seed from the global torch RNG) and the noise of training steps come from it: without this, a resumed fit
        # trains on other orders and noise than the uninterrupted one. Subclasses that override this call super().
        checkpoint[_RNG_KEY] = _rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Only when resuming a fit: loading weights to evaluate must not reseed the caller's random streams. The
        # restore runs after `setup` (model init, k-means, data splits), so what those drew does not matter.
        trainer = self._trainer
        if _RNG_KEY in checkpoint and trainer is not None and trainer.state.fn == "fit":
            _set_rng_states(checkpoint[_RNG_KEY])

    def log_train(self, values: dict[str, Tensor], batch_idx: int, batch_size: int | None = None) -> None:
        """Log training values as their means since the last logging step, only on the steps Lightning writes to its
        loggers (every ``trainer.log_every_n_steps``, and the first step of each epoch), shown on the progress bar.

        ``self.log`` reads its value back to the host and costs about 0.4 ms a call on CPU, a third of a small model's
        step; summing on the device and logging every ``log_every_n_steps`` steps keeps a zoo training step as
        cheap as the plain PyTorch one (README, Speed).

        Example:
            >>> class Tiny(ZooModule):
            ...     def __init__(self) -> None:
            ...         super().__init__()
            ...         self.w = nn.Parameter(torch.ones(1))
            ...     def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
            ...         loss = (self.w * batch).pow(2).mean()
            ...         self.log_train({"train/loss": loss}, batch_idx, batch_size=len(batch))
            ...         return loss
        """
        window = self.__dict__.setdefault("_train_window", {})
        for key, value in values.items():
            total, count = window.get(key, (0.0, 0))
            window[key] = (total + (value.detach() if isinstance(value, Tensor) else value), count + 1)
        every = self._trainer.log_every_n_steps if self._trainer is not None else 1
        if (self.global_step + 1) % every == 0 or batch_idx == 0:
            for key, (total, count) in window.items():
                self.log(key, total / count, prog_bar=True, batch_size=batch_size)
            window.clear()

    def on_before_backward(self, loss: torch.Tensor) -> None:
        # Checked before backward, so NaN gradients never reach the weights. The loss is read back for the
        # progress bar every step anyway, so this adds no host sync that was not already there.
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(
                f"Loss became {value} at step {self.global_step} (epoch {self.current_epoch}). "
                "Lower model.lr or set --trainer.gradient_clip_val."
            )


class ImageClassifier(ZooModule):
    """The evaluation side shared by the zoo's image classifiers; ``self.net`` maps ``(B, *in_shape)`` to logits.

    Subclasses save ``in_shape`` and ``num_classes`` as hyperparameters, build ``self.net``, call
    ``self.add_accuracy_metrics()``, and write their own ``training_step`` and optimiser. They get: ``forward`` with a
    shape check (a ``(x, y, ...)`` batch is accepted, its labels ignored), ``{val,test}/loss`` and
    ``{val,test}/accuracy`` (torchmetrics, synchronised across processes), and softmax ``predict_step`` outputs.

    Example:
        >>> class Linear(ImageClassifier):
        ...     def __init__(self, in_shape: list[int] = [1, 8, 8], num_classes: int = 10) -> None:
        ...         super().__init__()
        ...         self.save_hyperparameters()
        ...         self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
        ...         self.add_accuracy_metrics()
        >>> Linear()((torch.rand(4, 1, 8, 8), torch.zeros(4))).shape
        torch.Size([4, 10])
    """

    net: nn.Module

    def add_accuracy_metrics(self) -> None:
        """Register the validation and test accuracies (call in ``__init__``, after ``save_hyperparameters``)."""
        from torchmetrics.classification import MulticlassAccuracy

        classes = self.hparams.num_classes
        self.metrics = nn.ModuleDict({s: MulticlassAccuracy(classes, average="micro") for s in ("val", "test")})

    def forward(self, x: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """Logits ``(B, num_classes)``; a ``(x, y[, index])`` batch is accepted and its labels ignored."""
        if isinstance(x, (tuple, list)):
            x = x[0]
        expected = tuple(self.hparams.in_shape)
        if tuple(x.shape[1:]) != expected:
            raise ValueError(f"expected images of shape (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}")
        return self.net(x)

    def _evaluate(self, batch: tuple[Tensor, ...], stage: str) -> None:
        x, y = batch[0], batch[1]
        logits = self(x)
        self.metrics[stage].update(logits, y)
        self.log(f"{stage}/loss", nn.functional.cross_entropy(logits, y), batch_size=len(x), sync_dist=True)
        self.log(f"{stage}/accuracy", self.metrics[stage], prog_bar=True)

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self(batch).softmax(dim=-1)
