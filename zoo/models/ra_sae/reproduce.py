"""``zoo reproduce ra-sae``: RA-SAE against the paper's SAEs, its own ablations (the k-means start without the
constraint, the constraint without training) and the classical dictionaries, on stability, reconstruction and the
paper's two benchmarks.

The RA-SAE card's §5 experiment with the arms of ``experiment.py`` (64 atoms, 3 codes per sample, 3,000 Adam steps):

* **stability and reconstruction**: synthetic sparse concepts (d = 32, k* = 256 true concepts, 3 per sample,
  n = 20,000, 4,000 held out), raw and centred; run r trains on its own random half of the rest with its own
  k-means seed (no shared initialisation); disjoint run pairs (0, 1), (2, 3), (4, 5) give the stability
  (Hungarian-matched signed cosine), with test R², L0, dead atoms, W's share off the identity, the atoms' matched
  cosine to the true concepts, and the floors (two sets of random data points, two Gaussian dictionaries);
* **plausibility** (the paper's §5.2): SAEs with 5 × d atoms on a digits CNN's pooled features, element-wise
  standardised, scored by the best atom cosine with each of its head's class directions;
* **identifiability** (§5.3): as many atoms as objects on activation-space collages (4 of 10 non-negative concept
  vectors per sample), scored by the best atom and threshold at telling whether each object is present.

``--quick``: 1,500 steps and one run pair; the full run 3,000 steps and three pairs. The claims, their stand-ins
by kind and their calibration are in ``CLAIMS`` and ``CHECKS``; the headlines and their diagnoses
(``zoo reproduce ra-sae --diagnose``: training length, the backbone's width, the number of objects, and the
official overcomplete code on the same task) in ``HEADLINES`` and ``diagnosis.py``.

The critique (Brzozowski & Chung, 2026) says the archetypal stability comes from the k-means start; the ablation rows
test that side by side with RA-SAE.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.claims import Check, Claim, TaskCheck
from zoo.evidence import Headline
from zoo.metrics.dictionary_stability import stability_floor_gaussian, stability_floor_points
from zoo.models.ra_sae.diagnosis import (
    DIAGNOSIS_IDENTIFIABILITY,
    DIAGNOSIS_PLAUSIBILITY,
    DIAGNOSIS_STABILITY,
    diagnose,
)
from zoo.models.ra_sae.experiment import (
    ABLATIONS,
    ALTERNATIVES,
    ARMS,
    BASELINES,
    IDENTIFIABILITY_HEURISTICS,
    PREPS,
    heuristic_r2,
    identifiability_run,
    identifiability_task,
    pair_metrics,
    plausibility_run,
    plausibility_task,
    run_cache,
    train_arm,
)
from zoo.models.ra_sae.report import notes, plot
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["ARMS", "CHECKS", "CLAIMS", "HEADLINES", "diagnose", "run", "train_arm"]

RECONSTRUCTION_HEURISTICS = {
    "pca": "the top 3 principal directions, every sample projected on them (the best fixed 3-d linear code)",
    "points": "64 random training points as atoms, each sample coded by non-negative greedy pursuit (OMP, 3 atoms)",
}
_WHY = {
    "ra": "RA-SAE",
    "topk": "TopK SAE, random init (the paper's main comparison)",
    "batchtopk": "BatchTopK SAE (the paper's library's SAE)",
    "jumprelu": "JumpReLU SAE, L0 penalty (the paper's comparison)",
    "relu": "ReLU + L1 SAE (the paper's Vanilla)",
    "kmeans-frozen": "the archetypal mixing removed: the decoder frozen at the normalised k-means centroids",
    "ra-frozen-w": "W frozen at the identity: Λ, m and the encoder train, the archetypal mixing does not",
    "a": "the relaxation removed: A-SAE (δ = 0)",
    "topk-kmeans": "the constraint removed, the start kept: TopK started at the k-means centroids (the critique)",
    "ra-init": "nothing trained: RA-SAE at initialisation",
    "nmf-frozen": "NMF components, frozen, the same TopK encoder",
    "pca-frozen": "± PCA directions, frozen, the same TopK encoder",
}


def _kinds(exclude: Sequence[str] = ()) -> dict[str, dict[str, str]]:
    """Every arm but RA-SAE (and ``exclude``), by kind, with why it stands in."""
    return {
        kind: {a: _WHY[a] for a in arms if a not in exclude}
        for kind, arms in (("baselines", BASELINES), ("ablations", ABLATIONS), ("alternatives", ALTERNATIVES))
    }


def _stable_at_r2(prep: str, gain: float, ratio: float, over: str = "topk"):
    """``value(r, arm)``: ``min(stability gain over `over` − gain, R² ratio to `over` − ratio)`` in ``prep``: ≥ 0
    when the arm is more stable by ``gain`` at a reconstruction within ``ratio`` of ``over``'s."""

    def value(r: Mapping[str, Any], arm: str) -> float:
        gained = r[f"{prep}/{arm}/stability"] - r[f"{prep}/{over}/stability"]
        return min(gained - gain, r[f"{prep}/{arm}/r2"] / r[f"{prep}/{over}/r2"] - ratio)

    return value


