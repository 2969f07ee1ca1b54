"""PAP's Lightning modules on a tiny instance: PGD adversarial training of the base, the prompt learner's frozen base,
its signed steps, exemplar initialisation and λ's update, a user's safetensors base, and the adaptive pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning import Trainer
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset
from zoo.callbacks.robust_eval import RobustEvaluation

from zoo.attacks import make_attack
from zoo.models.pap.attacks import PromptedPipeline
from zoo.models.pap.module import AdversarialClassifier, PAPModule


def _loader(n: int = 64, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.rand(n, 1, 8, 8, generator=g), torch.arange(n) % 10
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=g)


def _trainer(**kwargs) -> Trainer:
    return Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   accelerator="cpu", **kwargs)  # fmt: skip


def test_adversarial_training_steps_on_pgd_examples_within_eps() -> None:
    torch.manual_seed(0)
    model = AdversarialClassifier(eps=0.1, alpha=0.025, attack_steps=2)
    before = [p.detach().clone() for p in model.parameters()]
    _trainer(max_steps=2).fit(model, _loader())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    x, y = torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,))
    x_adv = make_attack(model.net.eval(), "pgd", eps=0.1, alpha=0.025, steps=3)(x, y)
    assert (x_adv - x).abs().max() <= 0.1 + 1e-6 and x_adv.min() >= 0 and x_adv.max() <= 1


def test_prompt_learner_keeps_the_base_frozen_in_eval_and_takes_signed_steps(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = AdversarialClassifier().net
    for m in base.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight.data.normal_()
    save_file(base.state_dict(), str(tmp_path / "base.safetensors"))
    model = PAPModule(base_weights=str(tmp_path / "base.safetensors"), attack_steps=2, lr=0.3, lambda_every=1)
    for a, b in zip(base.state_dict().values(), model.base.state_dict().values()):
        assert torch.equal(a, b)
    modes, snapshot = [], {}
    model.on_train_batch_start = lambda batch, i: modes.append(model.base.training)  # type: ignore[method-assign]

    def before_step(optimizer: torch.optim.Optimizer) -> None:  # after the exemplar init and the backward pass
        for name, p in model.prompt.named_parameters():
            snapshot[name] = (p.detach().clone(), p.grad.detach().clone())

    model.on_before_optimizer_step = before_step  # type: ignore[method-assign]
    frozen = {k: v.clone() for k, v in model.base.state_dict().items()}
    _trainer(max_epochs=1, limit_train_batches=1).fit(model, _loader())
    assert modes == [False]
    assert all(torch.equal(frozen[k], v) for k, v in model.base.state_dict().items())
    assert bool(model.exemplars_set.all())
    for name, p in model.prompt.named_parameters():
        value, grad = snapshot[name]
        assert value.abs().sum() > 0  # exemplar-initialised before the first step
        torch.testing.assert_close(p.detach(), value - 0.3 * grad.sign())
    # λ's update ran at the end of epoch 1 (lambda_every=1), within the clamp
    assert 0.1 <= float(model.prompt.lambda_amp) <= 10


def test_a_base_file_that_does_not_fit_or_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    save_file({"weight": torch.zeros(3)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="does not fit the base network"):
        PAPModule(base_weights=str(tmp_path / "bad.safetensors"))
    (tmp_path / "base.pt").write_bytes(b"not read")
    with pytest.raises(ValueError, match="never unpickles"):
        PAPModule(base_weights=str(tmp_path / "base.pt"))
    with pytest.raises(FileNotFoundError, match="no base weights"):
        PAPModule(base_weights=str(tmp_path / "missing.safetensors"))


def test_adaptive_attack_on_the_pipeline_moves_the_input_through_the_prompt() -> None:
    torch.manual_seed(0)
    model = PAPModule()
    with torch.no_grad():
        model.prompt.amplitude.normal_()
        model.prompt.phase.normal_()
    x, y = torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,))
    pipe = PromptedPipeline(model.base, model.prompt).eval()
    torch.testing.assert_close(pipe(x), model(x))
    x_adv = make_attack(pipe, "pgd", eps=0.1, alpha=0.025, steps=3)(x, y)
    assert 0 < (x_adv - x).abs().max() <= 0.1 + 1e-6
    fixed = PromptedPipeline(model.base, model.prompt, fixed_class=3)
    torch.testing.assert_close(fixed(x), model.base(model.prompt(x, torch.full((8,), 3))))
    with pytest.raises(ValueError, match="unknown attack 'pgdd'.*did you mean 'pgd'"):
        make_attack(pipe, "pgdd")


def test_the_prompt_learner_starts_from_a_published_base_and_refuses_a_mismatch(tmp_path: Path) -> None:
    from zoo import hub

    torch.manual_seed(0)
    base = AdversarialClassifier(attack_steps=1).eval()
    hub.write_entry(base, tmp_path / "base", zoo_meta={"name": "base"}, card_text="# base\n")
    model = PAPModule(base=str(tmp_path / "base"), attack_steps=2)
    for a, b in zip(base.net.state_dict().values(), model.base.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="is a .* classifier, but this PAPModule is built for"):
        PAPModule(base=str(tmp_path / "base"), num_classes=5)
    with pytest.raises(ValueError, match="not both"):
        PAPModule(base=str(tmp_path / "base"), base_weights=str(tmp_path / "x.safetensors"))


def test_cifar_shaped_pipeline_on_a_user_resnet18_state_dict(tmp_path: Path) -> None:
    """The real path on a tiny instance: a CIFAR ResNet-18 base from a user's safetensors file, 3×32×32 images."""
    torch.manual_seed(0)
    net = AdversarialClassifier(backbone="resnet18", in_shape=[3, 32, 32]).net.eval()
    save_file(net.state_dict(), str(tmp_path / "resnet18.safetensors"))
    model = PAPModule(base_backbone="resnet18", in_shape=[3, 32, 32], base_weights=str(tmp_path / "resnet18.safetensors"),
                      attack_steps=1, eps=8 / 255, alpha=2 / 255).eval()  # fmt: skip
    x, y = torch.rand(2, 3, 32, 32), torch.tensor([3, 7])
    assert model.prompt.init_from_exemplars(x, y, classes=[3, 7]) == [3, 7]
    logits = model(x)
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    scores = RobustEvaluation(attacks=("pgd",), eps=8 / 255, alpha=2 / 255, steps=1, restarts=1,
                              view_attacks=("pgd",)).evaluate(model, x, y)  # fmt: skip
    assert {"natural/pap", "robust/pgd/nonadaptive/pap", "robust/pgd/true_prompt/pap", "robust/pgd/eot/pap",
            "robust/worst/pap"} <= set(scores)  # fmt: skip
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        model((x - 0.5) / 0.25)  # normalised images: the DataModule must serve [0, 1] (normalize=False)


