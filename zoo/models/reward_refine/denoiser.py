"""The masked-diffusion denoiser: a bidirectional transformer from partly masked sequences to per-position logits."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["MaskedDenoiser"]


class MaskedDenoiser(nn.Module):
    """Bidirectional transformer encoder: tokens in ``0..n_tokens`` (``n_tokens`` is MASK) to logits over the letters.

    The head predicts only the ``n_tokens`` real letters, so no sampler can ever draw MASK (the card's pitfall: the
    official code slices the first 20 amino-acid logits for the same reason).

    Args:
        n_tokens: real letters (4 for DNA); the MASK id is ``n_tokens``.
        length: sequence length (learned position embeddings).
        d_model: width.
        n_layers: encoder blocks.
        n_heads: attention heads.
        d_mlp: feed-forward width.
        dropout: dropout in training.

    Example:
        >>> net = MaskedDenoiser(4, 32)
        >>> x = torch.full((2, 32), net.mask_id)
        >>> net(x).shape
        torch.Size([2, 32, 4])
    """

    def __init__(
        self,
        n_tokens: int = 4,
        length: int = 32,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        d_mlp: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.n_tokens, self.length, self.mask_id = n_tokens, length, n_tokens
        self.embed = nn.Embedding(n_tokens + 1, d_model)
        self.pos = nn.Parameter(torch.randn(length, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_mlp, dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_tokens)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(f"expected tokens (B, {self.length}), got {tuple(x.shape)}")
        if x.numel() and (x.min() < 0 or x.max() > self.mask_id):
            raise ValueError(f"tokens must be in 0..{self.mask_id} (letters, then MASK = {self.mask_id})")
        return self.head(self.norm(self.encoder(self.embed(x) + self.pos)))
