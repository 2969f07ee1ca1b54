"""``SegmentAnyword``: the toy text-to-image model (trained here, the "frozen pretrained" model of the embedded default)
and the training-free Segment Anyword pipeline over it, evaluated with the grounding metrics."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from zoo.datamodules.shapes import VOCAB, ShapeTokenizer
from zoo.metrics.grounding import GroundingIoU
from zoo.models.segment_anyword.parser import get_parser
from zoo.models.segment_anyword.pipeline import SegmentAnywordPipeline
from zoo.models.segment_anyword.refine import RandomWalkerRefiner, SamRefiner
from zoo.models.segment_anyword.text2image import TextToImage
from zoo.module import ZooModule

__all__ = ["SegmentAnyword"]

Batch = dict[str, Tensor]
COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")
# <pad>, <bos>, <eos>: a word position on one of them means the ids are another caption's (the pipeline refuses them)
SPECIAL_IDS = (0, 1, 2)


class SegmentAnyword(ZooModule):
    """Segment Anyword (Liu et al., ICML 2025) on captioned shape scenes (the card's §6, textured here).

    ``fit`` pretrains the toy text-to-image model (a small text encoder and a diffusers ``UNet2DConditionModel``,
    ε-prediction, caption dropout). Everything after is training-free, as in the paper: ``segment(image, caption)``
    runs :class:`SegmentAnywordPipeline` on the frozen model, and ``test`` scores the mask of every named noun phrase
    against its object with ``test/miou`` (per shape class), ``test/ciou`` and ``test/giou``, also on the
    shared-colour scenes (every object in one colour: only the shape word names the object, ``test/shared_*``) and on
    the hard scenes (two objects of one shape, ``test/hard_*``). A phrase the parser misses scores an empty mask.
    ``forward(batch)`` returns the raw cross-attention map of each
    scene's first noun ``(B, S, S)`` (fixed noise: the same batch gives the same maps).

    Args:
        size / dim / block_out_channels / caption_dropout / lr: the toy model and its pretraining (AdamW; at lr
            1e-3 the toy's cross-attention stays nearly uniform over the words; at 3e-3 for 8,000 steps the shape
            word's map peaks on its object more often than chance, see ``zoo reproduce segment-anyword --diagnose``).
        tuning_steps / tuning_lr / inversion_steps / threshold / points / r1 / r2: the pipeline's (see
            ``SegmentAnywordPipeline``); ``mode="raw"`` gives the raw-attention baseline B0.
        refiner: ``"random_walker"`` (the CPU stand-in) or ``"sam"`` (needs ``sam_checkpoint``, the paper's ViT-H);
            ``"none"`` thresholds the maps (the M1 arm).
        parser: ``"rule"`` (the toy grammar's) or an installed spaCy model's name (``"en_core_web_sm"``).
        seed: the seed of the pipeline's noise and point sampling.

    Example:
        >>> model = SegmentAnyword(block_out_channels=[8, 16], tuning_steps=1, inversion_steps=2)
        >>> masks = model.segment(torch.rand(3, 16, 16) * 2 - 1, "a red circle and a blue circle")
        >>> len(masks), masks[0].shape
        (2, torch.Size([16, 16]))
    """

    def __init__(
        self,
        size: int = 16,
        dim: int = 32,
        block_out_channels: list[int] | None = None,
        caption_dropout: float = 0.1,
        lr: float = 3e-3,
        mode: Literal["inversion", "raw"] = "inversion",
        tuning_steps: int = 40,
        tuning_lr: float = 5e-3,
        inversion_steps: int = 20,
        threshold: float = 0.7,
        points: int = 3,
        r1: bool = True,
        r2: bool = True,
        refiner: Literal["random_walker", "sam", "none"] = "random_walker",
        sam_checkpoint: str | None = None,
        parser: str = "rule",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if refiner not in ("random_walker", "sam", "none"):
            raise ValueError(f"refiner must be 'random_walker', 'sam' or 'none', got {refiner!r}")
        if mode not in ("inversion", "raw"):
            raise ValueError(f"mode must be 'inversion' (the paper's) or 'raw' (the B0 baseline), got {mode!r}")
        self.save_hyperparameters()
        self.model = TextToImage(len(VOCAB), size, dim, tuple(block_out_channels or (16, 32)), 1000, caption_dropout)
        self.tokenizer = ShapeTokenizer()
        self.test_all = GroundingIoU(len(SHAPES))
        self.test_subsets = nn.ModuleDict({k: GroundingIoU(len(SHAPES)) for k in ("hard", "shared")})
        self._refiner: Any = None
        self._parser = get_parser(parser, SHAPES, COLOURS)
        self.pipeline(refiner=None)  # the pipeline refuses impossible settings (threshold, points, steps) here

    # -- pretraining --------------------------------------------------------------------------------------------------
    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        loss = self.model.loss(batch["image"], batch["tokens"])
        self.log_train({"train/loss": loss}, batch_idx, batch_size=len(batch["image"]))
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        g = torch.Generator(device=batch["image"].device).manual_seed(self.hparams.seed + batch_idx)
        self.log("val/loss", self.model.loss(batch["image"], batch["tokens"], g), batch_size=len(batch["image"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    # -- the training-free pipeline -----------------------------------------------------------------------------------
    def pipeline(self, **overrides: Any) -> SegmentAnywordPipeline:
        """The pipeline over this (frozen) model with the module's settings, or ``overrides`` (the ablations)."""
        h = self.hparams
        if self._refiner is None and h.refiner != "none":
            self._refiner = SamRefiner(h.sam_checkpoint) if h.refiner == "sam" else RandomWalkerRefiner()
        settings = {"refiner": self._refiner if h.refiner != "none" else None, "mode": h.mode,
                    "tuning_steps": h.tuning_steps, "tuning_lr": h.tuning_lr, "inversion_steps": h.inversion_steps,
                    "threshold": h.threshold, "points": h.points, "r1": h.r1, "r2": h.r2,
                    "special_ids": SPECIAL_IDS} | overrides  # fmt: skip
        return SegmentAnywordPipeline(
            unet=self.model.unet, encode_text=self.model.encode_text, embedding=self.model.text_encoder.token_embedding,
            scheduler=self.model.scheduler, word_positions=lambda c: [[p] for p in self.tokenizer.word_positions(c)],
            parser=self._parser, **settings,
        )  # fmt: skip

    def segment(self, image: Tensor, caption: str, generator: torch.Generator | None = None, **overrides: Any
                ) -> list[Tensor]:  # fmt: skip
        """The masks ``(S, S)`` of the noun phrases of ``caption`` in ``image`` ``(3, S, S)`` in [−1, 1]."""
        generator = generator or torch.Generator().manual_seed(self.hparams.seed)
        was_training = self.training
        self.eval()
        # Textual inversion needs autograd, also inside Lightning's test loop (inference mode by default): tensors
        # made in inference mode are cloned out of it first.
        with torch.inference_mode(False), torch.enable_grad():
            image = image.clone()
            ids = self.tokenizer.encode(caption).to(image.device)
            try:
                return self.pipeline(**overrides)(image, caption, ids, generator)
            finally:
                self.train(was_training)

    def forward(self, batch: Batch) -> Tensor:
        """The raw cross-attention map of each scene's first noun ``(B, S, S)`` (B0's maps; fixed noise)."""
        pipe = self.pipeline(mode="raw", tuning_steps=0)
        nouns = batch["phrase_tokens"][:, 0, 1]
        maps = [pipe.attention_maps(img, ids, n[None], torch.Generator().manual_seed(self.hparams.seed))[0]
                for img, ids, n in zip(batch["image"], batch["tokens"], nouns)]  # fmt: skip
        return torch.stack(maps)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        for i in range(len(batch["image"])):
            caption = self.tokenizer.decode(batch["tokens"][i])
            g = torch.Generator().manual_seed(self.hparams.seed + 1000 * batch_idx + i)
            masks = self.segment(batch["image"][i], caption, g)
            for k in range(batch["phrase_object"].shape[1]):
                obj = int(batch["phrase_object"][i, k])
                if obj < 0:
                    continue
                target, cls = batch["masks"][i, obj][None], batch["phrase_class"][i, k][None]
                # a phrase the parser missed scores an empty mask (a miss), so the dataset evaluation goes on
                mask = masks[k][None].to(target.device) if k < len(masks) else torch.zeros_like(target)
                self.test_all.update(mask, target, cls)
                subset = "hard" if bool(batch["hard"][i]) else "shared" if bool(batch["shared_colour"][i]) else None
                if subset is not None:
                    self.test_subsets[subset].update(mask, target, cls)

    def on_test_epoch_end(self) -> None:
        metrics = {f"test/{k}": v for k, v in self.test_all.compute().items()}
        for name, metric in self.test_subsets.items():
            if int(metric.count) > 0:  # a split without such scenes has no metrics for them
                metrics |= {f"test/{name}_{k}": v for k, v in metric.compute().items()}
            metric.reset()
        self.log_dict(metrics)
        self.test_all.reset()

    def card_notes(self) -> str:
        return (
            "A tiny text-to-image model (a 2-layer text encoder and a diffusers UNet2DConditionModel, pixel space, "
            "16 x 16) trained here on textured captioned shape scenes (the card's §6 with a texture per shape, so that "
            "a shape word, like a natural noun, tells what the object's pixels look like); it stands in for the "
            "paper's frozen pretrained LDM. The test metrics are the training-free pipeline's (40 textual-inversion "
            "steps, DDIM inversion with Direct Inversion, R1, R2, a random-walker refiner in place of SAM ViT-H, whose "
            "weights cannot be downloaded here) on the test scenes; `test/shared_*` on the scenes where every object "
            "has one colour (only the shape word names the object), `test/hard_*` on those with two named objects of "
            "one shape. The paper's RefCOCO, gRefCOCO, GranDf and Pascal-Context numbers are not reproduced; see "
            "`zoo reproduce segment-anyword` for the comparison with raw attention, the ablations and the heuristics."
        )
