"""``ZooModule``: the LightningModule base every paper subclasses, giving hub I/O and a NaN guard."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import PyTorchModelHubMixin
from lightning import LightningModule

__all__ = ["ZooModule"]


class ZooModule(LightningModule, PyTorchModelHubMixin, library_name="zoo", tags=["zoo"]):
    """LightningModule with safe hub I/O (``save_pretrained`` / ``from_pretrained``) and a NaN-loss stop.

    ``PyTorchModelHubMixin`` records the JSON-serialisable ``__init__`` arguments as ``config.json`` and the
    weights as ``model.safetensors``; local folders and Hugging Face Hub repos work alike. The zoo tightens
    its loading: ``config.json`` is required, every weight file's sha256 (recorded under ``config["zoo"]``)
    is checked before use, the state dict must match exactly, and a pickle file is never read.

    Subclasses call ``self.save_hyperparameters()`` and take JSON-serialisable init arguments only.
    A ``training_step`` returning a non-finite loss stops training with the step number.
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
        hub.verify_checksums(folder, config)
        model = cls(**model_kwargs)
        hub.load_weights(model, folder, map_location=map_location, strict=strict)
        return model.eval()

    def on_before_backward(self, loss: torch.Tensor) -> None:
        # Checked before backward, so NaN gradients never reach the weights. The loss is read back for the
        # progress bar every step anyway, so this adds no host sync that was not already there.
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(
                f"Loss became {value} at step {self.global_step} (epoch {self.current_epoch}). "
                "Lower model.lr or set --trainer.gradient_clip_val."
            )
