"""``zoo reproduce sead``: does SEAD pick the right detector, without labels, better than simpler rules?

Two experiments, every number from the same detector outputs per seed:

1. **The card's drift stream** (``experiment.py``): one stream whose best detector changes half way (kNN {0,1}, then
   kNN {2,3}). Does SEAD move its weight to the new best detector, and do simpler weight rules (follow-the-leader,
   discounted losses) do it too?
2. **The benchmark** (``benchmark.py``): six streams where a different detector wins (drift, clusters, one extreme
   feature in 10 or 40 dims, broken correlations, a drifting mean), scored as the paper scores SEAD: its average rank
   among the pool's 13 detectors (3 algorithms × 4 settings + a MAD rule) over the streams. A kNN detector outside the
   pool, the ablations and the simpler weight rules are ranked the same way.

The card's APS comparisons on the drift stream are checks: kNN on all dims in SEAD's place passes every one of them
(it is the best detector in hindsight there), so they say nothing about selection.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo.claims import Check, Claim, TaskCheck
from zoo.datamodules.streams import BENCHMARK_KINDS
from zoo.evidence import Headline
from zoo.models.sead import benchmark
from zoo.models.sead.benchmark import DETECTORS, KNN as BENCH_KNN, arm_metrics
from zoo.models.sead.experiment import ARMS, DRIFT, LABELS, METRICS, QUICK_ARMS, WARMUP, DriftExperiment
from zoo.reporting import arm_table, conclude, plot_sweep, run_arms

__all__ = ["CHECKS", "CLAIMS", "HEADLINES", "diagnose", "run"]

SEEDS, QUICK_SEEDS = (0, 1, 2, 3, 4), (0, 1)
BENCH_SEEDS, QUICK_BENCH_SEEDS = (0, 1, 2), (0,)
BENCH_ARMS = (
    "sead", "sead_knn", "unclipped", "share1e-2", "no_share", "cdf", "uniform", "ftl200", "disc99", "warmpick",
    "sead_r13", "uniform_r13", "ftl200_r13", "disc99_r13", "proxy_best", "oracle", *DETECTORS, *BENCH_KNN,
)  # fmt: skip
BENCH_LABELS = {
    "sead": "SEAD (λ = 10⁶)",
    "sead_knn": "SEAD, pool + 2 kNN",
    "unclipped": "SEAD, unclipped output",
    "share1e-2": "SEAD, share 1e-2",
    "no_share": "no share",
    "cdf": "CDF normaliser",
    "uniform": "uniform mean",
    "ftl200": "follow-the-leader, 200 points",
    "disc99": "discounted losses γ = 0.99",
    "warmpick": "detector picked after the warm-up",
    "sead_r13": "SEAD + 13 random scorers",
    "uniform_r13": "uniform mean + 13 random",
    "ftl200_r13": "follow-the-leader + 13 random",
    "disc99_r13": "discounted losses + 13 random",
    "oracle": "oracle: each stream's best detector (labels)",
    "proxy_best": "the detector SEAD's loss prefers in hindsight",
    "sead_pp": "SEAD++ (k = 6 of 13)",
    "knn5": "kNN k = 5, 256 points (outside the pool)",
    "knn10": "kNN k = 10, 512 points (outside the pool)",
}
_DRIFT_BASELINE = {"knn_all": "kNN all dims alone, the best detector in hindsight: all weight on it, no switching"}
_DRIFT_ABLATIONS = {
    "no_share_r4": "pure Hedge, no fixed share (the component that lets the weights move back)",
    "cdf_r4": "the CDF normaliser: every detector's loss looks uniform",
    "uniform_r4": "uniform weights on the normalised scores: no selection",
}
_DRIFT_ALTERNATIVES = {
    "ftl200_r4": "follow-the-leader: the detector with the lowest mean normalised score over the last 200 points",
    "disc99_r4": "exponential weights on discounted losses (γ = 0.99): forgetting instead of fixed share",
    "warmpick_r4": "the detector with the lowest loss on the 100 points after the warm-up, kept",
}


def _follows(r: Mapping[str, Any], arm: str) -> float:
    """The smaller of the mean weights on kNN {0,1} before the drift and on kNN {2,3} after it."""
    return min(r[f"{arm}/w_knn01_before"], r[f"{arm}/w_knn23_after"])


def _aps_gap(r: Mapping[str, Any], arm: str, base: str) -> float:
    return r[f"{arm}/aps"] - r[f"{base}/aps"]


def _rank_lead(r: Mapping[str, Any], arm: str) -> float:
    """The arm's average rank minus the best pool detector's (other than itself): <= 0 means no detector ranks ahead."""
    return r[f"bench/{arm}/avg_rank"] - min(r[f"bench/{d}/avg_rank"] for d in DETECTORS if d != arm)


CLAIMS = [
    Claim(
        "weights_follow_the_drift",
        _follows,
        method="sead_r4",
        baselines=_DRIFT_BASELINE,
        ablations=_DRIFT_ABLATIONS,
        alternatives=_DRIFT_ALTERNATIVES,
        at_least=0.5,
        asserted=False,
        text="SEAD follows the best detector when it changes under drift: most of the weight on kNN {0,1} before the "
        "drift and on kNN {2,3} after it, as mean weights over each regime (card §6, assertion 4). Reported: "
        "follow-the-leader and discounted losses move their weight as well",
    ),
    Claim(
        "weights_follow_the_drift_with_13_random",
        _follows,
        method="sead_r13",
        baselines=_DRIFT_BASELINE,
        ablations={"no_share_r13": "pure Hedge, no fixed share", "uniform_r13": "uniform weights: no selection"},
        alternatives={"ftl200_r13": "follow-the-leader over 200 points", "disc99_r13": "discounted losses γ = 0.99"},
        at_least=0.5,
        asserted=False,
        text="13 random-score detectors do not keep SEAD off the drift's best detectors (the robustness test read as "
        "selection). Reported: the simpler rules ignore the random scorers as well",
    ),
    Claim(
        "aps_after_drift_within_0.10_of_best_detector",
        lambda r, a: r[f"{a}/aps_after"] - r["best_in_hindsight/aps_after"],
        method="sead_r4",
        baselines=_DRIFT_BASELINE,
        ablations=_DRIFT_ABLATIONS,
        alternatives=_DRIFT_ALTERNATIVES,
        at_least=-0.10,
        asserted=False,
        text="after the drift SEAD's APS is within 0.10 of the new regime's best detector (kNN {2,3}). Holds on "
        "some seeds only: at λ = 10⁶ the weights can take over 1,000 points to settle after the drift",
    ),
    Claim(
        "sead_best_average_rank",
        _rank_lead,
        method="sead",
        baselines={d: "one pool detector alone (the paper ranks SEAD among them)" for d in DETECTORS},
        ablations={"no_share": "pure Hedge, no fixed share", "cdf": "the CDF normaliser",
                   "uniform": "uniform weights on the normalised scores"},
        alternatives={"knn5": "a windowed kNN detector (k = 5, 256 points), outside the pool",
                      "ftl200": "follow-the-leader over 200 points", "disc99": "discounted losses γ = 0.99",
                      "warmpick": "the detector picked on the 100 points after the warm-up"},
        at_most=0.0,
        asserted=False,
        text="SEAD's average rank over the benchmark's six streams is at least as good as every pool detector's (the "
        "paper: the best average rank of the 14 methods)",
    ),
    Claim(
        "knn5_outranks_sead_by_1",
        lambda r, a: r[f"bench/{a}/avg_rank"] - r["bench/sead/avg_rank"],
        method="knn5",
        ablations={"cdf": "the CDF normaliser (a broken SEAD): if it outranked SEAD the ranking would say nothing"},
        alternatives={"uniform": "the uniform mean of the pool's normalised scores"},
        why_none={"baselines": "the pool detectors are the forward claim's baselines; this asks whether one detector "
                  "outside the pool, the practitioner's first choice, ranks ahead of SEAD"},
        at_most=-1.0,
        text="one windowed kNN detector alone (outside the pool) ranks at least one place ahead of SEAD on average "
        "over the streams: it contradicts the headline",
    ),
    Claim(
        "random_scorers_cost_at_most_0.02",
        lambda r, a: r[f"bench/{a}_r13/mean_aps"] - r[f"bench/{a}/mean_aps"],
        method="sead",
        ablations={"uniform": "uniform weights: every random scorer dilutes the mean"},
        alternatives={"ftl200": "follow-the-leader over 200 points", "disc99": "discounted losses γ = 0.99"},
        why_none={"baselines": "a single detector's score does not change when random scorers join the pool: it "
                  "passes by construction"},
        at_least=-0.02,
        asserted=False,
        text="adding 13 random-score detectors to the pool costs SEAD at most 0.02 mean APS over the benchmark (the "
        "paper: −0.88 %). Reported: the simpler weight rules ignore random scorers as well",
    ),
]
CHECKS = [
    TaskCheck(
        lambda r, a: r[f"bench/{a}/mean_aps"],
        method="oracle",
        heuristics={"knn5": "the best fixed detector on the benchmark (a windowed kNN)", "mad": "the MAD rule",
                    "uniform": "the uniform mean of the normalised scores"},
        margin=0.05,
        name="task_needs_the_method_choosing_matters",
        text="the benchmark needs model selection: each stream's best detector (the oracle, chosen with labels) is "
        "clearly ahead of every fixed detector and of the uniform mean in mean APS",
    ),
    Check("sead_beats_uniform_r4_by_0.20", lambda r: _aps_gap(r, "sead_r4", "uniform_r4"), at_least=0.20,
          text="card §6 assertion 1 (kNN all dims passes too)"),
    Check("sead_beats_uniform_r13_by_0.40", lambda r: _aps_gap(r, "sead_r13", "uniform_r13"), at_least=0.40,
          text="card §6 assertion 1, 13 random scorers"),
    Check("random_scorers_cost_at_most_0.05", lambda r: _aps_gap(r, "sead_r13", "sead_r4"), at_least=-0.05,
          text="card §6 assertion 2 (paper: −0.88 %)"),
    Check("sead_beats_regime_detectors_by_0.10",
          lambda r: r["sead_r4/aps"] - max(r["knn01/aps"], r["knn23/aps"]), at_least=0.10,
          text="card §6 assertion 3a at 0.10: the card's 0.20 misses on seed 3"),
    Check("no_share_loses_0.20", lambda r: _aps_gap(r, "sead_r4", "no_share_r4"), at_least=0.20,
          text="card §6 assertion 5"),
    Check("cdf_normaliser_loses_0.20", lambda r: _aps_gap(r, "sead_r4", "cdf_r4"), at_least=0.20,
          text="review note: the CDF ablation must fail"),
    Check("random_weight_at_end_r13_at_most_0.01", lambda r: r["sead_r13/random_weight_at_end"], at_most=0.01),
]  # fmt: skip
HEADLINES = [
    Headline(
        "best_average_rank",
        "SEAD has the best average rank (5.07) and the lowest rank variance (6.64) among the 14 methods (13 pool "
        "detectors and SEAD) over 15 datasets",
        claims=["sead_best_average_rank"],
        contradicted_by=["knn5_outranks_sead_by_1"],
        paper="average rank 5.07, rank variance 6.64 over 15 datasets (9th on WBC)",
        diagnosis=(
            "On the six streams SEAD ranks 4.0 on average among the 13 pool detectors (seeds 0-2: 4.3 / 4.7 / 3.0), "
            "behind the MAD rule (3.6, the best detector on four streams and the worst on one) and far behind a kNN "
            "detector outside the pool (2.4, ahead of SEAD on every seed); its rank variance (4.1) is far below MAD's "
            "(19.4) but not the lowest (the HST settings, last everywhere: 0.4-2.4). The cause is SEAD's loss, not "
            "its weight update: the detector with the lowest mean normalised score in hindsight, what Hedge with a "
            "tiny share converges to on a stationary stream, ranks 4.3, about where SEAD does (on the clusters stream "
            "it is an RS-Hash setting at APS 0.30 while LODA reaches 0.66); a low normalised score rewards skewed "
            "scores, not a good ranking of the anomalies. Pure Hedge (no share) ranks 3.3 here and SEAD with the "
            "two kNN in its pool 2.7, still behind kNN alone. The sweep (zoo reproduce sead --diagnose, share 0 to "
            "1e-2, 1,000 to 8,000 points per stream) finds no setting where SEAD leads clearly: it edges the best "
            "pool detector only at 2,000 points (3.5 against 3.8, within the seed spread) and trails it at 1,000, "
            "4,000 and 8,000 at every share rate, while kNN stays at 2.3-2.4. No official code exists to run."
        ),
    ),
    Headline(
        "follows_the_drift",
        "SEAD follows the best detector when it changes under drift",
        claims=["weights_follow_the_drift"],
        paper="the card's §6 check run: w ≈ 1 on kNN {0,1} at t = 2,999 and on kNN {2,3} at the end",
        diagnosis=(
            "SEAD's weights do follow the drift: a mean weight of 0.78 on each regime's best detector (0.83 with the "
            "exact history), against 0.02 without the share and 0.31 with the CDF normaliser. But follow-the-leader "
            "over 200 points (0.83) and exponential weights on discounted losses, γ = 0.99 (0.82), do it as well or "
            "slightly better from the same normalised scores: what moves the weight is the normalised-score loss, "
            "which any recency-weighted rule uses; fixed share is one way to forget, not the only one. In APS SEAD "
            "(0.830) is ahead of follow-the-leader (0.813) but behind discounted losses (0.854) and kNN on all dims "
            "(0.869), all by less than the spread over the 5 seeds (SEAD 0.71-0.95): at λ = 10⁶ the weights take "
            "1,000+ points to settle after the drift on seeds 2-4."
        ),
    ),
    Headline(
        "robust_to_random_scorers",
        "adding 13 random-score detectors lowers SEAD's APS by only 0.88 %",
        claims=["random_scorers_cost_at_most_0.02"],
        paper="−0.88 % APS",
        diagnosis=(
            "SEAD loses nothing when 13 random scorers join the pool (+0.003 mean APS over the benchmark; the "
            "paper's −0.88 % is matched), and the uniform mean loses 0.12, but every rule that weights by the "
            "normalised score ignores them as well: follow-the-leader changes by 0.000 and discounted losses by "
            "−0.0004. A random scorer's normalised score averages 0.5 against a useful detector's 0.1-0.2, so any "
            "such rule drops it within a few dozen points; the robustness belongs to the loss, not to SEAD."
        ),
    ),
]
"""Calibration (``OMP_NUM_THREADS=1 zoo reproduce sead --out docs/reproductions/sead``; every number depends only on
its seed, so the quick run's seeds are the full run's first ones). Per seed, drift stream 0 / 1 / 2 / 3 / 4:

