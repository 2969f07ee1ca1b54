"""``zoo reproduce rcsc``: RCSC against SMVSC, k-means, a dense spectral baseline and two stand-ins (card §5).

The RCSC card's §5 experiment with its review notes, on the card's synthetic views (``synthetic_views`` defaults:
K = 5 clusters of 300 points, views of 10 and 15 dimensions, 10 % gross corruption in view 1, a 200-d pure-noise
view), per seed (the data seed is the solver's seed), in plain loops over the pure-torch solver:

* **rcsc**: the card's reconstruction (P), m = 3K anchors, d = K, λ = 1, β = 1, 10 warm-up rounds with β = 0, then
  the one-pass partition (labels = G);
* **smvsc**: β = 0 with SMVSC's spectral post-processing (all m left singular vectors of Zᵀ, row-normalised,
  k-means): ``acc``/``nmi``/``ari`` from the k-means restart of lowest inertia of 10 (the solver's labels), and
  ``*_mean`` the mean over 10 single restarts (the review: a mean, never SMVSC's max over restarts);
* **concat-kmeans** and **best-view-kmeans**: scikit-learn k-means on the concatenated standardised views and on
  each view (the view with the highest NMI is kept: an oracle choice that favours the baseline), 5 restarts: the
  lowest-inertia one and the mean over the 5 (``*_mean``);
* **spectral-dense**: spectral clustering with a dense n × n RBF affinity (γ = 1 / (2 D) on the concatenated
  standardised views, D features); it is quadratic in n, the stand-in for the linear-time claim;
* stand-ins: **rcsc-iter0** (the method with 0 iterations: the k-means-initialised Z, uniform α, its spectral
  labels) and **random** (uniform random labels);
* report only: **rcsc-noise10** (the same data with a 10-d noise view: the review's control), **rcsc-no-warmup**
  (β on from the first round) and **rcsc-beta0.1** / **rcsc-beta10**.

Per arm: ACC (Hungarian-matched), NMI and ARI (torchmetrics, as ``RCSCModule`` logs them); for the solver arms also
the noise view's α and α's largest distance from uniform, the objective at initialisation and at the end, the largest
relative objective rise in the β = 0 rounds and in the joint rounds, Z's simplex violation, the NMI between the
one-pass labels and the spectral labels of the same Z, fit seconds and rounds. Scaling: CPU seconds of a fit
(``time.process_time``: the shared CPU's other jobs do not count) of rcsc at n ∈ {1.5k, 3k, 6k, 12k} and of
spectral-dense at n ∈ {750, 1.5k, 3k}, with tol = 0 and a fixed 20 rounds (10 β = 0, 10 joint), min of 3 repeats
taken in turn over the sizes, and the log-log slope.

The claims, the stand-in arms each must reject, the sanity checks and their calibration are in ``CLAIMS`` and
``CHECKS`` below.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics.functional.clustering import adjusted_rand_score, cluster_accuracy, normalized_mutual_info_score

from zoo.claims import Check, Claim
from zoo.datamodules.multiview import synthetic_views
from zoo.models.rcsc import solver as S
from zoo.models.rcsc.evaluation import (
    _concat,
    _kmeans,
    _restart_means,
    _scaling,
    _scores,
    _solver_metrics,
    dense_spectral_labels,
    fit_seconds,
    loglog_slope,
)
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "SETTINGS", "fit_seconds", "loglog_slope", "run"]

K = 5
SOLVER = {"n_clusters": K, "n_anchors": 3 * K, "latent_dim": K, "lam": 1.0}  # card §5: m = 3K, d = K, λ = 1
# solver arms -> their arguments on top of SOLVER (and the noise view's dimension)
VARIANTS: dict[str, dict[str, Any]] = {
    "rcsc": {"beta": 1.0},
    "smvsc": {"beta": 0.0, "partition": "spectral"},
    "rcsc-iter0": {"beta": 1.0, "max_iter": 0},
    "rcsc-noise10": {"beta": 1.0},
    "rcsc-no-warmup": {"beta": 1.0, "warmup": 0},
    "rcsc-beta0.1": {"beta": 0.1},
    "rcsc-beta10": {"beta": 10.0},
}
NOISE_DIM = {"rcsc-noise10": 10}  # every other arm: the card's 200-d noise view
ARMS = ("rcsc", "smvsc", "concat-kmeans", "best-view-kmeans", "spectral-dense", "rcsc-iter0", "random",
        "rcsc-noise10", "rcsc-no-warmup", "rcsc-beta0.1", "rcsc-beta10")  # fmt: skip
METRICS = ("acc", "nmi", "ari", "acc_mean", "nmi_mean")
DIAGNOSTICS = ("alpha_noise", "alpha_shift", "obj_drop", "beta0_max_rise", "joint_max_rise", "z_min", "z_sum_err",
               "agreement_nmi", "fit_seconds", "iterations")  # fmt: skip
SCALING_ROUNDS = 20  # 10 warm-up rounds with β = 0 and 10 joint rounds, what the default stop rule runs at least
SETTINGS = {
    "full": {"seeds": (0, 1, 2), "sizes": (1500, 3000, 6000, 12000), "dense_sizes": (750, 1500, 3000), "repeats": 3},
    "quick": {"seeds": (0,), "sizes": (1500, 6000), "dense_sizes": (750, 1500, 3000), "repeats": 3},
}


class _Experiment:
    """``arm(name, seed) -> metrics`` for ``run_arms``: a seed's views are made once and shared by its arms."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.s = settings
        self.cache: dict[tuple[int, int], tuple[list[Tensor], Tensor]] = {}

    def _data(self, seed: int, noise_dim: int = 200) -> tuple[list[Tensor], Tensor]:
        if (seed, noise_dim) not in self.cache:
            self.cache = {k: v for k, v in self.cache.items() if k[0] == seed}
            self.cache[seed, noise_dim] = synthetic_views(n_clusters=K, noise_dim=noise_dim, seed=seed)
        return self.cache[seed, noise_dim]

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        views, y = self._data(seed, NOISE_DIM.get(arm, 200))
        if arm in VARIANTS:
            start = time.perf_counter()
            model = S.RCSC(**SOLVER, **VARIANTS[arm], seed=seed).fit(views)
            m = _solver_metrics(model, y, time.perf_counter() - start)
            if arm == "smvsc":  # the review: the mean over single k-means restarts of SMVSC's post-processing
                m |= _restart_means([S.spectral_labels(model.Z_, K, None, 1000 * seed + i, n_init=1)
                                     for i in range(10)], y)  # fmt: skip
            if arm == "rcsc":
                m |= _scaling(lambda v: S.RCSC(**SOLVER, beta=1.0, tol=0.0, max_iter=SCALING_ROUNDS, seed=seed).fit(v),
                              self.s["sizes"], seed, self.s["repeats"])  # fmt: skip
            return m
        if arm == "concat-kmeans":
            return _kmeans(_concat(views), y, seed)
        if arm == "best-view-kmeans":
            per_view = [_kmeans(_concat([v]), y, seed) | {"view": float(i)} for i, v in enumerate(views)]
            return max(per_view, key=lambda m: m["nmi"])
        if arm == "spectral-dense":
            start = time.perf_counter()
            m = _scores(dense_spectral_labels(views, seed), y) | {"fit_seconds": time.perf_counter() - start}
            return m | _scaling(lambda v: dense_spectral_labels(v, seed), self.s["dense_sizes"], seed,
                                self.s["repeats"])  # fmt: skip
        if arm == "random":
            g = torch.Generator().manual_seed(seed)
            return _scores(torch.randint(K, y.shape, generator=g), y)
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")


