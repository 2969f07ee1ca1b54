"""A tiny causal transformer LM with a per-row key/value cache, and the next-token interface every sampler uses.

Samplers call an LM as ``lm(tokens, lengths) -> (logits, hidden)``: ``tokens`` ``(R, W)`` right-padded rows,
``lengths`` ``(R,)``; the result is the next-token logits ``(R, V)`` after each row's prefix and the last layer's
hidden state ``(R, D)`` at its last token. Three adapters give that interface:

* :class:`CachedLM` wraps :class:`TinyCausalLM`: it keeps every row's keys and values by position, so a step that
  appends one token per row runs one position per row (the cost does not grow with the prefix), and a backtrack
  only shortens the row (the kept prefix's cache stays valid);
* :class:`HFCausalLM` wraps a Hugging Face causal LM (``GPT2LMHeadModel``...): it recomputes the padded batch with an
  attention mask at every call;
* :class:`FullSequenceLM` wraps any callable ``tokens -> logits (R, W, V)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["CachedLM", "FullSequenceLM", "HFCausalLM", "TinyCausalLM"]

Cache = list[tuple[Tensor, Tensor]]


class _Block(nn.Module):
    """Pre-LayerNorm transformer block; attention can read and write a positional key/value cache."""

    def __init__(self, d_model: int, n_heads: int, d_mlp: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model), nn.Dropout(dropout))

    def _heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        *lead, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(*lead, 3, self.n_heads, d // self.n_heads).unbind(-3)
        return q, k, v

    def forward(self, x: Tensor, cache: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Full causal pass over ``x`` ``(B, L, D)``; with ``cache``, also write every position's keys and values."""
        q, k, v = (t.transpose(1, 2) for t in self._heads(x))  # (B, H, L, dh)
        if cache is not None:
            cache[0][:, :, : x.shape[1]] = k
            cache[1][:, :, : x.shape[1]] = v
        p = self.dropout if self.training else 0.0
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self.proj(a.transpose(1, 2).flatten(2))
        return x + self.mlp(self.ln2(x))

    def step(self, x: Tensor, positions: Tensor, cache: tuple[Tensor, Tensor]) -> Tensor:
        """One token per row, ``x`` ``(R, D)`` at ``positions`` ``(R,)``: write its key/value, attend to ≤ position."""
        q, k, v = self._heads(x)  # (R, H, dh)
        rows = torch.arange(len(x), device=x.device)
        cache[0][rows, :, positions] = k
        cache[1][rows, :, positions] = v
        keys, values = cache  # (R, H, W, dh)
        scores = torch.einsum("rhd,rhwd->rhw", q, keys) / math.sqrt(q.shape[-1])
        visible = torch.arange(keys.shape[2], device=x.device)[None, None, :] <= positions[:, None, None]
        attn = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        x = x + self.proj(torch.einsum("rhw,rhwd->rhd", attn, values).flatten(1))
        return x + self.mlp(self.ln2(x))