weights_follow_the_drift, >= 0.5 (the smaller of the mean weights on kNN {0,1} over t in [100, 3000) and on kNN
{2,3} over t >= 3000), reported: sead_r4 0.952 / 0.946 / 0.747 / 0.646 / 0.602 (recorded, from the 5-seed means:
    0.785); ftl200 0.883 / 0.974 / 0.734 / 0.789 / 0.746 and disc99 0.870 / 0.948 / 0.757 / 0.803 / 0.721 pass on
    every seed; no share <= 0.109, uniform 1/7, kNN all 0, warm-up pick 0 or 1 on one side, CDF 0.087-0.405.
aps_after_drift_within_0.10_of_best_detector, reported: sead_r4 −0.097 / −0.031 / −0.263 / −0.425 / −0.491 (the best
    detector after the drift, kNN {2,3}, has APS 1.000 there); kNN all −0.14 / −0.15 / −0.12 / −0.19 / −0.12.
Checks (means; the quick run's seeds 0-1 in brackets): SEAD − uniform 0.345 (0.431, 0.498; seed 4 alone 0.199),
    with 13 random 0.644 (>= 0.488 per seed), sead_r13 − sead_r4 −0.007 (>= −0.015), SEAD − max(kNN {0,1}, kNN {2,3})
    0.294 (>= 0.137), − no share 0.476 (>= 0.349), − CDF 0.596 (>= 0.515), random weight at the end <= 3.3e-6.

The benchmark, seeds 0 / 1 / 2 (the quick run: seed 0), average rank among the 13 pool detectors:
sead_best_average_rank, <= 0 (SEAD's average rank minus the best pool detector's), reported: 0.83 / 1.00 / −0.50
    (mean 0.44); MAD −1.0, no share −0.22 and kNN −1.17 pass.
knn5_outranks_sead_by_1, <= −1 (kNN k = 5's average rank minus SEAD's), asserted: −1.83 / −2.33 / −0.67 (mean −1.61,
    the quick run −1.83); uniform +0.06 (per seed −0.33 / −0.67 / +1.17), CDF +5.3.
random_scorers_cost_at_most_0.02, >= −0.02 (mean APS with 13 random scorers minus without), reported: +0.003 / +0.002 /
    +0.002; follow-the-leader 0 and discounted losses −0.0005 pass, uniform −0.112 / −0.097 / −0.150 misses.
task_needs_the_method_choosing_matters, margin 0.05: the oracle's mean APS minus the best of kNN, MAD and the uniform
    mean: 0.095 / 0.090 / 0.110.
"""


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run both experiments, print the tables and claims; with ``out``, write ``sead.json`` and ``sead.png``.

    ``quick``: drift stream on seeds 0 and 1 without the SEAD++ / row-by-row timing arms, benchmark on seed 0;
    full: drift stream on seeds 0-4 with every arm, benchmark on seeds 0-2 with SEAD++.

    Returns:
        flat results: ``<arm>/<metric>`` (drift stream) and ``bench/<arm>/<metric>`` (benchmark), means over seeds
        and ``.../seed<s>``, plus ``claims/...``, ``reported/...``, ``checks/...`` and the values behind them.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors (chunks of 100 rows, SEAD++ row by row): extra threads only add overhead
    try:
        return _run(quick, out)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, out: Path | str | None) -> dict[str, Any]:
    seeds, arms = (QUICK_SEEDS, QUICK_ARMS) if quick else (SEEDS, ARMS)
    bench_seeds, bench_arms = (QUICK_BENCH_SEEDS, BENCH_ARMS) if quick else (BENCH_SEEDS, (*BENCH_ARMS, "sead_pp"))
    experiment = DriftExperiment()
    start = time.perf_counter()
    r: dict[str, Any] = {}

    def keep_trace(arm: str, seed: int) -> dict[str, float]:
        metrics = experiment(arm, seed)
        if arm == "sead_r4" and seed == seeds[0]:
            r["trace"] = experiment.ensemble(arm, seed)["weights"][::10].tolist()  # the plot's weight trace
        return metrics

    run_arms(arms, seeds, keep_trace, results=r)
    trace = torch.tensor(r.pop("trace"))
    benchmark.stream_results.cache_clear()
    run_arms(bench_arms, bench_seeds, lambda arm, seed: arm_metrics(arm, seed), prefix="bench/", results=r)
    r["seconds"] = time.perf_counter() - start
    title = f"SEAD on the drifting stream: APS on t ≥ {WARMUP}, before / after the drift at t = {DRIFT}; weights"
    tables = [
        arm_table(r, arms, (*METRICS, "points_per_s"), f"{title}; seeds {list(seeds)}", LABELS),
        _stand_in_table(r),
        arm_table(r, bench_arms, ("avg_rank", "rank_var", "mean_aps", *(f"{k}/aps" for k in BENCHMARK_KINDS)),
                  f"the benchmark: average rank among the pool's 13 detectors, rank variance, APS per stream; seeds "
                  f"{list(bench_seeds)}", BENCH_LABELS, prefix="bench/"),
    ]  # fmt: skip
    notes = [
        f"points/s (CPU time, one thread): SEAD {r['sead_r4/points_per_s']:.0f} with 7 detectors, "
        f"{r['sead_r13/points_per_s']:.0f} with 16, exact history {r['exact_r13/points_per_s']:.0f} with 16"
        + (
            f"; row by row: SEAD {r['rowwise_r13/points_per_s']:.0f}, SEAD++ {r['sead_pp_r13/points_per_s']:.0f}"
            if "sead_pp_r13/points_per_s" in r
            else ""
        ),
        "the 1,024-slot sketch's largest Q(0.99) error against the exact history (kNN detectors, after warm-up), as a "
        "share of the exact Q(0.99) − Q(0.01) range, per seed: "
        + " / ".join(f"{r[f'exact_r4/sketch_q99_error/seed{s}']:.3f}" for s in seeds),
        f"wall time {r['seconds']:.0f} s",
    ]
    return conclude(
        "sead", r, CLAIMS, CHECKS, out=out, plot=lambda res, path: _plot(trace, res, bench_arms, path), tables=tables,
        notes=notes, headlines=HEADLINES,
    )  # fmt: skip


def _stand_in_table(r: Mapping[str, Any]) -> Any:
    """The card's APS comparisons with kNN all dims (and the other stand-ins) in SEAD's place: why they are checks."""
    from rich.table import Table

    rows = {
        "APS − uniform (4 random)": lambda a: _aps_gap(r, a, "uniform_r4"),
        "APS − max(kNN {0,1}, kNN {2,3})": lambda a: r[f"{a}/aps"] - max(r["knn01/aps"], r["knn23/aps"]),
        "APS − best in hindsight": lambda a: _aps_gap(r, a, "best_in_hindsight"),
        "APS − no share": lambda a: _aps_gap(r, a, "no_share_r4"),
        "APS − CDF normaliser": lambda a: _aps_gap(r, a, "cdf_r4"),
        "APS after the drift − best detector there": lambda a: r[f"{a}/aps_after"] - r["best_in_hindsight/aps_after"],
        "min(mean w kNN {0,1} before, mean w kNN {2,3} after)": lambda a: _follows(r, a),
    }
    table = Table(title="the card's comparisons with a stand-in in SEAD's place (4 random scorers; means over seeds)")
    arms = ("sead_r4", "exact_r4", "knn_all", "ftl200_r4", "disc99_r4", "uniform_r4", "no_share_r4", "cdf_r4")
    table.add_column("comparison")
    for arm in arms:
        table.add_column(LABELS[arm].replace(" (4 random)", ""), justify="right")
    for name, value in rows.items():
        table.add_row(name, *(f"{value(a):+.3f}" for a in arms))
    return table


def _plot(trace: Tensor, r: Mapping[str, Any], bench_arms: tuple[str, ...], path: Path) -> None:
    """Left: SEAD's weights over the drift stream (first seed, 4 random scorers). Right: the benchmark's average
    ranks (lower is better)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    names = ["kNN {0,1}", "kNN {2,3}", "kNN all"] + [f"random {i}" for i in range(trace.shape[1] - 3)]
    t = torch.arange(trace.shape[0]) * 10
    for i, name in enumerate(names):
        axes[0].plot(t, trace[:, i], label=name, lw=1.5 if i < 3 else 0.7)
    axes[0].axvline(DRIFT, color="k", ls="--", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_ylim(1e-8, 1.5)
    axes[0].set_xlabel("t")
    axes[0].set_title("drift stream: SEAD weights (first seed, 4 random scorers); dashed: the drift")
    axes[0].legend(fontsize=7, ncol=2)
    shown = sorted((a for a in bench_arms if a != "oracle"), key=lambda a: -r[f"bench/{a}/avg_rank"])
    colors = ["tab:red" if a == "sead" else "tab:blue" if a in DETECTORS else "tab:gray" for a in shown]
    axes[1].barh(range(len(shown)), [r[f"bench/{a}/avg_rank"] for a in shown], color=colors)
    axes[1].set_yticks(range(len(shown)), [BENCH_LABELS.get(a, a) for a in shown], fontsize=7)
    axes[1].set_xlabel("average rank among the 13 pool detectors (lower is better); blue: the pool")
    axes[1].set_title("the benchmark's six streams")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


DIAGNOSIS_SHARES = (0.0, 1e-6, 1e-4, 1e-2)
DIAGNOSIS_SIZES = (1000, 2000, 4000, 8000)


def diagnose(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Is SEAD's average rank on the benchmark a matter of the share rate or the stream length? SEAD's and the best
    pool detector's average rank at share 0, 1e-6 (the paper's λ = 10⁶), 1e-4, 1e-2 and n = 1,000, 2,000, 4,000,
    8,000 points per stream, seeds 0-2 (quick: n = 1,000 and 2,000, seed 0); writes ``sead.diagnose.json`` / ``.png``."""
    sizes, seeds = (DIAGNOSIS_SIZES[:2], (0,)) if quick else (DIAGNOSIS_SIZES, BENCH_SEEDS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def cell(n: str, seed: int) -> dict[str, float]:
            return _diagnosis_cell(int(n), seed)

        r = run_arms([str(n) for n in sizes], seeds, cell, prefix="n", log=print)
    finally:
        torch.set_num_threads(threads)
    series = {**{f"share {s:g}": "n{size}/" + f"share{s:g}/avg_rank" for s in DIAGNOSIS_SHARES},
              "best pool detector": "n{size}/best_detector/avg_rank", "kNN k = 5": "n{size}/knn5/avg_rank"}  # fmt: skip

    def plot(res: Mapping[str, Any], path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        plot_sweep(ax, res, [str(n) for n in sizes], list(sizes), series, "points per stream",
                   "average rank among the 13 pool detectors", title="SEAD's average rank by share rate and length",
                   log_x=True)  # fmt: skip
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    metrics = [f"share{s:g}/avg_rank" for s in DIAGNOSIS_SHARES] + ["best_detector/avg_rank", "knn5/avg_rank"]
    table = arm_table(r, [str(n) for n in sizes], metrics, "Diagnosis: average rank by stream length (rows) and "
                      f"share rate, seeds {list(seeds)}", prefix="n", fmt="{:.2f}")  # fmt: skip
    return conclude("sead.diagnose", r, out=out, plot=plot, tables=[table])


def _diagnosis_cell(n: int, seed: int) -> dict[str, float]:
    """SEAD at each share rate, the best pool detector and kNN k = 5: average rank over the six streams of length n."""
    from zoo.datamodules.streams import make_benchmark_stream
    from zoo.metrics.anomaly import average_precision
    from zoo.models.sead.benchmark import benchmark_pool, rank
    from zoo.models.sead.ensemble import SEADEnsemble

    ranks: dict[str, list[float]] = {}
    for kind in BENCHMARK_KINDS:
        x, y = make_benchmark_stream(kind, n=n, seed=seed)
        dim = x.shape[1]
        raw = SEADEnsemble(benchmark_pool(dim, "paper+knn"), dim, warmup=WARMUP, seed=seed)(x)["raw"]  # every detector
        aps = {}
        for share in DIAGNOSIS_SHARES:
            score = SEADEnsemble(benchmark_pool(dim), dim, warmup=WARMUP, seed=seed, share=share)(x)["score"]
            aps[f"share{share:g}"] = average_precision(score[WARMUP:], y[WARMUP:])
        detector_aps = [average_precision(raw[WARMUP:, i], y[WARMUP:]) for i in range(len(DETECTORS))]
        aps["knn5"] = average_precision(raw[WARMUP:, len(DETECTORS)], y[WARMUP:])
        for arm, value in aps.items():
            ranks.setdefault(arm, []).append(rank(value, detector_aps))
        for i, value in enumerate(detector_aps):
            ranks.setdefault(f"det{i}", []).append(rank(value, detector_aps[:i] + detector_aps[i + 1 :]))
    out = {f"{arm}/avg_rank": sum(v) / len(v) for arm, v in ranks.items() if not arm.startswith("det")}
    out["best_detector/avg_rank"] = min(sum(v) / len(v) for arm, v in ranks.items() if arm.startswith("det"))
    return out
