"""The two learned parts of the end-to-end watermark: the perturbation encoder and the LSTM detector (decoder)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["PerturbationEncoder", "WatermarkDecoder"]


class PerturbationEncoder(nn.Module):
    """Context-dependent ±δ perturbation of the top-k next-token logits (the card's encoder, steps 1–5).

    Each of the ``top_k`` candidates c is scored from its window (the ``window − 1`` previous token embeddings and c's
    own): a per-token mapper MLP (``dim → hidden``, ReLU, ``mapper_layers − 1`` × (``hidden → hidden``, ReLU),
    ``hidden → hidden``), flattened, then ``window·hidden → hidden``, ReLU, ``hidden → 1``. The scores are centred over
    the candidates and squashed, ``e = tanh(sharpness · (s − mean s))`` (in float32: 1000·x overflows in fp16), and
    ``δ·e`` is added to the candidates' logits only. There is no key: the green/red split is the learned function.

    Args:
        dim: embedding width of the LM whose embedding table feeds the encoder.
        window: tokens per window (previous ``window − 1`` and the candidate).
        top_k: candidates perturbed per step.
        delta: perturbation strength δ.
        hidden: mapper width.
        mapper_layers: hidden layers of the mapper (5 in the official code).
        sharpness: the tanh's slope (1000 in the official code).

    Example:
        >>> enc = PerturbationEncoder(dim=8, window=4, top_k=5, delta=1.5)
        >>> logits, E = torch.randn(2, 30), torch.randn(30, 8)
        >>> out = enc(logits, E[torch.randint(0, 30, (2, 3))], E)
        >>> changed = (out != logits).sum(-1)
        >>> changed.tolist(), bool((out - logits).abs().max() <= 1.5)
        ([5, 5], True)
    """

    def __init__(
        self,
        dim: int,
        window: int = 4,
        top_k: int = 8,
        delta: float = 1.5,
        hidden: int = 32,
        mapper_layers: int = 5,
        sharpness: float = 1000.0,
    ) -> None:
        super().__init__()
        if window < 1 or top_k < 2:
            raise ValueError(f"need window ≥ 1 and top_k ≥ 2 (the split is relative to the candidates' mean), got "
                             f"window={window}, top_k={top_k}")  # fmt: skip
        self.window, self.top_k, self.delta, self.sharpness = window, top_k, delta, sharpness
        layers: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
        for _ in range(mapper_layers - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.mapper = nn.Sequential(*layers, nn.Linear(hidden, hidden))
        self.head = nn.Sequential(nn.Linear(window * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def signs(self, candidates: Tensor, context: Tensor) -> Tensor:
        """``e ∈ (−1, 1)`` per candidate: ``candidates`` ``(B, k, d)``, ``context`` ``(B, window − 1, d)`` → ``(B, k)``."""
        b, k, d = candidates.shape
        if context.shape[1] != self.window - 1:
            raise ValueError(f"the encoder needs {self.window - 1} context tokens, got {context.shape[1]}")
        windows = torch.cat([context[:, None].expand(b, k, -1, d), candidates[:, :, None]], dim=2)  # (B, k, w, d)
        s = self.head(self.mapper(windows).flatten(2)).squeeze(-1).float()  # squeeze(-1): batch size 1 stays a batch
        return torch.tanh(self.sharpness * (s - s.mean(-1, keepdim=True)))

    def forward(self, logits: Tensor, context: Tensor, embedding: Tensor) -> Tensor:
        """Perturbed logits ``(B, V)`` from ``logits`` ``(B, V)``, the context embeddings ``(B, window − 1, d)`` (hard
        or soft) and the LM's input embedding table ``(V, d)``."""
        if logits.shape[-1] != embedding.shape[0]:
            raise ValueError(f"logits have {logits.shape[-1]} tokens but the embedding table {embedding.shape[0]}: "
                             "the encoder must run on the LM it was trained with")  # fmt: skip
        top = logits.topk(self.top_k, dim=-1).indices
        e = self.signs(embedding[top], context)
        return logits.float().scatter_add(-1, top, self.delta * e).to(logits.dtype)


class WatermarkDecoder(nn.Module):
    """The detector: token embeddings → LSTM → last valid step → ``hidden → hidden``, ReLU, ``hidden → 1`` logit.

    Args:
        dim: embedding width.
        hidden: LSTM and MLP width.
        layers: LSTM layers (3 in the official code, 1 in the toy).

    Example:
        >>> dec = WatermarkDecoder(dim=8, hidden=16)
        >>> x = torch.randn(3, 10, 8)
        >>> dec(x, torch.tensor([10, 4, 7])).shape, dec.prefix_scores(x).shape
        (torch.Size([3]), torch.Size([3, 10]))
        >>> torch.allclose(dec.prefix_scores(x)[1, 3], dec(x, torch.tensor([10, 4, 7]))[1], atol=1e-6)
        True
    """

    def __init__(self, dim: int, hidden: int = 32, layers: int = 1) -> None:
        super().__init__()
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, embeds: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Watermark logits ``(B,)`` for embedded texts ``(B, L, d)`` (right-padded to ``lengths`` if given)."""
        if lengths is None:
            out, _ = self.lstm(embeds)
            last = out[:, -1]
        else:
            if int(lengths.min()) < 1:
                raise ValueError("every text needs at least one token")
            packed = nn.utils.rnn.pack_padded_sequence(embeds, lengths.cpu(), batch_first=True, enforce_sorted=False)
            _, (h, _) = self.lstm(packed)
            last = h[-1]
        return self.head(last).squeeze(-1)

    def prefix_scores(self, embeds: Tensor) -> Tensor:
        """``(B, L)`` logits: column l − 1 scores each text's first l tokens (a causal LSTM: one pass serves all)."""
        out, _ = self.lstm(embeds)
        return self.head(out).squeeze(-1)
