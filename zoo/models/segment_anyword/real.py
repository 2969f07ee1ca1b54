"""The real path of Segment Anyword: the parts of a diffusers text-to-image pipeline (card §7).

Two layouts are read: Stable Diffusion's (``StableDiffusionPipeline``: ``unet``, ``text_encoder`` (CLIP),
``tokenizer``, ``scheduler``, ``vae`` (``AutoencoderKL``)) and the paper's CompVis LDM (``LDMTextToImagePipeline``:
``unet``, ``bert`` (``LDMBertModel``), ``tokenizer`` (BERT WordPiece), ``scheduler``, ``vqvae`` (``VQModel``)). Both
text encoders return the hidden states first (``encoder(ids)[0]``, as both diffusers pipelines read them) and expose
their token table through ``get_input_embeddings()`` (LDMBert's ``model.embed_tokens``). Images are encoded to the
latents the UNet was trained on: the KL posterior mean or the VQ encoder's pre-quantisation ``latents`` (the CompVis
LDM encodes its first stage the same way), times the autoencoder's ``scaling_factor`` (diffusers' pipelines divide by
it before decoding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["diffusers_parts", "encode_image", "special_token_ids", "tokenizer_word_positions"]


def tokenizer_word_positions(tokenizer: Any, caption: str, max_length: int | None = None) -> list[list[int]]:
    """The token positions of each whitespace word of ``caption`` in the ids ``tokenizer(caption)`` makes.

    A word split into sub-words gets all its pieces (card pitfall); special tokens (BOS / ``[CLS]``) shift the
    positions as in the ids the text encoder sees; with ``max_length`` the words truncated away get no position.

    A fast (Rust) tokenizer maps words to tokens through its character offsets. A slow (Python) tokenizer has no
    offsets (the CompVis LDM's ``BertTokenizer`` loads as one under transformers 4): each word is tokenized alone and
    its pieces counted. That is exact where the tokenizer splits on whitespace first (BERT's WordPiece, CLIP's BPE);
    it is checked against the whole caption's tokens, and a tokenizer that tokenizes words differently in context
    (GPT-2-style byte-level BPE) is refused: load its fast version.

    Example:
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> from transformers import PreTrainedTokenizerFast
        >>> vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3, "red": 4, "ci": 5, "##rcle": 6}
        >>> rust = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        >>> rust.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tok = PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="[UNK]")
        >>> tokenizer_word_positions(tok, "a red circle")
        [[0], [1], [2, 3]]
    """
    truncate = {"truncation": True, "max_length": max_length} if max_length is not None else {}
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(caption, return_offsets_mapping=True, **truncate)
        offsets = encoded.get("offset_mapping")
        if offsets is not None:
            spans, pos = [], 0
            for word in caption.split():
                start = caption.index(word, pos)
                spans.append((start, start + len(word)))
                pos = start + len(word)
            return [[i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start] for start, end in spans]
    # no offsets: count each word's pieces
    per_word = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in caption.split()]
    text = tokenizer(caption, add_special_tokens=False)["input_ids"]
    full = tokenizer(caption)["input_ids"]
    if [t for ids in per_word for t in ids] != text:
        raise ValueError(f"{type(tokenizer).__name__} tokenizes the words of {caption!r} differently alone than in the "
                         "caption, and has no character offsets to map words to tokens: load its fast version "
                         "(AutoTokenizer.from_pretrained(..., use_fast=True)).")  # fmt: skip
    prefix = next((p for p in range(len(full) - len(text) + 1) if full[p : p + len(text)] == text), 0)
    limit = max_length - (len(full) - prefix - len(text)) if max_length is not None else len(full)
    positions, start = [], prefix
    for n in map(len, per_word):
        positions.append([p for p in range(start, start + n) if p < limit])
        start += n
    return positions


def special_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids of the tokenizer's BOS, EOS, padding, ``[CLS]`` and ``[SEP]`` tokens (those it has), sorted.

    CLIP pads with its EOS token (Stable Diffusion 1.x), BERT with ``[PAD]``: dropping these ids drops every column of
    the prompt that is not a word of the caption (the start token, the end token and all the padding).
    """
    ids = {getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "cls", "sep")}
    return tuple(sorted(i for i in ids if isinstance(i, int)))


def encode_image(vae: nn.Module, image: Tensor) -> Tensor:
    """The latent ``(C, h, w)`` of an RGB image ``(3, H, W)`` in [−1, 1]: a KL autoencoder's posterior mean or a VQ
    autoencoder's pre-quantisation latents, times ``vae.config.scaling_factor``."""
    with torch.no_grad():
        encoded = vae.encode(image[None].to(vae.dtype))
    latent = encoded.latent_dist.mean if hasattr(encoded, "latent_dist") else encoded.latents  # VQ: .latents
    return latent[0] * float(getattr(vae.config, "scaling_factor", 1.0))


def diffusers_parts(pipe: Any) -> dict[str, Any]:
    """The ``SegmentAnywordPipeline`` arguments read from a diffusers text-to-image pipeline: ``unet``,
    ``encode_text``, ``embedding``, ``scheduler``, ``word_positions``, ``vae``, ``tokenizer`` and ``max_length``.

    Raises:
        ValueError: a part is missing (the message names it and the accepted layouts).
        TypeError: the text encoder's token embedding is not an ``nn.Embedding``.
    """

    def part(*names: str) -> Any:  # the first present of the layouts' names (modules are not tested for truth)
        return next((v for v in (getattr(pipe, n, None) for n in names) if v is not None), None)

    text_encoder, vae = part("text_encoder", "bert"), part("vae", "vqvae")
    found = {"unet": getattr(pipe, "unet", None), "text_encoder (or bert)": text_encoder,
             "tokenizer": getattr(pipe, "tokenizer", None), "scheduler": getattr(pipe, "scheduler", None),
             "vae (or vqvae)": vae}  # fmt: skip
    missing = [k for k, v in found.items() if v is None]
    if missing:
        raise ValueError(f"{type(pipe).__name__} has no {', '.join(missing)}: expected a text-to-image diffusers "
                         "pipeline such as StableDiffusionPipeline (unet, text_encoder, tokenizer, scheduler, vae) or "
                         "LDMTextToImagePipeline (unet, bert, tokenizer, scheduler, vqvae)")  # fmt: skip
    tokenizer = pipe.tokenizer
    embedding = text_encoder.get_input_embeddings()
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(f"{type(text_encoder).__name__}.get_input_embeddings() returned {type(embedding).__name__}; "
                        "textual inversion needs the token table as an nn.Embedding")  # fmt: skip
    limits = [
        getattr(tokenizer, "model_max_length", None),
        getattr(text_encoder.config, "max_position_embeddings", None),
    ]
    limits = [int(n) for n in limits if isinstance(n, int) and n < 1_000_000]  # slow tokenizers say "1e30"
    max_length = min(limits) if limits else None

    def encode_text(ids: Tensor) -> Tensor:
        return text_encoder(ids, return_dict=True)[0]  # CLIP and LDMBert: the last hidden states

    word_positions: Callable[[str], list[list[int]]] = lambda c: tokenizer_word_positions(tokenizer, c, max_length)
    return {"unet": pipe.unet, "encode_text": encode_text, "embedding": embedding, "scheduler": pipe.scheduler,
            "word_positions": word_positions, "vae": vae, "tokenizer": tokenizer, "max_length": max_length}  # fmt: skip
