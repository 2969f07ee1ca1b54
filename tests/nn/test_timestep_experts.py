"""LoRA timestep experts: interval routing, exact zero-init behaviour, per-sample routing, the timestep hook, peft."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import UNet2DModel
from torch import Tensor, nn
from torch.nn import functional as F  # noqa: N812

from zoo.nn.timestep_experts import (
    TimestepExpertsConv2d,
    TimestepExpertsLinear,
    expert_index,
    inject_timestep_experts,
    load_peft_expert,
)

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2"]


def _unet() -> UNet2DModel:
    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    ).eval()


def _randomise_experts(experts: dict, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for layer in experts.values():
        for b in layer.lora_B:
            b.data.copy_(0.05 * torch.randn(b.shape, generator=g))


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_expert_index_follows_the_interval_formula_at_the_boundaries(n: int) -> None:
    """Check floor(t·n/T) at t = 0, T/n − 1, T/n and T − 1, and that it agrees with the paper's 1-indexed ceil."""
    T = 1000  # noqa: N806
    t = torch.tensor([0, T // n - 1, min(T // n, T - 1), T - 1])
    assert expert_index(t, n, T).tolist() == [0, 0, min(1, n - 1), n - 1]
    every = torch.arange(T)
    assert torch.equal(expert_index(every, n, T), torch.ceil((every + 1) * n / T).long() - 1)
    assert torch.equal(expert_index(every.float() + 0.5, n, T), expert_index(every, n, T))  # flow models' float t


@pytest.mark.parametrize("bad", [-1, 1001, -0.5, 1000.5])
def test_timestep_outside_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1000\]"):
        expert_index(torch.tensor([5, bad]), 4)


def test_timestep_t_equals_t_max_lands_in_the_last_interval() -> None:
    """Check that t = T (FlowMatchEulerDiscreteScheduler's first step, 1000.0) routes to the last expert, as T − 1."""
    for t in (torch.tensor([1000.0, 999.0]), torch.tensor([1000, 999])):
        assert expert_index(t, 4).tolist() == [3, 3]


def test_zero_init_gives_exactly_the_base_model_in_every_stage() -> None:
    """Check that B = 0 (and a zero router) leaves the UNet's output bit for bit unchanged."""
    unet = _unet()
    x, t = torch.randn(3, 1, 8, 8), torch.tensor([0, 500, 999])
    with torch.no_grad():
        reference = unet(x, t).sample
        experts = inject_timestep_experts(unet, TARGETS, scales=(4, 2, 1), rank=4)
        for stage, scale in (("foster", 0), ("foster", 2), ("assemble", 0)):
            for layer in experts.values():
                layer.set_stage(stage, scale)
            assert torch.equal(unet(x, t).sample, reference), stage
    assert all(not p.requires_grad for layer in experts.values() for p in layer.base.parameters())


def test_zero_router_gives_exactly_the_core_experts() -> None:
    """Check that assembling with the zero-initialised router gives the finest scale's experts alone (core only)."""
    unet = _unet()
    experts = inject_timestep_experts(unet, TARGETS, scales=(4, 2, 1), rank=4)
    _randomise_experts(experts)
    x, t = torch.randn(4, 1, 8, 8), torch.tensor([10, 260, 510, 990])
    with torch.no_grad():
        for layer in experts.values():
            layer.set_stage("foster", 0)
        core = unet(x, t).sample
        for layer in experts.values():
            layer.set_stage("assemble")
        assembled = unet(x, t).sample
        for layer in experts.values():
            layer.set_stage("base")
        base = unet(x, t).sample
    # Equal up to float summation order: assembling runs the core and the (zero-gated) context experts through one
    # fused projection and one B product.
    torch.testing.assert_close(assembled, core, rtol=0, atol=1e-6)
    assert not torch.allclose(core, base)  # the experts do act


def test_routing_is_per_sample_in_the_batch() -> None:
    """Check that a batch with different timesteps gives each sample what a batch of one would give it."""
    unet = _unet()
    experts = inject_timestep_experts(unet, TARGETS, scales=(4, 2, 1), rank=2)
    _randomise_experts(experts)
    for layer in experts.values():
        layer.set_stage("assemble")
        nn.init.normal_(layer.router.weight, std=0.1)
        nn.init.normal_(layer.time_gate.weight, std=0.1)
    x, t = torch.randn(4, 1, 8, 8), torch.tensor([999, 0, 400, 600])
    with torch.no_grad():
        batched = unet(x, t).sample
        alone = torch.cat([unet(x[i : i + 1], t[i : i + 1]).sample for i in range(4)])
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)


