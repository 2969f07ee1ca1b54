"""Regions and point prompts on maps: the largest connected component and farthest-point sampling (Segment Anyword,
card §2 steps 4–5). Shared by the pipeline (positive points) and ``SamRefiner`` (background negatives)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["largest_component", "sample_points"]


def largest_component(binary: Tensor) -> Tensor:
    """The largest 4-connected component of a boolean map ``(H, W)`` (empty stays empty).

    Example:
        >>> m = torch.zeros(4, 4, dtype=torch.bool)
        >>> m[0, 0] = m[2:4, 2:4] = True
        >>> int(largest_component(m).sum())
        4
    """
    from scipy import ndimage

    labels, count = ndimage.label(binary.cpu().numpy())
    if count == 0:
        return torch.zeros_like(binary, dtype=torch.bool)
    sizes = np.bincount(labels.ravel())[1:]
    return torch.from_numpy(labels == 1 + int(np.argmax(sizes))).to(binary.device)


def sample_points(region: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """``k`` points ``(k', 2)`` as (row, col), ``k' = min(k, |region|)``, spread over a boolean region ``(H, W)`` by
    farthest-point sampling from a random start (drawn with ``generator``: seed it for reproducible points).

    Example:
        >>> region = torch.zeros(5, 5, dtype=torch.bool)
        >>> region[0, 0] = region[4, 4] = True
        >>> sorted(sample_points(region, 3).tolist())
        [[0, 0], [4, 4]]
    """
    cells = region.nonzero().float()
    if len(cells) == 0 or k < 1:
        return torch.zeros(0, 2, dtype=torch.long)
    chosen = [int(torch.randint(len(cells), (1,), generator=generator))]
    dist = (cells - cells[chosen[0]]).norm(dim=-1)
    for _ in range(min(k, len(cells)) - 1):
        nxt = int(dist.argmax())
        chosen.append(nxt)
        dist = torch.minimum(dist, (cells - cells[nxt]).norm(dim=-1))
    return cells[chosen].long()
