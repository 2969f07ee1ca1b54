"""A timestep-conditioned scale for peft LoRA adapters: the cheapest way to let one LoRA act differently per noise level.

Each adapted layer's LoRA update is multiplied by a learned scalar per timestep, ``h = W x + s(t) · (α/r) B A x`` with
``s = nn.Embedding(T, 1)`` initialised to 1 (so training starts from plain LoRA). It is the stand-in that TimeStep
Master's experts must beat: one set of LoRA weights whose strength, not direction, depends on t.

peft has no timestep conditioning, so the scale is a forward hook on each layer's ``lora_B`` module; the timestep
comes from the denoiser call, read by the same forward pre-hook logic as :mod:`zoo.nn.timestep_experts`.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import Tensor, nn

from zoo.nn.timestep_experts import _call_arguments, _timestep_from_call, timestep_row

__all__ = ["add_timestep_scale"]


def add_timestep_scale(
    model: nn.Module, num_timesteps: int = 1000, adapter: str = "default"
) -> dict[str, nn.Embedding]:
    """Give every peft LoRA layer of ``model`` (its ``adapter``) a learned per-timestep scale of its update.

    Returns the scales by module name; each is registered on its LoRA layer as ``lora_time_scale`` (trainable, in the
    model's state dict). Raises ``ValueError`` when ``model`` has no LoRA layer with ``adapter`` or no ``timestep``
    argument.

    Example:
        >>> import torch
        >>> from diffusers import UNet2DModel
        >>> from peft import LoraConfig, inject_adapter_in_model
        >>> unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
        ...                    block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        ...                    up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)
        >>> unet = inject_adapter_in_model(LoraConfig(r=2, target_modules=["to_q", "to_v"]), unet)
        >>> scales = add_timestep_scale(unet)
        >>> len(scales), unet(torch.randn(2, 1, 8, 8), torch.tensor([3, 800])).sample.shape
        (8, torch.Size([2, 1, 8, 8]))
    """
    scales: dict[str, nn.Embedding] = {}
    for name, layer in model.named_modules():
        lora_b = getattr(layer, "lora_B", None)
        if not isinstance(lora_b, nn.ModuleDict) or adapter not in lora_b:
            continue
        scale = nn.Embedding(num_timesteps, 1)
        nn.init.ones_(scale.weight)
        layer.lora_time_scale = scale.to(next(lora_b[adapter].parameters()).device)
        layer._zoo_timesteps = None
        lora_b[adapter].register_forward_hook(_scaled(layer, num_timesteps))
        scales[name] = layer.lora_time_scale
    if not scales:
        raise ValueError(f"{type(model).__name__} has no peft LoRA layer with adapter {adapter!r}")
    signature = inspect.signature(model.forward)
    if "timestep" not in signature.parameters:
        raise ValueError(f"{type(model).__name__}.forward has no `timestep` argument to condition the scale on")
    first = next(iter(signature.parameters))
    layers = [model.get_submodule(name) for name in scales]

    def hand_over_timestep(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        arguments = _call_arguments(signature, args, kwargs)
        sample = arguments[first]
        t = timestep_row(_timestep_from_call(arguments, sample.shape[0]).to(sample.device), num_timesteps)
        for layer in layers:
            layer._zoo_timesteps = t

    model.register_forward_pre_hook(hand_over_timestep, with_kwargs=True)
    return scales


def _scaled(layer: nn.Module, num_timesteps: int) -> Any:
    """The forward hook of ``layer``'s ``lora_B``: each sample's update times its timestep's scale."""

    def hook(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
        t = layer._zoo_timesteps
        if t is None:
            raise RuntimeError("no timestep: call the model that add_timestep_scale wrapped, with its timestep")
        if len(t) != out.shape[0]:  # one t for all, or a batch doubled after t was built (CFG)
            t = t.expand(out.shape[0]) if len(t) == 1 else t.repeat_interleave(out.shape[0] // len(t))
        s = layer.lora_time_scale(t).to(out.dtype)  # (B, 1)
        return out * s.view(len(t), *([1] * (out.dim() - 1)))

    return hook
