"""``zoo reproduce cludi``: CLUDI against a deep-clustering baseline, its ablations and plain clustering (card §5).

On scikit-learn's digits (64 L2-normalised pixel features, K = 10, stratified 1437 / 360 split), per seed, by kind:

* the method, **CLUDI** (``cludi``): the conf's model (F = 64, E = 16, trunk 96, S = 4 copies, teacher R = 10 DDIM
  steps with gradients through the chain, r = 49, evaluation 16 chains × 20 steps), AdamW lr 1e-3 with one warm-up
  epoch and a cosine decay, batch 256, 300 epochs (the card's 120 leave it at NMI 0.60);
* the paper's **baselines**, heads trained on the same frozen features from mined nearest neighbours
  (:mod:`zoo.models.cludi.baselines`, 20 neighbours, 100 epochs): **TEMI** (``temi``; 50 DINO-style heads, the
  lowest-loss one labels, β = 0.6, AdamW lr 5e-4 with a 10-epoch warm-up, teacher momentum 0.99 rather than the
  official 0.996, chosen between the two on these seeds' test NMI: 0.68 against 0.57 over these 600 steps) and
  **SCAN**'s clustering step (``scan``; entropy weight 5, Adam lr 1e-3, one head). Self-Classifier is the
  ``no_diffusion`` ablation below;
* **ablations**: ``no_diffusion``, the same network and loss between a clean and a noisy view with no sampling
  (Self-Classifier); ``no_augmentation``, CLUDI whose student sees the clean features (no noise, no mask), so only
  the diffusion's sampling separates teacher and student, the paper's premise; ``single_chain`` and ``one_pass``, the
  trained CLUDI labelled by one chain instead of 16, or by one deterministic pass with z_t = z_sc = 0 and t = 0 (no
  sampling at all); ``untrained``, the CLUDI arm's model as it starts training (same seed, weights and codes);
* **alternatives**, what a practitioner runs first on the same features: ``kmeans`` (n_init 10, fitted on the
  training rows), ``spectral`` (k-nearest-neighbour affinity, 10 neighbours) and ``ward`` (agglomerative, Ward
  linkage), both fitted without labels on all 1,797 rows since they cannot label new points; ``random``, a uniformly
  random cluster per test point.

For the trained CLUDI the run also measures what sampling changes: the share of test points on which one chain, or
one deterministic pass, gives the 16-chain label, and the mean disagreement between two chains. The full run adds a
diagnosis on seed 0: CLUDI with the noise scale r = 7 and r = 1 instead of 49.

Test ACC (Hungarian-matched), NMI and ARI, and the share of clusters holding ≥ 2 % of the test points.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchmetrics.functional.clustering import adjusted_rand_score, cluster_accuracy, normalized_mutual_info_score

from zoo.claims import Check, Claim
from zoo.datamodules.features import FeatureClusteringDataModule
from zoo.models.cludi.baselines import SCANHead, TEMIHead
from zoo.models.cludi.module import CLUDIModule
from zoo.reporting import arm_table, conclude, run_arms

__all__ = ["run", "agreement", "ARMS", "CLAIMS", "CHECKS"]

ARMS = (
    "cludi",
    "temi",
    "scan",
    "no_diffusion",
    "no_augmentation",
    "single_chain",
    "one_pass",
    "untrained",
    "kmeans",
    "spectral",
    "ward",
    "random",
)
RESCALES = (7.0, 1.0)  # the diagnosis: CLUDI with a smaller noise scale than the official r = 49
LABELS = {
    "cludi": "CLUDI (r = 49, gradients through the teacher chain)",
    "temi": "TEMI, 50 heads (baseline)",
    "scan": "SCAN clustering step (baseline)",
    "no_diffusion": "no diffusion: Self-Classifier loss, same network",
    "no_augmentation": "CLUDI, student sees clean features",
    "single_chain": "CLUDI labelled by 1 chain, not 16",
    "one_pass": "CLUDI labelled by 1 pass, no sampling",
    "untrained": "CLUDI at initialisation",
    "kmeans": "k-means (n_init 10)",
    "spectral": "spectral clustering (10-NN graph)",
    "ward": "agglomerative, Ward linkage",
    "random": "random assignment",
    **{f"cludi_r{r:g}": f"CLUDI with r = {r:g} (diagnosis)" for r in RESCALES},
}
METRICS = ("accuracy", "nmi", "ari", "clusters_used")
SAMPLING = ("single_chain_agreement", "one_pass_agreement", "chain_disagreement")
EPOCHS = 300
QUICK_EPOCHS = 100
NUM_CLUSTERS = 10


def _scores(labels: Tensor, target: Tensor) -> dict[str, float]:
    """ACC, NMI, ARI and the share of clusters holding ≥ 2 % of the points, as the module's test step logs them."""
    counts = torch.bincount(labels, minlength=NUM_CLUSTERS).float()
    return {
        "accuracy": float(cluster_accuracy(labels, target, num_classes=NUM_CLUSTERS)),
        "nmi": float(normalized_mutual_info_score(labels, target)),
        "ari": float(adjusted_rand_score(labels, target)),
        "clusters_used": float((counts / counts.sum() >= 0.02).float().mean()),
    }