def test_the_hook_reads_every_form_of_timestep() -> None:
    """Check positional, keyword, int and 0-d timesteps, and a batch doubled after t was built (CFG)."""
    unet = _unet()
    experts = inject_timestep_experts(unet, ["to_q"], scales=(2, 1), rank=2)
    layer = next(iter(experts.values()))
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        unet(x, 700)
        assert layer.timesteps.tolist() == [700, 700]
        unet(x, timestep=torch.tensor(3))
        assert layer.timesteps.tolist() == [3, 3]
        unet(sample=x, timestep=torch.tensor([1, 2]))
        assert layer.timesteps.tolist() == [1, 2]
    layer.timesteps = torch.tensor([10, 900])
    assert layer._batch_timesteps(4).tolist() == [10, 10, 900, 900]


def test_unknown_target_module_names_the_closest_ones() -> None:
    with pytest.raises(ValueError, match="did you mean 'to_q'"):
        inject_timestep_experts(_unet(), ["to_qq"])


def test_bad_construction_is_refused() -> None:
    with pytest.raises(ValueError, match="finest first"):
        TimestepExpertsLinear(nn.Linear(4, 4), scales=(1, 4))
    with pytest.raises(ValueError, match="groups=1"):
        TimestepExpertsConv2d(nn.Conv2d(4, 4, 3, groups=2))
    layer = TimestepExpertsLinear(nn.Linear(4, 4), scales=(2, 1))
    with pytest.raises(RuntimeError, match="no timestep"):
        layer(torch.randn(2, 4))


def test_a_peft_lora_adapter_loads_into_its_expert_slot() -> None:
    """Check that an expert loaded from a peft LoRA (Linear and Conv2d targets) reproduces the peft model's output for
    timesteps inside its interval, and that other intervals stay at the base model."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    targets = ["to_q", "to_v", "conv1"]
    peft_model = get_peft_model(_unet(), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    g = torch.Generator().manual_seed(2)
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            p.data.copy_(0.05 * torch.randn(p.shape, generator=g))
    state = get_peft_model_state_dict(peft_model)
    unet = _unet()
    experts = inject_timestep_experts(unet, targets, scales=(4, 2, 1), rank=4)
    assert load_peft_expert(experts, state, scale=0, interval=2, peft_scaling=2.0) == len(experts)
    for layer in experts.values():
        layer.set_stage("foster", 0)
    x = torch.randn(2, 1, 8, 8)
    inside, outside = torch.tensor([500, 749]), torch.tensor([0, 999])
    with torch.no_grad():
        torch.testing.assert_close(unet(x, inside).sample, peft_model(x, inside).sample, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(unet(x, outside).sample, _unet()(x, outside).sample, rtol=0, atol=0)
    with pytest.raises(KeyError, match="no unique peft LoRA"):
        load_peft_expert(experts, {}, 0, 0)


# ------------------------------------------------------------------------------------------------ LoRA scaling pinned
# These tests never read ``layer.scaling``: the expected update uses peft's own layers or the literal α / r, so that a
# scaling computed the wrong way round (r / α) cannot cancel out of both sides.
class _TwoLayers(nn.Module):
    """A Linear on tokens and a 3×3 Conv2d on an image: peft's two LoRA forms (matmul; conv A then 1×1 B)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 5)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, tokens: Tensor, image: Tensor) -> tuple[Tensor, Tensor]:
        return self.lin(tokens), self.conv(image)


