"""RobustEvaluation on tiny models: the keys it logs, that attacks lower accuracy, and its errors."""

from __future__ import annotations

import pytest
import torch
from lightning import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("torchattacks")

from zoo.callbacks.robust_eval import RobustEvaluation


class _Linear(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def robustness_models(self) -> dict[str, nn.Module]:
        return {"bare": self.net, "blurred": nn.Sequential(nn.AvgPool2d(3, 1, 1), self.net)}

    def test_step(self, batch, batch_idx):
        return None


def test_attacks_lower_accuracy_under_both_threats_and_every_key_is_logged() -> None:
    model = _Linear()
    x = torch.rand(64, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model.net(x).argmax(1)  # labels the bare model gets right: natural accuracy 1
    callback = RobustEvaluation(attacks=("pgd",), eps=0.3, alpha=0.05, steps=5, max_images=48)
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.test(model, DataLoader(TensorDataset(x, y), batch_size=16))
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert set(m) == {"test/natural/bare", "test/natural/blurred", "test/robust/pgd/nonadaptive/bare",
                      "test/robust/pgd/nonadaptive/blurred", "test/robust/pgd/adaptive/blurred"}  # fmt: skip
    assert m["test/natural/bare"] == 1.0
    assert m["test/robust/pgd/nonadaptive/bare"] < 0.5
    assert m["test/robust/pgd/adaptive/blurred"] < m["test/natural/blurred"]


def test_a_module_without_robustness_models_or_bare_is_refused() -> None:
    callback = RobustEvaluation(steps=1)
    x, y = torch.rand(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match="has no robustness_models"):
        callback.evaluate(LightningModule(), x, y)
    odd = _Linear()
    odd.robustness_models = lambda: {"net": odd.net}  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="must include 'bare'"):
        callback.evaluate(odd, x, y)
    with pytest.raises(ValueError, match="unknown threat models"):
        RobustEvaluation(threats=("whitebox",))


class _Shifted(nn.Module):
    """A defended model with other views of itself: the adaptive worst case attacks each."""

    def __init__(self, net: nn.Module, shift: float = 0.0) -> None:
        super().__init__()
        self.net, self.shift = net, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x + self.shift)

    def adaptive_candidates(self) -> list[nn.Module]:
        return [_Shifted(self.net, 0.1), _Shifted(self.net, -0.1)]


def test_adaptive_worst_case_is_no_better_than_the_adaptive_attack_and_attacks_are_seeded() -> None:
    from zoo.callbacks.robust_eval import robust_accuracies

    model = _Linear()
    x = torch.rand(64, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model.net(x).argmax(1)
    model.net.eval()
    models = {"bare": model.net, "shifted": _Shifted(model.net)}  # a fresh wrapper in train mode, sharing the net
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = robust_accuracies(models, x, y, eps=0.1, alpha=0.02, steps=3)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is left as it was
    assert robust_accuracies(models, x, y, eps=0.1, alpha=0.02, steps=3) == first  # random starts are seeded
    assert first["robust/pgd/adaptive_worst/shifted"] <= first["robust/pgd/adaptive/shifted"]
    assert "robust/pgd/adaptive_worst/bare" not in first
    assert not model.net.training and models["shifted"].training  # every submodule's own mode is restored