class _MeanClassifier(torch.nn.Module):
    """Two classes by the image's mean pixel: class 1 when it is above 0.5."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.flatten(1).mean(1)
        return torch.stack([0.5 - m, m - 0.5], dim=1)


def test_lambda_is_updated_from_the_accuracy_ratio_on_adversarial_images_not_clean_ones() -> None:
    """A case worked by hand. The amplitude prompt of class 1 is 1.0 at the DC frequency only, so the amplitude-only
    image is x + λ·1.0/4 (ifftn divides by the 4 pixels) and the phase-only image is x (zero phase prompt). The clean
    images have mean 0.6: both variants are right on 4 of 4, a ratio of 1. The adversarial images have means 0.3,
    0.3, 0.3 and 0.6: amplitude-only gets 4 right (0.55, 0.55, 0.55, 0.85), phase-only 1, so λ ← 1 · 4/1 = 4."""
    model = PAPModule(in_shape=[1, 2, 2], num_classes=2, lambda_every=1, lambda_images=4)
    model.base = _MeanClassifier()
    with torch.no_grad():
        model.prompt.amplitude.zero_()
        model.prompt.phase.zero_()
        model.prompt.amplitude[1, 0, 0, 0] = 1.0
    clean = torch.full((4, 1, 2, 2), 0.6)
    adversarial = torch.tensor([0.3, 0.3, 0.3, 0.6]).view(4, 1, 1, 1).expand(4, 1, 2, 2).clone()
    model._attack = lambda x, y: adversarial  # type: ignore[method-assign]
    model._lambda_x, model._lambda_y = [clean], [torch.ones(4, dtype=torch.long)]
    model.on_train_epoch_end()
    assert float(model.prompt.lambda_amp) == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lambda_clamp": (10, 0.1)}, "lambda_clamp"),
        ({"lr": -1.0}, "`lr` to be a finite float > 0"),
        ({"lambda_every": 0}, "`lambda_every` to be an int >= 1"),
        ({"eps": 0.0}, "`eps`"),
        ({"attack_steps": 0}, "`attack_steps`"),
        ({"base_backbone": "resnet"}, "`base_backbone`"),
        ({"exp_l1_weight": -1.0}, "`exp_l1_weight`"),
    ],
)
def test_impossible_arguments_are_refused_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PAPModule(**kwargs)


def test_bad_images_are_refused_with_one_line_naming_the_problem() -> None:
    model = PAPModule().eval()
    x = torch.rand(2, 1, 8, 8)
    x[0, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="1 NaN or infinite values"):
        model(x)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 8, 8\), got \(2, 3, 32, 32\)"):
        model(torch.rand(2, 3, 32, 32))  # refused before the base's convolution sees it
    with pytest.raises(ValueError, match="empty batch"):
        model(torch.rand(0, 1, 8, 8))
