"""``zoo reproduce rcsc``: does RCSC cluster multi-view data better, and cheaper, than what it competes with?

No official code exists: RCSC is the card's reconstruction (P), SMVSC's objective plus a one-pass partition term,
solved by ``solver.RCSC`` with each view scaled to equal energy. The task (``unequal_views``, n = 1,500, K = 5):
a good view with 10 % gross corruption, a weak view, a redundant copy of the good one, and a 1,000-d pure-noise view,
so that no single view suffices and a per-feature concatenation drowns in noise. Every arm sees the same views:

* the method, **rcsc** (m = 3K anchors, d = K, λ = 1, β = 1, 10 warm-up rounds at β = 0, one-pass labels G);
* baselines (the anchor-graph methods of the paper's comparisons, as their official code runs them,
  ``baselines.py``): **smvsc** (``algo_qp.m``: the mean over 10 k-means restarts; its reported maximum is
  ``smvsc/acc_max``) and **lmvsc** (``lmv.m``);
* ablations: **beta0** (no partition term: SMVSC's objective with our solver and its spectral labels),
  **uniform-alpha** (α fixed at 1/V), **no-simplex** (Z without Z ≥ 0 and 1ᵀZ = 1ᵀ: the ridge step) and
  **mapstd** (SMVSC's view scaling instead of equal energies);
* alternatives: **concat-kmeans** (k-means on the per-feature standardised concatenation), **concat-kmeans-equal**
  (the same with each view scaled to equal energy, the practitioner's fix for a large view) and
  **best-view-kmeans** (k-means on the single view with the best NMI: an oracle choice); **random** labels.

Efficiency is measured on the card's views (n from 1,500 to 12,000): CPU seconds of a fit (tol = 0, 20 rounds, min
of 3) for rcsc, the dense spectral baseline (an n × n graph) and concat k-means, and each log-log slope.

What the run shows (the page's verdict table has the numbers): RCSC clusters these views well where a per-feature
concatenation and any single view fail (the task check), but its distinguishing parts do not matter here (β = 0,
uniform α and no simplex constraint score the same) and k-means on the equal-energy concatenation is better; its cost
is linear in n, as k-means' is. Every claim is therefore reported, not asserted, with a diagnosis
(``zoo reproduce rcsc --diagnose``: the gaps over n).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.cluster import KMeans
from torch import Tensor

from zoo.claims import Check, Claim, TaskCheck
from zoo.datamodules.multiview import synthetic_views, unequal_views
from zoo.evidence import Headline
from zoo.models.rcsc import baselines as B
from zoo.models.rcsc import solver as S
from zoo.models.rcsc.evaluation import (
    _concat,
    _kmeans,
    _restart_means,
    _scaling,
    _scores,
    _solver_metrics,
    dense_spectral_labels,
)
from zoo.reporting import arm_table, conclude, plot_sweep, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "HEADLINES", "diagnose", "run"]

K = 5
SOLVER = {"n_clusters": K, "n_anchors": 3 * K, "latent_dim": K, "lam": 1.0}  # card §5: m = 3K, d = K, λ = 1
VARIANTS: dict[str, dict[str, Any]] = {
    "rcsc": {"beta": 1.0},
    "beta0": {"beta": 0.0, "partition": "spectral"},
    "uniform-alpha": {"beta": 1.0, "weights": "uniform"},
    "no-simplex": {"beta": 1.0, "constraint": "none"},
    "mapstd": {"beta": 1.0, "view_scale": "mapstd"},
}
ARMS = (*VARIANTS, "smvsc", "lmvsc", "concat-kmeans", "concat-kmeans-equal", "best-view-kmeans", "random")
METRICS = ("acc", "nmi", "ari", "fit_seconds")
SCALING_ROUNDS = 20  # 10 warm-up rounds with β = 0 and 10 joint rounds, what the default stop rule runs at least
SETTINGS = {
    "full": {"seeds": (0, 1, 2), "sizes": (1500, 3000, 6000, 12000), "dense_sizes": (750, 1500, 3000), "repeats": 3},
    "quick": {"seeds": (0, 1, 2), "sizes": (1500, 6000), "dense_sizes": (750, 1500, 3000), "repeats": 2},
}


def _equal_energy(views: list[Tensor]) -> np.ndarray:
    """The per-feature standardised views, each divided by √(its features): every view weighs the same."""
    return np.concatenate([_concat([v]) / v.shape[1] ** 0.5 for v in views], 1)


class _Experiment:
    """``arm(name, seed) -> metrics`` for ``run_arms``: a seed's views are made once and shared by its arms."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.s = settings
        self.cache: dict[int, tuple[list[Tensor], Tensor]] = {}

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        if seed not in self.cache:
            self.cache = {seed: unequal_views(n_clusters=K, seed=seed)}
        views, y = self.cache[seed]
        start = time.perf_counter()
        if arm in VARIANTS:
            model = S.RCSC(**SOLVER, **VARIANTS[arm], seed=seed).fit(views)
            m = _solver_metrics(model, y, time.perf_counter() - start)
            if arm == "rcsc":
                m |= _scaling(lambda v: S.RCSC(**SOLVER, beta=1.0, tol=0.0, max_iter=SCALING_ROUNDS, seed=seed).fit(v),
                              self.s["sizes"], seed, self.s["repeats"])  # fmt: skip
            return m
        if arm == "smvsc":
            out = B.smvsc(views, 3 * K, K)
            runs = B.spectral_restarts(out.U, K, 10, seed)
            means = _restart_means(runs, y, K)
            best = max(_scores(r, y, K)["acc"] for r in runs)
            return {k.removesuffix("_mean"): v for k, v in means.items()} | {"acc_max": best,
                    "fit_seconds": time.perf_counter() - start, "alpha_noise": float(out.alpha[-1])}  # fmt: skip
        if arm == "lmvsc":
            return _scores(B.lmvsc(views, K, 3 * K, seed=seed), y, K) | {"fit_seconds": time.perf_counter() - start}
        if arm == "concat-kmeans":
            m = _kmeans(_concat(views), y, seed) | {"fit_seconds": time.perf_counter() - start}
            return m | _scaling(lambda v: KMeans(K, n_init=5, random_state=seed).fit(_concat(v)), self.s["sizes"], seed,
                                self.s["repeats"])  # fmt: skip
        if arm == "concat-kmeans-equal":
            return _kmeans(_equal_energy(views), y, seed) | {"fit_seconds": time.perf_counter() - start}
        if arm == "best-view-kmeans":
            per_view = [_kmeans(_concat([v]), y, seed) | {"view": float(i)} for i, v in enumerate(views)]
            return max(per_view, key=lambda m: m["nmi"])
        if arm == "random":
            g = torch.Generator().manual_seed(seed)
            return _scores(torch.randint(K, y.shape, generator=g), y)
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")


