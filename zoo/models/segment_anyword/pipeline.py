"""``SegmentAnywordPipeline``: training-free grounded segmentation over any text-to-image diffusers denoiser.

For an image and its expression (card §2; no official code exists: the steps follow the paper's description, the
parts it leaves open are the card's proposals, marked):

1. parse the expression into noun phrases (head noun + modifiers);
2. test-time textual inversion of the target tokens' embeddings (nouns and modifiers) with the LDM loss on this image;
3. DDIM inversion of the image and a Direct-Inversion re-denoising pass, recording the cross-attention of the target
   tokens at every step and layer (BOS column excluded, renormalised, upsampled, averaged, min-max normalised);
4. mask prompts: threshold 0.7, the largest connected component, positive points sampled in it (farthest-point,
   ``points`` of them: the count is not given, [proposal] 3);
5. R1, positive adjective prompt clustering: the noun's map times its modifiers' mean map before thresholding
   ([proposal], the card's toy rule); R2, negative mutual-exclusive binding: the other phrases' positive points become
   negatives; background seeds where every target map is below 0.2 ([proposal]);
6. a point-prompt refiner (SAM, or the random walker where SAM's weights are absent) gives the phrase's mask.

``mode="raw"`` is the DAAM-style baseline B0: the image noised at fixed timesteps, one forward each, no inversion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

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
from zoo.models.segment_anyword.refine import PointRefiner

__all__ = ["SegmentAnywordPipeline", "largest_component", "sample_points", "tokenizer_word_positions"]


def largest_component(binary: Tensor) -> Tensor:
    """The largest 4-connected component of a boolean map ``(H, W)`` (empty stays empty)."""
    from scipy import ndimage

    labels, count = ndimage.label(binary.cpu().numpy())
    if count == 0:
        return torch.zeros_like(binary, dtype=torch.bool)
    sizes = np.bincount(labels.ravel())[1:]
    return torch.from_numpy(labels == 1 + int(np.argmax(sizes))).to(binary.device)


def sample_points(region: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """``k`` points ``(k', 2)`` (row, col) spread over a region by farthest-point sampling from a random start."""
    cells = region.nonzero().float()
    if len(cells) == 0:
        return torch.zeros(0, 2, dtype=torch.long)
    chosen = [int(torch.randint(len(cells), (1,), generator=generator))]
    dist = (cells - cells[chosen[0]]).norm(dim=-1)
    for _ in range(min(k, len(cells)) - 1):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = torch.minimum(dist, (cells - cells[nxt]).norm(dim=-1))
    return cells[chosen].long()


def tokenizer_word_positions(tokenizer: object, caption: str, max_length: int | None = None) -> list[list[int]]:
    """The token positions of each whitespace word of ``caption`` for a Hugging Face fast tokenizer (its offsets; a
    word split into sub-words gets all its pieces, card pitfall). Special tokens (BOS) shift the positions as they do
    in the ids the text encoder sees."""
    encoded = tokenizer(caption, return_offsets_mapping=True, truncation=max_length is not None,  # type: ignore[operator]
                        max_length=max_length)  # fmt: skip
    offsets = encoded["offset_mapping"]
    spans, pos = [], 0
    for word in caption.split():
        start = caption.index(word, pos)
        spans.append((start, start + len(word)))
        pos = start + len(word)
    return [[i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start] for start, end in spans]


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
        inversion_steps: DDIM steps of the inversion and the re-denoising (the toy: 20).
        raw_timesteps: B0's timesteps (the toy: 10 over [50, 600]).
        threshold / points / background_threshold: mask-prompt binarisation (0.7), positive points per phrase,
            background seeds below this on every target map (0.2).
        r1 / r2: the two linguistic regularisations.
        vae / tokenizer / max_length: a latent denoiser's autoencoder (images are encoded, maps upsampled back) and
            the tokenizer that makes the ids (see ``from_diffusers``).
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
    vae: nn.Module | None = None
    tokenizer: object | None = None
    max_length: int | None = None

    # -- step 1: targets ----------------------------------------------------------------------------------------------
    def targets(self, caption: str) -> tuple[list[Phrase], list[list[list[int]]]]:
        """The phrases and, per phrase, the token positions of each of its words, noun first, then its modifiers (a
        word split into sub-word pieces has several; their maps are averaged, card pitfall)."""
        phrases = self.parser(caption)
        positions = self.word_positions(caption)
        if not phrases:
            raise ValueError(f"no noun phrase in {caption!r}: nothing to segment")
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

    # -- steps 2-3: attention maps ------------------------------------------------------------------------------------
    def attention_maps(self, image: Tensor, ids: Tensor, positions: Tensor, generator: torch.Generator | None = None
                       ) -> Tensor:  # fmt: skip
        """Target-token maps ``(K, H, W)`` in [0, 1] for one image ``(C, H, W)``, ids ``(T,)``, positions ``(K,)``."""
        size = image.shape[-1]
        x0, ids, pos = image[None], ids[None], positions[None]
        vectors = None
        if self.tuning_steps > 0:
            vectors = textual_inversion(self.unet, self.encode_text, self.embedding, ids, pos, x0, self.scheduler,
                                        steps=self.tuning_steps, lr=self.tuning_lr, draws=self.tuning_draws,
                                        generator=generator)  # fmt: skip
        if vectors is None:
            vectors = self.embedding(ids.gather(1, pos)).detach()
        with torch.no_grad(), substituted_embeddings(self.embedding, pos, vectors):
            states = self.encode_text(ids)
            with record_cross_attention(self.unet) as store:
                if self.mode == "raw":
                    noise = torch.randn(x0.shape, generator=generator).to(x0)
                    for t in self.raw_timesteps:
                        tt = torch.tensor([t], device=x0.device)
                        self.unet(self.scheduler.add_noise(x0, noise, tt), tt, encoder_hidden_states=states)
                else:
                    latents = ddim_invert(self.unet, states, x0, self.inversion_steps, self.scheduler)
                    store.clear()  # record the re-denoising pass only
                    ddim_denoise(self.unet, states, latents, steps=self.inversion_steps, direct=True,
                                 scheduler_config=self.scheduler)
                maps = store.maps(pos, size)
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
    def from_diffusers(cls, pipe: object, parser: Parser, refiner: PointRefiner | None = None, **settings: object
                       ) -> SegmentAnywordPipeline:  # fmt: skip
        """Over a diffusers text-to-image pipeline's parts: ``unet``, ``text_encoder``, ``tokenizer`` (a fast Hugging
        Face tokenizer: its offsets map words to sub-word tokens), ``scheduler`` and ``vae`` (Stable Diffusion's
        ``StableDiffusionPipeline``; the paper's CompVis LDM has the same parts).

        Example (downloads Stable Diffusion; SAM's checkpoint is a file from segment-anything's release):

            pipe = StableDiffusionPipeline.from_pretrained("CompVis/stable-diffusion-v1-4")
            segmenter = SegmentAnywordPipeline.from_diffusers(pipe, SpacyParser(), SamRefiner("sam_vit_h_4b8939.pth"),
                                                              tuning_steps=1100)
            masks = segmenter(image, "the dog left of a red car")  # image (3, 512, 512) in [-1, 1]
        """
        parts = ("unet", "text_encoder", "tokenizer", "scheduler", "vae")
        missing = [k for k in parts if getattr(pipe, k, None) is None]
        if missing:
            raise ValueError(f"{type(pipe).__name__} has no {', '.join(missing)}: expected a text-to-image diffusers "
                             "pipeline such as StableDiffusionPipeline")  # fmt: skip
        text_encoder, tokenizer = pipe.text_encoder, pipe.tokenizer  # type: ignore[attr-defined]
        max_length = min(int(tokenizer.model_max_length), int(text_encoder.config.max_position_embeddings))
        return cls(
            unet=pipe.unet, encode_text=lambda ids: text_encoder(ids).last_hidden_state,  # type: ignore[attr-defined]
            embedding=text_encoder.get_input_embeddings(), scheduler=pipe.scheduler,  # type: ignore[attr-defined]
            word_positions=lambda c: tokenizer_word_positions(tokenizer, c, max_length), parser=parser,
            refiner=refiner, vae=pipe.vae, tokenizer=tokenizer, max_length=max_length, **settings,  # type: ignore
        )  # fmt: skip

    def _encode_image(self, image: Tensor) -> Tensor:
        """The VAE latent of an RGB image ``(3, H, W)`` in [−1, 1] (the posterior mean, scaled as in training)."""
        with torch.no_grad():
            encoded = self.vae.encode(image[None].to(self.vae.dtype))  # type: ignore[union-attr]
        latent = encoded.latent_dist.mean if hasattr(encoded, "latent_dist") else encoded.latents  # VQ: .latents
        return latent[0] * float(getattr(self.vae.config, "scaling_factor", 1.0))  # type: ignore[union-attr]

    def _check_image(self, image: Tensor) -> None:
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

    def __call__(self, image: Tensor, caption: str, ids: Tensor | None = None,
                 generator: torch.Generator | None = None) -> list[Tensor]:  # fmt: skip
        """Masks ``(H, W)`` of every noun phrase of ``caption`` in ``image`` ``(C, H, W)`` (in [−1, 1]; RGB where a
        VAE encodes it). ``ids``: the caption's token ids ``(T,)``, or None to use the pipeline's tokenizer."""
        self._check_image(image)
        phrases, tokens = self.targets(caption)
        if ids is None:
            if self.tokenizer is None:
                raise ValueError("pass the caption's token ids: this pipeline has no tokenizer")
            encoded = self.tokenizer(caption, padding="max_length", truncation=True,  # type: ignore[operator]
                                     max_length=self.max_length)  # fmt: skip
            ids = torch.tensor(encoded["input_ids"], device=image.device)
        positions = self.flat_positions(tokens).to(ids.device)
        if self.vae is None:
            maps = self.attention_maps(image, ids, positions, generator)
        else:  # latent space: maps at the latent size, upsampled to the image's (the refiner reads the RGB image)
            maps = self.attention_maps(self._encode_image(image), ids, positions, generator)
            maps = torch.nn.functional.interpolate(maps[None], size=image.shape[-2:], mode="bilinear",
                                                   align_corners=False)[0].clamp(0, 1)  # fmt: skip
        return self.masks_from_maps(image, maps, phrases, tokens, generator)