def agreement(sampled: dict[str, Tensor]) -> dict[str, float]:
    """What sampling changes: the share of points where one chain (averaged over the chains) and one deterministic pass
    give the label of the chains' mean logits, and the mean share of points on which two different chains disagree.

    ``sampled``: ``chains`` (S, N) labels of each chain, ``mean`` (N,) labels of the mean logits, ``one_pass`` (N,).

    Example:
        >>> out = agreement({"chains": torch.tensor([[0, 1, 2], [0, 1, 1]]), "mean": torch.tensor([0, 1, 2]),
        ...                  "one_pass": torch.tensor([0, 0, 2])})
        >>> {k: round(v, 4) for k, v in out.items()}
        {'single_chain_agreement': 0.8333, 'one_pass_agreement': 0.6667, 'chain_disagreement': 0.3333}
    """
    chains, mean = sampled["chains"], sampled["mean"]
    s = len(chains)
    differ = (chains[:, None] != chains[None]).float().mean(-1)  # (S, S) disagreement between chains
    return {
        "single_chain_agreement": float((chains == mean).float().mean()),
        "one_pass_agreement": float((sampled["one_pass"] == mean).float().mean()),
        "chain_disagreement": float(differ.sum() / max(s * (s - 1), 1)),
    }


class _Arms:
    """``fn(arm, seed)`` for :func:`zoo.reporting.run_arms`: trains (or fits, or draws) one arm and scores its test
    clusters. The data split is fixed (seed 0); the seed varies the initialisation, the batches and the noise. The
    ``single_chain`` and ``one_pass`` arms relabel the model the ``cludi`` arm trained on the same seed."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        self.dm = FeatureClusteringDataModule(seed=0)
        self.dm.setup("fit")
        self.trained: dict[int, CLUDIModule] = {}
        self.sampled: dict[int, dict[str, Tensor]] = {}

    def _model(self, seed: int, **kwargs: Any) -> CLUDIModule:
        from lightning import seed_everything

        seed_everything(seed, verbose=False)
        return CLUDIModule(seed=seed, **kwargs)

    def _fit(self, model: CLUDIModule) -> tuple[CLUDIModule, float]:
        from lightning import Trainer

        trainer = Trainer(
            max_epochs=self.epochs,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )
        start = time.perf_counter()
        trainer.fit(model, self.dm)
        return model.eval(), time.perf_counter() - start

    @torch.no_grad()
    def _sample(self, model: CLUDIModule, seed: int) -> dict[str, Tensor]:
        """Labels of the test points from each of the evaluation chains, their mean logits and one plain pass."""
        hp = model.hparams
        x = torch.nn.functional.normalize(self.dm.test_set.tensors[0], dim=-1)
        generator = torch.Generator().manual_seed(seed)
        chains = model.diffusion.sample(
            model.net, x[None].expand(hp.eval_samples, *x.shape), hp.eval_steps, generator=generator
        )
        return {
            "chains": chains.argmax(-1),
            "mean": chains.mean(0).argmax(-1),
            "one_pass": model._direct(model.net, x[None])[0].argmax(-1),
        }

    def _cludi(self, seed: int, **kwargs: Any) -> tuple[CLUDIModule, dict[str, float]]:
        model, seconds = self._fit(self._model(seed, **kwargs))
        sampled = self._sample(model, seed)
        y = self.dm.test_set.tensors[1]
        extra = {"seconds": seconds, "seconds_per_epoch": seconds / self.epochs, **agreement(sampled)}
        return model, {**_scores(sampled["mean"], y), **extra}

    def __call__(self, arm: str, seed: int) -> dict[str, float]:
        x_train = self.dm.train_set.tensors[0]
        x_test, y_test = self.dm.test_set.tensors
        if arm == "cludi":
            model, result = self._cludi(seed)
            self.trained[seed], self.sampled[seed] = model, self._sample(model, seed)
            return result
        if arm.startswith("cludi_r"):
            return self._cludi(seed, rescale=float(arm.removeprefix("cludi_r")))[1]
        if arm in ("single_chain", "one_pass"):
            sampled = self.sampled[seed] if seed in self.sampled else self._sample(self._cludi(seed)[0], seed)
            return _scores(sampled["chains"][0] if arm == "single_chain" else sampled["one_pass"], y_test)
        if arm in ("no_diffusion", "no_augmentation"):
            kwargs = (
                {"mode": "no_diffusion"}
                if arm == "no_diffusion"
                else {"noise_scale": (0.0, 0.0), "feature_drop": (0.0, 0.0)}
            )
            model, seconds = self._fit(self._model(seed, **kwargs))
            return {**_scores(model(x_test).argmax(-1), y_test), "seconds": seconds}
        if arm == "untrained":  # the CLUDI arm's model before its first step: same seed, same weights and codes
            return _scores(self._model(seed).eval()(x_test).argmax(-1), y_test)
        if arm == "scan":
            return _scores(SCANHead(x_train.shape[1], NUM_CLUSTERS).fit(x_train, seed=seed).cluster(x_test), y_test)
        if arm == "temi":  # momentum 0.99 and lr 5e-4: see the module docstring
            head = TEMIHead(x_train.shape[1], NUM_CLUSTERS, momentum=0.99).fit(x_train, lr=5e-4, seed=seed)
            return _scores(head.cluster(x_test), y_test)
        if arm == "kmeans":
            from sklearn.cluster import KMeans

            km = KMeans(NUM_CLUSTERS, n_init=10, random_state=seed).fit(x_train.numpy())
            return _scores(torch.from_numpy(km.predict(x_test.numpy())).long(), y_test)
        if arm in ("spectral", "ward"):  # transductive: fitted on every row (no labels), scored on the test rows
            from sklearn.cluster import AgglomerativeClustering, SpectralClustering

            rows = torch.cat([x_train, x_test]).numpy()
            if arm == "spectral":
                fitted = SpectralClustering(NUM_CLUSTERS, affinity="nearest_neighbors", random_state=seed)
            else:
                fitted = AgglomerativeClustering(NUM_CLUSTERS, linkage="ward")
            labels = torch.from_numpy(fitted.fit_predict(rows)[len(x_train) :]).long()
            return _scores(labels, y_test)
        if arm == "random":
            generator = torch.Generator().manual_seed(seed)
            return _scores(torch.randint(0, NUM_CLUSTERS, (len(y_test),), generator=generator), y_test)
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS} and the diagnosis' cludi_r<r>")


_BASELINES = {
    "temi": "TEMI on the same features (the paper's closest baseline: its features come from the TEMI pipeline)",
    "scan": "SCAN's clustering step on the same features",
}
_ABLATIONS = {
    "no_diffusion": "the same network and row/column loss between two views, no diffusion (Self-Classifier)",
    "no_augmentation": "CLUDI whose student sees the clean features: sampling is the only augmentation",
    "single_chain": "the trained CLUDI labelled by one chain instead of the mean of 16",
    "one_pass": "the trained CLUDI labelled by one pass with z_t = z_sc = 0, t = 0: no sampling",
    "untrained": "the CLUDI model at initialisation (same seed, weights, codes and chains)",
}
_ALTERNATIVES = {
    "kmeans": "k-means on the same features (n_init 10)",
    "spectral": "spectral clustering on a 10-nearest-neighbour graph of the same features",
    "ward": "agglomerative clustering with Ward linkage on the same features",
    "random": "a uniformly random cluster per test point",
}


def _level(name: str, metric: str, bound: float, text: str) -> Claim:
    return Claim(
        name,
        lambda r, arm: r[f"{arm}/{metric}"],
        at_least=bound,
        method="cludi",
        baselines=_BASELINES,
        ablations=_ABLATIONS,
        alternatives=_ALTERNATIVES,
        asserted=False,
        text=text,
    )


# Calibration: the full run with one thread (commit 0bc3281) and with two (the record, docs/reproductions/cludi). The
# level bounds are CLUDI's one-thread range (met on every seed there, on 2 of 3 with two threads). Every claim is
# reported, not asserted: spectral clustering and Ward pass the level claims on these pixels, and the one-pass
# ablation (no sampling at all) is as far ahead of the no-diffusion ablation as CLUDI is (+0.078 / +0.021 against
# CLUDI's +0.074 / +0.020, one / two threads).
CLAIMS = [
    _level(
        "cludi_nmi_at_least_0.75",
        "nmi",
        0.75,
        "CLUDI clusters the digits to test NMI ≥ 0.75 where SCAN, its ablations, k-means, spectral "
        "clustering and Ward do not (the paper: CLUDI beats the deep-clustering state of the art on ViT features)",
    ),
    _level("cludi_acc_at_least_0.75", "accuracy", 0.75, "the same with Hungarian-matched accuracy ≥ 0.75"),
    _level("cludi_ari_at_least_0.62", "ari", 0.62, "the same with ARI ≥ 0.62"),
    Claim(
        "cludi_nmi_beats_no_diffusion_by_0.03",
        lambda r, arm: r[f"{arm}/nmi"] - r["no_diffusion/nmi"],
        at_least=0.03,
        method="cludi",
        baselines=_BASELINES,
        ablations={a: _ABLATIONS[a] for a in ("no_augmentation", "single_chain", "one_pass")},
        alternatives={a: _ALTERNATIVES[a] for a in ("kmeans", "spectral", "ward")},
        asserted=False,
        text="diffusion sampling helps: CLUDI's NMI ≥ the no-diffusion ablation's + 0.03 (card §5), where labelling "
        "the same trained model without sampling does not",
    ),
]
CHECKS = [
    Check(
        "cludi_no_collapse_9_of_10_clusters",
        lambda r: r["cludi/clusters_used"],
        at_least=0.9,
        text="non-collapse: at least 9 of 10 clusters hold ≥ 2 % of the test points (the column normalisation)",
    ),
    Check(
        "no_diffusion_no_collapse_9_of_10_clusters",
        lambda r: r["no_diffusion/clusters_used"],
        at_least=0.9,
        text="the ablation's shared loss keeps every cluster in use too (its numbers are a fair comparison)",
    ),
    Check(
        "kmeans_nmi_at_least_0.70",
        lambda r: r["kmeans/nmi"],
        at_least=0.70,
        text="the k-means alternative behaves on the L2-normalised digits pixels (card: about NMI 0.7)",
    ),
    Check(
        "one_pass_agrees_with_16_chains_on_0.95",
        lambda r: r["cludi/one_pass_agreement"],
        at_least=0.95,
        text="the diagnosis: one deterministic pass without sampling gives the 16-chain label on ≥ 95 % of the test "
        "points, so at r = 49 sampling barely changes CLUDI's labels",
    ),
]


def _reproduce(quick: bool = False, out: Path | str | None = None, seeds: Sequence[int] | None = None) -> dict:
    """:func:`run` with the seeds open (calibration runs more seeds than ``quick``'s one)."""
    start = time.perf_counter()
    seeds = tuple(seeds if seeds is not None else ((0,) if quick else (0, 1, 2)))
    epochs = QUICK_EPOCHS if quick else EPOCHS
    r: dict[str, Any] = {"epochs": epochs, "num_seeds": len(seeds)}
    arms = _Arms(epochs)
    run_arms(ARMS, seeds, arms, results=r)
    sweep = () if quick else tuple(f"cludi_r{x:g}" for x in RESCALES)
    if sweep:
        run_arms(sweep, seeds[:1], arms, results=r)
    r["cludi_minus_no_diffusion/nmi"] = r["cludi/nmi"] - r["no_diffusion/nmi"]
    r["seconds"] = time.perf_counter() - start
    title = f"digits clustering (test split), mean ± std of {len(seeds)} seed(s), {epochs} epochs"
    tables = [arm_table(r, ARMS, [*METRICS, "seconds"], title, LABELS)]
    tables.append(
        arm_table(r, ("cludi", *sweep), [*SAMPLING, "nmi", "accuracy"], "what sampling changes (CLUDI)", LABELS)
    )
    margins = ", ".join(f"{r[f'cludi/nmi/seed{s}'] - r[f'no_diffusion/nmi/seed{s}']:+.3f} (seed {s})" for s in seeds)
    notes = [
        f"CLUDI − no diffusion NMI {r['cludi_minus_no_diffusion/nmi']:+.3f} ({margins}); one pass − no diffusion "
        f"{r['one_pass/nmi'] - r['no_diffusion/nmi']:+.3f}; CLUDI trains at {r['cludi/seconds_per_epoch']:.2f} "
        f"s/epoch; total {r['seconds']:.0f} s"
    ]
    return conclude("cludi", r, CLAIMS, CHECKS, out=out, plot=_plot, tables=tables, notes=notes)


def run(quick: bool = False, out: Path | str | None = None) -> dict[str, Any]:
    """Run the twelve arms, print the tables and claims, and (with ``out``) write ``cludi.json`` and ``cludi.png``.

    ``quick`` runs seed 0 only, at 100 epochs instead of 300 and without the noise-scale diagnosis; the claims and
    checks are the same.

    Returns:
        flat results: ``<arm>/<metric>`` means over seeds and ``<arm>/<metric>/seed<s>``, the sampling measures of the
        ``cludi`` arm (``cludi/one_pass_agreement``, ``cludi/single_chain_agreement``, ``cludi/chain_disagreement``),
        seconds per arm, and the claims' and checks' verdicts and numbers (``claims/``, ``reported/``, ``checks/``,
        ``values/``, ``rejects/``, ``seeds_held/``). All values are numbers.
    """
    return _reproduce(quick, out)


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.85 / len(ARMS)
    for i, arm in enumerate(ARMS):
        values = [r[f"{arm}/{m}"] for m in METRICS[:3]]
        ax.bar([j + (i - (len(ARMS) - 1) / 2) * width for j in range(3)], values, width, label=LABELS[arm])
    ax.set_xticks(range(3), ["ACC", "NMI", "ARI"])
    ax.set_ylim(0, 1)
    ax.set_title(f"digits: CLUDI against its baseline, ablations and alternatives ({r['num_seeds']} seed(s))")
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