def _dense_scaling(seed: int, settings: Mapping[str, Any]) -> dict[str, float]:
    """The dense spectral baseline's CPU seconds over n (an n × n affinity: the non-anchor stand-in for cost)."""
    return _scaling(lambda v: dense_spectral_labels(v, seed), settings["dense_sizes"], seed, settings["repeats"])


_BASELINES = {
    "smvsc": "SMVSC as its official algo_qp.m runs it (mean over 10 k-means restarts)",
    "lmvsc": "LMVSC as its official lmv.m runs it (per-view anchors, stacked graphs, SVD, k-means)",
}
_ABLATIONS = {
    "beta0": "no partition term (β = 0): SMVSC's objective with RCSC's solver, spectral labels",
    "uniform-alpha": "the view weights fixed at 1/V",
    "no-simplex": "Z without its non-negative and affine constraints (the ridge step)",
    "mapstd": "SMVSC's view scaling (standardised features only) instead of equal view energies",
}
_ALTERNATIVES = {
    "concat-kmeans": "k-means on the per-feature standardised concatenation of the views",
    "concat-kmeans-equal": "k-means on the concatenation with each view scaled to equal energy",
    "best-view-kmeans": "k-means on the single best view (chosen by NMI: an oracle)",
}

# Calibration: `OMP_NUM_THREADS=1 python -c "from zoo.models.rcsc.reproduce import _run, SETTINGS; ..."` over seeds
# 0-4 at the full setting (quick runs the same seeds on the same data; its timings differ). Per seed 0 / 1 / 2 / 3 / 4:
# ACC        rcsc .914 .885 .903 .920 .945 | beta0 .917 .884 .899 .915 .943 | uniform-alpha .913 .880 .900 .917 .944
#            no-simplex .915 .891 .903 .918 .944 | mapstd .915 .901 .905 .925 .949 | smvsc (restart mean) .628 .499 .549
#            .625 .669 (its reported max .721 .557 .627) | lmvsc .657 .603 .693 .534 .721 | concat-kmeans .243 .279 .292
#            .316 .389 | concat-kmeans-equal .939 .929 .943 .937 .956 | best-view-kmeans .802 .764 .849 .821 .867
# task check (rcsc − the better heuristic): .112 .121 .054 .099 .078, hence the margin 0.04
# time slope (seeds 0-2): rcsc 1.149 1.134 1.140; concat-kmeans 1.352 1.253 1.267 (more Lloyd iterations at larger
#            n, not a higher complexity: too close to any bound to reject it); spectral-dense 2.26
# checks (seeds 0-2): one-pass vs spectral NMI .997 .995 .995; Z off the simplex by 4.4e-16; largest relative rise of
#            a round −3.4e-6 / −4.1e-7 / −9.5e-7 (every round fell)
CLAIMS = [
    Claim(
        "rcsc_acc_at_least_0.85",
        lambda r, a: r[f"{a}/acc"],
        at_least=0.85,
        method="rcsc",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text="RCSC clusters the views of unequal quality with ACC ≥ 0.85 (reported: its ablations and the "
        "equal-energy concatenation reach it too)",
    ),
    Claim(
        "one_pass_partition_beats_two_stage_by_0.02",
        lambda r, a: r[f"{a}/acc"] - r["beta0/acc"],
        at_least=0.02,
        method="rcsc",
        baselines={"lmvsc": _BASELINES["lmvsc"]},
        ablations={k: v for k, v in _ABLATIONS.items() if k != "beta0"},
        alternatives={"concat-kmeans-equal": _ALTERNATIVES["concat-kmeans-equal"]},
        asserted=False,
        text="learning the partition jointly with the anchor graph (β = 1) beats the two-stage graph-then-spectral "
        "pipeline (β = 0) by ≥ 0.02 ACC (reported: the two tie)",
    ),
    Claim(
        "rcsc_fit_time_loglog_slope_at_most_1.25",
        lambda r, a: r[f"{a}/time_slope"],
        at_most=1.25,
        method="rcsc",
        baselines={"spectral-dense": "spectral clustering on a dense n × n affinity (no anchors: quadratic in n)"},
        alternatives={"concat-kmeans": _ALTERNATIVES["concat-kmeans"]},
        why_none={"ablations": "without anchors the method is the dense graph, the baseline here"},
        asserted=False,
        text="linear cost in n: the log-log slope of a fit's CPU seconds (tol = 0, 20 rounds, min of 3) over n is "
        "≤ 1.25 (reported: k-means is linear too, and faster)",
    ),
]
CHECKS = [
    TaskCheck(
        lambda r, a: r[f"{a}/acc"],
        method="rcsc",
        heuristics={k: _ALTERNATIVES[k] for k in ("concat-kmeans", "best-view-kmeans")},
        margin=0.04,
        text="the task needs more than one view and more than a plain concatenation",
    ),
    Check(
        "one_pass_labels_agree_with_spectral_nmi_0.85",
        lambda r: r["rcsc/agreement_nmi"],
        at_least=0.85,
        text="RCSC's one-pass labels G and the spectral labels of the same Z agree (NMI ≥ 0.85; card review)",
    ),
    Check(
        "z_on_the_simplex_1e-5",
        lambda r: max(-r["rcsc/z_min"], r["rcsc/z_sum_err"], -r["beta0/z_min"], r["beta0/z_sum_err"]),
        at_most=1e-5,
        text="every column of Z is on the simplex within 1e-5 (card §5 assertion 4), RCSC and β = 0",
    ),
    Check(
        "objective_monotone_1e-6",
        lambda r: max(r["rcsc/beta0_max_rise"], r["rcsc/joint_max_rise"], r["beta0/beta0_max_rise"]),
        at_most=1e-6,
        text="no round raises the objective by more than 1e-6 relative (card §5 assertion 5), warm-up and joint",
    ),
]
HEADLINES = [
    Headline(
        "better_than_anchor_graph_methods",
        "Learning consensus anchors, the anchor graph and the partition jointly, with robust view weights, clusters "
        "multi-view data better than anchor-graph multi-view methods",
        claims=["rcsc_acc_at_least_0.85", "one_pass_partition_beats_two_stage_by_0.02"],
        paper="better ACC / NMI on eight multi-view datasets (tables not retrieved)",
        diagnosis=(
            "On views of unequal quality RCSC reaches ACC 0.89-0.95 where k-means on the per-feature concatenation "
            "(0.24-0.39), the best single view (0.76-0.87), SMVSC as its code runs (0.50-0.67) and LMVSC (0.53-0.72) "
            "do not (seeds 0-4). But its distinguishing parts do nothing here: without the partition term (β = 0), "
            "with uniform view weights, without the simplex constraint or with SMVSC's view scaling it scores the "
            "same within 0.016, and k-means on the views scaled to equal energy beats it (0.93-0.96): the gain over "
            "the concatenation is the view scaling, which k-means takes too. The sweep over n (zoo reproduce rcsc "
            "--diagnose: 750, 1,500, 3,000 samples) keeps RCSC within 0.007 of β = 0 and 0.024-0.036 below the "
            "equal-energy k-means at every size, so scale does not close it. No official RCSC code exists: the cause "
            "cannot be split between the card's reconstruction and the setting; the lineage's official code (SMVSC, "
            "ported from algo_qp.m and pinned to a QP solver) is the weakest arm here."
        ),
    ),
    Headline(
        "linear_in_n",
        "Anchors make the method efficient: its cost grows linearly with the number of samples",
        claims=["rcsc_fit_time_loglog_slope_at_most_1.25"],
        paper="linear complexity; running-time table (not retrieved)",
        diagnosis=(
            "The cost is linear in n, as claimed: the fit's CPU time grows with slope 1.13-1.15 from 1,500 to 12,000 "
            "samples, against 2.26 for spectral clustering on a dense n × n graph. Not asserted: k-means on the "
            "concatenated views is linear as well and 8x faster or more at every size (0.41 s against 3.32 s at n = 12,000); "
            "its measured slope (1.25-1.35, from more Lloyd iterations at larger n) is too close to any bound to "
            "reject it honestly."
        ),
    ),
]


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run every arm on seeds 0-2, print the tables, claims and verdict, and (with ``out``) write ``rcsc.json``,
    ``.png``, ``.claims.md`` and ``.verdict.md``. ``quick``: rcsc and k-means timed at n ∈ {1.5k, 6k}, 2 repeats.

    Returns:
        flat results: ``<arm>/<metric>`` (``acc``, ``nmi``, ``ari``, the solver diagnostics, timings ``t<n>``,
        ``time_slope``), each also per seed, and the verdicts.
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
    run_arms(["spectral-dense"], seeds[:1], lambda arm, seed: _dense_scaling(seed, settings), results=r, log=None)
    r["seconds"] = time.perf_counter() - start
    scores = arm_table(r, ARMS, METRICS, f"views of unequal quality (n = 1,500, K = 5, a 1,000-d noise view): mean ± "
                       f"std of {len(seeds)} seeds")  # fmt: skip
    diagnostics = arm_table(r, tuple(VARIANTS), ("alpha_noise", "alpha_shift", "obj_drop", "agreement_nmi",
                            "iterations"), "solver diagnostics", fmt="{:.3g}")  # fmt: skip
    sizes = sorted(set(settings["sizes"]) | set(settings["dense_sizes"]))
    timing = arm_table(r, ("rcsc", "concat-kmeans", "spectral-dense"), [*(f"t{n}" for n in sizes), "time_slope"],
                       f"fit CPU seconds vs n on the card's views (min of {settings['repeats']})",
                       fmt="{:.3g}")  # fmt: skip
    return conclude("rcsc", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=[scores, diagnostics, timing],
                    headlines=HEADLINES)  # fmt: skip


