"""ProDiff's denoiser: a 1-D DDPM-ResNet UNet whose timestep embedding is summed with the "Wide & Deep" joint
condition of the two endpoints and the matched prototype.

Written here because diffusers' ``UNet1DModel`` has no way to add a per-sample condition vector to its timestep
embedding, which is how ProDiff conditions (the input stays the 3 data channels).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from diffusers.models.embeddings import get_timestep_embedding
from torch import Tensor, nn

__all__ = ["GuidedUNet1D", "WideAndDeep"]


class WideAndDeep(nn.Module):
    """J_c = MLP(s_1) + MLP(s_k) [+ MLP(P_c)]: the joint condition, each MLP Linear → ReLU → Linear.

    Args:
        emb_dim: width of J_c (the UNet's timestep-embedding width).
        proto_dim: prototype width D; None drops the prototype branch (the Diff+Mask ablation, where the official
            P_c := 0 would only add the MLP's constant bias).
    """

    def __init__(self, emb_dim: int, proto_dim: int | None) -> None:
        super().__init__()

        def mlp(d: int) -> nn.Sequential:
            return nn.Sequential(nn.Linear(d, emb_dim), nn.ReLU(), nn.Linear(emb_dim, emb_dim))

        self.start, self.end = mlp(3), mlp(3)
        self.prototype = None if proto_dim is None else mlp(proto_dim)

    def forward(self, start: Tensor, end: Tensor, prototype: Tensor | None = None) -> Tensor:
        j = self.start(start) + self.end(end)
        if self.prototype is not None:
            if prototype is None:
                raise ValueError("this joint condition has a prototype branch: pass the matched prototype")
            j = j + self.prototype(prototype)
        return j


class _ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, emb_dim: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, c_in), nn.Conv1d(c_in, c_out, 3, padding=1)
        self.emb = nn.Linear(emb_dim, c_out)
        self.norm2, self.conv2 = nn.GroupNorm(groups, c_out), nn.Conv1d(c_out, c_out, 3, padding=1)
        self.dropout = nn.Dropout(dropout)
        self.skip = nn.Identity() if c_in == c_out else nn.Conv1d(c_in, c_out, 1)

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.emb(F.silu(emb))[:, :, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.skip(x) + h


class _Attention(nn.Module):
    def __init__(self, c: int, groups: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(groups, c)
        self.attn = nn.MultiheadAttention(c, 1, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(x).transpose(1, 2)
        return x + self.attn(h, h, h, need_weights=False)[0].transpose(1, 2)


def _fit(h: Tensor, length: int) -> Tensor:
    """Pad (replicating the edge) or crop ``h`` to ``length``: odd lengths halve to fewer than twice their half."""
    if h.shape[-1] > length:
        return h[..., :length]
    if h.shape[-1] < length:
        return F.pad(h, (0, length - h.shape[-1]), mode="replicate")
    return h


class GuidedUNet1D(nn.Module):
    """ε_θ(x_t, t, J): a 1-D UNet (ResBlocks with GroupNorm and SiLU, stride-2 conv down, nearest up + conv, skip
    connections, a mid block with self-attention) over [B, 3, k], conditioned by adding J to the timestep
    embedding (sinusoidal(ch) → Linear → SiLU → Linear, width 4·ch).

    Args:
        ch: base width (128 in the paper, 32 in the card's CPU reproduction).
        ch_mult: width multipliers per level; every level but the last halves the length.
        num_res_blocks: ResBlocks per level.
        groups: GroupNorm groups (must divide every width).
        dropout: ResBlock dropout.

    Example:
        >>> unet = GuidedUNet1D(ch=16, ch_mult=(1, 2), groups=4)
        >>> x, t, cond = torch.randn(2, 3, 6), torch.tensor([0, 99]), torch.randn(2, 64)
        >>> unet(x, t, cond).shape
        torch.Size([2, 3, 6])
    """

    def __init__(self, ch: int = 32, ch_mult: Sequence[int] = (1, 2), num_res_blocks: int = 1, groups: int = 8,
                 dropout: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        widths = [ch * m for m in ch_mult]
        if any(w % groups for w in [ch, *widths]):
            raise ValueError(f"GroupNorm groups {groups} must divide every width {[ch, *widths]}")
        self.ch = ch
        self.emb_dim = emb = 4 * ch
        self.temb = nn.Sequential(nn.Linear(ch, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.conv_in = nn.Conv1d(3, ch, 3, padding=1)
        self.down = nn.ModuleList()
        skips, c = [ch], ch
        for level, w in enumerate(widths):
            for _ in range(num_res_blocks):
                self.down.append(_ResBlock(c, w, emb, groups, dropout))
                c = w
                skips.append(c)
            if level < len(widths) - 1:
                self.down.append(nn.Conv1d(c, c, 3, stride=2, padding=1))
                skips.append(c)
        self.mid = nn.ModuleList([_ResBlock(c, c, emb, groups, dropout), _Attention(c, groups),
                                  _ResBlock(c, c, emb, groups, dropout)])  # fmt: skip
        self.up = nn.ModuleList()
        for level, w in reversed(list(enumerate(widths))):
            for _ in range(num_res_blocks + 1):
                self.up.append(_ResBlock(c + skips.pop(), w, emb, groups, dropout))
                c = w
            if level > 0:
                self.up.append(nn.Conv1d(c, c, 3, padding=1))  # after nearest-neighbour upsampling
        self.out = nn.Sequential(nn.GroupNorm(groups, c), nn.SiLU(), nn.Conv1d(c, 3, 3, padding=1))

    def forward(self, x: Tensor, t: Tensor, cond: Tensor) -> Tensor:
        """``x`` [B, 3, k], ``t`` [B] timesteps, ``cond`` [B, 4·ch] → ε̂ [B, 3, k]."""
        t = t.expand(len(x)) if t.ndim == 0 else t
        emb = self.temb(get_timestep_embedding(t, self.ch, flip_sin_to_cos=False, downscale_freq_shift=1))
        emb = emb + cond
        h = self.conv_in(x)
        hs = [h]
        for block in self.down:
            h = block(h, emb) if isinstance(block, _ResBlock) else block(h)
            hs.append(h)
        for block in self.mid:
            h = block(h, emb) if isinstance(block, _ResBlock) else block(h)
        for block in self.up:
            if isinstance(block, _ResBlock):
                skip = hs.pop()
                h = block(torch.cat([_fit(h, skip.shape[-1]), skip], 1), emb)
            else:
                h = block(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(_fit(h, x.shape[-1]))