def _r2_ratio_both(r: Mapping[str, Any], arm: str) -> float:
    """The smaller of the arm's raw and centred test R² as a fraction of TopK's."""
    return min(r[f"{prep}/{arm}/r2"] / r[f"{prep}/topk/r2"] for prep in PREPS)


CLAIMS = [
    Claim(
        "r2>=0.945x_topk_raw_and_centred",
        _r2_ratio_both,
        at_least=0.945,
        method="ra",
        why_none={"baselines": "the claim is that RA-SAE reaches the baselines' reconstruction: TopK is the yardstick"},
        ablations={a: _WHY[a] for a in ("a", "kmeans-frozen", "ra-init")},
        alternatives={a: _WHY[a] for a in ALTERNATIVES},
        text="RA-SAE reconstructs held-out data within 5.5 % of TopK's R², raw and centred, where the unrelaxed "
        "archetypal dictionary (A-SAE), the frozen k-means / NMF / PCA dictionaries and the untrained model fall "
        "short (the paper: RA-SAEs match state-of-the-art reconstruction). W frozen at the identity keeps the "
        "relaxation Λ this claim credits, and the k-means-started TopK has no constraint: neither stands in",
    ),
    Claim(
        "nmf_identifiability_ahead_of_ra_by_0.1",
        lambda r, a: r[f"identifiability/{a}/accuracy"] - r["identifiability/ra/accuracy"],
        at_least=0.1,
        method="nmf-frozen",
        baselines={a: _WHY[a] for a in BASELINES},
        ablations={a: _WHY[a] for a in ABLATIONS},
        alternatives={"pca-frozen": _WHY["pca-frozen"]},
        text="on the identifiability task here (non-negative mixtures, NMF's own model), a frozen NMF dictionary with "
        "the same TopK encoder is ahead of RA-SAE by at least 0.1 accuracy, while no SAE or ablation is that far "
        "ahead: on this task a classical dictionary does what the benchmark asks of the SAEs",
    ),
    Claim(
        "raw_stability_over_topk>=0.2_at_r2>=0.9x",
        _stable_at_r2("raw", gain=0.2, ratio=0.9),
        at_least=0.0,
        method="ra",
        **_kinds(),
        asserted=False,
        text="raw activations: RA-SAE is more stable across runs than TopK by at least 0.2 at a reconstruction within "
        "10 % of TopK's (the paper: .927 against .542 on DINOv2), and none of the stand-ins is",
    ),
    Claim(
        "centred_stability_over_topk>=0.02_at_r2>=0.9x",
        _stable_at_r2("centred", gain=0.02, ratio=0.9),
        at_least=0.0,
        method="ra",
        **_kinds(),
        asserted=False,
        text="centred activations: RA-SAE is more stable than TopK by at least 0.02 at a reconstruction within 10 % "
        "of TopK's, and none of the stand-ins is",
    ),
    Claim(
        "stability_over_kmeans_control>=0.02_at_r2>=0.9x_raw_and_centred",
        lambda r, a: min(_stable_at_r2(p, gain=0.02, ratio=0.9, over="topk-kmeans")(r, a) for p in PREPS),
        at_least=0.0,
        method="ra",
        **_kinds(exclude=("topk-kmeans",)),
        asserted=False,
        text="the archetypal constraint adds at least 0.02 stability over a TopK SAE started at the same kind of "
        "k-means centroids, at comparable R², raw and centred (what the critique denies)",
    ),
    Claim(
        "plausibility_over_topk>=0.03",
        lambda r, a: r[f"plausibility/{a}/plausibility"] - r["plausibility/topk/plausibility"],
        at_least=0.03,
        method="ra",
        **_kinds(exclude=("topk",)),
        asserted=False,
        text="RA-SAE's atoms align with the backbone's class directions better than TopK's, by at least 0.03 mean "
        "best cosine (the paper's Table 2: 0.50-0.62 against 0.17-0.31), and no stand-in's do",
    ),
    Claim(
        "identifiability_over_topk>=0.05",
        lambda r, a: r[f"identifiability/{a}/accuracy"] - r["identifiability/topk/accuracy"],
        at_least=0.05,
        method="ra",
        **_kinds(exclude=("topk",)),
        asserted=False,
        text="RA-SAE identifies the objects of a collage better than TopK, by at least 0.05 accuracy (the paper's "
        "Table 3: .945-.960 against .814-.833), and no stand-in does",
    ),
]
# Calibration: five disjoint run pairs (runs 0-9), the full run's 3,000 steps and the quick run's 1,500, one thread:
#   OMP_NUM_THREADS=1 python -c "from zoo.models.ra_sae.reproduce import run; run(pairs=5)"            (22 min)
#   OMP_NUM_THREADS=1 python -c "from zoo.models.ra_sae.reproduce import run; run(quick=True, pairs=5)" (13 min)
# Per pair (the benchmarks: the mean of the pair's two runs), full | quick:
# asserted: R² ratio to TopK, the smaller of raw and centred: RA-SAE 0.991 0.987 0.958 0.971 0.983 | 0.977 0.980
#   0.962 0.969 0.974; the stand-ins' best, A-SAE, 0.896-0.925 | 0.920-0.928 (frozen k-means 0.875-0.901 | 0.913-0.921,
#   PCA 0.860-0.891 | 0.896-0.910); bound 0.945, midway. In raw space RA-SAE is ahead of TopK (0.655 against 0.59).
# asserted: NMF's identifiability lead over RA-SAE: 0.162 0.191 0.176 0.152 0.188 | 0.201 0.212 0.210 0.187 0.208;
#   every stand-in behind RA-SAE (at most -0.009 | -0.008, W frozen); bound 0.1.
# reported: raw stability over TopK at R² >= 0.9x: RA-SAE +0.19-0.23 | +0.22-0.36, but the k-means-started TopK
#   (+0.18-0.23 | +0.21-0.34), W frozen (the same as RA-SAE to 0.002), A-SAE, the frozen centroids and frozen PCA pass;
#   centred: RA-SAE -0.034 to +0.027 | +0.023 to +0.072 (bound 0), passed by the same ablations. Over the k-means
#   control: RA-SAE -0.026 to -0.007 | -0.043 to -0.020, never. Plausibility over TopK: RA-SAE +0.032-0.079 |
#   +0.050-0.092, the untrained model and the frozen centroids +0.062-0.094. Identifiability over TopK: RA-SAE
#   +0.061-0.132 | +0.069-0.116, NMF +0.27-0.33, W frozen and the untrained model pass too.
# Task check: RA-SAE's smaller R² (centred) 0.643-0.648 | 0.624-0.628; the best heuristic, pursuit over random points,
#   centred 0.565-0.582 (raw 0.627-0.636), PCA's 3-d projection 0.424-0.429: pair by pair the gap is 0.065-0.081 |
#   0.042-0.061 (margin 0.035). Raw alone the gap is 0.02-0.03: pursuit over data points nearly matches RA-SAE there.

