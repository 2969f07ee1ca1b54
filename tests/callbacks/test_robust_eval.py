"""RobustEvaluation on tiny models: the keys it logs, the worst case over attacks and attack views, the cascade, the
seeding, and its errors. The attacks themselves are pinned in tests/test_attacks.py."""

from __future__ import annotations

import pytest
import torch
from lightning import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from zoo.callbacks.robust_eval import QUICK, RobustEvaluation, robust_accuracies


class _Linear(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def robustness_models(self) -> dict[str, nn.Module]:
        return {"bare": self.net, "blurred": nn.Sequential(nn.AvgPool2d(3, 1, 1), self.net)}

    def test_step(self, batch, batch_idx):
        return None


def _data(model: _Linear, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return x, model.net(x).argmax(1)  # labels the bare model gets right: natural accuracy 1


def test_attacks_lower_accuracy_under_both_threats_and_every_key_is_logged() -> None:
    model = _Linear()
    x, y = _data(model)
    callback = RobustEvaluation(attacks=("pgd", "square"), eps=0.3, alpha=0.05, steps=5, restarts=1, queries=50,
                                max_images=48)  # fmt: skip
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.test(model, DataLoader(TensorDataset(x, y), batch_size=16))
    m = {k.removeprefix("test/"): float(v) for k, v in trainer.callback_metrics.items()}
    assert set(m) == {"natural/bare", "natural/blurred", "robust/worst/bare", "robust/worst/blurred"} | {
        f"robust/{a}/{t}/{n}" for a in ("pgd", "square") for t, n in
        (("nonadaptive", "bare"), ("nonadaptive", "blurred"), ("adaptive", "blurred"))}  # fmt: skip
    assert m["natural/bare"] == 1.0
    assert m["robust/pgd/nonadaptive/bare"] < 0.5
    assert m["robust/pgd/adaptive/blurred"] < m["natural/blurred"]
    for name in ("bare", "blurred"):  # the worst case is no better than any single attack on the model
        assert m[f"robust/worst/{name}"] <= min(v for k, v in m.items() if k.startswith("robust/") and
                                                k.endswith(f"/{name}"))  # fmt: skip


class _Shifted(nn.Module):
    """A defended model with attack views: a shifted copy of itself, and one view per class."""

    def __init__(self, net: nn.Module, shift: float = 0.0, calls: list | None = None) -> None:
        super().__init__()
        self.net, self.shift, self.calls = net, shift, calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calls is not None:
            self.calls.append(len(x))
        return self.net(x + self.shift)

    def attack_views(self) -> dict[str, nn.Module | list[nn.Module]]:
        return {"shifted": _Shifted(self.net, 0.1), "per_class": [_Shifted(self.net, 0.0, self.calls)
                                                                   for _ in range(10)]}  # fmt: skip


def test_views_are_attacked_and_the_worst_case_takes_every_one_and_attacks_are_seeded() -> None:
    model = _Linear()
    x, y = _data(model)
    model.net.eval()
    models = {"bare": model.net, "shifted": _Shifted(model.net)}  # a fresh wrapper in train mode, sharing the net
    torch.manual_seed(123)
    state = torch.get_rng_state()
    kwargs = {"eps": 0.1, "alpha": 0.02, "steps": 3, "restarts": 1, "view_attacks": ("pgd",)}
    first = robust_accuracies(models, x, y, ("pgd",), **kwargs)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is left as it was
    assert robust_accuracies(models, x, y, ("pgd",), **kwargs) == first  # seeded
    views = [first[f"robust/pgd/{v}/shifted"] for v in ("adaptive", "shifted", "per_class", "nonadaptive")]
    assert first["robust/worst/shifted"] <= min(views)
    assert not model.net.training and models["shifted"].training  # every submodule's own mode is restored


def test_per_class_views_attack_each_image_through_its_own_classes_module() -> None:
    model = _Linear()
    x, y = _data(model)
    seen: dict[int, list[int]] = {k: [] for k in range(10)}
    defended = _Shifted(model.net)
    defended.attack_views = lambda: {"per_class": [_Shifted(model.net, 0.0, seen[k]) for k in range(10)]}
    robust_accuracies({"bare": model.net, "d": defended}, x, y, ("pgd",), eps=0.1, alpha=0.02, steps=1, restarts=1,
                      threats=("adaptive",), view_attacks=("pgd",))  # fmt: skip
    # view k is only ever given the images of class k (ART takes each group in one batch): never more, never others
    for k in range(10):
        assert max(seen[k], default=0) == int((y == k).sum()), k


def test_the_cascade_finds_the_same_worst_case_without_per_attack_keys() -> None:
    model = _Linear()
    x, y = _data(model)
    models = {"bare": model.net.eval(), "blurred": nn.Sequential(nn.AvgPool2d(3, 1, 1), model.net)}
    full = robust_accuracies(models, x, y, ("pgd", "apgd-ce"), eps=0.05, alpha=0.01, steps=10, restarts=1)
    cascade = robust_accuracies(models, x, y, ("pgd", "apgd-ce"), eps=0.05, alpha=0.01, steps=10, restarts=1,
                                cascade=True)  # fmt: skip
    assert set(cascade) == {"natural/bare", "natural/blurred", "robust/worst/bare", "robust/worst/blurred"}
    for name in ("bare", "blurred"):
        assert cascade[f"robust/worst/{name}"] == pytest.approx(full[f"robust/worst/{name}"], abs=0.05)


def test_bad_settings_and_modules_are_refused_with_one_clear_error_each() -> None:
    callback = RobustEvaluation(steps=1, restarts=1)
    x, y = torch.rand(2, 1, 8, 8), torch.zeros(2, dtype=torch.long)
    with pytest.raises(TypeError, match="has no robustness_models"):
        callback.evaluate(LightningModule(), x, y)
    odd = _Linear()
    odd.robustness_models = lambda: {"net": odd.net}  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="must include 'bare'"):
        callback.evaluate(odd, x, y)
    with pytest.raises(ValueError, match="unknown threat models"):
        RobustEvaluation(threats=("whitebox",))
    with pytest.raises(ValueError, match="attacks must be a non-empty list"):
        RobustEvaluation(attacks=("autoattack",))
    with pytest.raises(ValueError, match="restarts must be at least 1"):
        RobustEvaluation(restarts=0)
    with pytest.raises(ValueError, match="non-empty batch"):
        robust_accuracies({"bare": odd.net}, x[:0], y[:0], **QUICK)
