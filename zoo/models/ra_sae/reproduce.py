"""``zoo reproduce ra-sae``: cross-run stability of RA-SAE / A-SAE against TopK SAEs, with the critique's control.

The RA-SAE card's §5 experiment, as a plain loop over the pure-torch parts (no Trainer per cell):

* data: synthetic sparse concepts (d = 32, n = 20,000; k* = 48 identifiable and k* = 256 not), raw and centred;
* each run trains on its own random 50 % subset with its own k-means seed (no shared initialisation);
* arms: (a) TopK SAE, random init; (b) TopK SAE started at the normalised k-means centroids (the critique's
  control); (c) RA-SAE, C = 64 centroids, δ = 1; (d) A-SAE (δ = 0);
* metrics: stability (Hungarian-matched signed cosine) between runs of one arm, also restricted to atoms alive in
  both runs; test R²; dead-atom fraction; and the floors (two sets of random data points, two Gaussian
  dictionaries).

The critique (Brzozowski & Chung, 2026) says the archetypal stability comes from the shared k-means decoder
initialisation; arm (b) tests that, and the table shows it side by side with RA-SAE rather than hiding it.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo.metrics.dictionary_stability import dictionary_stability, stability_floor_gaussian, stability_floor_points
from zoo.models.ra_sae.sae import SparseAutoencoder, sae_loss
from zoo.nn.kmeans import kmeans_centroids
from zoo.reporting import print_claims

__all__ = ["run", "train_arm", "ARMS"]

ARMS: dict[str, dict[str, Any]] = {
    "topk": {"label": "TopK, random init", "dictionary": "free", "free_init": False},
    "topk-kmeans": {"label": "TopK, k-means init (control)", "dictionary": "free", "free_init": True},
    "ra": {"label": "RA-SAE (delta=1)", "dictionary": "ra", "free_init": False},
    "a": {"label": "A-SAE (delta=0)", "dictionary": "a", "free_init": False},
}


def train_arm(
    x: Tensor,
    arm: str,
    seed: int,
    steps: int,
    num_atoms: int = 64,
    top_k: int = 3,
    delta: float = 1.0,
    batch_size: int = 256,
    lr: float = 1e-3,
) -> tuple[SparseAutoencoder, Tensor, float]:
    """Train one arm on ``x`` ``(n, d)`` with the official loop (Adam, grad-norm clip 1.0, MSE).

    Returns ``(sae, initial_dictionary, first_batch_r2)``.
    """
    spec = ARMS[arm]
    torch.manual_seed(seed)
    sae = SparseAutoencoder(x.shape[1], num_atoms, top_k, spec["dictionary"], delta=delta, num_candidates=num_atoms)
    if spec["dictionary"] != "free" or spec["free_init"]:
        sae.set_candidates(kmeans_centroids(x, num_atoms, seed=seed), free_init=spec["free_init"])
    D0 = sae.dictionary.get_dictionary().detach().clone()
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    per_epoch = len(x) // batch_size
    first_r2 = float("nan")
    for step in range(steps):
        if step and step % per_epoch == 0:
            order = torch.randperm(len(x), generator=g)
        batch = x[order[(step % per_epoch) * batch_size : (step % per_epoch + 1) * batch_size]]
        pre, codes, x_hat = sae(batch)
        loss = sae_loss(batch, x_hat, pre, codes, None)
        if step == 0:
            first_r2 = float(1 - loss.detach() / (batch - batch.mean()).square().mean())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        opt.step()
    sae.dictionary.project_()
    return sae.eval(), D0, first_r2


@torch.no_grad()
def _evaluate(sae: SparseAutoencoder, x: Tensor) -> tuple[float, Tensor]:
    _, codes, x_hat = sae(x)
    r2 = 1 - (x - x_hat).square().sum() / ((x - x.mean()).square().sum() + 1e-6)  # official scalar-mean R²
    return float(r2), (codes > 0).any(0)


def run(quick: bool = False, out: Path | str | None = None, seeds: int | None = None) -> dict[str, float]:
    """Run the card's grid, print the table, and (with ``out``) write ``ra-sae.json`` and ``ra-sae.png``.

    ``quick``: 1,500 steps, one seed pair, k* = 256 only, arms a–c (about a minute). Full: 3,000 steps, 3 seeds
    (3 pairs), k* ∈ {48, 256}, all four arms.

    Returns:
        flat results, e.g. ``results["raw/k256/ra/stability"]``, plus ``claims/...`` (1.0 when a claim holds).
    """
    from datamodules.activations import make_sparse_concepts

    steps = 1500 if quick else 3000
    n_seeds = seeds or (2 if quick else 3)
    kstars = (256,) if quick else (48, 256)
    arms = ("topk", "topk-kmeans", "ra") if quick else tuple(ARMS)
    results: dict[str, float] = {}
    start = time.perf_counter()
    for kstar in kstars:
        pool, _ = make_sparse_concepts(20_000, 32, kstar, 3, 0.05, seed=0)
        test = pool[:4000]  # held out from every run
        train_pool = pool[4000:]
        subsets = [
            torch.randperm(len(train_pool), generator=torch.Generator().manual_seed(100 + r))[: len(train_pool) // 2]
            for r in range(n_seeds)
        ]
        for prep in ("raw", "centred"):
            key = f"{prep}/k{kstar}"
            g = torch.Generator().manual_seed(kstar)
            centre = train_pool.mean(0) if prep == "centred" else torch.zeros(32)
            results[f"{key}/floor_points"] = float(stability_floor_points(train_pool - centre, 64, generator=g))
            results[f"{key}/floor_gaussian"] = float(stability_floor_gaussian(64, 32, generator=g))
            for arm in arms:
                dicts, alive, r2s, moved, first = [], [], [], [], []
                for r in range(n_seeds):
                    x = train_pool[subsets[r]]
                    mu = x.mean(0) if prep == "centred" else torch.zeros(32)  # each run centres with its own subset
                    sae, D0, r2_first = train_arm(x - mu, arm, seed=r, steps=steps)
                    r2, alive_r = _evaluate(sae, test - mu)
                    D = sae.dictionary.get_dictionary()
                    dicts.append(D), alive.append(alive_r), r2s.append(r2), first.append(r2_first)
                    moved.append(float(1 - torch.nn.functional.cosine_similarity(D, D0, dim=1).mean()))
                    print(
                        f"  {key:<14} {arm:<12} seed {r}: R2 {r2:.3f}  ({time.perf_counter() - start:.0f} s)",
                        flush=True,
                    )
                pairs = list(itertools.combinations(range(n_seeds), 2))
                results[f"{key}/{arm}/stability"] = _mean(
                    float(dictionary_stability(dicts[i], dicts[j])) for i, j in pairs
                )
                results[f"{key}/{arm}/stability_alive"] = _mean(
                    float(dictionary_stability(dicts[i], dicts[j], alive=alive[i], alive_ref=alive[j]))
                    for i, j in pairs
                )
                results[f"{key}/{arm}/r2"] = _mean(r2s)
                results[f"{key}/{arm}/r2_first_step"] = _mean(first)
                results[f"{key}/{arm}/dead_fraction"] = _mean(1 - float(a.float().mean()) for a in alive)
                results[f"{key}/{arm}/moved"] = _mean(moved)
    results.update(_claims(results, quick))
    results["seconds"] = time.perf_counter() - start
    _print_table(results, kstars, arms, n_seeds, steps)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ra-sae.json").write_text(json.dumps(results, indent=2, sort_keys=True))
        _plot(results, kstars, arms, out / "ra-sae.png")
        print(f"Wrote {out / 'ra-sae.json'} and {out / 'ra-sae.png'}")
    return results


def _mean(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values)


def _claims(r: dict[str, float], quick: bool) -> dict[str, float]:
    """The card's assertions (§5), as 1.0 / 0.0. Claim 2 is too close to zero to judge at --quick scale."""
    claims = {
        "claims/raw_k256_ra_minus_topk>=0.20": float(r["raw/k256/ra/stability"] - r["raw/k256/topk/stability"] >= 0.20),
        "claims/centred_k256_r2_ra>=0.9*topk": float(r["centred/k256/ra/r2"] >= 0.9 * r["centred/k256/topk/r2"]),
    }
    # Review note: claim 1 alone would pass for an RA dictionary stuck at its centroids (the raw floor is ~0.9),
    # so also require that RA-SAE atoms moved and its reconstruction improved during training.
    for key in [k[: -len("/ra/moved")] for k in r if k.endswith("/ra/moved")]:
        claims[f"claims/{key.replace('/', '_')}_ra_trained"] = float(
            r[f"{key}/ra/moved"] > 1e-3 and r[f"{key}/ra/r2"] > r[f"{key}/ra/r2_first_step"] + 0.05
        )
    if not quick:
        claims["claims/centred_k256_ra_minus_topk>=0"] = float(
            r["centred/k256/ra/stability"] - r["centred/k256/topk/stability"] >= 0.0
        )
    return claims


