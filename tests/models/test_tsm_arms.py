"""Tests of the TSM reproduction's stand-ins, each against a case derived by hand: the timestep-scaled LoRA, full
fine-tuning of the adapted layers, the Gaussian (Wiener) denoiser, the negated source model, the uniform-gate
ablation, the per-expert fostering budget, the sample-quality metric, and that the arms built on the fostered experts
start from the same weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import Tensor, nn

from zoo.callbacks.timestep_experts import TimestepExpertsSchedule
from zoo.datamodules.domains import DomainShiftDataModule
from zoo.models.tsm import TSMDiffusion
from zoo.models.tsm.arms import FlippedSource, GaussianDenoiser, uniform_gates
from zoo.nn.timestep_scale import add_timestep_scale


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run this file's tiny UNets on one thread: on a busy 2-core machine OpenMP's waits cost seconds a test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Tiny(nn.Module):
    """A denoiser-shaped module: one Linear, called with ``(sample, timestep)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, sample: Tensor, timestep: Tensor) -> Tensor:
        return self.lin(sample)


def test_timestep_scale_multiplies_each_samples_lora_update_by_its_row() -> None:
    """h = W x + b + s(t) · (α/r) · B A x, with α/r = 8/4 = 2 written here, per sample."""
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=8, target_modules=["lin"]), Tiny())
    scales = add_timestep_scale(model, num_timesteps=10)
    layer = model.lin
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
        scales["lin"].weight[3] = 0.5
        scales["lin"].weight[7] = -2.0
    x, t = torch.randn(3, 4), torch.tensor([3, 7, 0])
    w, b = layer.base_layer.weight, layer.base_layer.bias
    a_, b_ = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    update = 2.0 * x @ a_.T @ b_.T
    expected = x @ w.T + b + torch.tensor([0.5, -2.0, 1.0])[:, None] * update
    torch.testing.assert_close(model(x, t), expected, atol=1e-6, rtol=0)


def test_timestep_scale_starts_as_plain_lora_and_trains() -> None:
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    plain = inject_adapter_in_model(LoraConfig(r=2, target_modules=["lin"]), Tiny())
    with torch.no_grad():
        plain.lin.lora_B["default"].weight.normal_()
    scaled = inject_adapter_in_model(LoraConfig(r=2, target_modules=["lin"]), Tiny())
    scaled.load_state_dict(plain.state_dict())
    scale = add_timestep_scale(scaled, num_timesteps=10)["lin"]
    x, t = torch.randn(5, 4), torch.tensor([0, 1, 2, 9, 9])
    torch.testing.assert_close(scaled(x, t), plain(x, t))
    scaled(x, t).sum().backward()
    assert scale.weight.grad is not None and scale.weight.grad[[0, 1, 2, 9]].abs().min() > 0
    assert not scale.weight.grad[3:9].any()  # rows of timesteps not in the batch get no gradient


def test_timestep_scale_refuses_a_model_without_lora_or_timestep() -> None:
    with pytest.raises(ValueError, match="no peft LoRA layer"):
        add_timestep_scale(Tiny())
    with pytest.raises(ValueError, match="lora_time_scale=True .* needs mode='lora'"):
        TSMDiffusion(mode="tsm", lora_time_scale=True)


def test_timestep_scale_on_a_conv_lora_and_in_a_deep_copy() -> None:
    """A 3×3 conv LoRA's update (peft: A a 3×3 conv, B a 1×1 conv) is scaled per sample, and a deep copy (an EMA)
    uses its own scales: zeroing the copy's scale at t removes the copy's update there and leaves the original's."""
    import copy

    from peft import LoraConfig, inject_adapter_in_model

    class TinyConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3, padding=1)

        def forward(self, sample: Tensor, timestep: Tensor) -> Tensor:
            return self.conv(sample)

    torch.manual_seed(0)
    model = inject_adapter_in_model(LoraConfig(r=2, lora_alpha=4, target_modules=["conv"]), TinyConv())
    scale = add_timestep_scale(model, num_timesteps=10)["conv"]
    layer = model.conv
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
        scale.weight[4] = 3.0
    x, t = torch.randn(2, 2, 5, 5), torch.tensor([4, 0])
    base = nn.functional.conv2d(x, layer.base_layer.weight, layer.base_layer.bias, padding=1)
    low_rank = nn.functional.conv2d(x, layer.lora_A["default"].weight, padding=1)
    update = 2.0 * nn.functional.conv2d(low_rank, layer.lora_B["default"].weight)  # α / r = 4 / 2
    torch.testing.assert_close(
        model(x, t), base + torch.tensor([3.0, 1.0]).view(2, 1, 1, 1) * update, atol=1e-5, rtol=0
    )
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.conv.lora_B["default"].time_scale.weight[4] = 0.0
    torch.testing.assert_close(twin(x, t)[0], base[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        model(x, t), base + torch.tensor([3.0, 1.0]).view(2, 1, 1, 1) * update, atol=1e-5, rtol=0
    )
    state = model.state_dict()
    assert "conv.lora_B.default.time_scale.weight" in state and "conv.lora_B.default.weight" in state


def test_lora_time_scale_module_trains_the_scale_with_the_lora() -> None:
    model = TSMDiffusion(mode="lora", lora_time_scale=True)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)
    assert sum(n.endswith("time_scale.weight") for n in trained) == sum(
        n.endswith("lora_B.default.weight") for n in trained
    )


