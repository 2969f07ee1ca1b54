"""Field networks f_θ(x, z) -> (f_x, f_z): an MLP for vectors and a diffusers UNet with a pooled z-head for images."""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

__all__ = ["MLPFieldNet", "UNetFieldNet", "build_field_net"]


class MLPFieldNet(nn.Module):
    """R^{D+1} -> R^{D+1} MLP on (x, z/L) plus ``fourier`` sin/cos features of z/L (the card's toy network).

    Args:
        dim: D.
        L: plate distance (z is fed as z/L).
        hidden: width of the hidden layers.
        depth: number of hidden layers.
        fourier: number of Fourier features of z/L (even; frequencies π·1 … π·fourier/2).

    Example:
        >>> net = MLPFieldNet(dim=2)
        >>> f_x, f_z = net(torch.randn(5, 2), torch.rand(5) * 6)
        >>> f_x.shape, f_z.shape
        (torch.Size([5, 2]), torch.Size([5]))
    """

    def __init__(self, dim: int, L: float = 6.0, hidden: int = 256, depth: int = 3, fourier: int = 16) -> None:
        super().__init__()
        if fourier % 2:
            raise ValueError(f"fourier must be even (sin and cos pairs), got {fourier}")
        self.dim, self.L = dim, float(L)
        self.register_buffer("freqs", math.pi * torch.arange(1, fourier // 2 + 1, dtype=torch.float32))
        layers: list[nn.Module] = []
        width = dim + 1 + fourier
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, dim + 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected x of shape (n, {self.dim}), got {tuple(x.shape)}")
        u = (z / self.L).to(x.dtype)[:, None]
        angles = u * self.freqs
        out = self.net(torch.cat([x, u, angles.sin(), angles.cos()], dim=1))
        return out[:, :-1], out[:, -1]


class UNetFieldNet(nn.Module):
    """A ``diffusers.UNet2DModel`` with C+1 output channels: C for f_x, the extra one averaged over space for f_z.

    This is the PFGM / official EFM image network: z enters as the diffusion "timestep" (rescaled to z/L·1000 so the
    sinusoidal embedding does not alias at z up to L = 500), and the pooled extra channel is the scalar f_z.

    Args:
        channels: image channels C.
        image_size: H = W.
        L: plate distance.
        block_out_channels: UNet widths per resolution (one down/up block each).
        layers_per_block: ResNet layers per block.
        attention: add self-attention to the lowest-resolution block.
        norm_num_groups: GroupNorm groups (must divide every width).

    Example:
        >>> net = UNetFieldNet(channels=1, image_size=8, block_out_channels=(16, 32), norm_num_groups=8)
        >>> f_x, f_z = net(torch.randn(3, 1, 8, 8), torch.rand(3))
        >>> f_x.shape, f_z.shape
        (torch.Size([3, 1, 8, 8]), torch.Size([3]))
    """

    def __init__(
        self,
        channels: int,
        image_size: int,
        L: float = 10.0,
        block_out_channels: Sequence[int] = (32, 64),
        layers_per_block: int = 1,
        attention: bool = False,
        norm_num_groups: int = 8,
    ) -> None:
        super().__init__()
        from diffusers import UNet2DModel

        self.channels, self.image_size, self.L = channels, image_size, float(L)
        blocks = len(block_out_channels)
        down = ["DownBlock2D"] * blocks
        up = ["UpBlock2D"] * blocks
        if attention:
            down[-1], up[0] = "AttnDownBlock2D", "AttnUpBlock2D"
        self.unet = UNet2DModel(
            sample_size=image_size,
            in_channels=channels,
            out_channels=channels + 1,
            block_out_channels=tuple(block_out_channels),
            layers_per_block=layers_per_block,
            down_block_types=tuple(down),
            up_block_types=tuple(up),
            norm_num_groups=norm_num_groups,
        )

    def forward(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        expected = (self.channels, self.image_size, self.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"expected images of shape (n, {', '.join(map(str, expected))}), got {tuple(x.shape)}")
        out = self.unet(x, z * (1000.0 / self.L)).sample
        return out[:, : self.channels], out[:, self.channels].mean(dim=(1, 2))


def build_field_net(net: str, shape: Sequence[int], L: float, **kwargs) -> nn.Module:
    """``"mlp"`` for ``shape == (D,)``, ``"unet"`` for ``shape == (C, H, W)`` (square images)."""
    shape = tuple(shape)
    if net == "mlp":
        if len(shape) != 1:
            raise ValueError(f"the MLP field network takes vectors; got sample shape {shape} (use net='unet')")
        return MLPFieldNet(shape[0], L=L, **kwargs)
    if net == "unet":
        if len(shape) != 3 or shape[1] != shape[2]:
            raise ValueError(f"the UNet field network takes square images (C, H, W); got sample shape {shape}")
        return UNetFieldNet(shape[0], shape[1], L=L, **kwargs)
    raise ValueError(f"unknown field network {net!r}; choose 'mlp' or 'unet'")
