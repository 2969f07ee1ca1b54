"""``zoo reproduce ra-sae --diagnose``: why RA-SAE's headlines do not reproduce here, as sweeps.

* **training length** (stability headline): 1,500 / 3,000 / 6,000 steps for RA-SAE, TopK, the k-means-started TopK
  and the frozen k-means decoder, raw and centred, one run pair: does the ablations' lead close with training?
* **backbone width** (plausibility headline): the digits CNN with 32 / 64 / 128 pooled channels (5 × width atoms):
  does RA-SAE pull away from TopK and from random data points as the space grows?
* **number of objects** (identifiability headline): 10 / 16 / 20 objects, 4 per sample, as many atoms as objects;
  and the paper's own construction, 16 × 16 collages of four digits through the digits CNN (pooled), with a
  supervised linear probe per digit as the ceiling of what the features carry.

The official code on the same task (overcomplete's RelaxedArchetypalDictionary and TopKSAE, run in a scratch folder,
never committed) is summarised in ``DIAGNOSIS_STABILITY``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo.models.ra_sae.experiment import (
    identifiability_run,
    identifiability_task,
    pair_metrics,
    plausibility_run,
    plausibility_task,
    run_cache,
)
from zoo.reporting import conclude

__all__ = ["DIAGNOSIS_IDENTIFIABILITY", "DIAGNOSIS_PLAUSIBILITY", "DIAGNOSIS_STABILITY", "diagnose"]

DIAGNOSIS_STABILITY = (
    "The stability comes from the k-means start, not from the archetypal constraint, at every training length and in "
    "the official code. Raw, RA-SAE (0.944) is matched by RA-SAE with W frozen at the identity (0.943: in raw space "
    "W does not move: every centroid lies in the same narrow cone, so an atom's gradient has one sign on all its "
    "candidates and the ReLU-then-normalise projection undoes Adam's step; overcomplete's raw W stays at the identity "
    "too), by TopK started at the normalised centroids (0.916) and passed by A-SAE and the decoder frozen "
    "at the centroids (0.979, at 0.96x TopK's R²); centred, RA-SAE (0.685) is within TopK's pair-to-pair spread "
    "(0.670 ± 0.016) and the frozen centroids (0.781) and frozen PCA directions (0.783) are more stable at 0.88-0.89x "
    "TopK's R². "
    "Training length (one pair, 1,500 / 3,000 / 6,000 steps): raw RA-SAE 0.942 / 0.941 / 0.942 against the control "
    "0.918 / 0.908 / 0.909 and the frozen centroids 0.977; centred RA-SAE 0.680 / 0.675 / 0.708, the control 0.680 / "
    "0.677 / 0.696, TopK 0.610 / 0.662 / 0.685: centred, TopK closes in as it trains (raw it stays at 0.48-0.53) and "
    "the ablations stay level with RA-SAE. The official "
    "code on the same task (overcomplete 0.3.0 = a1781af, RATopKSAE and TopKSAE with train_sae, 3 pairs, a scratch "
    "folder): raw RA-SAE 0.965 against TopK 0.391, but TopK started at the unit k-means centroids 0.956; centred 0.668 "
    "against 0.523 and the control 0.640. With the zoo's start (equal norms, tied encoder) the official RA-SAE gives "
    "0.943 at R² 0.654, 8 % dead atoms (the zoo: 0.944, 0.655, 8 %): the code is not the cause. The paper's runs "
    "share a deterministic k-means start (the critique), which gives the archetypal SAE this stability for free."
)
DIAGNOSIS_PLAUSIBILITY = (
    "RA-SAE's atoms align with the head's class directions better than TopK's (0.774 against 0.718, with 53 % of "
    "TopK's 160 atoms dead), but no better than where they started: the untrained RA-SAE and the decoder frozen at "
    "the k-means centroids score 0.798, random training points 0.787. Backbone width 32 / 64 / 128 (5 x width atoms, "
    "two runs): RA-SAE 0.777 / 0.805 / 0.787, TopK 0.720 / 0.745 / 0.742, frozen centroids 0.802 / 0.806 / 0.788, "
    "random points 0.788 / 0.797 / 0.791. With 10 classes a data point already lies close to some class direction, "
    "so the benchmark rewards data-like atoms, which the centroids give without training; the paper's gap (0.50-0.62 "
    "against 0.17-0.31) is at 1,000 ImageNet classes, 768-2,048 dimensions and 32k atoms, out of reach here. "
    "overcomplete ships no benchmark code to compare with."
)
DIAGNOSIS_IDENTIFIABILITY = (
    "RA-SAE identifies the objects better than TopK (0.809 against 0.701, 10 objects, 4 per sample), but so does "
    "RA-SAE with W frozen (0.796), and a frozen NMF dictionary with the same TopK encoder is far ahead (0.985, ahead by "
    ">= 0.1 on every run: asserted, as a fact of this task). The mixtures are non-negative sums of non-negative concept "
    "vectors, NMF's own model; the paper's table has SemiNMF and ConvexNMF (0.83-0.84), not NMF, on signed backbone "
    "features where NMF does not apply. Objects 10 / 16 / 20 (chance 0.6 / 0.75 / 0.8): RA-SAE 0.824 / 0.866 / 0.882, "
    "TopK 0.724 / 0.791 / 0.858, NMF 0.985 / 0.961 / 0.898: RA-SAE's lead over TopK shrinks as the objects grow, and "
    "NMF's over RA-SAE too (0.016 at 20). The paper's own construction, four-digit collages "
    "through the digits CNN (pooled, standardised features): every dictionary sits at single channels' level (RA-SAE "
    "0.678, TopK 0.671, NMF 0.677, channels 0.684) while a supervised probe per digit reaches 0.816, so the small "
    "backbone does not carry the objects linearly enough for any dictionary. overcomplete ships no benchmark code."
)

STEP_ARMS = ("ra", "topk", "topk-kmeans", "kmeans-frozen")
WIDTH_ARMS = ("ra", "topk", "kmeans-frozen", "points")
OBJECT_ARMS = ("ra", "topk", "a", "kmeans-frozen", "nmf-frozen", "channels")


def diagnose(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the three sweeps and (with ``out``) write ``ra-sae.diagnose.json`` / ``.png``.

    Returns:
        flat results: ``steps/s<S>/<prep>/<arm>/{stability,r2}``, ``width/w<W>/<arm>/plausibility``,
        ``objects/o<K>/<arm>/accuracy``, ``collages/<arm>/accuracy`` and ``collages/probe/accuracy``, each the mean
        over runs (pairs for stability) with ``/seed<r>`` per run.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest
    try:
        return _diagnose(quick, out)
    finally:
        torch.set_num_threads(threads)


def _mean_over_seeds(r: dict[str, Any]) -> None:
    bases: dict[str, list[float]] = {}
    for key, value in list(r.items()):
        if "/seed" in key:
            bases.setdefault(key.rsplit("/seed", 1)[0], []).append(value)
    r.update({base: float(np.mean(values)) for base, values in bases.items()})


def _diagnose(quick: bool, out: Path | str | None) -> dict[str, Any]:
    from zoo.datamodules.activations import make_sparse_concepts

    start = time.perf_counter()
    steps_grid = (750, 1500) if quick else (1500, 3000, 6000)
    widths = (32, 64) if quick else (32, 64, 128)
    objects = (10, 16) if quick else (10, 16, 20)
    runs = (0,) if quick else (0, 1)
    bench_steps = 1500 if quick else 3000
    r: dict[str, Any] = {"quick": quick}
    # Training length: one run pair, raw and centred, the grid's data.
    pool, true_atoms = make_sparse_concepts(20_000, 32, 256, 3, 0.05, seed=0)
    test, train_pool = pool[:4000], pool[4000:]
    subsets = [
        torch.randperm(len(train_pool), generator=torch.Generator().manual_seed(100 + i))[: len(train_pool) // 2]
        for i in (0, 1)
    ]
    for steps in steps_grid:
        for prep in ("raw", "centred"):
            fn = pair_metrics(run_cache(train_pool, test, subsets, prep == "centred", steps, true_atoms), [(0, 1)])
            for arm in STEP_ARMS:
                m = fn(arm, 0)
                for metric in ("stability", "r2", "dead_fraction"):
                    r[f"steps/s{steps}/{prep}/{arm}/{metric}/seed0"] = m[metric]
        print(f"  steps {steps}: done ({time.perf_counter() - start:.0f} s)")
    # Backbone width: plausibility with 5 x width atoms.
    for width in widths:
        task = plausibility_task(width=width)
        for arm in WIDTH_ARMS:
            for seed in runs:
                m = plausibility_run(task, arm, seed, bench_steps, 5 * width)
                r[f"width/w{width}/{arm}/plausibility/seed{seed}"] = m["plausibility"]
        print(f"  width {width}: done ({time.perf_counter() - start:.0f} s)")
    # Number of objects: identifiability with as many atoms as objects.
    for count in objects:
        task = identifiability_task(objects=count)
        for arm in OBJECT_ARMS:
            for seed in runs:
                r[f"objects/o{count}/{arm}/accuracy/seed{seed}"] = identifiability_run(task, arm, seed, bench_steps)[
                    "accuracy"
                ]
    _collages(r, runs, bench_steps)
    print(f"  identifiability: done ({time.perf_counter() - start:.0f} s)")
    _mean_over_seeds(r)
    r["seconds"] = time.perf_counter() - start
    notes = [
        "training length (stability, R²): "
        + "; ".join(
            f"{prep} {s} steps: "
            + ", ".join(
                f"{a} {r[f'steps/s{s}/{prep}/{a}/stability']:.3f} ({r[f'steps/s{s}/{prep}/{a}/r2']:.3f})"
                for a in STEP_ARMS
            )
            for prep in ("raw", "centred")
            for s in steps_grid
        ),
        "backbone width (plausibility): "
        + "; ".join(
            f"w{w}: " + ", ".join(f"{a} {r[f'width/w{w}/{a}/plausibility']:.3f}" for a in WIDTH_ARMS) for w in widths
        ),
        "objects (identifiability accuracy): "
        + "; ".join(
            f"{k} objects: " + ", ".join(f"{a} {r[f'objects/o{k}/{a}/accuracy']:.3f}" for a in OBJECT_ARMS)
            for k in objects
        ),
        "digit collages through the CNN (identifiability accuracy): "
        + ", ".join(f"{a} {r[f'collages/{a}/accuracy']:.3f}" for a in (*COLLAGE_ARMS, "probe")),
        f"{len(runs)} run(s) per benchmark cell, one run pair per stability cell; total {r['seconds']:.0f} s",
    ]
    plot = lambda results, path: _plot(results, path, steps_grid, widths, objects)
    return conclude("ra-sae.diagnose", r, out=out, plot=plot, notes=notes)


COLLAGE_ARMS = ("ra", "topk", "nmf-frozen", "channels")


def _collages(r: dict[str, Any], runs: tuple[int, ...], steps: int) -> None:
    """The paper's construction: four-digit collages through the digits CNN, pooled, standardised (its §5.3)."""
    from sklearn.linear_model import LogisticRegression

    from zoo.models.ra_sae.benchmarks import digits_backbone, digits_collages, standardise

    body, _, _ = digits_backbone()
    images, presence = digits_collages(4000)
    with torch.no_grad():
        features = body(images)
    train, mu, sigma = standardise(features[:2000])
    task = {"train": train, "test": (features[2000:] - mu) / sigma, "presence": presence[2000:], "present": 4}
    for arm in COLLAGE_ARMS:
        for seed in runs:
            r[f"collages/{arm}/accuracy/seed{seed}"] = identifiability_run(task, arm, seed, steps)["accuracy"]
    # The ceiling: a supervised linear probe per digit on the same features.
    hits = [
        LogisticRegression(max_iter=2000)
        .fit(train.numpy(), presence[:2000, j].numpy())
        .score(task["test"].numpy(), presence[2000:, j].numpy())
        for j in range(10)
    ]
    r["collages/probe/accuracy"] = float(np.mean(hits))


def _plot(
    r: dict[str, Any], path: Path, steps_grid: tuple[int, ...], widths: tuple[int, ...], objects: tuple[int, ...]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for ax, prep in zip(axes[:2], ("raw", "centred")):
        for arm in STEP_ARMS:
            ax.plot(steps_grid, [r[f"steps/s{s}/{prep}/{arm}/stability"] for s in steps_grid], marker="o", label=arm)
        ax.set_xscale("log")
        ax.set_xlabel("training steps")
        ax.set_ylabel("stability across runs")
        ax.set_title(f"{prep}, k* = 256")
        ax.legend(fontsize=7)
    for arm in WIDTH_ARMS:
        axes[2].plot(widths, [r[f"width/w{w}/{arm}/plausibility"] for w in widths], marker="o", label=arm)
    axes[2].set_xlabel("backbone width (atoms = 5 x width)")
    axes[2].set_ylabel("plausibility")
    axes[2].legend(fontsize=7)
    for arm in OBJECT_ARMS:
        axes[3].plot(objects, [r[f"objects/o{k}/{arm}/accuracy"] for k in objects], marker="o", label=arm)
    axes[3].set_xlabel("objects (4 per sample)")
    axes[3].set_ylabel("identifiability accuracy")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