CHECKS = [
    TaskCheck(
        lambda r, a: min(r[f"{prep}/{a}/r2"] for prep in PREPS),
        method="ra",
        heuristics=RECONSTRUCTION_HEURISTICS,
        margin=0.035,
        text="the reconstruction task needs a learned dictionary: RA-SAE's test R² (the smaller of raw and centred) is "
        "at least 0.035 above the best fixed 3-d projection (PCA) and above pursuit over random training points, with "
        "the same 3 codes per sample",
    ),
    Check(
        "topk_r2>=0.3_raw_and_centred",
        lambda r: min(r[f"{prep}/topk/r2"] for prep in PREPS),
        at_least=0.3,
        text="the TopK baseline reconstructs in both preprocessings",
    ),
    Check(
        "archetypal_constraints_hold",
        lambda r: max(r[f"{prep}/{a}/constraint_violation"] for prep in PREPS for a in ("ra", "a", "ra-frozen-w")),
        at_most=1e-5,
        text="after training: W >= 0, rows of W sum to 1, ‖Λ_i‖ <= δ (largest violation)",
    ),
    Check(
        "centred_ra_w_off_identity>=0.3",
        lambda r: r["centred/ra/w_off_identity"],
        at_least=0.3,
        text="training moved RA-SAE's archetypal mixing: at least 30 % of W's mass left the identity (centred)",
    ),
    Check(
        "raw_random_points_floor>=0.85",
        lambda r: r["raw/floor_points"],
        at_least=0.85,
        text="the raw cosine floor is high: two random sets of 64 data points already match at >= 0.85 (the "
        "critique's metric-design point; compare every raw stability with it)",
    ),
]

