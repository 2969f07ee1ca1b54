"""Grounded segmentation IoUs (Segment Anyword): per-class mIoU, cumulative cIoU and gRefCOCO's per-sample gIoU."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["GroundingIoU", "mask_iou"]


def _check_masks(preds: Tensor, target: Tensor, where: str) -> None:
    for name, x in (("preds", preds), ("target", target)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{where} expects `{name}` to be a torch.Tensor, got {type(x).__name__}.")
    if preds.ndim != 3 or preds.shape != target.shape:
        raise ValueError(f"{where} expects preds and target of one shape (N, H, W), got preds {tuple(preds.shape)} "
                         f"and target {tuple(target.shape)}. Add a batch dimension to a single mask "
                         "(mask[None]).")  # fmt: skip
    for name, x in (("preds", preds), ("target", target)):
        if x.dtype != torch.bool:
            raise TypeError(f"{where} expects boolean masks, got {name} of dtype {x.dtype}. Threshold scores or "
                            "probabilities first (e.g. probs > 0.5) or cast 0/1 masks with .bool().")  # fmt: skip


def _grounding_update(preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample ``|P ∩ G|`` and ``|P ∪ G|``, ``(N,)`` int64 each."""
    preds, target = preds.detach().flatten(1), target.detach().flatten(1)
    return (preds & target).sum(1), (preds | target).sum(1)


def _iou(intersection: Tensor, union: Tensor) -> Tensor:
    """``I / U`` where ``U > 0``, else 1 (nothing to find and nothing found), float64."""
    return torch.where(union > 0, intersection.double() / union.clamp_min(1).double(), 1.0)


def mask_iou(preds: Tensor, target: Tensor) -> Tensor:
    """IoU of each predicted mask with its target, ``|P ∩ G| / |P ∪ G|``, with gRefCOCO's empty-target rule.

    A sample whose target is empty scores 1 if the prediction is empty too, else 0 (which ``I / U`` gives already
    for a non-empty prediction; the rule fixes the 0 / 0 case).

    Args:
        preds: predicted masks ``(N, H, W)`` bool.
        target: ground-truth masks ``(N, H, W)`` bool.

    Returns:
        The IoU per sample, ``(N,)`` float32 in [0, 1].

    Raises:
        TypeError: an input that is not a bool tensor.
        ValueError: inputs that are not of one shape ``(N, H, W)``.

    Example:
        >>> target = torch.zeros(3, 2, 2, dtype=torch.bool)
        >>> target[0, 0] = True  # 2 pixels; samples 1 and 2 have no target
        >>> preds = torch.zeros(3, 2, 2, dtype=torch.bool)
        >>> preds[0, :, 0] = True  # 1 of 3 pixels of the union right
        >>> preds[2, 1, 1] = True  # a mask where there is nothing to find
        >>> mask_iou(preds, target)
        tensor([0.3333, 1.0000, 0.0000])
    """
    _check_masks(preds, target, "mask_iou")
    return _iou(*_grounding_update(preds, target)).float()


