"""What a practitioner would try instead of control variates: the stand-in estimators of ``zoo reproduce cv-winrate``.

All use the same inputs as Control Variates Evaluation (a synthetic score for every one of the N pairs, human labels
on n of them) and are batched over replicates like :func:`zoo.metrics.win_rate.subset_estimates`:

* **ratio estimator** (survey sampling's classical use of an auxiliary variable): ``z̄_H · ẑ̄_N / ẑ̄_H``, the
  synthetic mean rescaled by how far humans sit from the scores on the labelled pairs; no coefficient is fitted;
* **stratified human sampling**: the N pairs split into equal-count strata by their score, the n labels spread over
  the strata in proportion to their size, and the win rate ``Σ_h W_h z̄_h``. It needs the scores before labelling
  (as CV does) and a say in which pairs get labelled; it is unbiased by design, and it uses any monotone link between
  score and label, where CV's correction is linear;
* **isotonic recalibration** of an evaluator: a monotone map from its scores to the human labels, fitted on labelled
  comparisons (scikit-learn's ``IsotonicRegression``): the cheap alternative to fine-tuning the reward model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from zoo.arguments import check_range

__all__ = [
    "isotonic_recalibration",
    "ratio_estimates",
    "stratified_estimates",
    "stratified_indices",
    "stratified_variance",
]


def ratio_estimates(z_sub: Tensor, z_hat_sub: Tensor, z_hat_pool: Tensor) -> Tensor:
    """Ratio estimates ``z̄_H · ẑ̄_N / ẑ̄_H`` for many labelled subsets at once.

    Args:
        z_sub: ``(reps, n)`` human labels of each subset.
        z_hat_sub: ``(reps, n)`` synthetic scores of the same pairs.
        z_hat_pool: ``(N,)`` synthetic scores of every pair.

    Returns:
        ``(reps,)`` float64; a subset whose scores are all 0 gives its human mean.

    Example:
        >>> pool = torch.tensor([0.8, 0.2, 0.2, 0.4])
        >>> ratio_estimates(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.8, 0.2]]), pool)  # 0.5 · 0.4 / 0.5
        tensor([0.4000], dtype=torch.float64)
    """
    z, h = z_sub.double(), z_hat_sub.double()
    h_bar = h.mean(-1)
    scale = torch.where(h_bar > 0, z_hat_pool.double().mean() / h_bar.clamp_min(1e-300), 1.0)
    return z.mean(-1) * scale


def stratified_indices(
    scores: Tensor,
    n: int,
    reps: int,
    strata: int = 5,
    replace: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Draws of stratified human sampling: which pairs to label, and each label's weight in the estimate.

    The pool is sorted by score and cut into ``strata`` strata of (nearly) equal count; stratum h, of size N_h, gets
    ``m_h`` of the n labels in proportion to N_h (largest remainders, at least one each). Labels are drawn uniformly
    within each stratum, with replacement (the official bootstrap's resampling of a finite pool) or without. The
    estimate ``(z[index] * weight).sum(-1)`` is ``Σ_h (N_h / N) z̄_h``.

    Args:
        scores: ``(N,)`` synthetic scores of every pair.
        n: labels per replicate (``>= strata``).
        reps: replicates.
        strata: number of strata (``>= 1``).
        replace: draw with replacement within a stratum; without needs ``m_h <= N_h``.
        generator: the random generator.

    Returns:
        ``(index (reps, n) long, weight (n,) float64)``.

    Raises:
        ValueError: a bad ``n``, ``reps`` or ``strata``.

    Example:
        >>> index, weight = stratified_indices(torch.arange(10.0), n=4, reps=3, strata=2)
        >>> index.shape, weight.tolist(), bool((index[:, :2] < 5).all() and (index[:, 2:] >= 5).all())
        (torch.Size([3, 4]), [0.25, 0.25, 0.25, 0.25], True)
    """
    check_range("strata", strata, low=1, integer=True)
    check_range("n", n, low=strata, integer=True)
    check_range("reps", reps, low=1, integer=True)
    N = scores.numel()
    strata_rows, counts = _allocation(scores, n, strata)
    index, weight = [], []
    for h, rows in enumerate(strata_rows):
        m = int(counts[h])
        if replace:
            pick = torch.randint(len(rows), (reps, m), generator=generator)
        else:
            if m > len(rows):
                raise ValueError(f"Stratum {h} holds {len(rows)} pairs, fewer than its {m} labels: use replace=True.")
            pick = torch.rand(reps, len(rows), generator=generator).topk(m, dim=1).indices
        index.append(rows[pick])
        weight.append(torch.full((m,), len(rows) / N / m, dtype=torch.float64))
    return torch.cat(index, dim=1), torch.cat(weight)


