"""Token-level cross-attention maps of a diffusers ``UNet2DConditionModel`` (Segment Anyword, card §2 step 3).

Segment Anyword reads, at every denoising step and every cross-attention layer, the attention probabilities
``A_{l,t} ∈ R^{h_l w_l × N_tok}`` (softmax over the text tokens, averaged over heads) and turns the column of a target
token into a map: ``M̄_w = mean_{t,l} upsample(A_{l,t}[:, w])``, min–max normalised to [0, 1].

diffusers' default processor (``AttnProcessor2_0``) runs fused scaled-dot-product attention and never materialises
the probabilities, so :class:`CrossAttentionRecorder` recomputes the attention with an explicit softmax
(``Attention.get_attention_scores``), returns what the default processor returns, and hands the head-averaged
probabilities to an :class:`AttentionStore`. :func:`record_cross_attention` installs one recorder on every ``attn2``
(cross-attention) module of a UNet, leaves the self-attention processors alone, and restores the original processors
on exit. Nothing here depends on the UNet's size: the zoo's toy and Stable-Diffusion-sized UNets work alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AttentionRecord", "AttentionStore", "CrossAttentionRecorder", "record_cross_attention"]


@dataclass
class AttentionRecord:
    """One cross-attention call: ``probs`` ``(B, h·w, T)`` averaged over heads, its map size ``(h, w)``, its layer."""

    probs: Tensor
    size: tuple[int, int]
    name: str = ""


class AttentionStore:
    """The cross-attention probabilities recorded by :class:`CrossAttentionRecorder`, and the token maps made of them.

    Every recorded call is kept as an :class:`AttentionRecord` (detached, on the UNet's device and dtype). Memory grows
    with layers × calls × h·w × T: for Stable Diffusion at 512², a 64 × 64 layer costs 4096 · 77 values per image and
    call, so pass ``resolutions`` to keep only the layers you will average (the paper's useful maps are 16 × 16).

    Args:
        batch_slice: the part of each call's batch to record. Under classifier-free guidance diffusers' pipelines call
            the UNet on ``[unconditional; conditional]``, so with ``n`` prompts pass ``slice(n, None)`` to record only
            the conditional half (card pitfall: the empty-caption half attends elsewhere). None: the whole batch.
        resolutions: record only the calls whose map size is listed (an int ``r`` means ``(r, r)``). None: every call.
        sample_size: the UNet input's spatial size ``(H, W)`` used to read each call's ``(h, w)`` from its query
            length; :func:`record_cross_attention` sets it from every UNet call. None: square maps are assumed.

    Example:
        >>> store = AttentionStore()
        >>> probs = torch.tensor([[[0.1, 0.9], [0.5, 0.5], [0.5, 0.5], [0.1, 0.9]]])  # (B=1, h·w=4, T=2)
        >>> store.add(probs, (2, 2))
        >>> store.maps(torch.tensor([[1]]), size=2, exclude=())[0, 0]
        tensor([[1., 0.],
                [0., 1.]])
    """

    def __init__(
        self,
        batch_slice: slice | None = None,
        resolutions: Iterable[int | tuple[int, int]] | None = None,
        sample_size: tuple[int, int] | None = None,
    ) -> None:
        if batch_slice is not None and not isinstance(batch_slice, slice):
            raise TypeError(f"batch_slice must be a slice (e.g. slice(n, None) for the CFG conditional half), got "
                            f"{type(batch_slice).__name__}")  # fmt: skip
        self.batch_slice = batch_slice
        self.resolutions = None if resolutions is None else _sizes(resolutions)
        self.sample_size = sample_size
        self.records: list[AttentionRecord] = []

    def __len__(self) -> int:
        return len(self.records)

    def clear(self) -> None:
        """Forget every recorded call (e.g. those of the inversion pass, before the re-denoising pass)."""
        self.records.clear()

    def spatial_size(self, length: int) -> tuple[int, int]:
        """The map size ``(h, w)`` with ``h · w = length`` of a layer of the UNet whose input is ``sample_size``.

        A diffusers UNet halves its feature maps with stride-2 convolutions (padding 1), ``H → ceil(H / 2)``, so the
        size is found by halving the input size until the product reaches ``length``.
        """
        if self.sample_size is not None:
            h, w = self.sample_size
            while h * w > length:
                h, w = math.ceil(h / 2), math.ceil(w / 2)
            if h * w == length:
                return h, w
        side = math.isqrt(length)
        if side * side == length:
            return side, side
        raise ValueError(
            f"cannot read a map size from a query length of {length} (input size {self.sample_size}): expected a "
            "halving of the UNet's input size or a square. Record through record_cross_attention(unet), which tracks "
            "the input size, or set store.sample_size."
        )

    def add(self, probs: Tensor, size: tuple[int, int], name: str = "") -> None:
        """Record one call's head-averaged probabilities ``(B, h·w, T)`` of map size ``(h, w)`` (``batch_slice`` and
        ``resolutions`` apply)."""
        if probs.ndim != 3 or probs.shape[1] != size[0] * size[1]:
            raise ValueError(f"expected probabilities of shape (B, {size[0]}·{size[1]}, T), got {tuple(probs.shape)}")
        if self.resolutions is not None and tuple(size) not in self.resolutions:
            return
        if self.batch_slice is not None:
            probs = probs[self.batch_slice]
        self.records.append(AttentionRecord(probs.detach(), (int(size[0]), int(size[1])), name))

    def maps(
        self,
        token_positions: Tensor,
        size: int,
        exclude: Sequence[int] | Tensor = (0,),
        renormalize: bool = True,
        resolutions: Iterable[int | tuple[int, int]] | None = None,
    ) -> Tensor:
        """Token maps ``(B, K, size, size)`` in [0, 1], averaged over every recorded layer and call.

        For each call: the excluded token columns of the head-averaged probabilities are zeroed and, with
        ``renormalize``, each pixel's remaining probabilities are rescaled to sum to 1 (card pitfall: CLIP / SD put
        most mass on the BOS token, which would otherwise wash out every other map); the requested columns are reshaped
        to ``(h, w)`` and bilinearly upsampled to ``size × size``. The mean over calls is min–max normalised per map
        (a constant map becomes zeros).

        Args:
            token_positions: ``(B, K)`` token positions per batch item (LongTensor, negative counts from the end).
            size: output side.
            exclude: token positions to drop, the same for every item (default BOS, position 0), or a bool mask
                ``(B, T)`` that is True at the columns to drop (e.g. padding and EOS, which vary per item).
            renormalize: renormalise over the remaining tokens after the exclusion.
            resolutions: average only the layers of these map sizes (an int ``r`` means ``(r, r)``). None: all.

        Raises:
            RuntimeError: nothing was recorded (or nothing at ``resolutions``).
            ValueError: the batch or token count does not match the records, or a requested token is excluded.
        """
        chosen = self.records
        if resolutions is not None:
            wanted = _sizes(resolutions)
            chosen = [r for r in chosen if r.size in wanted]
        if not chosen:
            recorded = sorted({r.size for r in self.records})
            raise RuntimeError(f"no cross-attention recorded{'' if resolutions is None else ' at ' + str(resolutions)}"
                               f" (recorded sizes: {recorded}). Call the UNet inside record_cross_attention(unet) "
                               "before asking for maps.")  # fmt: skip
        batch, tokens = chosen[0].probs.shape[0], chosen[0].probs.shape[2]
        if token_positions.ndim != 2 or token_positions.shape[0] != batch:
            raise ValueError(f"expected token_positions of shape (B={batch}, K) like the recorded calls, got "
                             f"{tuple(token_positions.shape)}. Record one call per image batch (clear() between "
                             "passes of different batch sizes, and set batch_slice under CFG).")  # fmt: skip
        device = chosen[0].probs.device
        positions = token_positions.to(device).long() % tokens
        drop = torch.zeros(batch, tokens, dtype=torch.bool, device=device)
        if isinstance(exclude, Tensor) and exclude.dtype == torch.bool:
            if exclude.shape != (batch, tokens):
                raise ValueError(f"expected an exclude mask of shape ({batch}, {tokens}), got {tuple(exclude.shape)}")
            drop |= exclude.to(device)
        elif len(exclude) > 0:
            drop[:, torch.as_tensor(list(exclude), device=device).long() % tokens] = True
        if drop.gather(1, positions).any():
            shown = "the mask" if isinstance(exclude, Tensor) else tuple(exclude)
            raise ValueError(f"a requested token position is excluded: positions {token_positions.tolist()}, exclude "
                             f"{shown}. Ask for other tokens, or exclude fewer.")  # fmt: skip
        total = torch.zeros(batch, positions.shape[1], size, size, device=device)
        for record in chosen:
            p = record.probs.float()
            if p.shape[0] != batch or p.shape[2] != tokens:
                raise ValueError(f"recorded calls differ in shape ({tuple(p.shape)} vs (B={batch}, ·, T={tokens})): "
                                 "clear() the store between passes of different batches or prompts.")  # fmt: skip
            p = p.masked_fill(drop[:, None, :], 0.0)
            if renormalize:
                p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
            columns = p.gather(2, positions[:, None, :].expand(-1, p.shape[1], -1))  # (B, h·w, K)
            h, w = record.size
            grid = columns.transpose(1, 2).reshape(batch, -1, h, w)
            total += F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=False)
        mean = total / len(chosen)
        low = mean.flatten(2).amin(-1)[..., None, None]
        span = mean.flatten(2).amax(-1)[..., None, None] - low
        # A constant map carries no location: zeros, not 0/0.
        scaled = (mean - low) / span.clamp_min(torch.finfo(mean.dtype).tiny)
        return torch.where(span > 0, scaled, torch.zeros_like(mean))


class CrossAttentionRecorder:
    """A diffusers attention processor that computes the softmax explicitly and records the probabilities.

    It returns what diffusers' default ``AttnProcessor2_0`` returns (same projections, norms, residual and rescaling;
    the softmax via ``attn.get_attention_scores``, which honours ``upcast_attention`` / ``upcast_softmax``), and for a
    cross-attention call (``encoder_hidden_states`` given) adds the probabilities averaged over heads,
    ``(B, h·w, T)``, to ``store``. A self-attention call is computed but not recorded.

    Args:
        store: where the probabilities go.
        name: the attention module's name, kept with each record.

    Example:
        >>> from diffusers.models.attention_processor import Attention
        >>> attn = Attention(query_dim=16, cross_attention_dim=8, heads=2, dim_head=8)
        >>> store = AttentionStore()
        >>> attn.set_processor(CrossAttentionRecorder(store))
        >>> attn(torch.randn(1, 16, 16), encoder_hidden_states=torch.randn(1, 5, 8)).shape
        torch.Size([1, 16, 16])
        >>> store.records[0].probs.shape, store.records[0].size
        (torch.Size([1, 16, 5]), (4, 4))
    """

    def __init__(self, store: AttentionStore, name: str = "") -> None:
        self.store, self.name = store, name

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        temb: Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Tensor:
        # Follows AttnProcessor2_0 line by line, with F.scaled_dot_product_attention replaced by an explicit softmax.
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        size = None
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            size = (height, width)
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        cross = encoder_hidden_states is not None
        if attention_mask is not None:
            # (B·heads, 1 or L, S): the layout baddbmm in get_attention_scores adds to the scores
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)

        heads = attn.heads
        head_dim = key.shape[-1] // heads
        query = query.view(batch_size, -1, heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        length, tokens = query.shape[2], key.shape[2]
        probs = attn.get_attention_scores(
            query.reshape(batch_size * heads, length, head_dim),
            key.reshape(batch_size * heads, tokens, head_dim),
            attention_mask,
        )  # (B·heads, L, T)
        hidden_states = torch.bmm(probs, value.reshape(batch_size * heads, tokens, head_dim))
        hidden_states = hidden_states.view(batch_size, heads, length, head_dim).transpose(1, 2)
        hidden_states = hidden_states.reshape(batch_size, length, heads * head_dim).to(query.dtype)
        if cross:
            mean = probs.view(batch_size, heads, length, tokens).mean(1)
            self.store.add(mean, size or self.store.spatial_size(length), self.name)

        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


@contextmanager
def record_cross_attention(
    unet: nn.Module,
    batch_slice: slice | None = None,
    resolutions: Iterable[int | tuple[int, int]] | None = None,
) -> Iterator[AttentionStore]:
    """Install a :class:`CrossAttentionRecorder` on every ``attn2`` module of ``unet`` and yield their store.

    Self-attention (``attn1``) processors are left alone. A forward pre-hook on ``unet`` records each call's input
    size, from which the store reads every layer's ``(h, w)`` (any input size or aspect). On exit the original
    processors are restored and the hook removed, even after an exception.

    Args:
        unet: a diffusers ``UNet2DConditionModel`` (or any module whose cross-attention modules are named ``attn2`` and
            have ``set_processor``, e.g. ``Transformer2DModel``).
        batch_slice / resolutions: see :class:`AttentionStore`.

    Raises:
        ValueError: ``unet`` has no ``attn2`` module.

    Example:
        >>> from diffusers import UNet2DConditionModel
        >>> _ = torch.manual_seed(0)
        >>> unet = UNet2DConditionModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        ...     block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        ...     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, attention_head_dim=8,
        ...     norm_num_groups=8)
        >>> with record_cross_attention(unet) as store:
        ...     _ = unet(torch.randn(1, 3, 16, 16), 10, encoder_hidden_states=torch.randn(1, 6, 32))
        >>> len(store), store.records[0].size
        (4, (8, 8))
        >>> store.maps(torch.tensor([[2, 3]]), size=16).shape
        torch.Size([1, 2, 16, 16])
    """
    targets = [(name, m) for name, m in unet.named_modules() if name.rsplit(".", 1)[-1] == "attn2"]
    targets = [(name, m) for name, m in targets if hasattr(m, "set_processor")]
    if not targets:
        raise ValueError(f"{type(unet).__name__} has no cross-attention module named 'attn2' with set_processor: "
                         "expected a diffusers UNet2DConditionModel / Transformer2DModel with cross-attention blocks "
                         "(e.g. CrossAttnDownBlock2D).")  # fmt: skip
    config_size = getattr(getattr(unet, "config", None), "sample_size", None)
    if isinstance(config_size, int):
        config_size = (config_size, config_size)
    store = AttentionStore(batch_slice, resolutions, tuple(config_size) if config_size is not None else None)

    def track_input_size(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))
        if isinstance(sample, Tensor) and sample.ndim == 4:
            store.sample_size = (sample.shape[-2], sample.shape[-1])

    originals = {name: m.processor for name, m in targets}
    handle = unet.register_forward_pre_hook(track_input_size, with_kwargs=True)
    try:
        for name, m in targets:
            m.set_processor(CrossAttentionRecorder(store, name))
        yield store
    finally:
        handle.remove()
        for name, m in targets:
            m.set_processor(originals[name])


def _sizes(resolutions: Iterable[int | tuple[int, int]]) -> set[tuple[int, int]]:
    """``{(h, w)}`` from ints (squares) and pairs."""
    return {(int(r), int(r)) if isinstance(r, int) else (int(r[0]), int(r[1])) for r in resolutions}
