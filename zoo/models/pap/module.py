"""PAP's Lightning modules: the PGD adversarially trained base classifier and the prompt learner on top of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from zoo.arguments import check_choice, check_interval, check_range
from zoo.attacks import make_attack
from zoo.models.pap.attacks import PromptedPipeline
from zoo.models.pap.prompt import PhaseAmplitudePrompt
from zoo.models.pap.training import (
    SignSGD,
    lambda_counts,
    lr_drop_milestone,
    pap_loss,
    predict_with_prompts,
    update_lambda,
)
from zoo.models.snn_ecl.backbones import build_backbone
from zoo.module import ImageClassifier

__all__ = ["AdversarialClassifier", "PAPModule", "build_base_net"]


def build_base_net(backbone: str, in_shape: list[int], num_classes: int) -> nn.Module:
    """The base classifier's network: ``card_cnn`` is the card's §6 digits CNN (conv 1→16→32, 3×3, average pooling,
    FC 64, FC K); ``cnn_small`` and the CIFAR ``resnet18`` are the zoo's ReLU backbones.

    >>> build_base_net("card_cnn", [1, 8, 8], 10)(torch.rand(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """
    c, h, w = in_shape
    if backbone == "card_cnn":
        return nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * (h // 2) * (w // 2), 64), nn.ReLU(),
            nn.Linear(64, num_classes),
        )  # fmt: skip
    return build_backbone(backbone, list(in_shape), num_classes, nn.ReLU)


def _check_base_args(backbone: str, in_shape: list[int], num_classes: int, name: str = "backbone") -> None:
    check_choice(name, backbone, ("card_cnn", "cnn_small", "resnet18"))
    if len(in_shape) != 3 or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in in_shape):
        raise ValueError(f"Expected argument `in_shape` to be [C, H, W] of positive ints, but got {in_shape!r}.")
    check_range("num_classes", num_classes, 2, integer=True)


def _check_attack_args(eps: float, alpha: float, attack_steps: int) -> None:
    check_range("eps", eps, 0, 1, low_open=True)
    check_range("alpha", alpha, 0, low_open=True)
    check_range("attack_steps", attack_steps, 1, integer=True)


class AdversarialClassifier(ImageClassifier):
    """A classifier trained by PGD adversarial training (Madry et al.): each batch is replaced by its L∞ PGD
    examples (ART) (random start) against the current weights. PAP's frozen base (the ``pap-base`` entry).

    Inputs are images in [0, 1]; any normalisation belongs inside ``net``.

    Example:
        >>> model = AdversarialClassifier(eps=0.1, alpha=0.025, attack_steps=2)
        >>> model(torch.rand(3, 1, 8, 8)).shape
        torch.Size([3, 10])
    """

    def __init__(
        self,
        backbone: Literal["card_cnn", "cnn_small", "resnet18"] = "card_cnn",
        in_shape: list[int] = [1, 8, 8],  # noqa: B006 - jsonargparse and the hub config need a plain list
        num_classes: int = 10,
        eps: float = 0.1,
        alpha: float = 0.025,
        attack_steps: int = 5,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        _check_base_args(backbone, in_shape, num_classes)
        _check_attack_args(eps, alpha, attack_steps)
        check_range("lr", lr, 0, low_open=True)
        check_range("weight_decay", weight_decay, 0)
        self.save_hyperparameters()
        self.net = build_base_net(backbone, list(in_shape), num_classes)
        self.add_accuracy_metrics()
        self._pgd: Any = None

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y = batch[0], batch[1]
        hp = self.hparams
        if self._pgd is None:  # built once; the attack puts every submodule back in its mode after
            self._pgd = make_attack(self.net, "pgd", hp.eps, hp.alpha, hp.attack_steps, hp.num_classes)
        x_adv = self._pgd(x, y)
        loss = nn.functional.cross_entropy(self.net(x_adv), y)
        self.log_train({"train/loss": loss}, batch_idx, batch_size=len(x))
        return loss

    def robustness_models(self) -> dict[str, nn.Module]:
        """The bare network, for :class:`callbacks.robust_eval.RobustEvaluation` (natural and PGD accuracy)."""
        return {"bare": self.net}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def load_base_state(net: nn.Module, path: str | Path) -> None:
    """Load a user's state dict for the base from a safetensors file (never a pickle), exactly."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no base weights at {path}: pass a safetensors state dict of the base network")
    if path.suffix != ".safetensors":
        raise ValueError(f"{path} is not a .safetensors file: the zoo never unpickles weights")
    _load_net_state(net, load_file(str(path)), str(path))


def load_base_entry(net: nn.Module, base: str, backbone: str, in_shape: list[int], num_classes: int) -> None:
    """Load the network of a published :class:`AdversarialClassifier` (hub name such as ``"pap-base"``, or its
    folder) from its checksum-verified safetensors; its backbone, input shape and class count must be these."""
    from safetensors.torch import load_file

    from zoo import hub

    folder = hub.find(base)
    config = hub.read_config(folder)
    hub.verify_checksums(folder, config)
    theirs = {"backbone": config.get("backbone"), "in_shape": config.get("in_shape"),
              "num_classes": config.get("num_classes")}  # fmt: skip
    ours = {"backbone": backbone, "in_shape": list(in_shape), "num_classes": num_classes}
    if theirs != ours:
        raise ValueError(f"base={base!r} is a {theirs} classifier, but this PAPModule is built for {ours}")
    _load_net_state(net, load_file(str(folder / hub.WEIGHTS)), str(folder))


def _load_net_state(net: nn.Module, state: dict[str, Tensor], where: str) -> None:
    """Load ``state`` (keys with or without the ``net.`` prefix of a saved classifier) into ``net``, every key."""
    state = {k.removeprefix("net."): v for k, v in state.items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where} does not fit the base network: missing {missing[:5]}, unexpected {unexpected[:5]}")


class PAPModule(ImageClassifier):
    """Phase- and amplitude-aware prompts learned on a frozen base classifier (card §2).

    Each training batch is attacked on the bare base (PGD, ART), both prompted with the true label's
    prompts, and the prompts take one signed step on the card's loss; the learning rate drops tenfold at 75 % of
    ``max_epochs`` and λ is multiplied by acc_A / acc_Φ every ``lambda_every`` epochs (clamped). The base never
    trains and stays in eval mode. At test time the prompt of the base's own prediction is applied (§2.4).

    Args:
        base_backbone, in_shape, num_classes: the base network (see :func:`build_base_net`).
        base: a published base classifier to start from (hub name, ``"pap-base"``, or its folder).
        base_weights: or a user's safetensors state dict of the base network (e.g. a CIFAR ResNet-18). With neither,
            the module keeps the weights it is given (the ``pap`` hub entry stores base and prompts together).
        eps, alpha, attack_steps: the PGD attack of training and of λ's update.
        exp_l1_weight: 5000 at CIFAR scale; the embedded defaults scale it by the batch's element count (the card's
            §6 rule, an empirical choice per its Review notes): 26 for digits, 78.125 for the 3×8×8 photo patches.
        lambda_fixed: keep λ at 1 (the card's ablation).

    Example:
        >>> model = PAPModule(attack_steps=2)
        >>> model(torch.rand(3, 1, 8, 8)).shape
        torch.Size([3, 10])
    """

    def __init__(
        self,
        base_backbone: Literal["card_cnn", "cnn_small", "resnet18"] = "card_cnn",
        in_shape: list[int] = [1, 8, 8],  # noqa: B006 - jsonargparse and the hub config need a plain list
        num_classes: int = 10,
        base: str | None = None,
        base_weights: str | None = None,
        eps: float = 0.1,
        alpha: float = 0.025,
        attack_steps: int = 10,
        lr: float = 0.3,
        lr_drop_at: float = 0.75,
        exp_l1_weight: float = 26.0,
        cw_weight: float = 4.0,
        cw_margin: float = -0.1,
        nat_weight: float = 1.0,
        lambda_every: int = 5,
        lambda_fixed: bool = False,
        lambda_clamp: tuple[float, float] | None = (0.1, 10.0),
        lambda_images: int = 512,
    ) -> None:
        super().__init__()
        _check_base_args(base_backbone, in_shape, num_classes, "base_backbone")
        _check_attack_args(eps, alpha, attack_steps)
        check_range("lr", lr, 0, low_open=True)
        check_range("lr_drop_at", lr_drop_at, 0, 1, low_open=True)
        for name, weight in (("exp_l1_weight", exp_l1_weight), ("cw_weight", cw_weight), ("nat_weight", nat_weight)):
            check_range(name, weight, 0)
        check_range("cw_margin", cw_margin)
        check_range("lambda_every", lambda_every, 1, integer=True)
        check_range("lambda_images", lambda_images, 1, integer=True)
        if lambda_clamp is not None:
            check_interval("lambda_clamp", lambda_clamp, low=0)
            check_range("lambda_clamp[0]", lambda_clamp[0], 0, low_open=True)
        self.save_hyperparameters()
        self.base = build_base_net(base_backbone, list(in_shape), num_classes)
        if base is not None and base_weights is not None:
            raise ValueError("give base (a hub entry) or base_weights (a safetensors file), not both")
        if base is not None:
            load_base_entry(self.base, base, base_backbone, list(in_shape), num_classes)
        if base_weights is not None:
            load_base_state(self.base, base_weights)
        self.base.requires_grad_(False).eval()
        self.prompt = PhaseAmplitudePrompt(num_classes, tuple(in_shape))
        self.add_accuracy_metrics()  # {val,test}/accuracy: the defended pipeline's natural accuracy
        self.register_buffer("exemplars_set", torch.zeros(num_classes, dtype=torch.bool))
        self._lambda_x: list[Tensor] = []
        self._lambda_y: list[Tensor] = []
        self.generator = torch.Generator().manual_seed(0)
        self._pgd: Any = None
        self._exemplars_done = False  # a loaded entry has its buffer set; the first step then finds nothing to do

    def train(self, mode: bool = True) -> PAPModule:
        """Lightning calls ``train()`` on the whole module; the frozen base stays in eval mode (BatchNorm, dropout)."""
        super().train(mode)
        self.base.eval()
        return self

    def forward(self, x: Tensor | tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """The defended pipeline's logits: the base's prediction picks the prompt, then the base classifies."""
        if isinstance(x, (tuple, list)):
            x = x[0]
        return predict_with_prompts(self.base, self.prompt, x)

    def robustness_models(self) -> dict[str, nn.Module]:
        """The bare base and the defended pipeline, for :class:`callbacks.robust_eval.RobustEvaluation`."""
        return {"bare": self.base, "pap": PromptedPipeline(self.base, self.prompt)}

    def _attack(self, x: Tensor, y: Tensor) -> Tensor:
        hp = self.hparams
        if self._pgd is None:
            self._pgd = make_attack(self.base, "pgd", hp.eps, hp.alpha, hp.attack_steps, hp.num_classes)
        with torch.enable_grad():
            return self._pgd(x, y)

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y = batch[0], batch[1]
        if not self._exemplars_done:  # exemplar init: the first image of each class met (a Python flag: no sync)
            todo = (~self.exemplars_set).nonzero().flatten().tolist()
            self.exemplars_set[self.prompt.init_from_exemplars(x, y, classes=todo)] = True
            self._exemplars_done = bool(self.exemplars_set.all())
        x_adv = self._attack(x, y)
        hp = self.hparams
        loss, terms = pap_loss(
            self.base, self.prompt, x, x_adv, y, hp.exp_l1_weight, hp.cw_weight, hp.cw_margin, hp.nat_weight,
            generator=self.generator,
        )  # fmt: skip
        if len(self._lambda_y) * len(x) < hp.lambda_images:  # a fixed training subset for λ's update
            self._lambda_x.append(x.detach())
            self._lambda_y.append(y.detach())
        self.log("train/loss", loss, prog_bar=True, batch_size=len(x))
        self.log_dict({f"train/{k}": v for k, v in terms.items()}, on_step=False, on_epoch=True, batch_size=len(x))
        return loss

    def on_train_epoch_end(self) -> None:
        epoch, hp = self.current_epoch + 1, self.hparams
        if hp.lambda_fixed or epoch % hp.lambda_every or not self._lambda_y:
            self.log("train/lambda", self.prompt.lambda_amp)
            return
        x = torch.cat(self._lambda_x)[: hp.lambda_images]
        y = torch.cat(self._lambda_y)[: hp.lambda_images]
        x_adv = self._attack(x, y)  # fresh PGD examples, true labels (card §2.3)
        new, updated = update_lambda(
            float(self.prompt.lambda_amp), *lambda_counts(self.base, self.prompt, x_adv, y), hp.lambda_clamp
        )
        self.prompt.lambda_amp.fill_(new)
        self.log_dict({"train/lambda": new, "train/lambda_updated": float(updated)})

    def configure_optimizers(self) -> dict[str, Any]:
        opt = SignSGD(self.prompt.parameters(), lr=self.hparams.lr)
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 100
        sched = torch.optim.lr_scheduler.MultiStepLR(
            opt, milestones=[lr_drop_milestone(self.hparams.lr_drop_at, epochs)], gamma=0.1
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
