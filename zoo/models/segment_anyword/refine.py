"""Point-prompt refiners: positive and negative points (and a map-derived region) → a mask.

Segment Anyword refines its mask prompts with a frozen SAM ViT-H (card §2.6). ``SamRefiner`` is that, through
``segment_anything.SamPredictor`` (points in (x, y) order, the mask of highest predicted IoU), where a checkpoint
file is given. ``RandomWalkerRefiner`` is the card's CPU stand-in (§6), scikit-image's random walker on the RGB image
seeded with the points and background seeds: SAM's weights cannot be downloaded here. One interface:
``refiner(image, positive, negative, background=None) -> mask``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from zoo.models.segment_anyword.points import sample_points

__all__ = ["PointRefiner", "RandomWalkerRefiner", "SamRefiner"]


class PointRefiner(Protocol):
    def __call__(self, image: Tensor, positive: Tensor, negative: Tensor, background: Tensor | None = None) -> Tensor:
        """``image`` (3, H, W) in [−1, 1], points (P, 2) as (row, col), ``background`` (H, W) bool seeds → mask (H, W)
        bool."""
        ...


def _check(image: Tensor, positive: Tensor, negative: Tensor) -> None:
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected an RGB image of shape (3, H, W), got {tuple(image.shape)}")
    for name, points in (("positive", positive), ("negative", negative)):
        if points.ndim != 2 or points.shape[1] != 2:
            raise ValueError(f"expected {name} points of shape (P, 2) as (row, col), got {tuple(points.shape)}")
        h, w = image.shape[1:]
        if len(points) and ((points < 0).any() or (points[:, 0] >= h).any() or (points[:, 1] >= w).any()):
            raise ValueError(f"{name} points {points.tolist()} fall outside the {h} x {w} image")
    if len(positive) == 0:
        raise ValueError("a refiner needs at least one positive point")


class RandomWalkerRefiner:
    """Random-walker segmentation from point seeds (``skimage.segmentation.random_walker`` on the RGB image):
    label 1 at the positive points, label 2 at the negative points and at the background seeds.

    Args:
        beta: the random walker's edge penalty (scikit-image's default 130).

    Example:
        >>> image = -torch.ones(3, 12, 12)
        >>> image[0, 2:6, 2:6] = 1.0  # a red square on a dark background
        >>> mask = RandomWalkerRefiner()(image, torch.tensor([[3, 3]]), torch.tensor([[10, 10]]))
        >>> int(mask.sum()), bool(mask[4, 4])
        (16, True)
    """

    def __init__(self, beta: float = 130.0) -> None:
        self.beta = beta

    def __call__(self, image: Tensor, positive: Tensor, negative: Tensor, background: Tensor | None = None) -> Tensor:
        from skimage.segmentation import random_walker

        _check(image, positive, negative)
        seeds = np.zeros(image.shape[1:], dtype=np.int32)
        if background is not None:
            seeds[background.cpu().numpy().astype(bool)] = 2
        for label, points in ((2, negative), (1, positive)):  # positives last: they win a shared pixel
            for r, c in points.long().tolist():
                seeds[r, c] = label
        if not (seeds == 2).any():  # nothing to compete with: the walker would label everything 1
            return torch.from_numpy(seeds == 1)
        rgb = ((image.detach().cpu().float().permute(1, 2, 0).numpy() + 1) / 2).clip(0, 1)
        with warnings.catch_warnings():
            # cg_j's iterative solve can overshoot [0, 1] by more than prob_tol on flat regions; the labels are the
            # argmax of the probabilities, which the overshoot does not change, so the warning is noise here
            warnings.filterwarnings("ignore", message="The probability range is outside", category=UserWarning)
            labels = random_walker(rgb, seeds, beta=self.beta, mode="cg_j", channel_axis=-1)
        return torch.from_numpy(labels == 1)


class SamRefiner:
    """SAM from point prompts (``segment_anything.SamPredictor``): the multimask output with the highest predicted IoU.

    With a ``background`` region, up to ``background_points`` negative points spread over it (farthest-point sampling
    from a start drawn with ``seed``: the same points on every call) join the negatives: card §2.5 gives a
    single-object expression 1–3 negatives from the background, which it otherwise would not have.

    Args:
        checkpoint: a SAM checkpoint file (e.g. ``sam_vit_h_4b8939.pth``, the paper's ViT-H); it is loaded by
            ``segment_anything`` with ``torch.load``: use files you trust.
        model_type: ``"vit_h"``, ``"vit_l"`` or ``"vit_b"``.
        model: an already built ``segment_anything.modeling.Sam`` instead of a checkpoint (tests build a tiny one).
        background_points: negatives taken from the background region when one is given (``>= 0``; 0: none).
        seed: the seed of the background points' start.

    Raises:
        ImportError: without ``pip install segment-anything``.
        FileNotFoundError: when ``checkpoint`` does not exist.
    """

    def __init__(self, checkpoint: str | None = None, model_type: str = "vit_h", model: nn.Module | None = None,
                 background_points: int = 3, seed: int = 0) -> None:  # fmt: skip
        if isinstance(background_points, bool) or not isinstance(background_points, int) or background_points < 0:
            raise ValueError(f"background_points must be an int >= 0, got {background_points!r}")
        self.background_points, self.seed = background_points, seed
        try:
            from segment_anything import SamPredictor, sam_model_registry
        except ImportError as err:
            raise ImportError("SamRefiner needs `pip install segment-anything` and a checkpoint file; use "
                              "RandomWalkerRefiner where neither is available") from err  # fmt: skip
        if model is None:
            if checkpoint is None or not Path(checkpoint).is_file():
                raise FileNotFoundError(
                    f"no SAM checkpoint at {checkpoint!r}: download sam_vit_h_4b8939.pth from "
                    "the segment-anything release and pass its path, or use RandomWalkerRefiner"
                )
            if model_type not in sam_model_registry:
                raise ValueError(f"unknown SAM model_type {model_type!r}; known: {sorted(sam_model_registry)}")
            model = sam_model_registry[model_type](checkpoint=checkpoint)
        self.predictor: Any = SamPredictor(model.eval())

    @torch.no_grad()
    def __call__(self, image: Tensor, positive: Tensor, negative: Tensor, background: Tensor | None = None) -> Tensor:
        _check(image, positive, negative)
        rgb = (((image.detach().cpu().float() + 1) / 2).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
        self.predictor.set_image(rgb)
        if background is not None and self.background_points > 0:
            g = torch.Generator().manual_seed(self.seed)
            negative = torch.cat([negative.long(), sample_points(background.cpu().bool(), self.background_points, g)])
        points = torch.cat([positive, negative]).long()
        coords = points.flip(-1).numpy().astype(np.float32)  # SAM takes (x, y) = (col, row)
        labels = np.concatenate([np.ones(len(positive)), np.zeros(len(negative))]).astype(np.int64)
        masks, scores, _ = self.predictor.predict(point_coords=coords, point_labels=labels, multimask_output=True)
        return torch.from_numpy(masks[int(np.argmax(scores))].astype(bool))