HEADLINES = [
    Headline(
        "more_stable_than_standard_saes",
        "Archetypal SAEs are far more stable across runs than standard SAEs (TopK, JumpReLU, ReLU), because their "
        "atoms are anchored to the data's convex hull",
        claims=["raw_stability_over_topk>=0.2_at_r2>=0.9x", "centred_stability_over_topk>=0.02_at_r2>=0.9x"],
        paper="DINOv2, 2,000 concepts: stability RA-SAE .927, TopK .542, JumpReLU .539, Vanilla .710",
        diagnosis=DIAGNOSIS_STABILITY,
    ),
    Headline(
        "matches_reconstruction",
        "The relaxed variant RA-SAE matches state-of-the-art reconstruction (where A-SAE falls short)",
        claims=["r2>=0.945x_topk_raw_and_centred"],
        paper="DINOv2: R² RA-SAE 89.34 %, TopK 89.52 %, JumpReLU 89.92 %",
    ),
    Headline(
        "plausibility",
        "RA-SAE's atoms recover the model's true classification directions better than standard SAEs' "
        "(plausibility benchmark)",
        claims=["plausibility_over_topk>=0.03"],
        paper="k = 32k: ConvNeXt 0.558 vs TopK 0.168; ResNet 0.621 vs 0.313; ViT 0.501 vs 0.294",
        diagnosis=DIAGNOSIS_PLAUSIBILITY,
    ),
    Headline(
        "identifiability",
        "RA-SAE disentangles synthetic concept mixtures better than standard SAEs and classical dictionary learning "
        "(soft identifiability benchmark)",
        claims=["identifiability_over_topk>=0.05"],
        paper="mean accuracy RA-SAE .945-.960, TopK .814-.833, best classical (SemiNMF) .830-.842",
        diagnosis=DIAGNOSIS_IDENTIFIABILITY,
    ),
]


# --- the experiment -------------------------------------------------------------------------------------------------


