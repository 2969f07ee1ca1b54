"""GroundingIoU and mask_iou: a numpy reference, gRefCOCO's empty-target rule, mIoU over classes, merging, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.metrics.grounding import GroundingIoU, mask_iou


def _masks(n: int, seed: int, size: int = 8, empty_every: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random (preds, target, classes): blobby masks, every ``empty_every``-th target and some predictions empty."""
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(n, size, size, generator=g) < torch.rand(n, 1, 1, generator=g) * 0.6
    preds = target ^ (torch.rand(n, size, size, generator=g) < 0.2)
    target[::empty_every] = False
    preds[:: empty_every * 2] = False  # empty predictions on empty targets (and on non-empty ones below)
    preds[1 :: empty_every * 2] = False
    return preds, target, torch.randint(0, 3, (n,), generator=g)


def _reference(preds: np.ndarray, target: np.ndarray, classes: np.ndarray, num_classes: int) -> dict[str, float]:
    """mIoU, cIoU and gIoU written out in numpy, sample by sample."""
    inter = np.array([np.logical_and(p, t).sum() for p, t in zip(preds, target, strict=True)], dtype=float)
    union = np.array([np.logical_or(p, t).sum() for p, t in zip(preds, target, strict=True)], dtype=float)
    per_sample = []
    for p, t, i, u in zip(preds, target, inter, union, strict=True):
        per_sample.append((1.0 if not p.any() else 0.0) if not t.any() else i / u)
    seen = [c for c in range(num_classes) if (classes == c).any()]
    per_class = [inter[classes == c].sum() / union[classes == c].sum() for c in seen]
    return {"miou": float(np.mean(per_class)), "ciou": inter.sum() / union.sum(), "giou": float(np.mean(per_sample))}


def test_mask_iou_matches_numpy_per_sample() -> None:
    """Check mask_iou against |P∩G|/|P∪G| in numpy, with 1 for empty-empty and 0 for a mask on an empty target."""
    preds, target, _ = _masks(40, seed=0)
    iou = mask_iou(preds, target)
    assert iou.shape == (40,) and iou.dtype == torch.float32
    p, t = preds.numpy(), target.numpy()
    for i in range(40):
        union = np.logical_or(p[i], t[i]).sum()
        expected = np.logical_and(p[i], t[i]).sum() / union if union else 1.0
        assert float(iou[i]) == pytest.approx(expected, abs=1e-6)
    assert (iou[~target.flatten(1).any(1) & preds.flatten(1).any(1)] == 0).all()


def test_grounding_iou_matches_numpy_reference_over_batches() -> None:
    """Check miou, ciou and giou, accumulated over three uneven batches, against the numpy reference."""
    preds, target, classes = _masks(50, seed=1)
    m = GroundingIoU(num_classes=3)
    for start, stop in ((0, 7), (7, 30), (30, 50)):
        m.update(preds[start:stop], target[start:stop], classes[start:stop])
    out = m.compute()
    expected = _reference(preds.numpy(), target.numpy(), classes.numpy(), 3)
    assert set(out) == {"miou", "ciou", "giou"} and all(v.dtype == torch.float32 for v in out.values())
    for key, value in expected.items():
        assert float(out[key]) == pytest.approx(value, abs=1e-6), key


def test_grounding_iou_giou_follows_the_empty_target_rule() -> None:
    """Check gRefCOCO's rule: an empty target scores 1 with an empty prediction and 0 with any predicted pixel."""
    target = torch.zeros(2, 4, 4, dtype=torch.bool)
    preds = target.clone()
    preds[1, 0, 0] = True
    m = GroundingIoU()
    m.update(preds[:1], target[:1])
    assert float(m.compute()["giou"]) == 1.0 and float(m.compute()["ciou"]) == 1.0
    m.update(preds[1:], target[1:])
    out = m.compute()
    assert float(out["giou"]) == 0.5 and float(out["ciou"]) == 0.0
    assert "miou" not in out


