"""Simpler ways to weight a pool of streaming detectors: the stand-ins ``zoo reproduce sead`` runs in SEAD's place.

Each takes the same inputs SEAD's weights see: the normalised scores ``ŝ`` ``(N, M)`` of M detectors over a stream
(each row computed before the point enters the normalisers, as in SEAD), which double as the losses, and emits one
anomaly score per point using only the losses of earlier points:

* :func:`follow_the_leader`: the normalised score of the detector with the lowest mean loss over the last ``window``
  points (the practitioner's first adaptive choice);
* :func:`discounted_weights`: exponential weights on exponentially discounted cumulative losses, ``w ∝ exp(−η D_t)``
  with ``D_t = Σ_{s<t} γ^{t−1−s} ℓ_s`` (forgetting instead of fixed share);
* :func:`warmup_pick`: the one detector with the lowest mean loss over the first points after the warm-up, kept for
  the rest of the stream (no adaptation).

They run offline on the recorded losses, which is equivalent to running them online: every output at t uses rows
before t only.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from zoo.arguments import check_range

__all__ = ["RULES", "apply_rule", "discounted_weights", "follow_the_leader", "warmup_pick"]

RULES = ("uniform", "ftl200", "disc99", "warmpick")


def _check(losses: Tensor, warmup: int) -> np.ndarray:
    if losses.ndim != 2 or losses.shape[1] < 1:
        raise ValueError(f"Expected normalised scores of shape (N, M), got {tuple(losses.shape)}.")
    check_range("warmup", warmup, low=0, high=losses.shape[0], integer=True)
    return losses.detach().double().cpu().numpy()


def follow_the_leader(losses: Tensor, window: int = 200, warmup: int = 100) -> tuple[Tensor, Tensor]:
    """At each point after ``warmup``, emit the normalised score of the detector whose mean loss over the previous
    ``window`` points is lowest (ties: the first); during the warm-up, the uniform mean. Returns ``(scores (N,),
    weights (N, M))``, the weights one-hot on the leader (uniform during the warm-up).

    Example:
        >>> L = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.9], [0.1, 0.3]], dtype=torch.float64)
        >>> scores, weights = follow_the_leader(L, window=2, warmup=1)
        >>> scores.tolist(), weights[:, 1].tolist()  # the window means before t = 1, 2, 3 favour detector 1
        ([0.5, 0.2, 0.9, 0.3], [0.5, 1.0, 1.0, 1.0])
    """
    check_range("window", window, low=1, integer=True)
    L = _check(losses, warmup)
    n, m = L.shape
    csum = np.vstack([np.zeros((1, m)), np.cumsum(L, 0)])
    t = np.arange(n)
    lo = np.maximum(t - window, 0)
    mean = (csum[t] - csum[lo]) / np.maximum(t - lo, 1)[:, None]
    leader = mean.argmin(1)
    out = L[t, leader]
    out[:warmup] = L[:warmup].mean(1)
    weights = np.eye(m)[leader]
    weights[:warmup] = 1.0 / m
    return torch.from_numpy(out), torch.from_numpy(weights)


def discounted_weights(
    losses: Tensor, gamma: float = 0.99, eta: float = 1.0, warmup: int = 100
) -> tuple[Tensor, Tensor]:
    """Exponential weights on discounted losses: ``w_t ∝ exp(−η D_t)``, ``D_{t+1} = γ D_t + ℓ_t`` (from the end of the
    warm-up; uniform weights before it). Returns ``(scores (N,), weights (N, M))``, the score being ``w_t · ŝ_t``.

    Example:
        >>> s, w = discounted_weights(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]]), gamma=0.5, warmup=0)
        >>> [round(v, 4) for v in w[2].tolist()]  # D = (0.5·1 + 1, 0): weights ∝ (e^−1.5, 1)
        [0.1824, 0.8176]
    """
    check_range("gamma", gamma, 0.0, 1.0)
    check_range("eta", eta, low=0)
    L = _check(losses, warmup)
    n, m = L.shape
    D = np.zeros(m)
    weights = np.full((n, m), 1.0 / m)
    for t in range(warmup, n):  # a recursion over time: each step needs the last (M is a dozen detectors)
        w = np.exp(-eta * (D - D.min()))
        weights[t] = w / w.sum()
        D = gamma * D + L[t]
    return torch.from_numpy((weights * L).sum(1)), torch.from_numpy(weights)


def warmup_pick(losses: Tensor, raw: Tensor, span: int = 100, warmup: int = 100) -> tuple[Tensor, int]:
    """Pick the detector with the lowest mean loss over the ``span`` points after the warm-up and emit its raw score
    for the whole stream; returns ``(scores (N,), chosen index)``.

    Example:
        >>> L = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.8, 0.2], [0.1, 0.9]])
        >>> warmup_pick(L, torch.tensor([[1.0, 2.0]] * 4), span=2, warmup=1)[1]
        1
    """
    check_range("span", span, low=1, integer=True)
    L = _check(losses, warmup)
    if raw.shape != losses.shape:
        raise ValueError(f"Expected raw scores of the losses' shape {tuple(losses.shape)}, got {tuple(raw.shape)}.")
    chosen = int(L[warmup : warmup + span].mean(0).argmin())
    return raw[:, chosen].detach().clone(), chosen


def apply_rule(rule: str, normalized: Tensor, raw: Tensor, warmup: int = 100) -> tuple[Tensor, Tensor]:
    """One of :data:`RULES` in SEAD's place: ``(scores (N,), weights (N, M))``. ``"uniform"``: the mean of the
    normalised scores; ``"ftl200"``: :func:`follow_the_leader` over 200 points; ``"disc99"``:
    :func:`discounted_weights` with γ = 0.99; ``"warmpick"``: :func:`warmup_pick` over the 100 points after the
    warm-up (its raw score, all weight on it).

    Example:
        >>> L = torch.tensor([[0.25, 0.75], [0.5, 1.0]])
        >>> apply_rule("uniform", L, L)[0].tolist()
        [0.5, 0.75]
    """
    n, m = normalized.shape
    if rule == "uniform":
        return normalized.mean(1), torch.full((n, m), 1.0 / m)
    if rule == "ftl200":
        scores, weights = follow_the_leader(normalized, window=200, warmup=warmup)
    elif rule == "disc99":
        scores, weights = discounted_weights(normalized, gamma=0.99, warmup=warmup)
    elif rule == "warmpick":
        scores, chosen = warmup_pick(normalized, raw, span=100, warmup=warmup)
        weights = torch.eye(m)[chosen].expand(n, -1)
    else:
        raise ValueError(f"Expected argument `rule` to be one of {', '.join(map(repr, RULES))}, but got {rule!r}.")
    return scores, weights.float()
