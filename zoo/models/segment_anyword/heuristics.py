"""Non-learned grounding heuristics for the captioned shape scenes: what a practitioner tries before a diffusion model.

Each takes the scene image ``(3, S, S)`` in [−1, 1] and one named phrase's words (a colour and a shape of
``zoo.datamodules.shapes``) and returns the phrase's mask ``(S, S)``. They are the ``alternatives`` of the Segment
Anyword reproduction and the heuristics of its task check:

* :func:`colour_match`: every pixel whose nearest palette colour is the phrase's colour (per pixel);
* :func:`colour_component`: the largest connected component of that colour;
* :func:`random_component`: a random object (a connected non-background component), ignoring the words;
* :func:`texture_component`: the component of the phrase's colour whose stripes fit the named shape's texture (a
  two-tap filter, given the generator's key: which texture each shape word has);
* :func:`shape_template`: the component of the phrase's colour that best fits the named shape's template (the
  generator's own circle / square / triangle formulas at the component's size).

The last two know how the scenes are drawn (the key a text-to-image model has to learn from the captions); on the
textured scenes either solves the task.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from zoo.datamodules.shapes import COLOURS, PALETTE, SHAPES

__all__ = ["colour_component", "colour_match", "random_component", "shape_template", "texture_component"]

_PALETTE = torch.tensor([PALETTE[c] for c in (*COLOURS, "background")])  # (5, 3); index 4 is the background


def _labels(image: Tensor) -> Tensor:
    """Each pixel's nearest palette entry ``(S, S)``: a colour index of ``COLOURS``, or 4 for the background."""
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"expected an RGB image (3, S, S), got {tuple(image.shape)}")
    distance = (image.float().permute(1, 2, 0)[:, :, None, :] - _PALETTE).square().sum(-1)
    return distance.argmin(-1)


def _components(binary: Tensor) -> tuple[np.ndarray, int]:
    from scipy import ndimage

    return ndimage.label(binary.cpu().numpy())


def colour_match(image: Tensor, colour: str, shape: str | None = None) -> Tensor:
    """The pixels whose nearest palette colour is ``colour`` (the shape word is ignored).

    Example:
        >>> image = torch.zeros(3, 4, 4)
        >>> image[:, 1:3, 1:3] = torch.tensor([0.8, -0.7, -0.7])[:, None, None]  # a red square
        >>> int(colour_match(image, "red").sum())
        4
    """
    if colour not in COLOURS:
        raise ValueError(f"unknown colour {colour!r}; expected one of {COLOURS}")
    return _labels(image) == COLOURS.index(colour)


def colour_component(image: Tensor, colour: str, shape: str | None = None) -> Tensor:
    """The largest 4-connected component of :func:`colour_match` (empty when no pixel has the colour)."""
    labels, count = _components(colour_match(image, colour))
    if count == 0:
        return torch.zeros(image.shape[1:], dtype=torch.bool)
    sizes = np.bincount(labels.ravel())[1:]
    return torch.from_numpy(labels == 1 + int(np.argmax(sizes)))


def random_component(image: Tensor, colour: str | None = None, shape: str | None = None,
                     generator: torch.Generator | None = None) -> Tensor:  # fmt: skip
    """A random object: one connected component of the non-background pixels, drawn uniformly."""
    labels, count = _components(_labels(image) != len(COLOURS))
    if count == 0:
        return torch.zeros(image.shape[1:], dtype=torch.bool)
    return torch.from_numpy(labels == 1 + int(torch.randint(count, (1,), generator=generator)))


def _template(shape: int, radius: int) -> Tensor:
    """The generator's mask of ``shape`` at ``radius``, in its (2r + 1)² box (``datamodules.shapes._shape_masks``)."""
    pos = torch.arange(-radius, radius + 1)
    dy, dx = pos.view(-1, 1), pos.view(1, -1)
    if shape == 0:
        return dx * dx + dy * dy <= radius * radius + radius
    if shape == 1:
        return torch.ones(2 * radius + 1, 2 * radius + 1, dtype=torch.bool)
    return 2 * dx.abs() <= dy + radius


def shape_template(image: Tensor, colour: str, shape: str) -> Tensor:
    """The component of the phrase's colour whose pixels best fit the named shape's template (IoU of the component
    with the template of the radius its bounding box implies, placed at the box's top-left corner: the generator's
    boxes have odd sides, so that is the centre); ties go to the larger component."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    labels, count = _components(colour_match(image, colour))
    if count == 0:
        return torch.zeros(image.shape[1:], dtype=torch.bool)
    best, best_score = 0, (-1.0, 0)
    for k in range(1, count + 1):
        component = torch.from_numpy(labels == k)
        rows, cols = component.any(1).nonzero()[:, 0], component.any(0).nonzero()[:, 0]
        top, left = int(rows[0]), int(cols[0])
        side = max(int(rows[-1]) - top, int(cols[-1]) - left) + 1
        box = torch.zeros(side, side, dtype=torch.bool)
        crop = component[top : top + side, left : left + side]
        box[: crop.shape[0], : crop.shape[1]] = crop
        template = _template(SHAPES.index(shape), (side - 1) // 2)
        t = torch.zeros(side, side, dtype=torch.bool)
        t[: template.shape[0], : template.shape[1]] = template
        iou = float((box & t).sum()) / max(1, int((box | t).sum()))
        score = (iou, int(component.sum()))
        if score > best_score:
            best, best_score = k, score
    return torch.from_numpy(labels == best)


def _stripes(image: Tensor, component: Tensor) -> tuple[float, float]:
    """The mean absolute difference between vertical and between horizontal neighbours inside a component."""
    x = image.float()
    vertical = (x[:, 1:] - x[:, :-1]).abs().sum(0)[component[1:] & component[:-1]]
    horizontal = (x[:, :, 1:] - x[:, :, :-1]).abs().sum(0)[component[:, 1:] & component[:, :-1]]
    return (float(vertical.mean()) if len(vertical) else 0.0, float(horizontal.mean()) if len(horizontal) else 0.0)


def texture_component(image: Tensor, colour: str, shape: str) -> Tensor:
    """The component of the phrase's colour whose texture fits the named shape's: a two-tap filter per direction,
    given the generator's key (circles in horizontal stripes: large vertical differences; squares in vertical stripes:
    large horizontal ones; triangles in a checkerboard: both). Ties go to the larger component."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    labels, count = _components(colour_match(image, colour))
    if count == 0:
        return torch.zeros(image.shape[1:], dtype=torch.bool)
    best, best_score = 0, (-float("inf"), 0)
    for k in range(1, count + 1):
        component = torch.from_numpy(labels == k)
        v, h = _stripes(image, component)
        fit = {"circle": v - h, "square": h - v, "triangle": min(v, h)}[shape]
        score = (fit, int(component.sum()))
        if score > best_score:
            best, best_score = k, score
    return torch.from_numpy(labels == best)