def _minus_smvsc_nmi(r: Mapping[str, Any], a: str) -> float:
    """Arm ``a``'s NMI minus SMVSC's, SMVSC read the stronger way (lowest-inertia restart or restart mean)."""
    return r[f"{a}/nmi"] - max(r["smvsc/nmi"], r["smvsc/nmi_mean"])


_RANDOM = "uniformly random labels in RCSC's place"
_ITER0 = "RCSC with 0 iterations: the k-means-initialised Z, uniform α, the spectral labels of that Z"
_DENSE = "spectral clustering on a dense n × n RBF affinity in RCSC's place (no anchors: quadratic in n)"

# Calibration (``OMP_NUM_THREADS=1 python -c "from zoo.models.rcsc.reproduce import run; run(out='/tmp/rcsc-full')"``,
# seeds 0, 1, 2; the quick run is seed 0 of the full run with the same numbers, except the timings): each claim's
# value for the method | each stand-in, per seed 0 / 1 / 2. Bounds sit below (above, for ``at_most``) the weakest
# method value with room, and every stand-in is far on the other side.
#
#   rcsc_acc_at_least_0.90                 rcsc 0.951 / 0.958 / 0.961       | random 0.229 / 0.218 / 0.222
#   rcsc_objective_fell_by_half_from_init  rcsc 0.791 / 0.789 / 0.791       | rcsc-iter0 0 / 0 / 0
#   rcsc_alpha_moved_0.1_from_uniform      rcsc 0.309 / 0.309 / 0.309       | rcsc-iter0 0 / 0 / 0
#   high_dim_noise_view_alpha_at_most_0.1  rcsc 0.0241 / 0.0245 / 0.0242    | rcsc-iter0 0.333 (uniform)
#   rcsc_fit_time_loglog_slope_at_most_1.25  rcsc 1.045 / 1.078 / 1.099 over n in {1.5k, 3k, 6k, 12k} in CPU seconds
#       (t(12k)/t(1.5k) 8.8 / 9.6 / 9.8; quick, n in {1.5k, 6k}: 1.08, 1.10 in two runs) | spectral-dense 2.26 / 2.31 /
#       2.30 over {750, 1.5k, 3k}. In wall-clock seconds the slope was 1.12 / 1.10 / 1.15, and one quick run under the
#       neighbour job's load gave 1.31, hence CPU time and repeats taken in turn over the sizes. 1.25 (13.5x for 8x n)
#       rather than the review's 1.2 leaves room for cache contention when the tests run in parallel, and keeps
#       linear and quadratic far apart. The slope is above 1 mostly because the initial k-means (m centres, sklearn's
#       default tolerance) needs more Lloyd iterations at larger n: 18 at 1.5k, 51 at 12k (seed 0; 0.05 s vs 0.5 s).
#   reported: low_dim_noise_view_alpha_at_most_0.1  rcsc-noise10 0.360 / 0.362 / 0.359 | rcsc-iter0 0.333
#   reported: rcsc_acc_at_least_0.90_with_low_dim_noise_view  rcsc-noise10 0.846 / 0.857 / 0.881 | random as above
#   reported: rcsc_acc_beats_concat_kmeans  rcsc -0.032 / -0.025 / -0.029 | random -0.754 / -0.765 / -0.768
#
# Checks, per seed: NMI(rcsc) - max(SMVSC's NMI, its restart mean) +0.051 / +0.014 / +0.024 (SMVSC 0.791 / 0.846 /
# 0.843 at the lowest inertia, 0.672 / 0.806 / 0.808 as the restart mean); one-pass vs spectral NMI 0.875 / 0.897 /
# 0.932; min Z 0 on every seed; max |column sum - 1| <= 5.6e-16; largest relative rise of a beta = 0 round -1.4e-4
# (every round fell), of a joint round -2.7e-5. Not a stand-in: rcsc-iter0's ACC is 0.849 / 0.867 / 0.985, it passes
# assertion 1 on seed 2 (and the NMI non-inferiority on the means), as the review warned.
CLAIMS = (
    Claim(
        "rcsc_acc_at_least_0.90",
        lambda r, a: r[f"{a}/acc"],
        at_least=0.90,
        method="rcsc",
        stand_ins={"random": _RANDOM},
        text="RCSC's one-pass partition reaches ACC ≥ 0.90 on the card's views (card §5 assertion 1)",
    ),
    Claim(
        "rcsc_objective_fell_by_half_from_init",
        lambda r, a: r[f"{a}/obj_drop"],
        at_least=0.5,
        method="rcsc",
        stand_ins={"rcsc-iter0": _ITER0},
        text="the alternating updates do the work: the final objective is ≤ half the initial one (review: assertion "
        "1 alone passes for the initialisation's labels)",
    ),
    Claim(
        "rcsc_alpha_moved_0.1_from_uniform",
        lambda r, a: r[f"{a}/alpha_shift"],
        at_least=0.1,
        method="rcsc",
        stand_ins={"rcsc-iter0": _ITER0},
        text="the view weights were learned: some α_v is ≥ 0.1 away from 1/V (review)",
    ),
    Claim(
        "high_dim_noise_view_alpha_at_most_0.1",
        lambda r, a: r[f"{a}/alpha_noise"],
        at_most=0.1,
        method="rcsc",
        stand_ins={"rcsc-iter0": _ITER0},
        text="a 200-d pure-noise view gets α ≤ 0.1 (card §5 assertion 3, named for what it tests: α_v ∝ 1/R_v "
        "tracks the view's dimension, see the 10-d control)",
    ),
    Claim(
        "low_dim_noise_view_alpha_at_most_0.1",
        lambda r, a: r[f"{a}/alpha_noise"],
        at_most=0.1,
        method="rcsc-noise10",
        stand_ins={"rcsc-iter0": _ITER0},
        asserted=False,
        text="the review's control: a 10-d pure-noise view also gets α ≤ 0.1; reported, not asserted: it does not "
        "hold (α ≈ 0.36), the weight tracks the view's dimension, not its information",
    ),
    Claim(
        "rcsc_acc_at_least_0.90_with_low_dim_noise_view",
        lambda r, a: r[f"{a}/acc"],
        at_least=0.90,
        method="rcsc-noise10",
        stand_ins={"random": _RANDOM},
        asserted=False,
        text="assertion 1 with the 10-d noise view; reported, not asserted: the review measured ACC 0.83-0.87",
    ),
    Claim(
        "rcsc_fit_time_loglog_slope_at_most_1.25",
        lambda r, a: r[f"{a}/time_slope"],
        at_most=1.25,
        method="rcsc",
        stand_ins={"spectral-dense": _DENSE},
        text="linear cost in n: the log-log slope of a fit's CPU seconds (tol = 0, 20 rounds, min of 3) over n is "
        "≤ 1.25 (card §5 assertion 6 as the review restates it, with the margin of the calibration above)",
    ),
    Claim(
        "rcsc_acc_beats_concat_kmeans",
        lambda r, a: r[f"{a}/acc"] - r["concat-kmeans/acc"],
        at_least=0.0,
        method="rcsc",
        stand_ins={"random": _RANDOM},
        asserted=False,
        text="RCSC's ACC ≥ k-means on the concatenated views (5 restarts, lowest inertia); reported, not asserted: "
        "the card says concat k-means wins on this toy",
    ),
)
CHECKS = (
    Check(
        "rcsc_nmi_within_0.02_of_smvsc",
        lambda r: _minus_smvsc_nmi(r, "rcsc"),
        at_least=-0.02,
        text="non-inferiority (card §5 assertion 2): RCSC's NMI ≥ SMVSC's − 0.02, SMVSC read the stronger way; a "
        "check, not a claim: SMVSC in RCSC's place passes it by construction, only a random partition fails it",
    ),
    Check(
        "one_pass_labels_agree_with_spectral_nmi_0.85",
        lambda r: r["rcsc/agreement_nmi"],
        at_least=0.85,
        text="RCSC's one-pass labels G and the spectral labels of the same Z agree (NMI ≥ 0.85; review)",
    ),
    Check(
        "z_nonnegative_1e-7",
        lambda r: min(r["rcsc/z_min"], r["smvsc/z_min"]),
        at_least=-1e-7,
        text="every entry of Z is ≥ -1e-7 (card §5 assertion 4), RCSC and SMVSC",
    ),
    Check(
        "z_columns_sum_to_one_1e-5",
        lambda r: max(r["rcsc/z_sum_err"], r["smvsc/z_sum_err"]),
        at_most=1e-5,
        text="every column of Z sums to 1 within 1e-5 (card §5 assertion 4), RCSC and SMVSC",
    ),
    Check(
        "beta0_objective_monotone_1e-6",
        lambda r: max(r["rcsc/beta0_max_rise"], r["smvsc/beta0_max_rise"]),
        at_most=1e-6,
        text="no β = 0 round raises the objective by more than 1e-6 relative (card §5 assertion 5): RCSC's warm-up "
        "and every SMVSC round",
    ),
    Check(
        "joint_objective_monotone_1e-6",
        lambda r: r["rcsc/joint_max_rise"],
        at_most=1e-6,
        text="no joint (β > 0) round of RCSC raises its objective by more than 1e-6 relative",
    ),
)


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the arms over 3 seeds, print the tables and claims, and (with ``out``) write ``rcsc.json`` and
    ``rcsc.png``. ``quick``: seed 0 only, rcsc timed at n ∈ {1.5k, 6k}.

    Returns:
        flat results: ``<arm>/<metric>`` (``acc``, ``nmi``, ``ari``, the restart means ``*_mean``, the solver
        diagnostics, timings ``t<n>``, ``time_slope``), each also per seed (``.../seed<s>``), and the verdicts
        ``claims/...``, ``reported/...``, ``checks/...``, ``values/...``.
    """
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # n x 15 anchor graphs: extra threads only add overhead, and timings stay comparable
    try:
        with threadpool_limits(1):
            return _run(SETTINGS["quick" if quick else "full"], out)
    finally:
        torch.set_num_threads(threads)


def _run(settings: Mapping[str, Any], out: Path | str | None) -> dict[str, Any]:
    start = time.perf_counter()
    seeds = settings["seeds"]
    warm_views, _ = synthetic_views(n_per=40, n_clusters=K, noise_dim=20, seed=0)
    S.RCSC(**SOLVER, seed=0).fit(warm_views)  # one-off start-up costs (allocator, sklearn) stay out of the timings
    r: dict[str, Any] = {"num_seeds": len(seeds), "scaling_rounds": SCALING_ROUNDS, "repeats": settings["repeats"]}
    run_arms(list(ARMS), seeds, _Experiment(settings), results=r)
    r["seconds"] = time.perf_counter() - start
    scores = arm_table(r, ARMS, METRICS, f"RCSC card §5 views (n = 1,500, K = 5): mean ± std of {len(seeds)} seeds")
    solver_arms = tuple(VARIANTS)
    diagnostics = arm_table(r, solver_arms, DIAGNOSTICS, "solver diagnostics", fmt="{:.3g}")
    sizes = sorted(set(settings["sizes"]) | set(settings["dense_sizes"]))
    timing = arm_table(r, ("rcsc", "spectral-dense"), [*(f"t{n}" for n in sizes), "time_slope", "time_ratio"],
                       f"fit CPU seconds vs n (tol = 0, {SCALING_ROUNDS} rounds, min of {settings['repeats']})",
                       fmt="{:.3g}")  # fmt: skip
    notes = [
        (
            f"noise view α: {r['rcsc/alpha_noise']:.3f} with 200 dimensions, {r['rcsc-noise10/alpha_noise']:.3f} with "
            f"10 (ACC {r['rcsc/acc']:.3f} vs {r['rcsc-noise10/acc']:.3f}): the weight follows the view's dimension"
        ),
        (
            f"rcsc t(n_max)/t(n_min) = {r['rcsc/time_ratio']:.2f} for {r['rcsc/n_ratio']:.0f}x the samples (card: "
            f"≤ 12x for 8x); log-log slope {r['rcsc/time_slope']:.2f} (spectral-dense "
            f"{r['spectral-dense/time_slope']:.2f})"
        ),
        (
            f"k-means restarts: concat k-means ACC {r['concat-kmeans/acc']:.3f} at the lowest inertia, "
            f"{r['concat-kmeans/acc_mean']:.3f} mean over restarts; SMVSC {r['smvsc/acc']:.3f} / "
            f"{r['smvsc/acc_mean']:.3f}"
        ),
        (
            f"without the warm-up RCSC scores ACC {r['rcsc-no-warmup/acc']:.3f} (with: {r['rcsc/acc']:.3f}); "
            f"β = 0.1 / 10: {r['rcsc-beta0.1/acc']:.3f} / {r['rcsc-beta10/acc']:.3f}; total {r['seconds']:.0f} s"
        ),
    ]
    return conclude("rcsc", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=[scores, diagnostics, timing],
                    notes=notes)  # fmt: skip


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1.6, 1]})
    arms = [a for a in ARMS if f"{a}/acc" in r]
    x = np.arange(len(arms))
    for i, metric in enumerate(("acc", "nmi")):
        ax.bar(x + (i - 0.5) * 0.4, [r[f"{a}/{metric}"] for a in arms], 0.4, label=metric.upper())
        means = [(j, r[f"{a}/{metric}_mean"]) for j, a in enumerate(arms) if f"{a}/{metric}_mean" in r]
        if means:
            ax.scatter([j + (i - 0.5) * 0.4 for j, _ in means], [v for _, v in means], color="k", marker="_", s=120,
                       zorder=3, label="mean over k-means restarts" if i == 0 else None)  # fmt: skip
    ax.set_xticks(x, arms, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1.18)
    ax.set_title("clustering scores (mean over seeds)")
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    for arm, marker in (("rcsc", "o"), ("spectral-dense", "s")):
        ns = sorted(int(k.split("/t")[1]) for k in r if k.startswith(f"{arm}/t") and k.split("/t")[1].isdigit())
        if ns:
            ax_t.plot(ns, [r[f"{arm}/t{n}"] for n in ns], marker=marker,
                      label=f"{arm} (slope {r[f'{arm}/time_slope']:.2f})")  # fmt: skip
    ns = sorted(int(k.split("/t")[1]) for k in r if k.startswith("rcsc/t") and k.split("/t")[1].isdigit())
    if ns:
        ref = np.array([min(ns) / 2, max(ns)])
        ax_t.plot(ref, r[f"rcsc/t{ns[0]}"] * ref / ns[0], "k--", linewidth=1, label="slope 1 (linear)")
    ax_t.set_xscale("log")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("n (samples)")
    ax_t.set_ylabel(f"fit CPU seconds ({SCALING_ROUNDS} rounds, tol = 0, min of 3)")
    ax_t.set_title("fit time vs n")
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