def test_grounding_iou_miou_averages_over_classes_that_occurred() -> None:
    """Check that mIoU pools each class over the dataset and averages only the classes seen (not the 4 declared)."""
    target = torch.zeros(3, 1, 4, dtype=torch.bool)
    target[:, 0, :2] = True  # 2 pixels each
    preds = torch.zeros(3, 1, 4, dtype=torch.bool)
    preds[0, 0, :2] = True  # class 0: IoU 1
    preds[1, 0, 1:4] = True  # class 2: I = 1, U = 4
    preds[2, 0, :1] = True  # class 2: I = 1, U = 2 -> pooled 2 / 6
    m = GroundingIoU(num_classes=4)
    m.update(preds, target, torch.tensor([0, 2, 2]))
    out = m.compute()
    assert float(out["miou"]) == pytest.approx((1 + 2 / 6) / 2, abs=1e-6)
    assert float(out["giou"]) == pytest.approx((1 + 1 / 4 + 1 / 2) / 3, abs=1e-6)
    assert float(out["ciou"]) == pytest.approx(4 / 8, abs=1e-6)


def test_grounding_iou_merged_halves_equal_one_pass() -> None:
    """Check DDP-style merging: two metrics on halves, merged by merge_state or by summing states, equal one pass."""
    preds, target, classes = _masks(30, seed=2)
    full, left, right = GroundingIoU(3), GroundingIoU(3), GroundingIoU(3)
    full.update(preds, target, classes)
    left.update(preds[:11], target[:11], classes[:11])
    right.update(preds[11:], target[11:], classes[11:])
    summed = {name: getattr(left, name) + getattr(right, name) for name in left._defaults}
    left.merge_state(right)
    expected = full.compute()
    for key, value in left.compute().items():
        assert torch.equal(value, expected[key]), key
    manual = GroundingIoU(3)
    manual.update(preds[:0], target[:0], classes[:0])  # an empty update: the states stay zero
    for name, value in summed.items():
        setattr(manual, name, value)
    assert all(torch.equal(v, expected[k]) for k, v in manual.compute().items())
    assert all(getattr(full, name).numel() in (1, 3) for name in full._defaults)  # fixed-size states


def test_grounding_iou_perfect_predictions_score_one_and_reset_gives_nan() -> None:
    """Check that preds == target scores 1 everywhere, and that a reset metric reports NaN (no samples)."""
    _, target, classes = _masks(20, seed=3)
    m = GroundingIoU(num_classes=3)
    m.update(target, target, classes)
    assert all(float(v) == 1.0 for v in m.compute().values())
    m.reset()
    with pytest.warns(UserWarning, match="before the ``update`` method"):
        assert all(torch.isnan(v) for v in m.compute().values())


def test_grounding_iou_rejects_bad_shapes_and_dtypes() -> None:
    """Check the messages for mismatched or non-(N, H, W) masks, non-bool masks and misused or bad class ids."""
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"one shape \(N, H, W\), got preds \(2, 4, 4\) and target \(2, 4, 5\)"):
        GroundingIoU().update(mask, torch.zeros(2, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"got preds \(4, 4\)"):
        mask_iou(mask[0], mask[0])
    with pytest.raises(TypeError, match="boolean masks, got preds of dtype torch.float32"):
        GroundingIoU().update(mask.float(), mask)
    with pytest.raises(ValueError, match=r"needs classes \(N,\)"):
        GroundingIoU(num_classes=3).update(mask, mask)
    with pytest.raises(ValueError, match="has no num_classes"):
        GroundingIoU().update(mask, mask, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"classes of shape \(2,\)"):
        GroundingIoU(num_classes=3).update(mask, mask, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"class ids in -1..1, expected 0..2"):
        GroundingIoU(num_classes=3).update(mask, mask, torch.tensor([-1, 1]))
    with pytest.raises(TypeError, match="integer class ids"):
        GroundingIoU(num_classes=3).update(mask, mask, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="`num_classes` to be >= 1"):
        GroundingIoU(num_classes=0)
    with pytest.raises(TypeError, match="`num_classes` to be an int"):
        GroundingIoU(num_classes=2.0)  # type: ignore[arg-type]
