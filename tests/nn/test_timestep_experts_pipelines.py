"""Timestep experts on the paths real pipelines take: the assembled output by hand, strided convolutions, float and
t = T timesteps of flow-matching schedulers, and transformer denoisers that take the timestep after other arguments.

Each diffusers denoiser is a tiny random instance built from its config (no weights), driven by a DDPM-family and a
flow-matching scheduler's own timesteps, in the assemble stage with non-zero experts and router.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from zoo.nn.timestep_experts import TimestepExpertsConv2d, TimestepExpertsLinear, inject_timestep_experts


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _randomise(layers: Any, seed: int = 0) -> None:
    """Non-zero B and router everywhere, so that every expert and gate changes the output."""
    g = torch.Generator().manual_seed(seed)
    for layer in layers:
        for p in [*layer.lora_B, *layer.router_parameters()]:
            p.data.copy_(0.1 * torch.randn(p.shape, generator=g))


# ------------------------------------------------------------------------------------------------ the maths by hand
def test_assembled_linear_is_core_plus_gated_context_experts_by_hand() -> None:
    """Check y = W x + s (B_c A_c x + Σ_j G_j(x, t) B_j A_j x) with G_j = x·F_j + f_j + ε_j(t), each sample through its
    own interval's experts: every context gate routed by its own column, ε read at t (not T − 1 − t). s = α / r is
    written out (α = 4, r = 2: 2.0), not read from the layer, so that a wrong scaling cannot cancel."""
    torch.manual_seed(0)
    layer = TimestepExpertsLinear(nn.Linear(6, 5), scales=(4, 2, 1), rank=2, alpha=4.0)
    _randomise([layer])
    layer.set_stage("assemble")
    t = torch.tensor([10, 400, 620, 999])
    layer.timesteps = t
    x = torch.randn(4, 3, 6)
    got = layer(x)
    expected = layer.base(x)
    for b in range(4):
        gates = x[b] @ layer.router.weight.T + layer.router.bias + layer.time_gate.weight[t[b]]  # (3 tokens, 2)
        for j, n in enumerate(layer.scales):
            i = int(t[b]) * n // 1000
            update = x[b] @ layer.lora_A[j][i].T @ layer.lora_B[j][i].T  # (3, 5)
            expected[b] += 2.0 * (update if j == 0 else gates[:, j - 1 : j] * update)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("stride", "padding"), [(2, 1), (1, 0), (2, 0)])
def test_assembled_conv_gates_at_the_output_resolution(stride: int, padding: int) -> None:
    """Check a strided / unpadded convolution in the assemble stage: it runs, and equals core + pooled gates × context
    computed by hand (gates from the input averaged over each output pixel's region, adaptive average pooling), with
    the scaling α / r = 1 / 2 written out."""
    torch.manual_seed(1)
    layer = TimestepExpertsConv2d(nn.Conv2d(3, 4, 3, stride=stride, padding=padding), scales=(2, 1), rank=2, alpha=1.0)
    _randomise([layer])
    layer.set_stage("assemble")
    t = torch.tensor([100.0, 900.5])  # float timesteps: the time gate reads floor(t)
    layer.timesteps = t
    x = torch.randn(2, 3, 9, 9)
    got = layer(x)
    base = layer.base
    out = base(x)
    size = out.shape[2:]
    conv = lambda w: nn.functional.conv2d(x, w, None, base.stride, base.padding)  # noqa: E731
    rows = t.floor().long()
    linear = nn.functional.adaptive_avg_pool2d(
        torch.einsum("bchw,gc->bghw", x, layer.router.weight) + layer.router.bias[None, :, None, None], tuple(size)
    )
    gate = linear + layer.time_gate.weight[rows][:, :, None, None]  # (B, 1, H', W')
    for b in range(2):
        for j, n in enumerate(layer.scales):
            i = int(rows[b]) * n // 1000
            h = conv(layer.lora_A[j][i])[b]  # (r, H', W')
            update = torch.einsum("rhw,dr->dhw", h, layer.lora_B[j][i])
            out[b] += 0.5 * (update if j == 0 else gate[b, 0] * update)
    assert got.shape == out.shape
    torch.testing.assert_close(got, out, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ real denoisers
def _unet_cond() -> tuple[nn.Module, Callable[[nn.Module, Tensor, Tensor], Tensor], list[str]]:
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=12,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    text = torch.randn(2, 5, 12)
    return model, lambda m, x, t: m(x, t, text).sample, ["to_q", "to_v", "conv1", "conv2", "conv"]


def _sd3() -> tuple[nn.Module, Callable[[nn.Module, Tensor, Tensor], Tensor], list[str]]:
    from diffusers import SD3Transformer2DModel

    model = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=12,
        caption_projection_dim=16,
        pooled_projection_dim=10,
        out_channels=4,
        pos_embed_max_size=8,
    )
    text, pooled = torch.randn(2, 5, 12), torch.randn(2, 10)
    # Positional, as pipelines' helpers may call it: (hidden_states, encoder_hidden_states, pooled_projections, t).
    return model, lambda m, x, t: m(x, text, pooled, t).sample, ["to_q", "to_v", "add_q_proj", "proj"]


def _pixart() -> tuple[nn.Module, Callable[[nn.Module, Tensor, Tensor], Tensor], list[str]]:
    from diffusers import PixArtTransformer2DModel

    model = PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        cross_attention_dim=16,
        sample_size=8,
        patch_size=2,
        caption_channels=12,
        use_additional_conditions=False,
    )
    text = torch.randn(2, 5, 12)
    # Positional (hidden_states, encoder_hidden_states, timestep): args[1] is the text, not t.
    return model, lambda m, x, t: m(x, text, t, added_cond_kwargs={}).sample, ["to_q", "to_v", "proj"]


def _schedulers() -> dict[str, Any]:
    from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler

    return {"ddpm": DDPMScheduler(num_train_timesteps=1000), "flow": FlowMatchEulerDiscreteScheduler()}


@pytest.mark.parametrize("scheduler_name", ["ddpm", "flow"])
@pytest.mark.parametrize("build", [_unet_cond, _sd3, _pixart], ids=["unet2dcondition", "sd3", "pixart"])
def test_assembled_experts_run_a_real_denoiser_with_its_schedulers_timesteps(build: Any, scheduler_name: str) -> None:
    """Check the assemble stage through a short sampling loop of each scheduler (flow matching: float t from 1000.0):
    finite outputs that differ from the base model's, and the positional call routes like the keyword one."""
    torch.manual_seed(0)
    model, call, targets = build()
    model.eval()
    x = torch.randn(2, 4, 8, 8)
    scheduler = _schedulers()[scheduler_name]
    scheduler.set_timesteps(3)
    timesteps = list(scheduler.timesteps)
    with torch.no_grad():
        base = [call(model, x, t.expand(2)) for t in timesteps]
    experts = inject_timestep_experts(model, targets, scales=(4, 2, 1), rank=2)
    if build is _unet_cond:  # the downsampler's stride-2 convolution is among the adapted layers
        assert any(isinstance(m, TimestepExpertsConv2d) and m.base.stride == (2, 2) for m in experts.values())
    _randomise(experts.values())
    for layer in experts.values():
        layer.set_stage("assemble")
    if scheduler_name == "flow":
        assert float(timesteps[0]) == 1000.0 and timesteps[0].is_floating_point()
    sample = x
    with torch.no_grad():
        for step, t in enumerate(timesteps):
            out = call(model, sample, t.expand(2))
            assert torch.isfinite(out).all()
            assert not torch.allclose(out, base[step])
            sample = scheduler.step(out, t, sample).prev_sample
        # The hook found the call's timestep by name, wherever it stands among the positional arguments.
        t = timesteps[-1].expand(2)
        for layer in experts.values():
            layer.timesteps = None
        call(model, x, t)
        assert all(layer.timesteps is not None and torch.equal(layer.timesteps, t) for layer in experts.values())