def test_full_mode_trains_exactly_the_target_layers() -> None:
    model = TSMDiffusion(mode="full", target_modules=["to_q", "conv1"])
    trained = {n for n, p in model.unet.named_parameters() if p.requires_grad}
    assert trained and all(n.rsplit(".", 2)[-2] in ("to_q", "conv1") for n in trained)
    targets = {f"{name}.{leaf}" for name, m in model.unet.named_modules() if name.endswith((".to_q", ".conv1"))
               for leaf, _ in m.named_parameters()}  # fmt: skip
    assert trained == targets
    with pytest.raises(ValueError, match="'to_z' matches no Linear or Conv2d"):
        TSMDiffusion(mode="full", target_modules=["to_z"])


def test_gaussian_denoiser_is_the_wiener_formula() -> None:
    """With μ, Σ = σ² I set by hand: ε̂ = b (x_t − a μ) / (a² σ² + b²), a = √ᾱ_t, b = √(1 − ᾱ_t)."""
    model = GaussianDenoiser(mode="pretrain").fit_images(torch.zeros(2, 1, 8, 8))
    mu, sigma2 = torch.linspace(-0.5, 0.5, 64), 0.3
    model.mu.copy_(mu), model.eigenvalues.fill_(sigma2), model.eigenvectors.copy_(torch.eye(64))
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([100, 900])
    abar = model.scheduler.alphas_cumprod[t]
    a, b = abar.sqrt()[:, None], (1 - abar).sqrt()[:, None]
    expected = (b * (x.flatten(1) - a * mu) / (a**2 * sigma2 + b**2)).view_as(x)
    torch.testing.assert_close(model(x, t), expected, atol=1e-5, rtol=1e-5)


def test_gaussian_denoiser_fit_solves_the_wiener_system_in_float64() -> None:
    """On images with an anisotropic covariance the fitted denoiser equals b (a² Σ + b² I)⁻¹ (x_t − a μ), solved
    directly in float64 from the images' own mean and covariance (no eigenbasis)."""
    g = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(64, 64, generator=g, dtype=torch.float64))[0]
    spread = torch.linspace(0.01, 0.6, 64, dtype=torch.float64)
    images = (torch.randn(500, 64, generator=g, dtype=torch.float64) * spread) @ basis.T + 0.1
    model = GaussianDenoiser(mode="pretrain").fit_images(images.float().view(-1, 1, 8, 8))
    mu, sigma = images.mean(0), torch.cov(images.float().double().T)
    x, t = torch.randn(3, 1, 8, 8, generator=g), torch.tensor([5, 300, 990])
    abar = model.scheduler.alphas_cumprod[t].double()
    expected = []
    for i in range(3):
        a, b = abar[i].sqrt(), (1 - abar[i]).sqrt()
        system = a**2 * sigma + b**2 * torch.eye(64, dtype=torch.float64)
        expected.append(b * torch.linalg.solve(system, x[i].flatten().double() - a * mu))
    torch.testing.assert_close(model(x, t).flatten(1).double(), torch.stack(expected), atol=2e-4, rtol=1e-3)


def test_gaussian_denoiser_of_one_image_recovers_the_noise_exactly() -> None:
    """Σ = 0: x_t − a·x0 = b·ε, so the denoiser returns ε and the loss is 0 at every t."""
    x0 = torch.rand(1, 1, 8, 8) * 2 - 1
    model = GaussianDenoiser(mode="pretrain").fit_images(x0.expand(5, -1, -1, -1))
    noise, t = torch.randn(4, 1, 8, 8), torch.tensor([0, 250, 600, 999])
    assert model.loss(x0.expand(4, -1, -1, -1), t, noise).max() < 1e-6


