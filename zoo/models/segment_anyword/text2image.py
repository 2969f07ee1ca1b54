"""The "frozen pretrained" text-to-image diffusion model of the embedded default: a tiny text encoder and a diffusers
``UNet2DConditionModel`` trained from scratch on captioned shape scenes (card §6; no weights can be downloaded here).

The text encoder is the card's: token embeddings + learned positions + a 2-layer Transformer encoder (d = 32, 4 heads);
its token embedding is an ``nn.Embedding`` (``get_input_embeddings()``), the interface textual inversion needs, as in
transformers' text encoders. The denoiser is pixel-space (no VAE), ε-prediction on a cosine DDPM schedule, trained with
10 % caption dropout (the empty caption is BOS, EOS and padding).
"""

from __future__ import annotations

import torch
from diffusers import DDPMScheduler, UNet2DConditionModel
from torch import Tensor, nn

__all__ = ["ShapeTextEncoder", "TextToImage"]


class ShapeTextEncoder(nn.Module):
    """Token ids ``(B, T)`` → contextual states ``(B, T, dim)``.

    Example:
        >>> enc = ShapeTextEncoder(vocab_size=14, dim=32)
        >>> enc(torch.tensor([[1, 3, 7, 11, 2, 0]])).shape
        torch.Size([1, 6, 32])
    """

    def __init__(self, vocab_size: int, dim: int = 32, layers: int = 2, heads: int = 4, max_length: int = 16) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position = nn.Parameter(torch.zeros(max_length, dim))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.token_embedding

    def forward(self, ids: Tensor) -> Tensor:
        if ids.ndim != 2 or ids.shape[1] > len(self.position):
            raise ValueError(f"expected token ids of shape (B, T <= {len(self.position)}), got {tuple(ids.shape)}")
        x = self.token_embedding(ids) + self.position[: ids.shape[1]]
        return self.norm(self.transformer(x, src_key_padding_mask=ids == 0))


class TextToImage(nn.Module):
    """The toy text-to-image model: ``ShapeTextEncoder`` + ``UNet2DConditionModel`` + a cosine ``DDPMScheduler``.

    With block widths (16, 32) and cross-attention in the second level only, the cross-attention maps are 8 × 8 at
    16 × 16 scenes (the card's review: the paper found the 16 × 16 maps of SD the most useful; here the one attention
    resolution is the one the model has).

    Example:
        >>> model = TextToImage(vocab_size=14)
        >>> model.loss(torch.rand(2, 3, 16, 16) * 2 - 1, torch.tensor([[1, 3, 7, 11, 2, 0]] * 2)).ndim
        0
    """

    def __init__(self, vocab_size: int, size: int = 16, dim: int = 32, block_out_channels: tuple[int, ...] = (16, 32),
                 num_train_timesteps: int = 1000, caption_dropout: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.size, self.caption_dropout = size, caption_dropout
        self.text_encoder = ShapeTextEncoder(vocab_size, dim)
        levels = len(block_out_channels)
        self.unet = UNet2DConditionModel(
            sample_size=size,
            in_channels=3,
            out_channels=3,
            layers_per_block=1,
            block_out_channels=tuple(block_out_channels),
            down_block_types=("DownBlock2D",) * (levels - 1) + ("CrossAttnDownBlock2D",),
            up_block_types=("CrossAttnUpBlock2D",) + ("UpBlock2D",) * (levels - 1),
            cross_attention_dim=dim,
            attention_head_dim=8,  # diffusers reads it as the number of heads here (its naming quirk): 8 heads
            norm_num_groups=8,
        )
        self.scheduler = DDPMScheduler(num_train_timesteps=num_train_timesteps, beta_schedule="squaredcos_cap_v2")

    def encode_text(self, ids: Tensor) -> Tensor:
        return self.text_encoder(ids)

    def loss(self, images: Tensor, ids: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """The ε-loss at uniform t with caption dropout (a dropped caption keeps only BOS and EOS)."""
        if images.ndim != 4 or images.shape[1:] != (3, self.size, self.size):
            raise ValueError(f"expected images of shape (B, 3, {self.size}, {self.size}), got {tuple(images.shape)}")
        n, device = len(images), images.device
        if self.training and self.caption_dropout > 0:
            drop = torch.rand(n, device=device, generator=generator) < self.caption_dropout
            empty = torch.zeros_like(ids)
            empty[:, 0], empty[:, 1] = 1, 2  # <bos> <eos>, then padding
            ids = torch.where(drop[:, None], empty, ids)
        t = torch.randint(0, self.scheduler.config.num_train_timesteps, (n,), device=device, generator=generator)
        noise = torch.randn(images.shape, device=device, generator=generator)
        noisy = self.scheduler.add_noise(images, noise, t)
        return (self.unet(noisy, t, encoder_hidden_states=self.encode_text(ids)).sample - noise).square().mean()