def run(quick: bool = False, out: Path | str | None = None, *, pairs: int | None = None) -> dict[str, Any]:
    """Run the grid and the two benchmarks, print the tables and verdicts, and (with ``out``) write ``ra-sae.json``,
    ``ra-sae.png`` and the claims and verdict tables.

    ``quick``: 1,500 steps, one run pair (runs 0, 1); full: 3,000 steps, three pairs (runs 0-5). ``pairs``
    overrides the number of pairs (calibration). Every arm runs in both.

    Returns:
        flat results: ``<prep>/<arm>/<metric>`` (mean over pairs; ``/seed<p>`` per pair p) for prep ``raw`` and
        ``centred``, ``plausibility/<arm>/...`` and ``identifiability/<arm>/...`` (mean over runs; ``/seed<r>`` per
        run r), the floors, and the verdicts.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and does not stall on a shared CPU
    try:
        return _run(quick, out, pairs)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, out: Path | str | None, pairs: int | None) -> dict[str, Any]:
    from zoo.datamodules.activations import make_sparse_concepts

    steps = 1500 if quick else 3000
    n_pairs = pairs or (1 if quick else 3)
    run_pairs = [(2 * p, 2 * p + 1) for p in range(n_pairs)]
    runs = range(2 * n_pairs)
    arms = tuple(ARMS)
    r: dict[str, Any] = {"steps": steps, "num_pairs": n_pairs}
    start = time.perf_counter()
    pool, true_atoms = make_sparse_concepts(20_000, 32, 256, 3, 0.05, seed=0)
    test, train_pool = pool[:4000], pool[4000:]  # the test rows are held out from every run
    subsets = [
        torch.randperm(len(train_pool), generator=torch.Generator().manual_seed(100 + i))[: len(train_pool) // 2]
        for i in runs
    ]
    for prep in PREPS:
        g = torch.Generator().manual_seed(256)
        centre = train_pool.mean(0) if prep == "centred" else torch.zeros(32)
        r[f"{prep}/floor_points"] = float(stability_floor_points(train_pool - centre, 64, generator=g))
        r[f"{prep}/floor_gaussian"] = float(stability_floor_gaussian(64, 32, generator=g))
        one_run = run_cache(train_pool, test, subsets, prep == "centred", steps, true_atoms)
        run_arms(arms, range(n_pairs), pair_metrics(one_run, run_pairs), prefix=f"{prep}/", results=r)
        for p, pair in enumerate(run_pairs):  # the non-learned reconstructions of the task check, per run
            for kind in RECONSTRUCTION_HEURISTICS:
                values = []
                for i in pair:
                    x = train_pool[subsets[i]]
                    mu = x.mean(0) if prep == "centred" else torch.zeros(32)
                    values.append(heuristic_r2(x - mu, test - mu, kind, seed=i))
                r[f"{prep}/{kind}/r2/seed{p}"] = sum(values) / 2
        for kind in RECONSTRUCTION_HEURISTICS:
            r[f"{prep}/{kind}/r2"] = sum(r[f"{prep}/{kind}/r2/seed{p}"] for p in range(n_pairs)) / n_pairs
    task = plausibility_task()
    r["plausibility/backbone_accuracy"] = task["backbone_accuracy"]
    num_atoms = 5 * task["train"].shape[1]  # the paper's dictionary size, 5 x the feature width
    plaus_arms = (*arms, "points")
    run_arms(plaus_arms, runs, lambda a, s: plausibility_run(task, a, s, steps, num_atoms), "plausibility/", r)
    ident = identifiability_task()
    ident_arms = (*arms, *IDENTIFIABILITY_HEURISTICS)
    run_arms(ident_arms, runs, lambda a, s: identifiability_run(ident, a, s, steps), "identifiability/", r)
    r["seconds"] = time.perf_counter() - start
    labels = {**{a: ARMS[a].label for a in arms}, **{h: f"heuristic: {h}" for h in IDENTIFIABILITY_HEURISTICS}}
    tables = [
        arm_table(
            r,
            arms,
            ("stability", "stability_alive", "r2", "l0", "dead_fraction", "w_off_identity", "truth_cosine"),
            title=f"{prep}, k* = 256: stability across runs ({n_pairs} disjoint run pair(s), {steps} steps); floors: "
            f"random points {r[f'{prep}/floor_points']:.2f}, Gaussian {r[f'{prep}/floor_gaussian']:.2f}",
            labels=labels,
            prefix=f"{prep}/",
        )
        for prep in PREPS
    ] + [
        arm_table(
            r,
            plaus_arms,
            ("plausibility", "r2", "dead_fraction"),
            title=f"plausibility: best atom cosine with each of the head's 10 class directions ({num_atoms} atoms on a "
            f"digits CNN's pooled features, standardised; backbone test accuracy {r['plausibility/backbone_accuracy']:.3f})",
            labels=labels,
            prefix="plausibility/",
        ),
        arm_table(
            r,
            ident_arms,
            ("accuracy", "r2"),
            title="identifiability: best atom and threshold per object, mean accuracy (10 atoms, 4 of 10 objects per "
            "sample; answering 'absent' every time scores 0.6)",
            labels=labels,
            prefix="identifiability/",
        ),
    ]
    return conclude(
        "ra-sae",
        r,
        CLAIMS,
        CHECKS,
        out=out,
        plot=plot,
        tables=tables,
        notes=notes(r),
        headlines=HEADLINES,
    )
