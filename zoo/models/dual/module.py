"""``DualClassifier``: the classifier DUAL scores and prunes for, with the official schedule (cosine per iteration)."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor, nn

from zoo.module import ImageClassifier

__all__ = ["DualClassifier", "build_backbone", "cosine_schedule"]


def build_backbone(backbone: str, in_shape: list[int], num_classes: int, hidden: list[int] | None = None) -> nn.Module:
    """``"mlp"`` (flattened input, ReLU; the card's digits model 64-256-128-10) or ``"resnet18_cifar"``.

    ``resnet18_cifar`` is torchvision's ResNet-18 with the CIFAR stem of the official code (3×3 stride-1 first
    convolution, no max-pool).
    """
    if backbone == "mlp":
        widths = [math.prod(in_shape), *(hidden or [256, 128])]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], num_classes))
    if backbone == "resnet18_cifar":
        import torchvision

        net = torchvision.models.resnet18(num_classes=num_classes)
        net.conv1 = nn.Conv2d(in_shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        return net
    raise ValueError(f"unknown backbone {backbone!r}; choose 'mlp' or 'resnet18_cifar'")


def cosine_schedule(opt: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Cosine from the peak learning rate to 0 over ``total_steps`` optimiser steps, flat at 0 after (stepped per
    iteration, as the official DUAL code)."""
    total = max(total_steps, 1)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total)))


class DualClassifier(ImageClassifier):
    """An image classifier trained with DUAL's recipe: SGD (Nesterov, wd 5e-4), cosine stepped every iteration.

    The cosine schedule is built for ``schedule_epochs`` (200 in the paper) whatever the Trainer's ``max_epochs``:
    the scoring run records the first T = 30 epochs of that long schedule (``callbacks.TrainingDynamics`` stops it),
    while the learning rate is still high. ``training_step`` returns ``{"loss", "logits"}``, the interface of the
    training-dynamics callback; batches are ``(x, y, index)``.

    Args:
        backbone: ``"mlp"`` or ``"resnet18_cifar"``.
        in_shape: shape of one image ``[C, H, W]``.
        num_classes: classes.
        hidden: MLP widths.
        lr: peak learning rate.
        momentum: SGD momentum.
        nesterov: Nesterov momentum.
        weight_decay: L2 weight decay.
        schedule_epochs: length of the cosine schedule in epochs (None: the Trainer's own length).

    Example:
        >>> model = DualClassifier()
        >>> model(torch.rand(4, 1, 8, 8)).shape
        torch.Size([4, 10])
    """

    def __init__(
        self,
        backbone: Literal["mlp", "resnet18_cifar"] = "mlp",
        in_shape: list[int] = [1, 8, 8],  # noqa: B006 - jsonargparse and the hub config need a plain list
        num_classes: int = 10,
        hidden: list[int] | None = None,
        lr: float = 0.05,
        momentum: float = 0.9,
        nesterov: bool = True,
        weight_decay: float = 5e-4,
        schedule_epochs: int | None = 200,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = build_backbone(backbone, list(in_shape), num_classes, hidden)
        self.add_accuracy_metrics()

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> dict[str, Tensor]:
        x, y = batch[0], batch[1]
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.log_train({"train/loss": loss}, batch_idx, batch_size=len(x))
        return {"loss": loss, "logits": logits.detach()}

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        opt = torch.optim.SGD(
            self.parameters(), lr=hp.lr, momentum=hp.momentum, nesterov=hp.nesterov, weight_decay=hp.weight_decay
        )
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        if hp.schedule_epochs is not None and self.trainer.max_epochs and self.trainer.max_epochs > 0:
            total = math.ceil(total / self.trainer.max_epochs) * hp.schedule_epochs  # per-epoch steps × the long run
        sched = cosine_schedule(opt, total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def card_notes(self) -> str:
        return (
            "The subset was chosen by the DataModule (see Data above): DUAL scores every training sample from the "
            "first 30 epochs of a 200-epoch scoring run, then keeps (1 − r) of the set by the ratio-adaptive Beta "
            "sampling (c_D = 4). `zoo reproduce dual` compares DUAL + β with the paper's baselines (EL2N, forgetting, "
            "AUM, entropy, Dyn-Unc, TDDS, CCS), its ablations and random subsets at r = 0.5-0.9, with and without "
            "label noise. A small MLP on the embedded digits: a working example, "
            "not the paper's CIFAR or ImageNet ResNets."
        )
