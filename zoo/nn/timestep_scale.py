"""A timestep-conditioned scale for peft LoRA adapters: the cheapest way to let one LoRA act differently per noise level.

Each adapted layer's LoRA update is multiplied by a learned scalar per timestep, ``h = W x + s(t) · (α/r) B A x`` with
``s = nn.Embedding(T, 1)`` initialised to 1 (so training starts from plain LoRA). It is the stand-in that TimeStep
Master's experts must beat: one set of LoRA weights whose strength, not direction, depends on t.

peft has no timestep conditioning, so the scale is a forward hook on each layer's ``lora_B`` module (a
``nn.Embedding`` registered on that module); the timestep comes from the denoiser call, read by the same forward
pre-hook logic as :mod:`zoo.nn.timestep_experts`.
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

    Returns the scales by module name; each is registered on the layer's ``lora_B[adapter]`` module as
    ``time_scale`` (trainable, in the model's state dict as ``….lora_B.<adapter>.time_scale.weight``, which peft's
    "only LoRA weights train" rule keeps trainable). The hooks read the scale and the timesteps from the module they
    run on, so a deep copy of the model (an EMA) uses its own scales. Raises ``ValueError`` when ``model`` has no LoRA
    layer with ``adapter`` or no ``timestep`` argument.

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
        target = lora_b[adapter]
        scale = nn.Embedding(num_timesteps, 1)
        nn.init.ones_(scale.weight)
        target.time_scale = scale.to(next(target.parameters()).device)
        target._zoo_timesteps = None
        target.register_forward_hook(_scale_update)
        scales[name] = target.time_scale
    if not scales:
        raise ValueError(f"{type(model).__name__} has no peft LoRA layer with adapter {adapter!r}")
    signature = inspect.signature(model.forward)
    if "timestep" not in signature.parameters:
        raise ValueError(f"{type(model).__name__}.forward has no `timestep` argument to condition the scale on")
    first = next(iter(signature.parameters))

    def hand_over_timestep(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        arguments = _call_arguments(signature, args, kwargs)
        sample = arguments[first]
        t = timestep_row(_timestep_from_call(arguments, sample.shape[0]).to(sample.device), num_timesteps)
        for m in module.modules():  # the module called: a deep copy hands the timesteps to its own layers
            if isinstance(getattr(m, "time_scale", None), nn.Embedding):
                m._zoo_timesteps = t

    model.register_forward_pre_hook(hand_over_timestep, with_kwargs=True)
    return scales


def _scale_update(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
    """The forward hook of a ``lora_B`` module: each sample's update times its timestep's scale."""
    t = module._zoo_timesteps
    if t is None:
        raise RuntimeError("no timestep: call the model that add_timestep_scale wrapped, with its timestep")
    if len(t) != out.shape[0]:  # one t for all, or a batch repeated after t was built (as timestep_experts does)
        t = t.expand(out.shape[0]) if len(t) == 1 else t.repeat_interleave(out.shape[0] // len(t))
    s = module.time_scale(t).to(out.dtype)  # (B, 1)
    return out * s.view(len(t), *([1] * (out.dim() - 1)))
