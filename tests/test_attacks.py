"""``zoo.attacks.make_attack`` (ART's PGD, APGD-CE, APGD-T and Square) against a case solved by hand.

For a linear model whose decision is z₁ − z₀ = w·x + b (a third class, far below, gives the DLR loss its third logit)
and an L∞ budget ε, the worst perturbation is −ε·sign(w)·s (s the sign of the margin), so an image stays correctly
classified exactly when its margin |w·x + b| exceeds ε‖w‖₁, provided every pixel can move ε both ways inside [0, 1].
No attack may break an image above that line; the gradient attacks must break every image below it (they solve a
linear problem), and Square, which searches the ball's vertices by random squares, every image with half the margin
to spare.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zoo.attacks import ATTACKS, make_attack

EPS = 0.05


def _linear_case(n: int = 200) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    net = nn.Linear(64, 3)
    with torch.no_grad():
        net.weight.copy_(torch.stack([torch.zeros(64), torch.randn(64, generator=g) / 4, torch.zeros(64)]))
        net.bias.copy_(torch.tensor([0.0, 0.0, -100.0]))
    model = nn.Sequential(nn.Flatten(), net).eval()
    x = 0.2 + 0.6 * torch.rand(n, 1, 8, 8, generator=g)  # every pixel at least ε from the box
    with torch.no_grad():
        margin = model(x) @ torch.tensor([-1.0, 1.0, 0.0])
    y = (margin > 0).long()  # the labels the model gets right
    robust = margin.abs() > EPS * net.weight[1].abs().sum()
    return model, x, y, robust, margin.abs() / (EPS * net.weight[1].abs().sum())


@pytest.mark.parametrize("name", ATTACKS)
def test_each_attack_breaks_exactly_the_images_a_linear_model_cannot_defend(name: str) -> None:
    model, x, y, robust, ratio = _linear_case()
    assert 0.2 < float(robust.float().mean()) < 0.9  # both kinds of image are there
    x_adv = make_attack(model, name, eps=EPS, alpha=EPS / 4, steps=20, num_classes=3, targets=1, queries=500)(x, y)
    assert (x_adv - x).abs().max() <= EPS + 1e-6 and x_adv.min() >= 0 and x_adv.max() <= 1
    with torch.no_grad():
        correct = model(x_adv).argmax(1) == y
    assert bool(correct[robust].all())  # nothing above the line can be broken
    # Square searches vertices of the ε-ball by random squares: held to every image with half the margin to spare
    breakable = ratio < (0.5 if name == "square" else 1.0)
    broken = (~correct[breakable]).float().mean()
    assert broken >= (0.95 if name == "square" else 1.0), f"{name} broke {float(broken):.2f} of the breakable images"


def test_attacks_are_seeded_and_leave_numpys_random_state_alone() -> None:
    model, x, y, _, _ = _linear_case(32)
    np.random.seed(5)
    state = np.random.get_state()[1].copy()
    first = make_attack(model, "pgd", eps=EPS, alpha=0.01, steps=2, num_classes=3, seed=3)(x, y)
    assert np.array_equal(np.random.get_state()[1], state)
    torch.testing.assert_close(make_attack(model, "pgd", eps=EPS, alpha=0.01, steps=2, num_classes=3, seed=3)(x, y),
                               first)  # fmt: skip


def test_the_attack_restores_every_submodules_mode() -> None:
    model, x, y, _, _ = _linear_case(8)
    model.train()
    make_attack(model, "apgd-ce", eps=EPS, steps=2, num_classes=3)(x, y)
    assert all(m.training for m in model.modules())


def test_bad_arguments_and_inputs_fail_with_one_clear_error_each() -> None:
    model, x, y, _, _ = _linear_case(4)
    with pytest.raises(ValueError, match="did you mean 'apgd-ce'"):
        make_attack(model, "apgd_ce")
    with pytest.raises(ValueError, match="steps must be at least 1"):
        make_attack(model, "pgd", steps=0)
    with pytest.raises(ValueError, match=r"eps must be in \(0, 1\]"):
        make_attack(model, "pgd", eps=8)
    attack = make_attack(model, "pgd", eps=EPS, num_classes=3)
    with pytest.raises(ValueError, match=r"finite and lie in \[0, 1\]"):
        attack(x * float("nan"), y)
    with pytest.raises(ValueError, match="one label each"):
        attack(x, y[:2])
    assert attack(x[:0], y[:0]).shape == (0, 1, 8, 8)
