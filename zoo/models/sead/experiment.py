"""The card's §6 drift experiment of ``zoo reproduce sead``: does SEAD move its weight to the best detector?

The drifting stream (6,000 points in R⁴, 2 % anomalies; from t = 3,000 the anomalies move from dims (0, 1) to dims
(2, 3) and dims (0, 1) triple their spread). Pool: windowed kNN on dims {0,1}, on {2,3} and on all dims, plus 4 (or
13) random scorers. Arms, per seed on the same stream:

* SEAD (η = 1, λ = 10⁶, quantile min–max, warm-up 100) with 4 and 13 random scorers, with the shipped 1,024-slot
  sketch (``sead_r*``) and with the exact history (``exact_r*``, ``capacity=None``: the card's prototype), and with
  the unclipped output (``unclipped_r4``);
* ablations: no share (pure Hedge), the CDF normaliser, the uniform mean of the normalised scores;
* alternatives on the SEAD pass's normalised scores (``alternatives.py``): follow-the-leader over 200 points
  (``ftl200_r*``), discounted-loss weights γ = 0.99 (``disc99_r*``), the detector picked after the warm-up
  (``warmpick_r4``);
* each single detector (all weight on it) and the best detector in hindsight (labels);
* the full run adds SEAD++ (8 of 16 detectors drawn per point) and SEAD row by row, for the speed comparison.

Average precision (exact, ``zoo.metrics.average_precision``) on t ≥ 100, and per regime: t < 3,000 (``aps_before``)
and t ≥ 3,000 (``aps_after``). Weights: the mean weight on kNN {0,1} over the evaluated part of regime 1 and on
kNN {2,3} over regime 2, the card's snapshots (t = 2,999 and the end), and the total on the random scorers at the
end. Throughput is CPU time on one thread, so other load on the machine does not count.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from zoo.metrics.anomaly import average_precision
from zoo.models.sead.alternatives import RULES, apply_rule
from zoo.models.sead.detectors import default_pool
from zoo.models.sead.ensemble import SEADEnsemble

__all__ = ["ARMS", "DriftExperiment", "KNN", "LABELS", "METRICS", "QUICK_ARMS"]

WARMUP = 100
N = 6000
DRIFT = N // 2
KNN = ("knn01", "knn23", "knn_all")  # pool columns 0, 1, 2; the random scorers follow
ENSEMBLES: dict[str, tuple[int, dict[str, Any]]] = {  # arm -> (random scorers, SEADEnsemble options)
    "sead_r4": (4, {}),
    "sead_r13": (13, {}),
    "exact_r4": (4, {"capacity": None}),
    "exact_r13": (13, {"capacity": None}),
    "unclipped_r4": (4, {"clip_output": False}),
    "no_share_r4": (4, {"share": 0.0}),
    "no_share_r13": (13, {"share": 0.0}),
    "cdf_r4": (4, {"normalizer": "cdf"}),
    "sead_pp_r13": (13, {"sample_k": 8}),
    "rowwise_r13": (13, {"chunked": False}),
}
QUICK_ARMS = (
    "sead_r4", "exact_r4", "unclipped_r4", "sead_r13", "exact_r13", *KNN, "best_in_hindsight",
    "no_share_r4", "no_share_r13", "cdf_r4", "uniform_r4", "uniform_r13",
    "ftl200_r4", "ftl200_r13", "disc99_r4", "disc99_r13", "warmpick_r4",
)  # fmt: skip
ARMS = (*QUICK_ARMS, "sead_pp_r13", "rowwise_r13")
LABELS = {
    "sead_r4": "SEAD, sketch (4 random)",
    "exact_r4": "SEAD, exact history (4 random)",
    "unclipped_r4": "SEAD, unclipped output (4 random)",
    "sead_r13": "SEAD, sketch (13 random)",
    "exact_r13": "SEAD, exact history (13 random)",
    "knn01": "kNN {0,1}",
    "knn23": "kNN {2,3}",
    "knn_all": "kNN all dims",
    "best_in_hindsight": "best detector in hindsight (labels)",
    "no_share_r4": "no share (4 random)",
    "no_share_r13": "no share (13 random)",
    "cdf_r4": "CDF normaliser (4 random)",
    "uniform_r4": "uniform mean (4 random)",
    "uniform_r13": "uniform mean (13 random)",
    "ftl200_r4": "follow-the-leader, 200 points (4 random)",
    "ftl200_r13": "follow-the-leader, 200 points (13 random)",
    "disc99_r4": "discounted losses γ = 0.99 (4 random)",
    "disc99_r13": "discounted losses γ = 0.99 (13 random)",
    "warmpick_r4": "detector picked after the warm-up (4 random)",
    "sead_pp_r13": "SEAD++ k = 8 (13 random)",
    "rowwise_r13": "SEAD row by row (13 random)",
}
METRICS = (
    "aps", "aps_before", "aps_after", "w_knn01_before", "w_knn23_after", "w_knn01_at_drift", "w_knn23_at_end",
    "random_weight_at_end",
)  # fmt: skip


def _aps(score: Tensor, y: Tensor, lo: int = WARMUP, hi: int = N) -> float:
    return average_precision(score[lo:hi], y[lo:hi])


def _score_metrics(score: Tensor, y: Tensor) -> dict[str, float]:
    """APS on the evaluated stream and on each regime."""
    return {"aps": _aps(score, y), "aps_before": _aps(score, y, WARMUP, DRIFT), "aps_after": _aps(score, y, DRIFT)}


def _weight_metrics(w: Tensor) -> dict[str, float]:
    """What the weight trace ``(N, M)`` (after each point) says about following the drift: the mean weight on each
    regime's best detector over that regime (evaluated points only), and the card's snapshots at t = 2,999 and at the
    end."""
    return {
        "w_knn01_before": float(w[WARMUP:DRIFT, 0].mean()),
        "w_knn23_after": float(w[DRIFT:, 1].mean()),
        "w_knn01_at_drift": float(w[DRIFT - 1, 0]),
        "w_knn23_at_end": float(w[-1, 1]),
        "random_weight_at_end": float(w[-1, len(KNN) :].sum()),
    }


class DriftExperiment:
    """One seed's stream and ensemble passes, cached: the derived arms (weight rules, single detectors) reuse the
    SEAD pass's raw and normalised scores, so every arm of a seed is scored from the same detector outputs."""

    def __init__(self) -> None:
        self.seed: int | None = None
        self.passes: dict[str, dict[str, Any]] = {}

    def stream(self, seed: int) -> tuple[Tensor, Tensor]:
        from zoo.datamodules.streams import make_drifting_stream

        if seed != self.seed:
            self.seed, self.passes = seed, {}
            self.x, self.y = make_drifting_stream(n=N, seed=seed)
        return self.x, self.y

    def ensemble(self, arm: str, seed: int) -> dict[str, Any]:
        """Run (once) the ensemble arm over the stream, in 100-point chunks, recording the normaliser's quantiles
        after each chunk (the chunks give the same numbers as one call: the ensemble is tested to equal a pass
        point by point)."""
        x, _ = self.stream(seed)
        if arm not in self.passes:
            num_random, options = ENSEMBLES[arm]
            ens = SEADEnsemble(default_pool(x.shape[1], num_random), x.shape[1], warmup=WARMUP, seed=seed, **options)
            outs, quantiles, seconds = [], [], 0.0
            for chunk in x.split(100):
                start = time.process_time()  # CPU time, one thread: the speed alone, not the machine's load
                outs.append(ens(chunk))
                seconds += time.process_time() - start
                quantiles.append(torch.stack([ens.normalizer.quantiles(q) for q in (0.01, 0.99)], 1))  # (M, 2)
            out: dict[str, Any] = {k: torch.cat([o[k] for o in outs]) for k in outs[0]}
            out["quantiles"], out["points_per_s"] = torch.stack(quantiles), N / seconds  # (chunks, M, 2)
            self.passes[arm] = out
        return self.passes[arm]

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        _, y = self.stream(seed)
        if arm in ENSEMBLES:
            out = self.ensemble(arm, seed)
            if arm == "rowwise_r13":  # the same numbers as sead_r13 (tested), only its speed is of interest
                return {"points_per_s": out["points_per_s"]}
            metrics = {**_score_metrics(out["score"], y), **_weight_metrics(out["weights"])}
            metrics["points_per_s"] = out["points_per_s"]
            if arm == "exact_r4":  # the kNN columns' raw scores are the same in every pass of the seed
                metrics["sketch_q99_error"] = _q99_error(self.ensemble("sead_r4", seed), out)
            return metrics
        rule, _, pool = arm.rpartition("_")
        if rule in RULES:
            out = self.ensemble(f"sead_{pool}", seed)
            scores, weights = apply_rule(rule, out["normalized"], out["raw"], warmup=WARMUP)
            return {**_score_metrics(scores, y), **_weight_metrics(weights)}
        raw = self.ensemble("sead_r4", seed)["raw"]
        if arm in KNN:  # a fixed selection: all weight on this detector, its raw score emitted
            i = KNN.index(arm)
            return {**_score_metrics(raw[:, i], y), **_weight_metrics(torch.eye(raw.shape[1])[i].expand(N, -1))}
        if arm == "best_in_hindsight":  # per metric, the best pool member (chosen with the labels)
            per_detector = [_score_metrics(raw[:, i], y) for i in range(raw.shape[1])]
            return {k: max(d[k] for d in per_detector) for k in per_detector[0]}
        raise KeyError(f"unknown arm {arm!r}; the arms are {ARMS}")


def _q99_error(sketch: Mapping[str, Tensor], exact: Mapping[str, Tensor]) -> float:
    """Largest |Q(0.99) sketch − Q(0.99) exact| over the chunks after warm-up and the kNN detectors, as a share of
    the exact Q(0.99) − Q(0.01) range (the same raw scores enter both normalisers)."""
    qs, qe = sketch["quantiles"][1:, : len(KNN)], exact["quantiles"][1:, : len(KNN)]
    return float(((qs[..., 1] - qe[..., 1]).abs() / (qe[..., 1] - qe[..., 0])).max())
