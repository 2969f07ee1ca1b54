"""``AnnotationSaving``: the predicted human-annotation saving of control-variates evaluation, averaged over pairs."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from zoo.arguments import check_range

__all__ = ["AnnotationSaving"]


class AnnotationSaving(Metric):
    """Mean over model pairs of ρ², the squared human–synthetic correlation (Zhou et al., ICML 2025).

    With control variates, matching the variance of human-only evaluation needs only ``(1 − ρ²)`` of the human
    labels, so ρ² is the saving. As the official ``compute_sample_saving``, ρ is Pearson's correlation of ``z`` and
    ``ẑ`` within each ordered model pair ``(llm_a, llm_b)``, and the reported saving is the unweighted mean of ρ²
    over pairs with at least ``min_count`` comparisons (the bootstrap's ``≥ 100`` threshold; the official statistics
    script uses a strict ``>``). Pooling all pairs would inflate ρ with between-pair differences in win rate.

    State: six fixed-size ``(num_llms, num_llms)`` sums, so accumulation is exact and DDP sync is cheap.

    Args:
        num_llms: number of LLM ids (ids are ``0 .. num_llms - 1``).
        min_count: pairs with fewer comparisons are left out.

    Example:
        >>> m = AnnotationSaving(num_llms=2, min_count=3)
        >>> z = torch.tensor([1.0, 0.0, 1.0, 0.0])
        >>> a, b = torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long)
        >>> m.update(z, torch.tensor([0.9, 0.2, 0.7, 0.4]), a, b)
        >>> round(float(m.compute()), 3)  # numpy: corrcoef(z, z_hat)[0, 1] ** 2
        0.862
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, num_llms: int, min_count: int = 100, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_range("num_llms", num_llms, low=2, integer=True)
        check_range("min_count", min_count, low=2, integer=True)
        self.num_llms, self.min_count = num_llms, min_count
        for name in ("n", "sz", "sh", "szz", "shh", "szh"):
            self.add_state(name, default=torch.zeros(num_llms, num_llms, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, z: Tensor, z_hat: Tensor, llm_a: Tensor, llm_b: Tensor) -> None:
        """Add comparisons: human labels ``z``, synthetic scores ``z_hat`` and the two LLM ids, all ``(N,)``."""
        if not (z.shape == z_hat.shape == llm_a.shape == llm_b.shape) or z.ndim != 1:
            raise ValueError(
                f"Expected z, z_hat, llm_a, llm_b of one shape (N,), got {tuple(z.shape)}, {tuple(z_hat.shape)}, "
                f"{tuple(llm_a.shape)}, {tuple(llm_b.shape)}."
            )
        cell = (llm_a.long() * self.num_llms + llm_b.long()).to(self.n.device)
        z, h = z.to(self.n), z_hat.detach().to(self.n)
        for state, values in (
            (self.n, torch.ones_like(z)),
            (self.sz, z),
            (self.sh, h),
            (self.szz, z * z),
            (self.shh, h * h),
            (self.szh, z * h),
        ):
            state.view(-1).index_add_(0, cell, values)

    def per_pair(self) -> Tensor:
        """ρ² per ordered pair ``(num_llms, num_llms)``; NaN where a pair has too few comparisons or no variance."""
        n = self.n
        cov = self.szh - self.sz * self.sh / n
        var_z, var_h = self.szz - self.sz**2 / n, self.shh - self.sh**2 / n
        rho2 = cov**2 / (var_z * var_h)
        return torch.where((n >= self.min_count) & (var_z > 0) & (var_h > 0), rho2, torch.nan)

    def compute(self) -> Tensor:
        return self.per_pair().nanmean().float()
