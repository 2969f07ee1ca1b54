"""The figures of ``zoo reproduce segment-anyword``: per-arm scores by subset, and masks on shared-colour scenes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zoo.models.segment_anyword.experiment import SUBSETS

__all__ = ["plot"]


def plot(r: Mapping[str, Any], experiment: Any, arms: tuple[str, ...], path: Path) -> None:
    """``path``: gIoU per arm and subset; ``<stem>-masks.png``: four shared-colour scenes of the first seed with the
    masks of raw attention, the full pipeline and the colour component."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.8))
    width = 0.8 / len(SUBSETS)
    for j, subset in enumerate(SUBSETS):
        xs = [i + (j - 1) * width for i in range(len(arms))]
        ax.bar(xs, [r[f"{a}/{subset}_giou"] for a in arms], width, label=subset)
    ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
    ax.set(ylabel="gIoU (mean IoU per phrase)", ylim=(0, 1.05),
           title=f"Segment Anyword on textured shape scenes, mean of {r['num_seeds']} seed(s)")  # fmt: skip
    ax.legend(title="scenes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

    shown = [a for a in ("raw", "full", "colour_component") if experiment.panels.get(a)]
    if not shown:
        return
    data = experiment.scenes_of(0)
    # the scenes the panels hold: the first four shared-colour scenes that name two objects
    scenes = [
        i for i in range(experiment.scenes) if bool(data["shared_colour"][i]) and len(data["caption"][i].split()) > 3
    ]
    rows = min(len(scenes), *(len(experiment.panels[a]) for a in shown))
    if rows == 0:
        return
    cols = 1 + 2 * len(shown)
    fig, axes = plt.subplots(rows, cols, figsize=(1.4 * cols, 1.5 * rows), squeeze=False)
    for row, i in enumerate(scenes[:rows]):
        axes[row, 0].imshow(((data["image"][i].permute(1, 2, 0) + 1) / 2).clamp(0, 1))
        axes[row, 0].set_title(data["caption"][i], fontsize=5)
        for j, arm in enumerate(shown):
            for k, mask in enumerate(experiment.panels[arm][row][:2]):
                ax = axes[row, 1 + 2 * j + k]
                ax.imshow(mask.float(), cmap="gray", vmin=0, vmax=1)
                ax.set_title(f"{arm}: phrase {k + 1}", fontsize=6)
    for ax in axes.flat:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path.with_name(path.stem + "-masks.png"), dpi=110)
    plt.close(fig)
