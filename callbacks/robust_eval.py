"""Natural and robust accuracy of a bare classifier and of a defended pipeline, under two threat models.

* ``nonadaptive``: the attack is crafted on the bare model only, and every model is scored on those images (the
  setting of prompt-defence papers' headline numbers);
* ``adaptive``: each defended model is attacked through itself (its selection made differentiable by the model:
  PAP's pipeline uses straight-through selection), the number that non-adaptive results overstate, and, where the
  model offers other views of itself (``adaptive_candidates()``), the worst case over those attacks too.

The module under evaluation says what to evaluate through ``robustness_models() -> dict[str, nn.Module]``: the key
``"bare"`` is the undefended classifier, every other key a defended model mapping [0, 1] images to logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from torch import Tensor

from zoo.attacks import make_attack

__all__ = ["RobustEvaluation", "robust_accuracies"]


@torch.no_grad()
def _correct(model: torch.nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return model(x).argmax(1) == y


def robust_accuracies(
    models: Mapping[str, torch.nn.Module],
    x: Tensor,
    y: Tensor,
    attacks: Sequence[str] = ("pgd",),
    eps: float = 8 / 255,
    alpha: float = 2 / 255,
    steps: int = 10,
    threats: Sequence[str] = ("nonadaptive", "adaptive"),
    seed: int | None = 0,
) -> dict[str, float]:
    """Natural and robust accuracy of every model on ``x`` (in [0, 1]) with labels ``y``.

    Keys: ``natural/{model}``; ``robust/{attack}/nonadaptive/{model}`` (every model on the bare model's adversarial
    images); ``robust/{attack}/adaptive/{model}`` (each defended model attacked through itself); and, for a defended
    model with ``adaptive_candidates()`` (other differentiable views of it, e.g. PAP's pipeline with each class's
    prompt forced), ``robust/{attack}/adaptive_worst/{model}``: an image counts only if the model classifies it right
    under its own attack and under the attack of every candidate, the worst case over them. ``models["bare"]`` is
    the undefended classifier. ``seed`` fixes the attacks' random starts (the caller's random state is left as it
    was), so that a model's robust accuracy is a number, not a draw; ``None`` uses the global random state.
    """
    if "bare" not in models:
        raise ValueError(f"models must include 'bare', got {sorted(models)}")
    bad = set(threats) - {"nonadaptive", "adaptive"}
    if bad:
        raise ValueError(f"unknown threat models {sorted(bad)}; choose 'nonadaptive' and/or 'adaptive'")
    # Every submodule's mode, restored after: defended models share layers with the bare one (and with each other)
    modes = {sub: sub.training for m in models.values() for sub in m.modules()}
    for m in models.values():
        m.eval()
    out = {f"natural/{name}": float(_correct(m, x, y).float().mean()) for name, m in models.items()}
    num_classes = int(models["bare"](x[:1]).shape[1])
    # Lightning evaluates under inference mode, where no gradient can be taken: the attacks leave it
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        x, y = x.clone(), y.clone()
        for attack in attacks:
            if "nonadaptive" in threats:
                x_adv = make_attack(models["bare"], attack, eps, alpha, steps, num_classes)(x, y)
                for name, m in models.items():
                    out[f"robust/{attack}/nonadaptive/{name}"] = float(_correct(m, x_adv, y).float().mean())
            if "adaptive" not in threats:
                continue
            for name, m in models.items():
                if name == "bare":
                    continue
                correct = _correct(m, make_attack(m, attack, eps, alpha, steps, num_classes)(x, y), y)
                out[f"robust/{attack}/adaptive/{name}"] = float(correct.float().mean())
                candidates = getattr(m, "adaptive_candidates", None)
                if callable(candidates):
                    for view in candidates():
                        correct &= _correct(m, make_attack(view, attack, eps, alpha, steps, num_classes)(x, y), y)
                    out[f"robust/{attack}/adaptive_worst/{name}"] = float(correct.float().mean())
    for sub, mode in modes.items():
        sub.training = mode
    return out


class RobustEvaluation(Callback):
    """Log ``{stage}/natural/{model}`` and ``{stage}/robust/{attack}/{threat}/{model}`` accuracies at the end of
    validation and test, on the first ``max_images`` images of the stage (attacks from :mod:`zoo.attacks`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Bare(LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        ...     def robustness_models(self):
        ...         return {"bare": self.net, "smoothed": nn.Sequential(nn.AvgPool2d(3, 1, 1), self.net)}
        >>> cb = RobustEvaluation(attacks=("pgd",), eps=0.1, alpha=0.025, steps=2)
        >>> scores = cb.evaluate(Bare(), torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,)))
        >>> sorted(scores)[:3]
        ['natural/bare', 'natural/smoothed', 'robust/pgd/adaptive/smoothed']
    """

    def __init__(
        self,
        attacks: tuple[str, ...] | list[str] = ("pgd",),
        eps: float = 8 / 255,
        alpha: float = 2 / 255,
        steps: int = 10,
        threats: tuple[str, ...] | list[str] = ("nonadaptive", "adaptive"),
        max_images: int = 500,
        stages: tuple[str, ...] | list[str] = ("test",),
        seed: int | None = 0,
    ) -> None:
        bad = set(threats) - {"nonadaptive", "adaptive"}
        if bad:
            raise ValueError(f"unknown threat models {sorted(bad)}; choose 'nonadaptive' and/or 'adaptive'")
        self.attacks, self.threats, self.stages = tuple(attacks), tuple(threats), tuple(stages)
        self.eps, self.alpha, self.steps, self.max_images, self.seed = eps, alpha, steps, max_images, seed
        self._x: list[Tensor] = []
        self._y: list[Tensor] = []

    @staticmethod
    def _models(pl_module: LightningModule) -> dict[str, torch.nn.Module]:
        if not hasattr(pl_module, "robustness_models"):
            raise TypeError(
                f"{type(pl_module).__name__} has no robustness_models(): return {{'bare': model, name: defended, ...}}"
            )
        models = pl_module.robustness_models()
        if "bare" not in models:
            raise ValueError(f"robustness_models() must include 'bare', got {sorted(models)}")
        return models

    def evaluate(self, pl_module: LightningModule, x: Tensor, y: Tensor) -> dict[str, float]:
        """Every accuracy for images ``x`` (in [0, 1]) with labels ``y``; keys without the stage prefix."""
        return robust_accuracies(
            self._models(pl_module), x, y, self.attacks, self.eps, self.alpha, self.steps, self.threats, self.seed
        )

    def _collect(self, batch: Any) -> None:
        if sum(len(y) for y in self._y) < self.max_images:
            self._x.append(batch[0].detach())
            self._y.append(batch[1].detach())

    def _finish(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage not in self.stages or not self._y or trainer.sanity_checking:
            self._x, self._y = [], []
            return
        x, y = torch.cat(self._x)[: self.max_images], torch.cat(self._y)[: self.max_images]
        self._x, self._y = [], []
        for key, value in self.evaluate(pl_module, x, y).items():
            pl_module.log(f"{stage}/{key}", value, sync_dist=True)

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if "val" in self.stages:
            self._collect(batch)

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if "test" in self.stages:
            self._collect(batch)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, pl_module, "test")