def _plot(r: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_t) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1.6, 1]})
    arms = [a for a in ARMS if f"{a}/acc" in r]
    x = np.arange(len(arms))
    colours = ["tab:blue" if a == "rcsc" else "tab:orange" if a in _BASELINES else "tab:grey" if a in _ABLATIONS
               else "tab:green" if a in _ALTERNATIVES else "k" for a in arms]  # fmt: skip
    ax.bar(x, [r[f"{a}/acc"] for a in arms], color=colours)
    ax.set_xticks(x, arms, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("ACC (mean over seeds)")
    ax.set_title("method (blue), baselines (orange), ablations (grey), alternatives (green)")
    for arm, marker in (("rcsc", "o"), ("concat-kmeans", "^"), ("spectral-dense", "s")):
        ns = sorted(int(k.split("/t")[1]) for k in r if k.startswith(f"{arm}/t") and k.split("/t")[1].isdigit())
        if ns:
            ax_t.plot(ns, [r[f"{arm}/t{n}"] for n in ns], marker=marker,
                      label=f"{arm} (slope {r[f'{arm}/time_slope']:.2f})")  # fmt: skip
    ax_t.set_xscale("log")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("n (samples)")
    ax_t.set_ylabel("fit CPU seconds (min of repeats)")
    ax_t.set_title("fit time vs n (card's views)")
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- diagnosis -----------------------------------------------------------------------------------------------------

DIAGNOSIS_ARMS = ("rcsc", "beta0", "lmvsc", "concat-kmeans-equal")


def diagnose(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Do the gaps close with scale? RCSC, its β = 0 ablation, LMVSC and the equal-energy k-means on the same views
    at n = 750, 1,500 and 3,000 (quick: 750, 1,500), seeds 0-2; writes ``rcsc.diagnose.json`` / ``.png``."""
    sizes = (750, 1500) if quick else (750, 1500, 3000)
    names = [f"n{n}" for n in sizes]

    def cell(size: str, seed: int) -> dict[str, float]:
        views, y = unequal_views(n_per=int(size[1:]) // K, n_clusters=K, seed=seed)
        out = {}
        for arm in DIAGNOSIS_ARMS:
            if arm in VARIANTS:
                labels = S.RCSC(**SOLVER, **VARIANTS[arm], seed=seed).fit(views).labels_
            elif arm == "lmvsc":
                labels = B.lmvsc(views, K, 3 * K, seed=seed)
            else:
                labels = KMeans(K, n_init=5, random_state=seed).fit_predict(_equal_energy(views))
            out[f"{arm}/acc"] = _scores(labels, y, K)["acc"]
        return out

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        r = run_arms(names, SETTINGS["full"]["seeds"], cell, log=print)

    def plot(res: Mapping[str, Any], path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4))
        plot_sweep(ax, res, names, sizes, {a: "{size}/" + f"{a}/acc" for a in DIAGNOSIS_ARMS}, "samples n", "ACC",
                   title="views of unequal quality: ACC over n (mean ± std, 3 seeds)", log_x=True)  # fmt: skip
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    table = arm_table(r, names, [f"{a}/acc" for a in DIAGNOSIS_ARMS], "Diagnosis: ACC over n", fmt="{:.3f}")
    return conclude("rcsc.diagnose", r, out=out, plot=plot, tables=[table])
