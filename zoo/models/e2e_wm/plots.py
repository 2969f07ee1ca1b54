"""The figure of ``zoo reproduce e2e-wm``: robustness against distortion, and detection over swap rates."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["ATTACKS", "plot_reproduction"]

ATTACKS = (0.0, 0.3, 0.5)  # the share of tokens swapped for a synonym, on both sides


def plot_reproduction(r: Mapping[str, Any], path: Path) -> None:
    """Robustness against distortion (KL) per arm, and AUC over swap rates, from ``zoo reproduce e2e-wm``'s results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = [k[: -len("/auc_50")] for k in r if k.endswith("/auc_50") and "/seed" not in k]
    for scheme, marker in (("kgw", "o-"), ("unigram", "s-")):
        pts = sorted((r[f"{a}/kl"], r[f"{a}/auc_50"]) for a in arms if a.startswith(scheme))
        axes[0].plot(*zip(*pts), marker, label=f"{scheme} (δ sweep)")
    for a, m in (
        ("e2e", "*"),
        ("e2e-no-noise", "^"),
        ("e2e-init", "v"),
        ("e2e-soft", "P"),
        ("exp", "D"),
        ("none", "x"),
    ):
        if f"{a}/auc_50" in r:
            axes[0].plot(r[f"{a}/kl"], r[f"{a}/auc_50"], m, markersize=12, label=a)
    axes[0].set(
        xlabel="distortion KL(q ‖ p) (nats/token)", ylabel="ROC-AUC at 50 % synonym swap", title="robustness vs quality"
    )
    axes[0].legend(fontsize=8)
    for a in ("e2e", "e2e-no-noise", "e2e-likelihood", "exp", "kgw-d3", "unigram-d3", "none"):
        if f"{a}/auc_0" in r:
            axes[1].plot([100 * p for p in ATTACKS], [r[f"{a}/auc_{round(100 * p)}"] for p in ATTACKS], "o-", label=a)
    axes[1].set(xlabel="tokens swapped (%)", ylabel="ROC-AUC", title="detection under synonym swaps")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