def _allocation(scores: Tensor, n: int, strata: int) -> tuple[list[Tensor], np.ndarray]:
    """The strata (rows of equal-count score bins) and the labels each gets (proportional, largest remainders)."""
    N = scores.numel()
    if N < strata:
        raise ValueError(f"Expected at least `strata` = {strata} pairs in `scores`, got {N}.")
    order = torch.argsort(scores.detach().double(), stable=True)
    bounds = torch.linspace(0, N, strata + 1).round().long().tolist()
    sizes = np.diff(bounds)
    share = n * sizes / N
    counts = np.maximum(np.floor(share).astype(int), 1)
    left = n - counts.sum()
    for h in np.argsort(-(share - np.floor(share)), kind="stable")[:left]:  # largest remainders, then in order
        counts[h] += 1
    if counts.sum() != n:  # equal-count strata with n >= strata always allocate exactly n; keep it that way
        raise ValueError(f"Could not spread n = {n} labels over {strata} strata of sizes {sizes.tolist()}.")
    return [order[bounds[h] : bounds[h + 1]] for h in range(strata)], counts


def stratified_variance(z: Tensor, scores: Tensor, n: int, strata: int = 5, replace: bool = True) -> float:
    """The exact variance of the stratified estimate of :func:`stratified_indices` on a fully labelled pool.

    Stratified sampling is unbiased by design, so this is its MSE against the pool's mean, with no Monte-Carlo
    noise: ``Σ_h W_h² σ_h² / m_h`` with replacement (σ_h² the stratum's variance, ddof 0), and
    ``Σ_h W_h² S_h² / m_h · (1 − m_h / N_h)`` without (S_h² with ddof 1), ``W_h = N_h / N``.

    Example:
        >>> z = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
        >>> stratified_variance(z, torch.arange(8.0), n=4, strata=2)  # W = 1/2, m = 2: (0.25 + 0.1875) / 8
        0.0546875
    """
    check_range("strata", strata, low=1, integer=True)
    check_range("n", n, low=strata, integer=True)
    z = z.detach().double()
    N = z.numel()
    strata_rows, counts = _allocation(scores, n, strata)
    total = 0.0
    for rows, m in zip(strata_rows, counts):
        W, zh = len(rows) / N, z[rows]
        if replace:
            total += W**2 * float(zh.var(correction=0)) / int(m)
        elif len(rows) > 1:
            total += W**2 * float(zh.var(correction=1)) / int(m) * (1 - int(m) / len(rows))
    return float(total)


def stratified_estimates(z: Tensor, index: Tensor, weight: Tensor) -> Tensor:
    """Stratified win rates ``(z[index] * weight).sum(-1)`` for the draws of :func:`stratified_indices`.

    Example:
        >>> index, weight = stratified_indices(torch.arange(10.0), n=10, reps=1, strata=2, replace=False)
        >>> round(float(stratified_estimates(torch.arange(10.0) / 10, index, weight)[0]), 6)  # each pair once: the mean
        0.45
    """
    return (z.double()[index] * weight).sum(-1)


def isotonic_recalibration(scores: Tensor, labels: Tensor) -> Callable[[Tensor], Tensor]:
    """Fit a monotone map from an evaluator's scores to human labels (ties as 0.5), and return it.

    Args:
        scores: ``(M,)`` the evaluator's scores on labelled comparisons.
        labels: ``(M,)`` their human labels in ``{0, 0.5, 1}``.

    Returns:
        ``recalibrate(scores) -> scores`` in ``[0, 1]``, float64, clipped outside the fitted range.

    Example:
        >>> f = isotonic_recalibration(torch.tensor([0.1, 0.2, 0.6, 0.9]), torch.tensor([0.0, 1.0, 0.0, 1.0]))
        >>> [round(v, 4) for v in f(torch.tensor([0.15, 0.95])).tolist()]  # PAVA: 0, 0.5, 0.5, 1; then interpolated
        [0.25, 1.0]
    """
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    iso.fit(scores.detach().double().cpu().numpy(), labels.detach().double().cpu().numpy())
    return lambda s: torch.from_numpy(iso.predict(s.detach().double().cpu().numpy()))