def test_flipped_source_on_negated_images_is_the_source_on_the_originals() -> None:
    """x0' = −x0 and ε' = −ε give x_t' = −x_t; −ε_θ(−x_t') = −ε_θ(x_t), whose error against −ε is the source's."""
    torch.manual_seed(0)
    source = TSMDiffusion(mode="pretrain")
    flipped = FlippedSource(mode="pretrain")
    flipped.load_state_dict(source.state_dict())
    x0, noise, t = torch.rand(3, 1, 8, 8) * 2 - 1, torch.randn(3, 1, 8, 8), torch.tensor([10, 400, 900])
    torch.testing.assert_close(flipped.loss(-x0, t, -noise), source.loss(x0, t, noise))


def test_uniform_gates_are_the_mean_of_the_active_experts() -> None:
    """The no-router ablation (gates 1, every B divided by 3) is, per layer, base + (Δ_core + Δ_2 + Δ_1) / 3, with the
    scales' updates Δ_j read from the fostering stage of the same layer."""
    torch.manual_seed(0)
    fostered = TSMDiffusion(mode="tsm", scales=[4, 2, 1])
    with torch.no_grad():
        for name, p in fostered.unet.named_parameters():
            if "lora_B" in name or "router" in name:
                p.normal_(0, 0.1)
    uniform = TSMDiffusion(mode="tsm", scales=[4, 2, 1])
    uniform.load_state_dict(fostered.state_dict())
    uniform_gates(uniform)
    t = torch.tensor([10, 400, 900])
    for name in ("down_blocks.1.attentions.0.to_q", "down_blocks.0.resnets.0.conv1"):
        layer, reference = uniform.experts[name], fostered.experts[name]
        if isinstance(reference.base, nn.Linear):
            x = torch.randn(3, 4, reference.base.in_features)
        else:
            x = torch.randn(3, reference.base.in_channels, 8, 8)
        layer.timesteps = reference.timesteps = t
        base = reference.base(x)
        deltas = []
        for scale in range(3):
            reference.set_stage("foster", scale)
            deltas.append(reference(x) - base)
        torch.testing.assert_close(layer(x), base + sum(deltas) / 3, atol=1e-5, rtol=1e-5)


def test_per_expert_budget_gives_every_expert_the_same_steps() -> None:
    schedule = TimestepExpertsSchedule(steps_per_expert=10, router_steps=3)
    phases = schedule.phases((4, 2, 1), 1000)
    assert [steps for *_, steps in phases] == [10] * 7 + [3]
    assert [bounds for _, j, bounds, _ in phases if j == 1][:2] == [(0, 500), (500, 1000)]
    assert schedule.total_steps((4, 2, 1), 1000) == 73
    with pytest.raises(ValueError, match="steps_per_expert must be ≥ 1"):
        TimestepExpertsSchedule(steps_per_expert=0)


def test_sample_quality_is_zero_for_the_reference_and_grows_with_a_shift() -> None:
    from zoo.models.tsm.quality import SampleQuality

    dm = DomainShiftDataModule("target", batch_size=64, seed=0)
    dm.setup("fit")
    x, y = dm.train_set.tensors[:2]
    reference = dm.val_set.tensors[0]
    quality = SampleQuality(x, y, reference, steps=60)
    same = quality(reference)
    assert abs(same["fd"]) < 1e-2 and same["target_share"] > 0.8
    assert quality((reference + 0.5).clamp(-1, 1))["fd"] > 1.0
    assert quality(-reference)["fd"] > quality((reference + 0.1).clamp(-1, 1))["fd"]


def test_sample_quality_is_the_frechet_distance_of_the_classifier_features_by_hand() -> None:
    """FD = |μ₁ − μ₂|² + tr(Σ₁ + Σ₂ − 2 (Σ₁ Σ₂)^½) of the classifier's features of [−1, 1] images (scipy's sqrtm)."""
    import numpy as np
    from scipy import linalg

    from zoo.models.tsm.quality import SampleQuality

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(200, 1, 8, 8, generator=g) * 2 - 1, torch.arange(200) % 10
    quality = SampleQuality(x, y, x[:100], steps=20)
    fake = (x[100:] * 0.5).clamp(-1, 1)
    torch.testing.assert_close(quality.net((x[:5] + 1) / 2), quality.net.features(x[:5]))
    with torch.no_grad():
        f1, f2 = (quality.net.features(v).double().numpy() for v in (x[:100], fake))
    m1, m2, s1, s2 = f1.mean(0), f2.mean(0), np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    expected = ((m1 - m2) ** 2).sum() + np.trace(s1 + s2 - 2 * linalg.sqrtm(s1 @ s2).real)
    assert quality(fake)["fd"] == pytest.approx(expected, rel=1e-3, abs=1e-3)


