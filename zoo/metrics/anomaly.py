"""Average precision of anomaly scores, exact and on the scores as they are (no sigmoid), as scikit-learn computes it.

torchmetrics' classification metrics treat predictions outside [0, 1] as logits and pass them through a sigmoid. For
anomaly scores that is wrong twice over: they are not logits, and the sigmoid saturates in float32, tying every score
above about 17 (or below about −17) so that the ranking, and the average precision, change. Every APS in the zoo goes
through :func:`anomaly_ap_metric` (``normalization=None``, exact thresholds).
"""

from __future__ import annotations

from torch import Tensor
from torchmetrics.classification import BinaryAveragePrecision

__all__ = ["anomaly_ap_metric", "average_precision"]


def anomaly_ap_metric(ignore_index: int | None = None) -> BinaryAveragePrecision:
    """A ``BinaryAveragePrecision`` for anomaly scores: exact (no threshold binning), scores used as given."""
    return BinaryAveragePrecision(thresholds=None, ignore_index=ignore_index, normalization=None)


def average_precision(scores: Tensor, labels: Tensor) -> float:
    """Average precision of ``scores`` (higher = more anomalous) against 0/1 ``labels``, equal to scikit-learn's
    ``average_precision_score``.

    Example:
        >>> import torch
        >>> average_precision(torch.tensor([-1e5, -2e5, 30.0, 40.0]), torch.tensor([1, 0, 0, 1]))  # sigmoid would tie
        0.8333...
    """
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError(f"Expected scores and labels of one shape (N,), got {tuple(scores.shape)} and "
                         f"{tuple(labels.shape)}.")  # fmt: skip
    return float(anomaly_ap_metric()(scores.double(), labels.long()))