def _peft_two_layers(alpha: float) -> nn.Module:
    """peft LoRA (r = 4, ``lora_alpha`` = alpha) on both layers, with non-zero random B."""
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    model = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=alpha, target_modules=["lin", "conv"]), _TwoLayers())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


# (α, α / r written out for r = 4), (scales, the scale fostered, its interval, timesteps inside that interval)
SCALINGS = [(8.0, 2.0), (2.0, 0.5)]
SLOTS = [((1,), 0, 0, [0, 999]), ((4, 2, 1), 0, 2, [500, 749]), ((4, 2, 1), 1, 1, [500, 999])]


@pytest.mark.parametrize("how", ["copy", "load_peft_expert", "load_peft_expert_alpha_1"])
@pytest.mark.parametrize(("scales", "scale", "interval", "inside"), SLOTS)
@pytest.mark.parametrize(("alpha", "scaling"), SCALINGS)
def test_an_expert_with_peft_lora_weights_gives_peft_lora_output(
    alpha: float, scaling: float, scales: tuple[int, ...], scale: int, interval: int, inside: list[int], how: str
) -> None:
    """Check that a Linear / 3×3 Conv2d expert holding a peft LoRA's A and B, with the same α and r, gives peft's
    output: A and B copied as they are (the expert must scale by α / r itself) or through ``load_peft_expert`` with
    ``peft_scaling`` = α / r, also into experts of another α (1: B must be rescaled by (α / r) / (1 / r))."""
    from peft import get_peft_model_state_dict

    peft_model = _peft_two_layers(alpha)
    assert peft_model.lin.scaling["default"] == scaling  # peft's own α / r, the number the expert must match
    own_alpha = 1.0 if how == "load_peft_expert_alpha_1" else alpha
    experts = {
        "lin": TimestepExpertsLinear(copy.deepcopy(peft_model.lin.base_layer), scales, rank=4, alpha=own_alpha),
        "conv": TimestepExpertsConv2d(copy.deepcopy(peft_model.conv.base_layer), scales, rank=4, alpha=own_alpha),
    }
    if how == "copy":
        with torch.no_grad():
            for name, layer in experts.items():
                peft_layer = getattr(peft_model, name)
                b = peft_layer.lora_B["default"].weight
                layer.lora_A[scale][interval].copy_(peft_layer.lora_A["default"].weight)
                layer.lora_B[scale][interval].copy_(b.reshape(b.shape[0], -1))
    else:
        state = get_peft_model_state_dict(peft_model)
        assert load_peft_expert(experts, state, scale=scale, interval=interval, peft_scaling=scaling) == 2
    tokens, image = torch.randn(2, 3, 6), torch.randn(2, 3, 7, 7)
    with torch.no_grad():
        want_lin, want_conv = peft_model(tokens, image)
        for layer in experts.values():
            layer.set_stage("foster", scale)
            layer.timesteps = torch.tensor(inside)
        torch.testing.assert_close(experts["lin"](tokens), want_lin, rtol=0, atol=1e-6)
        torch.testing.assert_close(experts["conv"](image), want_conv, rtol=0, atol=1e-6)
        assert not torch.allclose(want_lin, peft_model.lin.base_layer(tokens))  # the LoRA does act