def _print_table(r: dict[str, float], kstars: tuple[int, ...], arms: tuple[str, ...], n_seeds: int, steps: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"RA-SAE stability across runs ({n_seeds} seeds, {steps} steps; stab = matched cosine)")
    table.add_column("setting")
    table.add_column("floor pts / gauss")
    for arm in arms:
        table.add_column(f"{ARMS[arm]['label']}\nstab (alive) | R2 | dead")
    for kstar in kstars:
        for prep in ("raw", "centred"):
            key = f"{prep}/k{kstar}"
            cells = [
                f"{r[f'{key}/{a}/stability']:.3f} ({r[f'{key}/{a}/stability_alive']:.3f}) | "
                f"{r[f'{key}/{a}/r2']:.3f} | {r[f'{key}/{a}/dead_fraction']:.2f}"
                for a in arms
            ]
            table.add_row(
                f"{prep}, k*={kstar}", f"{r[f'{key}/floor_points']:.2f} / {r[f'{key}/floor_gaussian']:.2f}", *cells
            )
    console = Console(width=200)
    console.print(table)
    print_claims(console, r)
    if "topk-kmeans" in arms:
        key = "raw/k256"
        console.print(
            f"Critique check ({key}): TopK with k-means init reaches stability "
            f"{r[f'{key}/topk-kmeans/stability']:.3f} vs RA-SAE {r[f'{key}/ra/stability']:.3f} and random-init TopK "
            f"{r[f'{key}/topk/stability']:.3f}: much of the gain comes from the shared k-means initialisation."
        )


def _plot(r: dict[str, float], kstars: tuple[int, ...], arms: tuple[str, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = [f"{p}/k{k}" for k in kstars for p in ("raw", "centred")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [s + i * width for s in range(len(settings))]
        axes[0].bar(xs, [r[f"{k}/{arm}/stability"] for k in settings], width, label=ARMS[arm]["label"])
        axes[1].bar(xs, [r[f"{k}/{arm}/r2"] for k in settings], width, label=ARMS[arm]["label"])
    for s, key in enumerate(settings):
        span = (s - width / 2, s + 0.8 - width / 2)
        axes[0].hlines(
            r[f"{key}/floor_points"],
            *span,
            colors="k",
            linestyles="--",
            label="floor: random data points" if s == 0 else None,
        )
        axes[0].hlines(
            r[f"{key}/floor_gaussian"],
            *span,
            colors="grey",
            linestyles=":",
            label="floor: Gaussian dictionaries" if s == 0 else None,
        )
    for ax, title in zip(axes, ("stability across runs (matched cosine)", "test R²")):
        ax.set_xticks([s + 0.4 - width / 2 for s in range(len(settings))], settings)
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
