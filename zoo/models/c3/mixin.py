"""``C3Regularized``: the plug-in that adds C³R to any multi-modal LightningModule.

The interface a host offers (checked in ``setup``, so a missing piece fails before the first step):

* ``self.head``: an ``nn.Module`` mapping the fused representation ``(B, d)`` to class logits ``(B, C)``;
* ``self.c3``: a :class:`~zoo.models.c3.regularizer.C3Regularizer` (or ``None`` to train the plain host), built in
  ``__init__`` so its instrument weights are optimised and saved with the host's;
* in ``training_step``: ``loss = task_loss + self.c3_loss(features, z, y)``, with the per-modality features
  ``[(B, d), ...]`` and the fused ``z`` ``(B, d)`` the head reads (not detached: C³R trains the encoders too).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from zoo.models.c3.regularizer import C3Regularizer
    >>> from zoo.module import ZooModule
    >>> class Host(C3Regularized, ZooModule):
    ...     def __init__(self) -> None:
    ...         super().__init__()
    ...         self.enc = nn.ModuleList([nn.Linear(5, 8), nn.Linear(7, 8)])
    ...         self.head, self.c3 = nn.Linear(8, 3), C3Regularizer(dim=8)
    >>> host = Host()
    >>> feats = [host.enc[0](torch.randn(4, 5)), host.enc[1](torch.randn(4, 7))]
    >>> host.c3_loss(feats, feats[0] + feats[1], torch.tensor([0, 1, 2, 0])).ndim
    0
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from zoo.models.c3.regularizer import C3Regularizer

__all__ = ["C3Regularized"]


class C3Regularized:
    """Mixin for a LightningModule (list it before the LightningModule base): ``c3_loss`` and the interface check."""

    def setup(self, stage: str) -> None:
        head, c3 = getattr(self, "head", None), getattr(self, "c3", "missing")
        name = type(self).__name__
        if not isinstance(head, nn.Module):
            raise TypeError(f"C3Regularized needs `{name}.head`, an nn.Module from the fused representation (B, d) to "
                            f"logits (B, C), got {type(head).__name__}. Add it, or drop the mixin.")  # fmt: skip
        if c3 is not None and not isinstance(c3, C3Regularizer):
            raise TypeError(f"C3Regularized needs `{name}.c3`, a C3Regularizer built in __init__ (or None for the "
                            f"plain host), got {type(c3).__name__}.")  # fmt: skip
        super().setup(stage)  # type: ignore[misc]

    def c3_loss(self, features: Sequence[Tensor], z: Tensor, y: Tensor) -> Tensor:
        """The weighted C³R loss of one training batch (0 for the plain host); logs ``train/<term>`` of every term."""
        c3: C3Regularizer | None = getattr(self, "c3", None)
        if c3 is None:
            return z.new_zeros(())
        sizes = {len(h) for h in features} | {len(z), len(y)}
        if len(sizes) != 1:
            raise ValueError(f"C³R needs every modality, Z and the labels to share the batch size, got modalities "
                             f"{[len(h) for h in features]}, Z {len(z)}, labels {len(y)}")  # fmt: skip
        loss, metrics = c3(features, z, self.head, y)  # type: ignore[attr-defined]
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, batch_size=len(y))  # type: ignore[attr-defined]
        return loss