class TinyCausalLM(nn.Module):
    """GPT-style causal LM: token + learned position embeddings, pre-LN blocks, a final LayerNorm and a linear head.

    Args:
        vocab_size: tokens.
        max_len: longest sequence (positions).
        d_model: width.
        n_layers: blocks.
        n_heads: attention heads.
        d_mlp: hidden width of the MLPs.
        dropout: dropout in training.

    Example:
        >>> lm = TinyCausalLM(7, 26)
        >>> logits, hidden = lm(torch.randint(0, 7, (2, 10)))
        >>> logits.shape, hidden.shape
        (torch.Size([2, 10, 7]), torch.Size([2, 10, 64]))
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        d_mlp: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.vocab_size, self.max_len, self.n_heads = vocab_size, max_len, n_heads
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, d_mlp, dropout) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    @property
    def d_model(self) -> int:
        return self.tok.embedding_dim

    def _check(self, tokens: Tensor) -> None:
        if tokens.dtype != torch.long:
            raise TypeError(f"tokens must be integer ids (torch.long), got {tokens.dtype}")
        if tokens.shape[-1] > self.max_len:
            raise ValueError(f"sequence of {tokens.shape[-1]} tokens is longer than the LM's {self.max_len} positions")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must be in [0, {self.vocab_size}), got {int(tokens.min())}…{int(tokens.max())}"
            )

    def forward(self, tokens: Tensor, cache: Cache | None = None) -> tuple[Tensor, Tensor]:
        """Logits ``(B, L, V)`` and last-layer hidden states ``(B, L, D)``; with ``cache``, fill it for all positions."""
        self._check(tokens)
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i])
        h = self.ln(x)
        return self.head(h), h

    def new_cache(self, rows: int, device: torch.device | None = None) -> Cache:
        """Empty key/value buffers ``(rows, heads, max_len, d_head)`` per layer."""
        shape = (rows, self.n_heads, self.max_len, self.d_model // self.n_heads)
        return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in self.blocks]

    def step(self, tokens: Tensor, positions: Tensor, cache: Cache) -> tuple[Tensor, Tensor]:
        """Run one token per row (``tokens`` ``(R,)`` at ``positions`` ``(R,)``) against the cache: logits, hidden."""
        x = self.tok(tokens) + self.pos(positions)
        for block, layer_cache in zip(self.blocks, cache):
            x = block.step(x, positions, layer_cache)
        h = self.ln(x)
        return self.head(h), h


def _last(values: Tensor, lengths: Tensor) -> Tensor:
    return values[torch.arange(len(values), device=values.device), lengths - 1]


class CachedLM:
    """``(tokens, lengths) -> (logits, hidden)`` for a :class:`TinyCausalLM`, reusing keys and values by position.

    The cache remembers the tokens it was computed for. When every row's prefix up to its last token is unchanged
    (the sampling step appended one token, or a backtrack shortened the row), only the last position of each row
    runs: one position per row whatever the prefix length. Anything else (a new batch, prompts) recomputes the rows
    in one causal pass.

    Example:
        >>> lm = CachedLM(TinyCausalLM(7, 26).eval())
        >>> tokens = torch.ones(2, 26, dtype=torch.long)
        >>> logits, hidden = lm(tokens, torch.tensor([3, 5]))
        >>> torch.allclose(logits, lm.lm(tokens[:, :5])[0][[0, 1], [2, 4]], atol=1e-5)
        True
    """

    def __init__(self, lm: TinyCausalLM) -> None:
        self.lm = lm
        self.reset()

    def reset(self) -> None:
        self._tokens: Tensor | None = None
        self._valid: Tensor | None = None
        self._cache: Cache | None = None
        self.positions_run = 0  # positions computed since reset (the cost counter of the benchmark)

    @torch.no_grad()
    def __call__(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        if int(lengths.min()) < 1:
            raise ValueError("every row needs at least one token (BOS) before the LM can predict the next")
        rows, width = tokens.shape
        if self._tokens is not None and self._tokens.shape == tokens.shape:
            same = (tokens == self._tokens).long().cumprod(1).sum(1)  # length of the unchanged prefix
            valid = torch.minimum(self._valid, same)
            if bool((valid >= lengths - 1).all()):
                positions = lengths - 1
                logits, hidden = self.lm.step(tokens.gather(1, positions[:, None])[:, 0], positions, self._cache)
                self._tokens, self._valid = tokens.clone(), lengths.clone()
                self.positions_run += rows
                return logits, hidden
        self._cache = self.lm.new_cache(rows, tokens.device)
        logits, hidden = self.lm(tokens[:, : int(lengths.max())], self._cache)
        self._tokens, self._valid = tokens.clone(), lengths.clone()
        self.positions_run += rows * int(lengths.max())
        return _last(logits, lengths), _last(hidden, lengths)


class HFCausalLM:
    """``(tokens, lengths) -> (logits, hidden)`` for a Hugging Face causal LM (right padding + attention mask).

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=7, n_positions=32, n_embd=16, n_layer=1, n_head=2))
        >>> logits, hidden = HFCausalLM(model.eval())(torch.ones(2, 6, dtype=torch.long), torch.tensor([2, 6]))
        >>> logits.shape, hidden.shape
        (torch.Size([2, 7]), torch.Size([2, 16]))
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.vocab_size = model.config.vocab_size

    @torch.no_grad()
    def __call__(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        width = int(lengths.max())
        mask = torch.arange(width, device=tokens.device)[None, :] < lengths[:, None]
        out = self.model(input_ids=tokens[:, :width], attention_mask=mask.long(), output_hidden_states=True)
        return _last(out.logits, lengths), _last(out.hidden_states[-1], lengths)

    # The soft-input interface (``embedding`` / ``begin`` / ``step`` / ``last_hidden``) drives the LM from input
    # embeddings rather than ids, as differentiable generation does (e2e-wm: Gumbel-softmax mixtures times the
    # embedding table). Gradients are the caller's choice: these methods add no ``no_grad``.
    @property
    def embedding(self) -> Tensor:
        """The input embedding table ``(V, d)``."""
        return self.model.get_input_embeddings().weight

    def begin(self, embeds: Tensor) -> tuple[Tensor, object]:
        """Run equal-length input embeddings ``(B, L, d)``: the next-token logits ``(B, V)`` and the key/value cache."""
        out = self.model(inputs_embeds=embeds, use_cache=True)
        return out.logits[:, -1], out.past_key_values

    def step(self, embed: Tensor, state: object) -> tuple[Tensor, object]:
        """Append one input embedding per row ``(B, d)`` to the cache ``state``: logits ``(B, V)``, the new cache."""
        out = self.model(inputs_embeds=embed[:, None], past_key_values=state, use_cache=True)
        return out.logits[:, -1], out.past_key_values

    def last_hidden(self, embeds: Tensor) -> Tensor:
        """The last layer's hidden state at the final position of ``embeds`` ``(B, L, d)``: ``(B, D)``."""
        return self.model(inputs_embeds=embeds, output_hidden_states=True).hidden_states[-1][:, -1]


class FullSequenceLM:
    """``(tokens, lengths) -> (logits, hidden)`` for any ``fn(tokens) -> logits (R, W, V)`` (hidden = logits)."""

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        self.fn = fn

    @torch.no_grad()
    def __call__(self, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        logits = _last(self.fn(tokens[:, : int(lengths.max())]), lengths)
        return logits, logits
