"""The benchmark of ``zoo reproduce sead``: streams where no single detector wins, scored by the paper's average rank.

Six streams (``datamodules.streams.make_benchmark_stream``: the card's abrupt drift, separated clusters, one extreme
feature in 10 or in 40 dims, broken correlations, a steadily drifting mean), each run once per seed through the pool
of :func:`benchmark_pool` (the paper's shape, 3 algorithms × 4 settings + a MAD rule, plus two windowed kNN). Every
arm is scored on the same detector outputs:

* SEAD (``sead``, the paper's λ = 10⁶, the clipped output), with a larger share (``share1e-2``), with the unclipped
  output (``unclipped``), SEAD++ (``sead_pp``, k = 8; full run only: it steps row by row);
* ablations: no share (``no_share``), the CDF normaliser (``cdf``, own passes), the uniform mean of the normalised
  scores (``uniform``);
* alternatives (``alternatives.py``, on SEAD's own normalised scores): follow-the-leader over 200 points
  (``ftl200``), discounted-loss weights with γ = 0.99 (``disc99``), the detector picked on the 100 points after the
  warm-up (``warmpick``);
* the detector with the lowest mean normalised score over the stream (``proxy_best``: SEAD's loss, in hindsight;
  what Hedge with a small share converges to on a stationary stream), a diagnostic arm;
* each single detector (:data:`DETECTORS`) and the oracle (the best detector of each stream, chosen with the labels);
* the same pool with 13 random scorers added (``*_r13``), for the paper's robustness test.

A method's rank on a stream is 1 + the number of pool detectors with a higher APS (the paper ranks SEAD among its 13
detectors; a detector is ranked among the others); its average rank is the mean over the streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any


from zoo.datamodules.streams import BENCHMARK_KINDS, make_benchmark_stream
from zoo.metrics.anomaly import average_precision
from zoo.models.sead.alternatives import RULES, apply_rule
from zoo.models.sead.detectors import paper_pool
from zoo.models.sead.ensemble import SEADEnsemble

__all__ = ["DETECTORS", "PASSES", "arm_metrics", "benchmark_pool", "rank", "stream_results"]

WARMUP = 100
N = 4000
# the paper's pool (paper_pool's order: LODA, RS-Hash, HST at settings 0-3, the MAD rule): the methods are ranked
# among these 13, as the paper ranks SEAD among its 13 detectors
DETECTORS = (*(f"{name}{i}" for name in ("loda", "rshash", "hst") for i in range(4)), "mad")
KNN = ("knn5", "knn10")  # windowed kNN: outside the paper's pool, the practitioner's first detector
PASSES: dict[str, tuple[str, dict[str, Any]]] = {  # SEAD passes: arm -> (pool, ensemble options)
    "sead": ("paper", {}),
    "sead_knn": ("paper+knn", {}),
    "share1e-2": ("paper", {"share": 1e-2}),
    "unclipped": ("paper", {"clip_output": False}),
    "no_share": ("paper", {"share": 0.0}),
    "cdf": ("paper", {"normalizer": "cdf"}),
    "sead_r13": ("paper+13 random", {}),
    "sead_pp": ("paper", {"sample_k": 6}),
}
SLOW = ("sead_pp",)  # row by row (SEAD++'s draws depend on the previous point's weights): the full run only


def benchmark_pool(dim: int, pool: str = "paper") -> list[dict[str, Any]]:
    """``"paper"``: the paper's pool shape (``paper_pool``: LODA, RS-Hash, Half-Space Trees at 4 settings each, a MAD
    rule); ``"paper+knn"`` adds two windowed kNN detectors (the card's §6 kind), ``"paper+13 random"`` 13 random
    scorers (the paper's robustness test).

    Example:
        >>> [len(benchmark_pool(4, p)) for p in ("paper", "paper+knn", "paper+13 random")]
        [13, 15, 26]
    """
    extra = {
        "paper": [],
        "paper+knn": [{"name": "knn", "params": {"k": 5, "window": 256}}, {"name": "knn", "params": {"k": 10, "window": 512}}],
        "paper+13 random": [{"name": "random", "params": {}} for _ in range(13)],
    }
    if pool not in extra:
        raise ValueError(f"Expected argument `pool` to be one of {', '.join(map(repr, extra))}, but got {pool!r}.")
    return paper_pool(dim) + extra[pool]


def _passes(kind: str, seed: int, n: int, arms: Sequence[str]) -> dict[str, float]:
    x, y = make_benchmark_stream(kind, n=n, seed=seed)
    labels = y[WARMUP:]
    aps: dict[str, float] = {}
    for arm in arms:
        pool, options = PASSES[arm]
        ens = SEADEnsemble(benchmark_pool(x.shape[1], pool), x.shape[1], warmup=WARMUP, seed=seed, **options)
        out = ens(x)
        aps[arm] = average_precision(out["score"][WARMUP:], labels)
        if arm == "sead":  # the detector SEAD's loss prefers in hindsight: what Hedge converges to on a stationary stream
            best = int(out["normalized"][WARMUP:].mean(0).argmin())
            aps["proxy_best"] = average_precision(out["raw"][WARMUP:, best], labels)
        if arm in ("sead", "sead_r13"):
            suffix = "" if arm == "sead" else "_r13"
            for rule in RULES:
                score = apply_rule(rule, out["normalized"], out["raw"], warmup=WARMUP)[0]
                aps[rule + suffix] = average_precision(score[WARMUP:], labels)
        if arm == "sead_knn":  # every detector's raw score (the same in every pass: scores do not see the weights)
            for i, name in enumerate(DETECTORS + KNN):
                aps[name] = average_precision(out["raw"][WARMUP:, i], labels)
    return aps


@lru_cache(maxsize=64)
def stream_results(kind: str, seed: int, n: int = N, slow: bool = False) -> dict[str, float]:
    """Every arm's APS on one stream (warm-up excluded): the SEAD passes, the alternatives (on the ``sead`` and
    ``sead_r13`` passes' scores), each detector's and the oracle's; ``slow`` adds the row-by-row passes (SEAD++)."""
    if slow:
        return {**stream_results(kind, seed, n), **_passes(kind, seed, n, SLOW)}
    aps = _passes(kind, seed, n, [arm for arm in PASSES if arm not in SLOW])
    aps["oracle"] = max(aps[d] for d in DETECTORS)
    return aps


def rank(value: float, pool: Sequence[float]) -> float:
    """1 + the number of pool APS values strictly above ``value`` (ties count in the method's favour).

    Example:
        >>> rank(0.8, [0.9, 0.8, 0.5])
        2.0
    """
    return 1.0 + sum(v > value + 1e-12 for v in pool)


def arm_metrics(
    arm: str, seed: int, n: int = N, kinds: Sequence[str] = BENCHMARK_KINDS, pool: Sequence[str] = DETECTORS
) -> dict[str, float]:
    """One arm's APS and rank (among the ``pool`` detectors other than itself) on every stream, its average rank,
    rank variance and mean APS over the streams."""
    out: dict[str, float] = {}
    ranks, values = [], []
    for kind in kinds:
        res = stream_results(kind, seed, n, slow=arm in SLOW)
        out[f"{kind}/aps"] = res[arm]
        out[f"{kind}/rank"] = rank(res[arm], [res[d] for d in pool if d != arm])
        ranks.append(out[f"{kind}/rank"])
        values.append(res[arm])
    mean = sum(ranks) / len(ranks)
    out["avg_rank"] = mean
    out["rank_var"] = sum((r - mean) ** 2 for r in ranks) / len(ranks)
    out["mean_aps"] = sum(values) / len(values)
    return out
