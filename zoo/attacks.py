"""L∞ evasion attacks from the Adversarial Robustness Toolbox (ART, never hand-written), for any model that maps
[0, 1] images to logits.

ART (``adversarial-robustness-toolbox``) is maintained, installs with its dependencies, and has the attacks a
defence paper's reviewer asks for: PGD with random restarts (Madry et al.), APGD with the cross-entropy and the
targeted difference-of-logits-ratio losses (Croce & Hein 2020, the gradient half of AutoAttack) and the
gradient-free Square attack (Andriushchenko et al. 2020, AutoAttack's check for masked gradients). torchattacks,
the PAP reference script's library, pins ``requests~=2.25.1`` and could only be installed with ``--no-deps``.

:func:`make_attack` returns ``attack(x, y) -> x_adv`` on torch tensors. ART draws its random starts and Square's
proposals from numpy's global generator: each call seeds it from the attack's own generator and restores it after,
so an attack made with a seed gives the same images every run and leaves the caller's random state alone.

``apgd-t`` runs targeted APGD on the DLR loss once per target class, the ``targets`` classes with the highest clean
logits after the true one, each on the images still classified right (AutoAttack's APGD-T schedule). ART's targeted
DLR is its untargeted DLR with the target label, minimised: −(z_t − max_{i≠t} z_i) / (z_π1 − z_π3).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["ATTACKS", "Attack", "make_attack"]

ATTACKS = ("pgd", "apgd-ce", "apgd-t", "square")


def _art() -> Any:
    try:
        from art.attacks import evasion
        from art.estimators.classification import PyTorchClassifier
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the zoo's adversarial attacks come from the Adversarial Robustness Toolbox: "
            "pip install adversarial-robustness-toolbox (it is in the zoo's install_requires)"
        ) from err
    return evasion, PyTorchClassifier


class Attack:
    """An L∞ attack on ``model`` at budget ``eps``: ``attack(x, y)`` returns adversarial images in the ε-ball around
    ``x`` (in [0, 1]) for the labels ``y``. Made by :func:`make_attack`."""

    def __init__(
        self,
        model: nn.Module,
        name: str,
        eps: float,
        alpha: float,
        steps: int,
        num_classes: int,
        restarts: int,
        targets: int,
        queries: int,
        seed: int | None,
    ) -> None:
        self.model, self.name, self.eps, self.alpha, self.steps = model, name, float(eps), float(alpha), int(steps)
        self.num_classes, self.restarts, self.targets, self.queries = int(num_classes), restarts, targets, queries
        self.rng = np.random.default_rng(seed)
        self._built: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def __repr__(self) -> str:
        return (
            f"Attack({self.name!r}, eps={self.eps:g}, alpha={self.alpha:g}, steps={self.steps}, "
            f"restarts={self.restarts}, targets={self.targets}, queries={self.queries})"
        )

    def _build(self, shape: tuple[int, ...], device: torch.device) -> tuple[Any, Any]:
        """ART's classifier around the model, and the attack on it (built once per input shape and device)."""
        key = (shape, str(device))
        if key in self._built:
            return self._built[key]
        evasion, PyTorchClassifier = _art()
        clf = PyTorchClassifier(
            self.model, nn.CrossEntropyLoss(), input_shape=shape, nb_classes=self.num_classes, clip_values=(0.0, 1.0),
            device_type="gpu" if device.type == "cuda" else "cpu",
        )  # fmt: skip
        common = {"norm": np.inf, "eps": self.eps, "batch_size": 4096, "verbose": False}
        if self.name == "pgd":
            attack = evasion.ProjectedGradientDescentPyTorch(
                clf, eps_step=self.alpha, max_iter=self.steps, num_random_init=self.restarts, **common
            )
        elif self.name in ("apgd-ce", "apgd-t"):
            # APGD's first step is 2ε (AutoAttack's); its step size then adapts per image
            # APGD-T starts once per target class (AutoAttack's standard schedule): its targets are its restarts
            attack = evasion.AutoProjectedGradientDescent(
                clf, eps_step=2 * self.eps, max_iter=self.steps,
                nb_random_init=self.restarts if self.name == "apgd-ce" else 1,
                targeted=self.name == "apgd-t",
                loss_type="cross_entropy" if self.name == "apgd-ce" else "difference_logits_ratio", **common,
            )  # fmt: skip
        else:
            attack = evasion.SquareAttack(clf, max_iter=self.queries, nb_restarts=self.restarts, p_init=0.8, **common)
        self._built[key] = (clf, attack)
        return clf, attack

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        if x.dim() < 2 or y.shape != (len(x),):
            raise ValueError(f"expected images (B, ...) and one label each, got {tuple(x.shape)} and {tuple(y.shape)}")
        if not len(x):
            return x.clone()
        if not bool(torch.isfinite(x).all()) or float(x.min()) < 0 or float(x.max()) > 1:
            raise ValueError("images to attack must be finite and lie in [0, 1]: the attacks' ε assumes unnormalised "
                             "images; put any normalisation inside the model")  # fmt: skip
        # ART switches the model to eval mode and leaves it there: restore every submodule's mode after
        modes = {m: m.training for m in self.model.modules()}
        state = np.random.get_state()
        np.random.seed(int(self.rng.integers(2**31 - 1)))
        try:
            clf, attack = self._build(tuple(x.shape[1:]), x.device)
            xs = x.detach().cpu().float().numpy()
            ys = y.detach().cpu().numpy().astype(np.int64)
            x_adv = self._targeted(clf, attack, xs, ys) if self.name == "apgd-t" else attack.generate(xs, ys)
        finally:
            np.random.set_state(state)
            for m, mode in modes.items():
                m.training = mode
        x_adv = torch.from_numpy(np.asarray(x_adv, dtype=np.float32)).to(device=x.device, dtype=x.dtype)
        # float32 round-off in ART's projection can leave a pixel 1 ulp outside the ball
        return torch.minimum(torch.maximum(x_adv, x - self.eps), x + self.eps).clamp(0.0, 1.0)

    def _targeted(self, clf: Any, attack: Any, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        """APGD-T: one targeted run per target class (the highest clean logits after the true class), each on the
        images the model still classifies right; an image keeps the first adversarial example found."""
        logits = clf.predict(xs)
        logits[np.arange(len(ys)), ys] = -np.inf
        order = np.argsort(-logits, axis=1)[:, : min(self.targets, self.num_classes - 1)]
        x_adv = xs.copy()
        for i in range(order.shape[1]):
            robust = clf.predict(x_adv).argmax(1) == ys
            if not robust.any():
                break
            found = attack.generate(xs[robust], order[robust, i])
            fooled = clf.predict(found).argmax(1) != ys[robust]
            rows = np.flatnonzero(robust)[fooled]
            x_adv[rows] = found[fooled]
        return x_adv


def make_attack(
    model: nn.Module,
    name: str = "pgd",
    eps: float = 8 / 255,
    alpha: float = 2 / 255,
    steps: int = 10,
    num_classes: int = 10,
    restarts: int = 1,
    targets: int = 9,
    queries: int = 1000,
    seed: int | None = 0,
) -> Callable[[Tensor, Tensor], Tensor]:
    """An L∞ attack on ``model`` (which maps [0, 1] images to logits), from ART.

    Args:
        name: ``pgd`` (step ``alpha``, random start), ``apgd-ce`` or ``apgd-t`` (APGD on cross-entropy, or targeted
            on the DLR loss over ``targets`` target classes), or ``square`` (gradient-free, ``queries`` queries).
        steps: iterations of the gradient attacks (the field's standard for a defence: 100 or more).
        restarts: random restarts of PGD, APGD-CE and Square; an image counts as broken when any restart breaks it.
            APGD-T starts once per target class, as in AutoAttack.
        seed: seeds the random starts (``None``: numpy's global state).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).eval()
        >>> attack = make_attack(net, "apgd-ce", eps=0.1, steps=5)
        >>> x, y = torch.rand(4, 1, 8, 8), torch.randint(0, 10, (4,))
        >>> bool(((attack(x, y) - x).abs() <= 0.1 + 1e-6).all())
        True
    """
    if name not in ATTACKS:
        close = difflib.get_close_matches(name, ATTACKS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown attack {name!r}{hint}; choose one of {ATTACKS}")
    for arg, value in (("steps", steps), ("restarts", restarts), ("targets", targets), ("queries", queries)):
        if int(value) < 1:
            raise ValueError(f"{arg} must be at least 1, got {value}")
    if not 0 < eps <= 1 or alpha <= 0:
        raise ValueError(f"eps must be in (0, 1] and alpha positive (images in [0, 1]), got eps={eps}, alpha={alpha}")
    if num_classes < (3 if name == "apgd-t" else 2):
        raise ValueError(f"num_classes must be at least {3 if name == 'apgd-t' else 2} for {name!r} (the DLR loss "
                         f"reads the third-largest logit), got {num_classes}")
    return Attack(model, name, eps, alpha, steps, num_classes, int(restarts), int(targets), int(queries), seed)
