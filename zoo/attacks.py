"""Adversarial attacks from ``torchattacks`` (never hand-written), for any model mapping [0, 1] images to logits.

torchattacks 3.5.1 pins ``requests~=2.25.1`` although it never imports requests; installing it with its
dependencies downgrades requests, idna and urllib3 under the rest of the stack, so it is installed with
``pip install --no-deps torchattacks==3.5.1`` and imported here only when an attack is made.
"""

from __future__ import annotations

import difflib
from typing import Any

from torch import nn

__all__ = ["ATTACKS", "make_attack"]

ATTACKS = ("pgd", "cw", "autoattack")


def _torchattacks() -> Any:
    try:
        import torchattacks
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "PAP's attacks come from torchattacks: pip install --no-deps torchattacks==3.5.1 (its requests pin is "
            "spurious and would downgrade requests under the rest of the zoo)"
        ) from err
    return torchattacks


def make_attack(
    model: nn.Module,
    name: str = "pgd",
    eps: float = 8 / 255,
    alpha: float = 2 / 255,
    steps: int = 10,
    num_classes: int = 10,
    seed: int = 0,
) -> Any:
    """A torchattacks attack on ``model`` (which maps [0, 1] images to logits): L∞ PGD with a random start (the
    card's training and evaluation attack), CW-L2, or AutoAttack (standard, L∞, at ``eps``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).eval()
        >>> attack = make_attack(net, "pgd", eps=0.1, alpha=0.025, steps=3)
        >>> x, y = torch.rand(4, 1, 8, 8), torch.randint(0, 10, (4,))
        >>> bool(((attack(x, y) - x).abs() <= 0.1 + 1e-6).all())
        True
    """
    ta = _torchattacks()
    if name == "pgd":
        return ta.PGD(model, eps=eps, alpha=alpha, steps=steps, random_start=True)
    if name == "cw":
        # L2 Carlini-Wagner, torchattacks' form (the papers' CW∞ is PGD on the CW margin, which torchattacks lacks);
        # fewer than 50 Adam steps at lr 0.05 leave most images unattacked even on a linear model
        return ta.CW(model, c=1.0, kappa=0.0, steps=max(steps, 50), lr=0.05)
    if name == "autoattack":
        return ta.AutoAttack(model, norm="Linf", eps=eps, version="standard", n_classes=num_classes, seed=seed)
    close = difflib.get_close_matches(name, ATTACKS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown attack {name!r}{hint}; choose one of {ATTACKS}")
