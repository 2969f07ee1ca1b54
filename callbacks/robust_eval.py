"""Natural and robust accuracy of a bare classifier and of defended models, at the strength a defence paper's
reviewer asks for (attacks from :mod:`zoo.attacks`, the Adversarial Robustness Toolbox).

For each attack in ``attacks`` (by default APGD-CE, targeted APGD-DLR and the gradient-free Square attack):

* ``nonadaptive``: the attack is crafted on the bare model and every model is scored on those images (the setting of
  prompt-defence papers' headline numbers);
* ``adaptive``: each defended model is attacked end to end through its own forward (a non-differentiable step in it,
  such as PAP's label-driven prompt selection, is the model's to make differentiable: straight-through, i.e. BPDA
  with the identity); and through each *attack view* the model offers (``attack_views()``): differentiable
  surrogates an adaptive attacker would use (for PAP, the true class's prompt fixed, and the expectation over every
  class's prompt), the resulting images scored on the model itself;
* ``robust/worst/{model}``: an image counts only if the model classifies it right under every attack and view
  above: the worst case per image, the number a defence is judged by. Square, which needs no gradient, is the check
  that a low number is not gradient masking.

The module under evaluation says what to evaluate through ``robustness_models() -> dict[str, nn.Module]``: the key
``"bare"`` is the undefended classifier, every other key a defended model mapping [0, 1] images to logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from torch import Tensor, nn

from zoo.attacks import ATTACKS, make_attack

__all__ = ["FULL", "QUICK", "RobustEvaluation", "robust_accuracies"]

THREATS = ("nonadaptive", "adaptive")
#: The field's strength (the full runs, ``zoo publish``): 100 steps, 3 restarts, all 9 targets, 1,000 Square queries.
FULL = {"steps": 100, "restarts": 3, "targets": 9, "queries": 1000}
#: The test suite's: the same attacks, shorter.
QUICK = {"steps": 20, "restarts": 1, "targets": 3, "queries": 200}


@torch.no_grad()
def _correct(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return model(x).argmax(1) == y


def _views(model: nn.Module) -> dict[str, nn.Module | Sequence[nn.Module]]:
    views = getattr(model, "attack_views", None)
    return dict(views()) if callable(views) else {}


def robust_accuracies(
    models: Mapping[str, nn.Module],
    x: Tensor,
    y: Tensor,
    attacks: Sequence[str] = ("apgd-ce", "apgd-t", "square"),
    eps: float = 8 / 255,
    alpha: float = 2 / 255,
    steps: int = FULL["steps"],
    threats: Sequence[str] = THREATS,
    seed: int | None = 0,
    restarts: int = FULL["restarts"],
    targets: int = FULL["targets"],
    queries: int = FULL["queries"],
    cascade: bool = False,
    view_attacks: Sequence[str] = ("apgd-ce",),
) -> dict[str, float]:
    """Natural and robust accuracy of every model on ``x`` (in [0, 1]) with labels ``y``, as fractions.

    Keys: ``natural/{model}``; ``robust/{attack}/nonadaptive/{model}`` (every model on the bare model's adversarial
    images); ``robust/{attack}/adaptive/{model}`` (each defended model attacked end to end);
    ``robust/{attack}/{view}/{model}`` (attacked through each of the model's ``attack_views()``: a module, or one
    module per class, image ``i`` then attacked through ``view[y[i]]``; with the attacks in ``view_attacks`` that are
    also in ``attacks``); and
    ``robust/worst/{model}``, the worst case per image over all of them (for the bare model: over its attacks).

    With ``cascade`` each attack only runs on the images every earlier one left correct (AutoAttack's order: the
    non-adaptive transfer, then each attack end to end and through the views): the worst case is the same, found
    at a fraction of the cost, and the per-attack keys are left out (they would be upper bounds).

    ``seed`` fixes the attacks' random starts (the caller's random state is left as it was), so that a model's robust
    accuracy is a number, not a draw; every submodule's train/eval mode is restored after.
    """
    if "bare" not in models:
        raise ValueError(f"models must include 'bare', got {sorted(models)}")
    bad = set(threats) - set(THREATS)
    if bad:
        raise ValueError(f"unknown threat models {sorted(bad)}; choose 'nonadaptive' and/or 'adaptive'")
    unknown = [a for a in attacks if a not in ATTACKS]
    if unknown or not attacks:
        raise ValueError(f"attacks must be a non-empty list of {ATTACKS}, got {list(attacks)}")
    if x.dim() < 2 or y.shape != (len(x),) or not len(x):
        raise ValueError(f"expected a non-empty batch of images and one label each, got {tuple(x.shape)}, "
                         f"{tuple(y.shape)}")  # fmt: skip
    # Every submodule's mode, restored after: defended models share layers with the bare one (and with each other)
    modes = {sub: sub.training for m in models.values() for sub in m.modules()}
    for m in models.values():
        m.eval()

    def attack(target: nn.Module | Sequence[nn.Module], name: str, scored: nn.Module, rows: Tensor) -> Tensor:
        """Which of ``rows`` ``scored`` still gets right after ``name`` on ``target`` (one module per class: each
        image through its own class's)."""
        correct = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        if isinstance(target, nn.Module):
            groups = [(target, rows)]
        else:
            groups = [(target[k], rows & (y == k)) for k in range(len(target))]
        for module, mask in groups:
            if mask.any():
                idx = mask.nonzero().flatten()
                x_adv = make_attack(module, name, **settings)(x[idx], y[idx])
                correct[idx] = _correct(scored, x_adv, y[idx])
        return correct

    # Lightning evaluates under inference mode, where no gradient can be taken: the attacks leave it. ART draws from
    # numpy (seeded per attack); torch's generator is forked so that the caller's state is left as it was
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.inference_mode(False), torch.enable_grad(), torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.manual_seed(seed)
        x, y = x.clone(), y.clone()
        out = {f"natural/{name}": float(_correct(m, x, y).float().mean()) for name, m in models.items()}
        num_classes = int(models["bare"](x[:1]).shape[1])
        settings = {"eps": eps, "alpha": alpha, "steps": steps, "num_classes": num_classes, "restarts": restarts,
                    "targets": targets, "queries": queries, "seed": seed}  # fmt: skip
        worst = {name: _correct(m, x, y) for name, m in models.items()}
        everyone = torch.ones(len(x), dtype=torch.bool, device=x.device)
        for name in attacks:  # the bare model, and the non-adaptive transfer of its examples
            rows = worst["bare"] if cascade else everyone
            x_adv = x.clone()
            if rows.any():
                idx = rows.nonzero().flatten()
                x_adv[idx] = make_attack(models["bare"], name, **settings)(x[idx], y[idx])
            for model_name, m in models.items():
                if model_name != "bare" and "nonadaptive" not in threats:
                    continue
                correct = _correct(m, x_adv, y)
                worst[model_name] &= correct
                if not cascade:
                    out[f"robust/{name}/nonadaptive/{model_name}"] = float(correct.float().mean())
        if "adaptive" in threats:
            for model_name, m in models.items():
                if model_name == "bare":
                    continue
                targets_ = [("adaptive", m)] + [(v, t) for v, t in _views(m).items()]
                for name in attacks:
                    for view, target in targets_:
                        if view != "adaptive" and name not in view_attacks:
                            continue  # a surrogate's gradient is nothing to Square; APGD-CE on it is the usual check
                        correct = attack(target, name, m, worst[model_name] if cascade else everyone)
                        worst[model_name] &= correct
                        if not cascade:
                            out[f"robust/{name}/{view}/{model_name}"] = float(correct.float().mean())
    for model_name, correct in worst.items():
        out[f"robust/worst/{model_name}"] = float(correct.float().mean())
    for sub, mode in modes.items():
        sub.training = mode
    return out


class RobustEvaluation(Callback):
    """Log ``{stage}/natural/{model}``, ``{stage}/robust/{attack}/{threat or view}/{model}`` and
    ``{stage}/robust/worst/{model}`` accuracies at the end of validation and test, on the first ``max_images``
    images of the stage (:func:`robust_accuracies`; the defaults are the field's strength, :data:`FULL`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Bare(LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        ...     def robustness_models(self):
        ...         return {"bare": self.net, "smoothed": nn.Sequential(nn.AvgPool2d(3, 1, 1), self.net)}
        >>> cb = RobustEvaluation(attacks=("pgd",), eps=0.1, alpha=0.025, steps=2, restarts=1)
        >>> scores = cb.evaluate(Bare(), torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,)))
        >>> sorted(scores)[:3]
        ['natural/bare', 'natural/smoothed', 'robust/pgd/adaptive/smoothed']
    """

    def __init__(
        self,
        attacks: tuple[str, ...] | list[str] = ("apgd-ce", "apgd-t", "square"),
        eps: float = 8 / 255,
        alpha: float = 2 / 255,
        steps: int = FULL["steps"],
        threats: tuple[str, ...] | list[str] = THREATS,
        max_images: int = 500,
        stages: tuple[str, ...] | list[str] = ("test",),
        seed: int | None = 0,
        restarts: int = FULL["restarts"],
        targets: int = FULL["targets"],
        queries: int = FULL["queries"],
        cascade: bool = False,
        view_attacks: tuple[str, ...] | list[str] = ("apgd-ce",),
    ) -> None:
        bad = set(threats) - set(THREATS)
        if bad:
            raise ValueError(f"unknown threat models {sorted(bad)}; choose 'nonadaptive' and/or 'adaptive'")
        unknown = [a for a in attacks if a not in ATTACKS]
        if unknown or not attacks:
            raise ValueError(f"attacks must be a non-empty list of {ATTACKS}, got {list(attacks)}")
        for arg, value in (("steps", steps), ("restarts", restarts), ("targets", targets), ("queries", queries),
                           ("max_images", max_images)):  # fmt: skip
            if int(value) < 1:
                raise ValueError(f"{arg} must be at least 1, got {value}")
        self.attacks, self.threats, self.stages = tuple(attacks), tuple(threats), tuple(stages)
        self.eps, self.alpha, self.steps, self.max_images, self.seed = eps, alpha, steps, max_images, seed
        self.restarts, self.targets, self.queries, self.cascade = restarts, targets, queries, cascade
        self.view_attacks = tuple(view_attacks)
        self._x: list[Tensor] = []
        self._y: list[Tensor] = []

    @staticmethod
    def _models(pl_module: LightningModule) -> dict[str, nn.Module]:
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
            self._models(pl_module), x, y, self.attacks, self.eps, self.alpha, self.steps, self.threats, self.seed,
            self.restarts, self.targets, self.queries, self.cascade, self.view_attacks,
        )  # fmt: skip

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
