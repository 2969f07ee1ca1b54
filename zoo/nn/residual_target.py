"""Adjacent residual prediction (ARP): a forecasting target made of frame-to-frame changes, and its inverse.

TCP-Diffusion (Huang et al., ICML 2025) diffuses the *change* of rainfall between adjacent frames rather than the
rainfall itself, then integrates the changes from the last observed frame. In the official code
(``rainfall_dataset_ICML.py``, ``utils.py``) the changes are taken in log space, r̃ = log(1 + R):

* Δ_k = r̃_k − r̃_{k−1}, with Δ = 0 for the first observed frame (nothing precedes it);
* normalised Δ̂ = (Δ − Δ_min) / (Δ_max − Δ_min) ∈ [0, 1], then mapped to [−1, 1] for the diffusion model;
* the history also holds r̂ = r̃ / r̃_max, mapped to [−1, 1];
* the inverse: r̃_{T+k} = r̃_T + Σ_{j ≤ k} Δ_{T+j}, R̂ = max(exp(r̃) − 1, 0).

The official constants (r̃_max 6.5498, Δ_min −5.3701, Δ_max 5.3105) fit MSWEP; :meth:`AdjacentResidualTarget.fit`
computes them from a training split instead. ``mode="absolute"`` is the baseline the paper ablates against: the
target is r̂ of the future frames themselves, with the same interface. Nothing here is specific to cyclones: any
(N, T, H, W) sequence forecaster can use it.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["AdjacentResidualTarget"]

# rainfall_dataset_ICML.py: "loge" (0, 6.549829553) and "diff_loge" (-5.370121099, 5.3104655)
OFFICIAL = {"log_max": 6.549829553, "diff_min": -5.370121099, "diff_max": 5.3104655}


class AdjacentResidualTarget(nn.Module):
    """Map rain sequences to a diffusion target in [−1, 1] and back: adjacent log-space residuals or absolute log rain.

    ``encode(past, future)`` returns ``(history, target)``: the history channels a denoiser is conditioned on
    (residual mode: ``[Δ̂_past, r̂_past]``, 2T channels; absolute mode: ``r̂_past``, T channels) and the target
    ``(N, T_out, H, W)``. ``decode(past, target)`` returns the rain of the future frames (clamped at 0).

    Args:
        mode: ``"residual"`` (ARP, the paper's) or ``"absolute"`` (the ablation baseline).
        log_max: r̃_max, the scale of log(1 + R).
        diff_min / diff_max: the range of Δ that maps onto [−1, 1].

    Example:
        >>> arp = AdjacentResidualTarget()
        >>> past, future = torch.rand(2, 4, 8, 8) * 30, torch.rand(2, 4, 8, 8) * 30
        >>> history, x0 = arp.encode(past, future)
        >>> history.shape, x0.shape, bool(x0.abs().max() <= 1)
        (torch.Size([2, 8, 8, 8]), torch.Size([2, 4, 8, 8]), True)
        >>> torch.allclose(arp.decode(past, x0), future, atol=1e-3)
        True
    """

    def __init__(
        self,
        mode: Literal["residual", "absolute"] = "residual",
        log_max: float = OFFICIAL["log_max"],
        diff_min: float = OFFICIAL["diff_min"],
        diff_max: float = OFFICIAL["diff_max"],
    ) -> None:
        super().__init__()
        if mode not in ("residual", "absolute"):
            raise ValueError(f"mode must be 'residual' or 'absolute', got {mode!r}")
        if not log_max > 0 or not diff_max > diff_min:
            raise ValueError(f"need log_max > 0 and diff_max > diff_min, got {log_max}, {diff_min}, {diff_max}")
        self.mode = mode
        self.register_buffer("constants", torch.tensor([log_max, diff_min, diff_max], dtype=torch.float64))

    @staticmethod
    def fit(rain: Tensor, margin: float = 0.05) -> dict[str, float]:
        """The constants of a training split of rain sequences ``(N, T, H, W)`` (mm per step, ≥ 0): the largest
        log(1 + R) and the range of adjacent log-space changes, each widened by ``margin`` of the range so that
        test data slightly outside still maps inside [−1, 1]."""
        if rain.ndim != 4 or rain.shape[1] < 2:
            raise ValueError(f"fit expects rain of shape (N, T >= 2, H, W), got {tuple(rain.shape)}")
        log = torch.log1p(rain.double().clamp_min(0))
        diff = log[:, 1:] - log[:, :-1]
        lo, hi = float(diff.min()), float(diff.max())
        pad = margin * (hi - lo)
        return {"log_max": float(log.max()) * (1 + margin), "diff_min": lo - pad, "diff_max": hi + pad}

    @property
    def _c(self) -> tuple[float, float, float]:
        log_max, diff_min, diff_max = self.constants.tolist()
        return log_max, diff_min, diff_max

    def _check(self, name: str, rain: Tensor) -> None:
        if rain.ndim != 4:
            raise ValueError(f"{name} must be rain of shape (N, T, H, W), got {tuple(rain.shape)}")

    def scaled_log(self, rain: Tensor) -> Tensor:
        """r̂ = log(1 + R) / r̃_max mapped to [−1, 1]."""
        return 2 * torch.log1p(rain.clamp_min(0)) / self._c[0] - 1

    def residuals(self, rain: Tensor, previous: Tensor | None = None) -> Tensor:
        """Δ̂ in [−1, 1] of a sequence ``(N, T, H, W)``: changes from ``previous`` ``(N, H, W)`` for the first frame,
        or 0 there when ``previous`` is None (the official first observed frame)."""
        log = torch.log1p(rain.clamp_min(0))
        first = torch.zeros_like(log[:, :1]) if previous is None else log[:, :1] - torch.log1p(previous)[:, None]
        diff = torch.cat([first, log[:, 1:] - log[:, :-1]], 1)
        _, lo, hi = self._c
        return 2 * (diff - lo) / (hi - lo) - 1

    def encode(self, past: Tensor, future: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``(history, target)`` of past ``(N, T_in, H, W)`` and future ``(N, T_out, H, W)`` rain (target None when
        future is None, for sampling)."""
        self._check("past", past)
        history = self.scaled_log(past)
        if self.mode == "residual":
            history = torch.cat([self.residuals(past), history], 1)
        if future is None:
            return history, None
        self._check("future", future)
        target = self.residuals(future, past[:, -1]) if self.mode == "residual" else self.scaled_log(future)
        return history, target

    def decode(self, past: Tensor, target: Tensor) -> Tensor:
        """Rain ``(N, T_out, H, W)`` of a target in model space, integrated from the last past frame (residual mode)."""
        log_max, lo, hi = self._c
        if self.mode == "absolute":
            log = (target.clamp(-1, 1) + 1) / 2 * log_max
        else:
            diff = (target + 1) / 2 * (hi - lo) + lo
            log = torch.log1p(past[:, -1:].clamp_min(0)) + diff.cumsum(1)
        return torch.expm1(log).clamp_min(0)