class GroundingIoU(Metric):
    """The IoUs of grounded and referring segmentation: mIoU, cIoU and gIoU (Segment Anyword card §4).

    With ``P_i`` and ``G_i`` the predicted and ground-truth masks of sample i and ``c_i`` its class:

    - ``miou`` = ``mean_{c seen} Σ_{i: c_i = c} |P_i ∩ G_i| / Σ_{i: c_i = c} |P_i ∪ G_i|``: per class TP / (TP + FP +
      FN) accumulated over the dataset, averaged over the classes that occurred in ``classes`` (a class whose union
      stayed empty scores 1). Returned only when ``num_classes`` is set.
    - ``ciou`` = ``Σ_i |P_i ∩ G_i| / Σ_i |P_i ∪ G_i|`` (cumulative IoU; 1 if every union is empty).
    - ``giou`` = ``mean_i IoU_i`` with gRefCOCO's rule: a sample with an empty target scores 1 if its prediction is
      empty, else 0 (:func:`mask_iou`).

    States are fixed-size sums (``dist_reduce_fx="sum"``): the intersection and union totals (int64), per class when
    ``num_classes`` is set, with the samples per class; the gIoU sum (float64) and the sample count. So batches,
    ``merge_state`` and DDP sync all give the numbers of one pass over all samples. Before any update the three
    values are NaN.

    ``update(preds, target, classes=None)``: masks ``(N, H, W)`` bool, classes ``(N,)`` integer ids in
    ``0 .. num_classes - 1`` (required when ``num_classes`` is set, refused otherwise). ``compute()``: dict of float32
    scalars.

    Args:
        num_classes: the number of classes for mIoU, ``>= 1``; None to track cIoU and gIoU only.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        TypeError: ``num_classes`` not an int; inputs that are not tensors, masks that are not bool, classes that are
            not integers.
        ValueError: ``num_classes < 1``; in ``update``, masks not of one shape ``(N, H, W)``, classes not ``(N,)`` or
            outside ``0 .. num_classes - 1``, classes missing with ``num_classes`` or given without it.

    Example:
        >>> target = torch.zeros(3, 4, 4, dtype=torch.bool)
        >>> target[0, :2] = True  # 8 pixels, class 0
        >>> target[1, :, :1] = True  # 4 pixels, class 1; sample 2 (class 1) has no target
        >>> preds = target.clone()
        >>> preds[1] = False
        >>> preds[1, :2, :1] = True  # half of sample 1 found: IoU 2/4; sample 2 correctly empty: IoU 1
        >>> m = GroundingIoU(num_classes=2)
        >>> m.update(preds, target, torch.tensor([0, 1, 1]))
        >>> {k: round(v.item(), 4) for k, v in m.compute().items()}  # miou (1 + 1/2) / 2, ciou 10/12, giou 2.5/3
        {'miou': 0.75, 'ciou': 0.8333, 'giou': 0.8333}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    intersection: Tensor
    union: Tensor
    giou_sum: Tensor
    count: Tensor
    class_intersection: Tensor
    class_union: Tensor
    class_count: Tensor

    def __init__(self, num_classes: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if num_classes is not None:
            if isinstance(num_classes, bool) or not isinstance(num_classes, int):
                raise TypeError(f"Expected argument `num_classes` to be an int or None but got {num_classes!r}.")
            if num_classes < 1:
                raise ValueError(f"Expected argument `num_classes` to be >= 1 classes but got {num_classes}.")
        self.num_classes = num_classes
        self.add_state("intersection", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("union", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("giou_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")
        if num_classes is not None:
            for name in ("class_intersection", "class_union", "class_count"):
                self.add_state(name, default=torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

    def _check_classes(self, classes: Tensor | None, n: int) -> None:
        C = self.num_classes
        if C is None:
            if classes is not None:
                raise ValueError("GroundingIoU.update got classes but the metric has no num_classes; create it with "
                                 "GroundingIoU(num_classes=C) for mIoU, or drop classes.")  # fmt: skip
            return
        if classes is None:
            raise ValueError(f"GroundingIoU(num_classes={C}).update needs classes (N,) for mIoU, got None; pass each "
                             "sample's class id, or create the metric with num_classes=None.")  # fmt: skip
        if not isinstance(classes, Tensor):
            raise TypeError(f"GroundingIoU.update expects `classes` to be a torch.Tensor, got "
                            f"{type(classes).__name__}.")  # fmt: skip
        if classes.dtype == torch.bool or classes.is_floating_point() or classes.is_complex():
            raise TypeError(f"GroundingIoU.update expects integer class ids, got dtype {classes.dtype}; cast with "
                            ".long().")  # fmt: skip
        if classes.shape != (n,):
            raise ValueError(f"GroundingIoU.update expects classes of shape ({n},), one per mask, got "
                             f"{tuple(classes.shape)}.")  # fmt: skip
        if n and (int(classes.min()) < 0 or int(classes.max()) >= C):
            raise ValueError(f"GroundingIoU.update got class ids in {int(classes.min())}..{int(classes.max())}, "
                             f"expected 0..{C - 1} (num_classes={C}). Drop samples without a class (e.g. id -1) "
                             "before the update.")  # fmt: skip

    def update(self, preds: Tensor, target: Tensor, classes: Tensor | None = None) -> None:
        """Add masks ``(N, H, W)`` bool and, with ``num_classes``, their class ids ``(N,)``."""
        _check_masks(preds, target, "GroundingIoU.update")
        self._check_classes(classes, preds.shape[0])
        intersection, union = _grounding_update(preds, target)
        self.intersection += intersection.sum()
        self.union += union.sum()
        self.giou_sum += _iou(intersection, union).sum()
        self.count += intersection.numel()
        if self.num_classes is not None:
            classes = classes.to(self.class_count.device).long()  # type: ignore[union-attr]
            self.class_intersection.index_add_(0, classes, intersection.to(self.class_intersection))
            self.class_union.index_add_(0, classes, union.to(self.class_union))
            self.class_count.index_add_(0, classes, torch.ones_like(classes))

    def compute(self) -> dict[str, Tensor]:
        """``{"miou" (with num_classes), "ciou", "giou"}``, float32 scalars (NaN before any update)."""
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.count.device)
        seen = self.count > 0
        out = {
            "ciou": torch.where(seen, _iou(self.intersection, self.union), nan),
            "giou": torch.where(seen, self.giou_sum / self.count.clamp_min(1), nan),
        }
        if self.num_classes is not None:
            occurred = self.class_count > 0
            per_class = _iou(self.class_intersection, self.class_union)
            miou = (per_class * occurred).sum() / occurred.sum().clamp_min(1)
            out = {"miou": torch.where(occurred.any(), miou, nan), **out}
        return {key: value.float() for key, value in out.items()}
