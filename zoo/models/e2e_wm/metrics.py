"""Detection metrics on watermarked (positive) and human (negative) scores: ROC-AUC, TPR at a fixed FPR, best F1."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.classification import (
    binary_auroc,
    binary_precision_recall_curve,
    binary_roc,
)

__all__ = ["detection_metrics", "tpr_at_fpr"]


def tpr_at_fpr(fpr: Tensor, tpr: Tensor, target: float) -> float:
    """The highest TPR among the ROC's thresholds whose FPR is ≤ ``target`` (a threshold the user could set)."""
    ok = fpr <= target + 1e-12
    return float(tpr[ok].max()) if bool(ok.any()) else 0.0


def detection_metrics(positives: Tensor, negatives: Tensor) -> dict[str, float]:
    """``auc``, ``tpr@1%``, ``tpr@10%`` and ``best_f1`` of scores (higher = watermarked), via torchmetrics.

    Example:
        >>> m = detection_metrics(torch.tensor([3.0, 2.0, 0.5]), torch.tensor([0.0, 1.0, 0.6]))
        >>> round(m["auc"], 3), round(m["tpr@1%"], 3), round(m["best_f1"], 3)
        (0.778, 0.667, 0.8)
    """
    if positives.numel() == 0 or negatives.numel() == 0:
        raise ValueError("detection metrics need at least one watermarked and one human score")
    scores = torch.cat([positives, negatives]).float().cpu()
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("detection scores contain NaN or inf")
    target = torch.cat([torch.ones(len(positives)), torch.zeros(len(negatives))]).long()
    fpr, tpr, _ = binary_roc(scores, target)
    precision, recall, _ = binary_precision_recall_curve(scores, target)
    f1 = 2 * precision * recall / (precision + recall).clamp_min(1e-12)
    return {
        "auc": float(binary_auroc(scores, target)),
        "tpr@1%": tpr_at_fpr(fpr, tpr, 0.01),
        "tpr@10%": tpr_at_fpr(fpr, tpr, 0.10),
        "best_f1": float(f1.max()),
    }
