"""``zoo.attacks.make_attack``: each torchattacks attack it builds lowers the accuracy of a tiny model, within its
budget, and an unknown name fails with a close match."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("torchattacks")

from zoo.attacks import make_attack


def _model_and_data() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).eval()
    x = torch.rand(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = net(x).argmax(1)  # labels the model gets right
    return net, x, y


@pytest.mark.parametrize("name", ["pgd", "cw", "autoattack"])
def test_each_attack_lowers_accuracy_within_its_budget(name: str) -> None:
    net, x, y = _model_and_data()
    x_adv = make_attack(net, name, eps=0.1, alpha=0.025, steps=10)(x, y)
    with torch.no_grad():
        accuracy = float((net(x_adv).argmax(1) == y).float().mean())
    assert accuracy <= 0.5
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    if name != "cw":  # the L∞ attacks stay in the ε-ball (CW is an L2 attack with no fixed budget)
        assert (x_adv - x).abs().max() <= 0.1 + 1e-6


def test_an_unknown_attack_names_the_close_match() -> None:
    net, _, _ = _model_and_data()
    with pytest.raises(ValueError, match="did you mean 'autoattack'"):
        make_attack(net, "autoatack")