def test_reproduction_arms_on_the_fostered_experts_start_from_the_same_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tsm`` changes only the router, ``tsm_core_more`` only the finest scale's experts (its router stays zero, so
    it is evaluated as core only), ``tsm_core`` is the fostered state itself; TSM counts 7·S + R steps, LoRA-r4 S."""
    from zoo.models.tsm import arms as module

    states: dict[str, dict[str, Tensor]] = {}
    current: list[str] = []

    def record(model: TSMDiffusion, dm: DomainShiftDataModule) -> dict[str, float]:
        states[current[-1]] = {k: v.detach().clone() for k, v in model.unet.state_dict().items()}
        return {"mse": 0.0}

    monkeypatch.setattr(module, "test_mse", record)
    monkeypatch.setattr(module, "mean_abs_gate", lambda model, images: 0.0)
    torch.manual_seed(0)
    base = {k: v.clone() for k, v in TSMDiffusion(mode="pretrain").unet.state_dict().items()}
    from zoo.models.tsm import quality

    monkeypatch.setattr(quality.SampleQuality, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(quality.SampleQuality, "__call__", lambda self, samples: {"fd": 0.0})
    monkeypatch.setattr(quality.SampleQuality, "accuracy", lambda self, images, labels: 1.0)
    arms = module.Arms(base, steps=4, router_steps=2, samples=2, sample_steps=2)
    phases: dict[str, list[str]] = {}
    original_test = record

    def record_with_phase(model: TSMDiffusion, dm: DomainShiftDataModule) -> dict[str, float]:
        phases[current[-1]] = sorted({layer.stage for layer in model.experts.values()})
        return original_test(model, dm)

    monkeypatch.setattr(module, "test_mse", record_with_phase)
    every = ("tsm_core", "tsm", "tsm_core_more", "tsm_const_gates", "tsm_core_matched", "tsm_uniform", "lora_r4",
             "lora_r4_long", "lora_r28", "lora_tscale", "full_ft", "tsm_card", "tsm_card_core")  # fmt: skip
    for arm in every:
        current.append(arm)
        arms(arm, seed=0)
    fostered, routed, core = states["tsm_core"], states["tsm"], states["tsm_core_more"]

    def changed(state: dict[str, Tensor]) -> set[str]:
        return {k for k in fostered if not torch.equal(state[k], fostered[k])}

    assert changed(routed) and all(".router." in k or ".time_gate." in k for k in changed(routed))
    assert changed(core) and all(k.endswith(("lora_A.0", "lora_B.0")) for k in changed(core))
    assert all(not v.any() for k, v in core.items() if ".router." in k or ".time_gate." in k)
    assert (
        arms.static["tsm/steps"] == arms.static["tsm_core_more/steps"] == arms.static["lora_r4_long/steps"] == 7 * 4 + 2
    )
    assert arms.static["lora_r4/steps"] == 4 and arms.static["tsm_core/steps"] == 7 * 4
    for arm in ("lora_r28", "lora_tscale", "full_ft", "tsm_const_gates"):
        assert arms.static[f"{arm}/steps"] == 7 * 4 + 2, arm
    assert arms.static["tsm_core_matched/steps"] == 4 * ((7 * 4 + 2) // 4)
    assert arms.static["tsm_card/steps"] == 3 * 4 + 2 and arms.static["tsm_card_core/steps"] == 3 * 4
    assert all(phases[arm] == ["assemble"] for arm in phases if arm.startswith("tsm")), phases  # core only = assembled
    const = changed(states["tsm_const_gates"])
    assert const and all(k.endswith(".router.bias") for k in const)  # one learned constant per context scale
    matched = {k for k, v in states["tsm_core_matched"].items() if "lora_" in k and v.any() and "lora_B" in k}
    assert matched and all(k.endswith("lora_B.0") for k in matched)  # only the core experts trained
