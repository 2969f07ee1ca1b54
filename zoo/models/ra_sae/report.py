"""The notes and the figure of ``zoo reproduce ra-sae`` (numbers from the run's results)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zoo.models.ra_sae.experiment import ARMS, IDENTIFIABILITY_HEURISTICS, PREPS

__all__ = ["notes", "plot"]


def notes(r: Mapping[str, Any]) -> list[str]:
    """What the ablations show, in numbers from this run."""

    def arm(prep: str, name: str) -> str:
        return f"{r[f'{prep}/{name}/stability']:.3f} (R² {r[f'{prep}/{name}/r2']:.3f})"

    out = [
        f"{prep}: stability (R²): TopK {arm(prep, 'topk')}; RA-SAE {arm(prep, 'ra')}; TopK started at the k-means "
        f"centroids {arm(prep, 'topk-kmeans')}; decoder frozen at the centroids {arm(prep, 'kmeans-frozen')}; RA-SAE "
        f"with W frozen {arm(prep, 'ra-frozen-w')}; RA-SAE with the official start (raw C, m = 0) "
        f"{arm(prep, 'ra-raw')}, {r[f'{prep}/ra-raw/dead_fraction']:.0%} of its atoms dead against "
        f"{r[f'{prep}/ra/dead_fraction']:.0%} with the equal-norm start."
        for prep in PREPS
    ]
    out.append(
        "Non-learned reconstructions with the same 3 codes per sample (the task check): "
        + "; ".join(
            f"{prep}: the top-3 PCA projection R² {r[f'{prep}/pca/r2']:.3f}, random data points {r[f'{prep}/points/r2']:.2f}"
            for prep in PREPS
        )
        + "."
    )
    out.append(
        "The untrained RA-SAE's stability is that of two sets of k-means centroids alone; compare every stability "
        f"with it and with the random-points floor (raw {r['raw/floor_points']:.2f}, centred "
        f"{r['centred/floor_points']:.2f})."
    )
    return out


def plot(r: Mapping[str, Any], path: Path) -> None:
    """Stability against R² per arm (raw and centred), and the two benchmarks per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.8))
    for ax, prep in zip(axes[:2], PREPS):
        for arm in ARMS:
            if arm == "ra-init":
                continue  # R² far below 0
            x, y = r[f"{prep}/{arm}/r2"], r[f"{prep}/{arm}/stability"]
            ax.scatter(x, y, s=60 if arm == "ra" else 25, c="k" if arm == "ra" else None)
            ax.annotate(arm, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(r[f"{prep}/floor_points"], color="grey", ls="--", lw=1, label="floor: random data points")
        ax.set_xlabel("test R²")
        ax.set_ylabel("stability across runs")
        ax.set_title(f"{prep}, k* = 256 (untrained RA-SAE left out)")
        ax.legend(fontsize=7)
    for ax, bench, metric, extra in (
        (axes[2], "plausibility", "plausibility", ("points",)),
        (axes[3], "identifiability", "accuracy", tuple(IDENTIFIABILITY_HEURISTICS)),
    ):
        names = [*ARMS, *extra]
        values = [r[f"{bench}/{a}/{metric}"] for a in names]
        ax.barh(range(len(names)), values, color=["k" if a == "ra" else "C0" for a in names])
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlim(min(values) - 0.05, 1.0)
        ax.set_title(f"{bench} ({metric})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