@pytest.mark.parametrize(("alpha", "scaling"), SCALINGS)
def test_fostered_experts_are_lora_by_hand_with_the_literal_scaling(alpha: float, scaling: float) -> None:
    """Check y = W x + b + (α / r) · B_i A_i x, with α / r written out and the expert i of each sample written out
    (t = 0, 249, 250, 999 with 4 intervals: 0, 0, 1, 3), by explicit matmuls and ``F.conv2d``."""
    torch.manual_seed(0)
    lin = TimestepExpertsLinear(nn.Linear(6, 5), scales=(4,), rank=4, alpha=alpha)
    conv = TimestepExpertsConv2d(nn.Conv2d(3, 4, 3, padding=1), scales=(4,), rank=4, alpha=alpha)
    g = torch.Generator().manual_seed(4)
    t, index = torch.tensor([0, 249, 250, 999]), [0, 0, 1, 3]
    tokens, image = torch.randn(4, 3, 6), torch.randn(4, 3, 7, 7)
    with torch.no_grad():
        for layer in (lin, conv):
            layer.lora_B[0].copy_(0.3 * torch.randn(layer.lora_B[0].shape, generator=g))
            layer.timesteps = t
        got_lin, got_conv = lin(tokens), conv(image)
        for b, i in enumerate(index):
            a, bb = lin.lora_A[0][i], lin.lora_B[0][i]  # (r, k), (d, r)
            want = tokens[b] @ lin.base.weight.T + lin.base.bias + scaling * ((tokens[b] @ a.T) @ bb.T)
            torch.testing.assert_close(got_lin[b], want, rtol=0, atol=1e-6)
            a, bb, x = conv.lora_A[0][i], conv.lora_B[0][i], image[b : b + 1]  # (r, k, 3, 3), (d, r)
            base = F.conv2d(x, conv.base.weight, conv.base.bias, padding=1)
            want = base + scaling * F.conv2d(F.conv2d(x, a, padding=1), bb[:, :, None, None])
            torch.testing.assert_close(got_conv[b : b + 1], want, rtol=0, atol=1e-6)


def test_a_dit_transformer_gets_experts_and_routes_per_sample() -> None:
    """Check the component on a diffusers DiT (timestep passed as a keyword): exact at B = 0, per-sample routing."""
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    dit = DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=1,
        out_channels=1,
        num_layers=1,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
        norm_num_groups=1,
    ).eval()
    x, t, labels = torch.randn(3, 1, 8, 8), torch.tensor([5, 480, 900]), torch.tensor([1, 2, 3])
    with torch.no_grad():
        reference = dit(x, timestep=t, class_labels=labels).sample
        experts = inject_timestep_experts(dit, ["to_q", "to_k", "to_v", "to_out.0"], scales=(4, 2, 1), rank=2)
        assert torch.equal(dit(x, timestep=t, class_labels=labels).sample, reference)
        _randomise_experts(experts)
        for layer in experts.values():
            layer.set_stage("assemble")
            nn.init.normal_(layer.time_gate.weight, std=0.1)
        batched = dit(x, timestep=t, class_labels=labels).sample
        alone = torch.cat(
            [dit(x[i : i + 1], timestep=t[i : i + 1], class_labels=labels[i : i + 1]).sample for i in range(3)]
        )
    assert not torch.allclose(batched, reference)
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)


def test_a_text_conditioned_unet_gets_experts_on_its_cross_attention() -> None:
    """Check the component on a diffusers UNet2DConditionModel: exact at B = 0, experts act once B is non-zero."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=12,
        attention_head_dim=4,
        norm_num_groups=8,
    ).eval()
    x, t, text = torch.randn(2, 1, 8, 8), torch.tensor([30, 970]), torch.randn(2, 5, 12)
    with torch.no_grad():
        reference = unet(x, t, encoder_hidden_states=text).sample
        experts = inject_timestep_experts(unet, ["attn2.to_k", "attn2.to_v"], scales=(2, 1), rank=2)
        assert torch.equal(unet(x, t, encoder_hidden_states=text).sample, reference)
        _randomise_experts(experts)
        for layer in experts.values():
            layer.set_stage("foster", 0)
        assert not torch.allclose(unet(x, t, encoder_hidden_states=text).sample, reference)


def test_a_denoiser_call_with_a_timestep_outside_the_range_is_refused() -> None:
    """Check that the pre-hook checks the call's timesteps once (the layers route without reading them back)."""
    unet = _unet()
    inject_timestep_experts(unet, ["to_q"], scales=(2, 1), rank=2)
    with pytest.raises(ValueError, match=r"\[0, 1000\]"):
        unet(torch.randn(2, 1, 8, 8), torch.tensor([3, 1001]))
