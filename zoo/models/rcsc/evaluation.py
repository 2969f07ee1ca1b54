"""The pieces ``zoo reproduce rcsc`` scores with: clustering scores, the k-means and dense-spectral baselines, a
fitted solver's diagnostics, and the CPU-time scaling measurement."""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.clustering import adjusted_rand_score, cluster_accuracy, normalized_mutual_info_score

from zoo.datamodules.multiview import synthetic_views
from zoo.models.rcsc import solver as S

__all__ = ["dense_spectral_labels", "fit_seconds", "loglog_slope"]


def _scores(labels: Tensor | np.ndarray, y: Tensor, k: int = 5) -> dict[str, float]:
    """ACC (Hungarian-matched), NMI and ARI with torchmetrics, as ``RCSCModule``'s test step logs them."""
    labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    with warnings.catch_warnings():  # torchmetrics' contingency table: a sparse-invariant notice, not a problem
        warnings.filterwarnings("ignore", message="Sparse invariant checks")
        return {
            "acc": float(cluster_accuracy(labels, y, num_classes=k)),
            "nmi": float(normalized_mutual_info_score(labels, y)),
            "ari": float(adjusted_rand_score(labels, y)),
        }


def _restart_means(runs: Sequence[np.ndarray], y: Tensor, k: int = 5) -> dict[str, float]:
    """The mean over k-means restarts of each metric (``acc_mean``, ...): the review's mean, not SMVSC's max."""
    scores = [_scores(labels, y, k) for labels in runs]
    return {f"{k}_mean": float(np.mean([s[k] for s in scores])) for k in scores[0]}


def _kmeans(x: np.ndarray, y: Tensor, seed: int, restarts: int = 5, k: int = 5) -> dict[str, float]:
    """k-means with ``restarts`` single restarts: the scores of the lowest-inertia one and the means over all."""
    from sklearn.cluster import KMeans

    fits = [KMeans(k, n_init=1, random_state=1000 * seed + i).fit(x) for i in range(restarts)]
    best = min(fits, key=lambda f: f.inertia_)
    return _scores(best.labels_, y, k) | _restart_means([f.labels_ for f in fits], y, k)


def _concat(views: Sequence[Tensor]) -> np.ndarray:
    """The views standardised per feature (the solver's ``mapstd``) and concatenated: ``(n, sum d_v)``."""
    return torch.cat([S.standardize(v.double()) for v in views], 1).numpy()


def dense_spectral_labels(views: Sequence[Tensor], seed: int, k: int = 5) -> np.ndarray:
    """Spectral clustering with a dense n × n RBF affinity on the concatenated standardised views (γ = 1 / (2 D):
    two independent standardised points are 2 D apart in squared distance on average). Quadratic in n."""
    from sklearn.cluster import SpectralClustering

    x = _concat(views)
    return SpectralClustering(k, affinity="rbf", gamma=1.0 / (2 * x.shape[1]), n_init=10,
                              random_state=seed).fit_predict(x)  # fmt: skip


def _max_rise(history: Sequence[float]) -> float | None:
    """The largest relative rise ``(h[t+1] - h[t]) / |h[t]|`` of consecutive objectives (negative: all fell)."""
    if len(history) < 2:
        return None
    return max((b - a) / max(abs(a), 1e-12) for a, b in itertools.pairwise(history))


def _solver_metrics(model: S.RCSC, y: Tensor, seconds: float) -> dict[str, float]:
    """Scores and diagnostics of a fitted solver: α, objective, monotonicity, simplex, one-pass vs spectral."""
    h, s, Z = model.history_, model.state_, model.Z_
    warm = len(h) - 1 if model.beta == 0 else min(model.warmup, len(h) - 1)  # index of the last β = 0 round
    V = len(s.alpha)
    m = _scores(model.labels_, y, model.K) | {
        "alpha_noise": float(s.alpha[-1]),  # the noise view is the last view
        "alpha_shift": float((s.alpha - 1.0 / V).abs().max()),
        "obj_init": h[0],
        "obj_final": h[-1],
        "obj_drop": (h[0] - h[-1]) / abs(h[0]),
        "z_min": float(Z.min()),
        "z_sum_err": float((Z.sum(0) - 1).abs().max()),
        "fit_seconds": seconds,
        "iterations": float(len(h) - 1),
    }
    for key, part in (("beta0_max_rise", h[: warm + 1]), ("joint_max_rise", h[warm + 1 :])):
        rise = _max_rise(part)
        if rise is not None:
            m[key] = rise
    if model.partition == "onepass" and s.G is not None:  # the one-pass G against the spectral labels of its Z
        spectral = S.spectral_labels(Z, model.K, None, model.seed)
        m["agreement_nmi"] = _scores(spectral, torch.as_tensor(model.labels_), model.K)["nmi"]
    return m


def fit_seconds(fit: Callable[[], Any]) -> float:
    """CPU seconds of this process spent in one call of ``fit`` (``time.process_time``): with one thread this is the
    fit's own compute, and time the shared CPU gives to another job does not count, as it would in wall-clock time."""
    start = time.process_time()
    fit()
    return time.process_time() - start


def loglog_slope(ns: Sequence[int], seconds: Sequence[float]) -> float:
    """The least-squares slope of log(seconds) against log(n): 1 for linear cost, 2 for quadratic.

    Example:
        >>> round(loglog_slope([1, 2, 4], [3.0, 12.0, 48.0]), 6)
        2.0
    """
    return float(np.polyfit(np.log(ns), np.log(seconds), 1)[0])


def _scaling(fit: Callable[[list[Tensor]], Any], sizes: Sequence[int], seed: int, repeats: int, k: int = 5
             ) -> dict[str, float]:
    """``t<n>``: the least CPU seconds of ``repeats`` fits on the card's views with n samples (the repeats go round
    the sizes in turn, so a burst of load on the shared CPU hits every size, not one), ``time_slope``, ``time_ratio``.
    """
    data = {n: synthetic_views(n_per=n // k, n_clusters=k, seed=seed)[0] for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            times[n].append(fit_seconds(lambda n=n: fit(data[n])))
    ts = [min(times[n]) for n in sizes]
    return {f"t{n}": t for n, t in zip(sizes, ts)} | {
        "time_slope": loglog_slope(sizes, ts),
        "time_ratio": ts[-1] / ts[0],
        "n_ratio": sizes[-1] / sizes[0],
    }
