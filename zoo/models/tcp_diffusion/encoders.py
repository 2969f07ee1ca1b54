"""TCP-Diffusion's condition encoders: the TC scalar sequence (the official ``Env_net``) and the NWP field stack.

Both map their modality to one vector per sample that the denoiser adds to its timestep embedding (diffusers'
``class_embed_type="identity"``). The official code concatenates [time ‖ Env_net ‖ NWP] into a 1024-d FiLM vector;
each ResNet block then applies a linear map of (an activation of) that vector, and a sum of embeddings is what
diffusers' ``UNet2DModel`` offers. That is the one departure here: a linear map of a concatenation is a sum of
linear maps of the parts, but the activation is applied after the sum rather than per part.
"""

from __future__ import annotations

from typing import Literal

import torch  # noqa: F401 (the doctests use it)
from torch import Tensor, nn

__all__ = ["FieldStackEncoder", "ScalarSequenceEncoder"]


class ScalarSequenceEncoder(nn.Module):
    """Encode per-frame TC scalars ``(N, T, D)`` into ``(N, out_dim)``: an MLP per frame, a Transformer encoder over
    the frames, the last frame's output (``Env_net.py``: per-group linear maps, an MLP 96→192→192→256 with GELU,
    2 Transformer layers of width 256 and 4 heads, the last frame's token).

    Args:
        num_scalars: D, the scalars per frame (wind, one-hot intensity class, ...).
        out_dim: width of the output (the denoiser's embedding width).
        width: the Transformer's width (256 in the paper).
        layers / heads: the Transformer's depth and heads (2 and 4 in the paper).

    Example:
        >>> enc = ScalarSequenceEncoder(num_scalars=5, out_dim=64, width=32)
        >>> enc(torch.rand(3, 4, 5)).shape
        torch.Size([3, 64])
    """

    def __init__(self, num_scalars: int, out_dim: int, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.num_scalars = num_scalars
        self.mlp = nn.Sequential(
            nn.Linear(num_scalars, 2 * width), nn.GELU(), nn.Linear(2 * width, 2 * width), nn.GELU(),
            nn.Linear(2 * width, width),
        )  # fmt: skip
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, batch_first=True, dropout=0.0)
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(width, out_dim)

    def forward(self, scalars: Tensor) -> Tensor:
        if scalars.ndim != 3 or scalars.shape[-1] != self.num_scalars:
            raise ValueError(f"expected scalars of shape (N, T, {self.num_scalars}), got {tuple(scalars.shape)}")
        return self.out(self.transformer(self.mlp(scalars))[:, -1])


class FieldStackEncoder(nn.Module):
    """Encode a stack of 2-D fields ``(N, C, T, H, W)`` (variables × frames) into ``(N, out_dim)``.

    ``arch="resnet18"`` is the official NWP encoder: torchvision's ResNet-18 (random init) with ``conv1`` taking
    C·T channels and ``fc`` → ``out_dim`` (512 in the paper). ``arch="small"`` is the card's CPU analogue: three
    strided 3×3 convolutions (GroupNorm, SiLU) and global average pooling.

    Args:
        channels: C·T, the variables times frames stacked as channels.
        out_dim: width of the output.
        arch: ``"small"`` or ``"resnet18"``.
        width: first convolution's width (``"small"`` only).

    Example:
        >>> enc = FieldStackEncoder(channels=4, out_dim=64)
        >>> enc(torch.rand(2, 1, 4, 16, 16)).shape
        torch.Size([2, 64])
    """

    def __init__(
        self, channels: int, out_dim: int, arch: Literal["small", "resnet18"] = "small", width: int = 16
    ) -> None:
        super().__init__()
        self.channels = channels
        if arch == "resnet18":
            from torchvision.models import resnet18

            net = resnet18(weights=None, num_classes=out_dim)
            net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.net: nn.Module = net
        elif arch == "small":
            blocks: list[nn.Module] = []
            c_in = channels
            for c_out in (width, 2 * width, 4 * width):
                conv = nn.Conv2d(c_in, c_out, 3, stride=2, padding=1)
                blocks += [conv, nn.GroupNorm(min(8, c_out), c_out), nn.SiLU()]
                c_in = c_out
            self.net = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, out_dim))
        else:
            raise ValueError(f"arch must be 'small' or 'resnet18', got {arch!r}")

    def forward(self, fields: Tensor) -> Tensor:
        if fields.ndim != 5 or fields.shape[1] * fields.shape[2] != self.channels:
            raise ValueError(f"expected fields of shape (N, C, T, H, W) with C·T = {self.channels}, got "
                             f"{tuple(fields.shape)}")  # fmt: skip
        return self.net(fields.flatten(1, 2))
