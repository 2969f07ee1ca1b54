"""``SegmentAnywordPipeline``: training-free grounded segmentation over any text-to-image diffusers denoiser.

For an image and its expression (card §2; no official code exists: the steps follow the paper's description, the
parts it leaves open are the card's proposals, marked):

1. parse the expression into noun phrases (head noun + modifiers);
2. test-time textual inversion of the target tokens' embeddings (nouns and modifiers) with the LDM loss on this image;
3. DDIM inversion of the image and a Direct-Inversion re-denoising pass, recording the cross-attention of the target
   tokens at every step and layer (BOS column excluded, or BOS, EOS and padding with ``exclude_tokens="special"``;
   renormalised, upsampled, averaged over the layers of ``resolutions``, min-max normalised);
4. mask prompts: threshold 0.7, the largest connected component, positive points sampled in it (farthest-point,
   ``points`` of them: the count is not given, [proposal] 3);
5. R1, positive adjective prompt clustering: the noun's map times its modifiers' mean map before thresholding
   ([proposal], the card's toy rule); R2, negative mutual-exclusive binding: the other phrases' positive points become
   negatives; background seeds where every target map is below 0.2 ([proposal]);
6. a point-prompt refiner (SAM, or the random walker where SAM's weights are absent) gives the phrase's mask.

``mode="raw"`` is the DAAM-style baseline B0: the image noised at fixed timesteps, one forward each, no inversion.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from zoo.models.segment_anyword.attention import record_cross_attention
from zoo.models.segment_anyword.inversion import (
    ddim_denoise,
    ddim_invert,
    substituted_embeddings,
    textual_inversion,
)
from zoo.models.segment_anyword.parser import Parser, Phrase
from zoo.models.segment_anyword.points import largest_component, sample_points
from zoo.models.segment_anyword.real import diffusers_parts, encode_image, special_token_ids, tokenizer_word_positions
from zoo.models.segment_anyword.refine import PointRefiner

__all__ = ["SegmentAnywordPipeline", "largest_component", "sample_points", "tokenizer_word_positions"]


def _normalize(m: Tensor) -> Tensor:
    lo, hi = m.amin((-2, -1), keepdim=True), m.amax((-2, -1), keepdim=True)
    return torch.where(hi > lo, (m - lo) / (hi - lo).clamp_min(1e-12), torch.zeros_like(m))


@dataclass
class SegmentAnywordPipeline:
    """Masks for the noun phrases of expressions, from a frozen text-to-image denoiser's cross-attention.

    Args:
        unet: a diffusers ``UNet2DConditionModel`` (frozen; pixel or latent space: ``images`` are what it denoises).
        encode_text: token ids ``(B, T)`` → encoder states ``(B, T, D)``.
        embedding: the text encoder's token embedding (``get_input_embeddings()``), for textual inversion.
        scheduler: the denoiser's training scheduler (its ᾱ and prediction type).
        word_positions: caption → the token positions of each whitespace word (several for sub-words).
        parser: caption → noun phrases (``RuleParser`` or ``SpacyParser``).
        refiner: ``RandomWalkerRefiner`` or ``SamRefiner``; None thresholds the map (M1, B0).
        mode: ``"inversion"`` (DDIM inversion + Direct-Inversion denoising, the paper's) or ``"raw"`` (B0).
        tuning_steps / tuning_lr / tuning_draws: test-time textual inversion (0 steps: off). The paper: 1,100 steps,
            lr 0.005, batch 8; the toy: 40.
        inversion_steps: DDIM steps of the inversion and the re-denoising (``>= 1``; the toy: 20).
        raw_timesteps: B0's timesteps (the toy: 10 over [50, 600]).
        threshold / points / background_threshold: mask-prompt binarisation (0.7, in [0, 1]), positive points per
            phrase (``>= 1``), background seeds below this on every target map (0.2, in [0, 1]).
        r1 / r2: the two linguistic regularisations.
        resolutions: the cross-attention map sizes averaged (an int ``r`` means ``r × r``). None: every layer.
            ``"auto"``: the maps whose side is the UNet input's side / 4, the card's choice (16 × 16 for Stable
            Diffusion at 512², whose latent is 64 × 64; 8 × 8 for the CompVis LDM at 256², latent 32 × 32); an input
            whose UNet has no such layer is refused with the sizes it has. ``from_diffusers`` defaults to ``"auto"``.
        exclude_tokens: the prompt columns dropped before renormalising each pixel's attention over the rest (card
            pitfall): ``"bos"`` the start token only (position 0); ``"special"`` the start token, the end token and all
            the padding, i.e. position 0 and every id in ``special_ids`` and the tokenizer's BOS / EOS / pad / CLS /
            SEP ids. ``from_diffusers`` defaults to ``"special"``; the dataclass default is ``"bos"``.
        special_ids: token ids dropped with ``exclude_tokens="special"`` besides the tokenizer's (for a pipeline
            without a tokenizer, e.g. the toy's ``<pad>``, ``<bos>`` and ``<eos>``).
        vae / tokenizer / max_length: a latent denoiser's autoencoder (images are encoded, maps upsampled back) and
            the tokenizer that makes the ids (see ``from_diffusers``).

    Raises:
        ValueError: an impossible setting (the message names it and what is accepted).
    """

    unet: nn.Module
    encode_text: Callable[[Tensor], Tensor]
    embedding: nn.Embedding
    scheduler: object
    word_positions: Callable[[str], list[list[int]]]
    parser: Parser
    refiner: PointRefiner | None = None
    mode: Literal["inversion", "raw"] = "inversion"
    tuning_steps: int = 40
    tuning_lr: float = 5e-3
    tuning_draws: int = 8
    inversion_steps: int = 20
    raw_timesteps: Sequence[int] = tuple(int(t) for t in np.linspace(50, 600, 10))
    threshold: float = 0.7
    points: int = 3
    background_threshold: float = 0.2
    r1: bool = True
    r2: bool = True
    resolutions: Sequence[int | tuple[int, int]] | Literal["auto"] | None = None
    exclude_tokens: Literal["bos", "special"] = "bos"
    special_ids: Sequence[int] = ()
    vae: nn.Module | None = None
    tokenizer: Any = None
    max_length: int | None = None
    _auto_sizes: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, accepted: str) -> None:
            if not ok:
                raise ValueError(f"SegmentAnywordPipeline: {name}={getattr(self, name)!r} is not accepted; "
                                 f"expected {accepted}")  # fmt: skip

        def is_int(x: object) -> bool:
            return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

        need(self.mode in ("inversion", "raw"), "mode", "'inversion' or 'raw'")
        need(self.exclude_tokens in ("bos", "special"), "exclude_tokens", "'bos' or 'special'")
        need(is_int(self.tuning_steps) and self.tuning_steps >= 0, "tuning_steps", "an int >= 0 (0: no inversion)")
        need(self.tuning_lr >= 0, "tuning_lr", "a learning rate >= 0")
        need(is_int(self.tuning_draws) and self.tuning_draws >= 1, "tuning_draws", "an int >= 1")
        need(is_int(self.inversion_steps) and self.inversion_steps >= 1, "inversion_steps", "an int >= 1")
        need(0 <= self.threshold <= 1, "threshold", "a value in [0, 1] (the maps are min-max normalised)")
        need(0 <= self.background_threshold <= 1, "background_threshold", "a value in [0, 1]")
        need(is_int(self.points) and self.points >= 1, "points", "an int >= 1")
        need(len(self.raw_timesteps) > 0 and all(is_int(t) and t >= 0 for t in self.raw_timesteps), "raw_timesteps",
             "a non-empty sequence of timesteps >= 0")  # fmt: skip
        need(all(is_int(i) for i in self.special_ids), "special_ids", "a sequence of token ids")
        need(self.exclude_tokens != "special" or self.tokenizer is not None or len(self.special_ids) > 0,
             "exclude_tokens", "'bos' where the pipeline has neither a tokenizer nor special_ids (pass special_ids, "
             "the BOS, EOS and padding ids, to drop them)")  # fmt: skip
        r = self.resolutions
        sizes_ok = not isinstance(r, str) and all(
            is_int(x) or (isinstance(x, Sequence) and len(x) == 2 and all(map(is_int, x))) for x in r or ()
        )
        need(r is None or r == "auto" or sizes_ok, "resolutions",
             "None (every layer), 'auto' (the side / 4) or map sizes such as [16] or [(16, 24)]")  # fmt: skip

    # -- step 1: targets ----------------------------------------------------------------------------------------------
    def targets(self, caption: str, strict: bool = True) -> tuple[list[Phrase], list[list[list[int]]]]:
        """The phrases and, per phrase, the token positions of each of its words, noun first, then its modifiers (a
        word split into sub-word pieces has several; their maps are averaged, card pitfall).

        Raises:
            ValueError: the parser finds no noun phrase (with ``strict``; otherwise ``([], [])``), or a phrase word
                has no token in the prompt (e.g. truncated away).
        """
        phrases = self.parser(caption)
        if not phrases:
            if strict:
                raise ValueError(f"no noun phrase in {caption!r}: nothing to segment (RuleParser finds only the nouns "
                                 "it was given)")  # fmt: skip
            return [], []
        positions = self.word_positions(caption)
        tokens = []
        for p in phrases:
            words = [p.noun, *p.modifiers]
            if any(w >= len(positions) or not positions[w] for w in words):
                raise ValueError(f"phrase {p.text!r} of {caption!r} has a word with no token in the prompt")
            tokens.append([list(positions[w]) for w in words])
        return phrases, tokens

    @staticmethod
    def flat_positions(tokens: list[list[list[int]]]) -> Tensor:
        """Every target token position, in the order ``masks_from_maps`` reads the maps."""
        return torch.tensor([t for phrase in tokens for word in phrase for t in word], dtype=torch.long)

    def excluded_columns(self, ids: Tensor) -> Tensor:
        """The prompt columns ``(T,)`` bool dropped before the renormalisation (``exclude_tokens``) for ids ``(T,)``."""
        drop = torch.zeros(ids.shape[-1], dtype=torch.bool, device=ids.device)
        drop[0] = True  # BOS (CLIP's <|startoftext|>, BERT's [CLS], the toy's <bos>): the attention sink
        if self.exclude_tokens == "special":
            special = {*map(int, self.special_ids), *special_token_ids(self.tokenizer)}
            drop |= torch.isin(ids, torch.tensor(sorted(special), dtype=ids.dtype, device=ids.device))
        return drop

    # -- steps 2-3: attention maps ------------------------------------------------------------------------------------
    def _resolutions(self, x0: Tensor, ids: Tensor) -> list[tuple[int, int]] | None:
        """The map sizes to record for an input ``x0`` ``(1, C, h, w)`` (``"auto"``: found with one probing call)."""
        if self.resolutions is None:
            return None
        if self.resolutions != "auto":
            return [(int(r), int(r)) if not isinstance(r, Sequence) else (int(r[0]), int(r[1])) for r in
                    self.resolutions]  # fmt: skip
        h, w = x0.shape[-2:]
        if (h, w) not in self._auto_sizes:
            dtype = next(self.unet.parameters()).dtype
            with torch.no_grad(), record_cross_attention(self.unet) as probe:
                self.unet(x0.to(dtype), torch.zeros(1, dtype=torch.long, device=x0.device),
                          encoder_hidden_states=self.encode_text(ids).to(dtype))  # fmt: skip
            sizes = sorted({r.size for r in probe.records})
            if h % 4 or w % 4 or (h // 4, w // 4) not in sizes:
                raise ValueError(
                    f"resolutions='auto' asks for the maps of side / 4 ({h}/4 x {w}/4) of a {h} x {w} "
                    "UNet input (the card's 16 x 16 at Stable Diffusion's 64 x 64 latent), but this "
                    f"UNet's maps are {sizes}. Pass resolutions=[...] (some of those) or None (all)."
                )
            self._auto_sizes[(h, w)] = [(h // 4, w // 4)]
        return self._auto_sizes[(h, w)]

    def attention_maps(self, image: Tensor, ids: Tensor, positions: Tensor, generator: torch.Generator | None = None
                       ) -> Tensor:  # fmt: skip
        """Target-token maps ``(K, H, W)`` in [0, 1] for one image ``(C, H, W)``, ids ``(T,)``, positions ``(K,)``.

        ``image`` is what the UNet denoises (pixels, or a VAE latent). It may be called under ``torch.no_grad()`` or
        ``torch.inference_mode()``: textual inversion enables autograd locally.
        """
        size = image.shape[-1]
        x0, ids, pos = image[None], ids[None], positions[None]
        resolutions = self._resolutions(x0, ids)
        drop = self.excluded_columns(ids[0])
        if int((~drop).sum()) == 1:
            warnings.warn(f"only one prompt column is left after excluding {self.exclude_tokens!r} tokens: its "
                          "renormalised attention is 1 at every pixel, so its map is empty. Use a caption of several "
                          "words ('a photo of a dog') or exclude_tokens='bos'.", stacklevel=2)  # fmt: skip
        vectors = None
        if self.tuning_steps > 0:
            vectors = textual_inversion(self.unet, self.encode_text, self.embedding, ids, pos, x0, self.scheduler,
                                        steps=self.tuning_steps, lr=self.tuning_lr, draws=self.tuning_draws,
                                        generator=generator)  # fmt: skip
        with torch.no_grad():
            if vectors is None:
                vectors = self.embedding(ids.gather(1, pos)).detach()
            with substituted_embeddings(self.embedding, pos, vectors):
                states = self.encode_text(ids)
            with record_cross_attention(self.unet, resolutions=resolutions) as store:
                if self.mode == "raw":
                    noise = torch.randn(x0.shape, generator=generator).to(x0)
                    for t in self.raw_timesteps:
                        tt = torch.tensor([t], device=x0.device)
                        self.unet(self.scheduler.add_noise(x0, noise, tt), tt, encoder_hidden_states=states)
                else:
                    latents = ddim_invert(self.unet, states, x0, self.inversion_steps, self.scheduler)
                    store.clear()  # record the re-denoising pass only
                    ddim_denoise(self.unet, states, latents, steps=self.inversion_steps, direct=True,
                                 scheduler_config=self.scheduler)  # fmt: skip
                exclude = (0,) if self.exclude_tokens == "bos" else drop[None]
                maps = store.maps(pos, size, exclude=exclude)
        return maps[0]

    # -- steps 4-6: prompts and masks ---------------------------------------------------------------------------------
    def _phrase_map(self, word_maps: list[Tensor], modifiers: bool) -> Tensor:
        noun = word_maps[0]
        if self.r1 and modifiers and len(word_maps) > 1:
            return _normalize(noun * torch.stack(word_maps[1:]).mean(0))  # R1 [proposal]: noun ⊙ its modifiers' map
        return noun

    def masks_from_maps(self, image: Tensor, maps: Tensor, phrases: list[Phrase], tokens: list[list[list[int]]],
                        generator: torch.Generator | None = None) -> list[Tensor]:  # fmt: skip
        """One mask ``(H, W)`` bool per phrase from the target maps (in the order of ``flat_positions(tokens)``)."""
        per_phrase, start = [], 0
        for phrase in tokens:
            word_maps = []
            for word in phrase:
                word_maps.append(maps[start : start + len(word)].mean(0))  # sub-word pieces: their mean map
                start += len(word)
            per_phrase.append(word_maps)
        regions = []
        for p, word_maps in zip(phrases, per_phrase):
            m = self._phrase_map(word_maps, bool(p.modifiers))
            region = largest_component(m >= self.threshold)
            if not region.any():  # card pitfall: an empty component falls back to the argmax pixel
                region = torch.zeros_like(m, dtype=torch.bool)
                region.view(-1)[int(m.argmax())] = True
            regions.append(region)
        if self.refiner is None:
            return regions
        positives = [sample_points(r, self.points, generator) for r in regions]
        background = (maps < self.background_threshold).all(0)
        out = []
        for i, pos in enumerate(positives):
            others = [positives[j] for j in range(len(positives)) if j != i] if self.r2 else []
            neg = torch.cat(others) if others else torch.zeros(0, 2, dtype=torch.long)
            out.append(self.refiner(image, pos, neg, background))
        return out

    # -- the real path: a diffusers text-to-image pipeline -------------------------------------------------------------
    @classmethod
    def from_diffusers(cls, pipe: object, parser: Parser, refiner: PointRefiner | None = None, **settings: Any
                       ) -> SegmentAnywordPipeline:  # fmt: skip
        """Over a diffusers text-to-image pipeline's parts (``zoo.models.segment_anyword.real``): Stable Diffusion's
        ``StableDiffusionPipeline`` (``unet``, ``text_encoder``, ``tokenizer``, ``scheduler``, ``vae``) or the paper's
        CompVis LDM, ``LDMTextToImagePipeline`` (``bert`` and ``vqvae`` in place of ``text_encoder`` and ``vae``).

        The card's choices are the defaults here (``settings`` override them): ``resolutions="auto"`` (the 16 × 16
        maps of SD at 512²) and ``exclude_tokens="special"`` (BOS, EOS and padding dropped before renormalising).

        Example (downloads Stable Diffusion, and spaCy's English model: offline, only ``RuleParser(nouns,
        adjectives)`` works, on a closed vocabulary; SAM's checkpoint is a file from segment-anything's release):

            pipe = StableDiffusionPipeline.from_pretrained("CompVis/stable-diffusion-v1-4")
            segmenter = SegmentAnywordPipeline.from_diffusers(pipe, SpacyParser(), SamRefiner("sam_vit_h_4b8939.pth"),
                                                              tuning_steps=1100)
            masks = segmenter(image, "the dog left of a red car")  # image (3, 512, 512) float in [-1, 1]
        """
        defaults = {"resolutions": "auto", "exclude_tokens": "special"}
        return cls(**diffusers_parts(pipe), parser=parser, refiner=refiner, **(defaults | settings))

    def _encode_image(self, image: Tensor) -> Tensor:
        """The VAE latent of an RGB image ``(3, H, W)`` in [−1, 1] (the posterior mean, scaled as in training)."""
        return encode_image(self.vae, image)  # type: ignore[arg-type]

    def _check_image(self, image: Tensor) -> None:
        if not isinstance(image, Tensor) or not image.is_floating_point():
            raise ValueError(
                f"SegmentAnywordPipeline expects float images in [-1, 1], got "
                f"{getattr(image, 'dtype', type(image).__name__)}: convert with image.float() / 127.5 - 1"
            )
        sample = getattr(getattr(self.unet, "config", None), "sample_size", None)
        if self.vae is not None:
            factor = 2 ** (len(self.vae.config.block_out_channels) - 1)  # type: ignore[union-attr]
            if image.ndim != 3 or image.shape[0] != 3 or image.shape[-1] % factor or image.shape[-2] % factor:
                raise ValueError(f"expected an RGB image (3, H, W) with H and W multiples of the VAE's {factor}, got "
                                 f"{tuple(image.shape)}")  # fmt: skip
        elif image.ndim != 3 or (sample is not None and tuple(image.shape[-2:]) != (sample, sample)):
            raise ValueError(f"expected an image of shape (C, {sample}, {sample}) for this denoiser, got "
                             f"{tuple(image.shape)}")  # fmt: skip
        if not torch.isfinite(image).all():
            raise ValueError("the image has NaN or infinite values")
        lo, hi = float(image.min()), float(image.max())
        if lo < -1 - 1e-3 or hi > 1 + 1e-3:
            raise ValueError(f"SegmentAnywordPipeline expects float images in [-1, 1], got values in [{lo:g}, {hi:g}]: "
                             "rescale (e.g. image / 127.5 - 1 for [0, 255])")  # fmt: skip

    def _check_ids(self, ids: Tensor, caption: str, positions: Tensor) -> None:
        """Refuse ids that are not the caption's: with a tokenizer, ids must be what it makes (padded to
        ``max_length`` or not); without one, ids must cover the target positions, and those must not be special ids."""
        if ids.ndim != 1:
            raise ValueError(f"expected the caption's token ids of shape (T,), got {tuple(ids.shape)}")
        if self.tokenizer is not None:
            made = [self._tokenize(caption, pad=True), self._tokenize(caption, pad=False)]
            if ids.tolist() not in made:
                raise ValueError(
                    f"ids {ids.tolist()} are not the ids of {caption!r}: the pipeline's tokenizer makes "
                    f"{made[1]} (padded to {self.max_length}). Pass the caption's own ids, or ids=None."
                )
            return
        if int(positions.max()) >= len(ids):
            raise ValueError(f"ids of length {len(ids)} do not hold the words of {caption!r}: its targets sit at token "
                             f"positions {positions.tolist()}. Pass the caption's own ids.")  # fmt: skip
        special = torch.tensor(list(self.special_ids), dtype=ids.dtype, device=ids.device)
        if len(special) and torch.isin(ids[positions], special).any():
            raise ValueError(f"ids {ids.tolist()} are not the ids of {caption!r}: its words' positions "
                             f"{positions.tolist()} hold special or padding ids {list(self.special_ids)}")  # fmt: skip

    def _tokenize(self, caption: str, pad: bool) -> list[int]:
        limit = {"truncation": True, "max_length": self.max_length} if self.max_length is not None else {}
        padding = {"padding": "max_length"} if pad and self.max_length is not None else {}
        return list(self.tokenizer(caption, **limit, **padding)["input_ids"])

    def __call__(self, image: Tensor, caption: str, ids: Tensor | None = None,
                 generator: torch.Generator | None = None) -> list[Tensor]:  # fmt: skip
        """Masks ``(H, W)`` of every noun phrase of ``caption`` in ``image`` ``(C, H, W)`` (float in [−1, 1]; RGB where
        a VAE encodes it), one per phrase in the parser's order; an empty list, with a warning, where the parser finds
        no noun phrase (a dataset evaluation goes on). ``ids``: the caption's token ids ``(T,)``, or None to use the
        pipeline's tokenizer (where it has one, given ids must be what it makes; without one, they can only be checked
        to cover the words' positions). Works under ``torch.no_grad()`` and ``torch.inference_mode()``.

        Raises:
            ValueError: an image that is not float in [−1, 1] or of the wrong shape, or ids of another caption.
        """
        self._check_image(image)
        phrases, tokens = self.targets(caption, strict=False)
        if not phrases:
            warnings.warn(f"no noun phrase in {caption!r}: no mask returned (RuleParser finds only the nouns it was "
                          "given)", stacklevel=2)  # fmt: skip
            return []
        positions = self.flat_positions(tokens)
        if ids is None:
            if self.tokenizer is None:
                raise ValueError("pass the caption's token ids: this pipeline has no tokenizer")
            ids = torch.tensor(self._tokenize(caption, pad=True), device=image.device)
        self._check_ids(ids, caption, positions.to(ids.device))
        positions = positions.to(ids.device)
        if self.vae is None:
            maps = self.attention_maps(image, ids, positions, generator)
        else:  # latent space: maps at the latent size, upsampled to the image's (the refiner reads the RGB image)
            maps = self.attention_maps(self._encode_image(image), ids, positions, generator)
            maps = torch.nn.functional.interpolate(maps[None], size=image.shape[-2:], mode="bilinear",
                                                   align_corners=False)[0].clamp(0, 1)  # fmt: skip
        return self.masks_from_maps(image, maps, phrases, tokens, generator)
