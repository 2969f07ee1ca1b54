"""PAP's Lightning modules on a tiny instance: PGD adversarial training of the base, the prompt learner's frozen base,
its signed steps, exemplar initialisation and λ's update, a user's safetensors base, and the adaptive pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning import Trainer
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("torchattacks")

from zoo.attacks import make_attack
from zoo.callbacks.robust_eval import RobustEvaluation
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
    scores = RobustEvaluation(eps=8 / 255, alpha=2 / 255, steps=1).evaluate(model, x, y)
    assert {"natural/pap", "robust/pgd/nonadaptive/pap", "robust/pgd/adaptive_worst/pap"} <= set(scores)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        model((x - 0.5) / 0.25)  # normalised images: the DataModule must serve [0, 1] (normalize=False)
