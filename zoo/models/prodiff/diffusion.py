"""ProDiff's diffusion over trajectory windows with the two endpoints held: the forward process, the guided ε̂ and
the DDPM / DDIM samplers.

The schedules and the reverse steps are diffusers' :class:`~diffusers.DDPMScheduler` (linear β, log-clipped
posterior variance, as the official DDPM) and :class:`~diffusers.DDIMScheduler`. What diffusers has no option for is
written here: the clean endpoints in x_t and after every reverse step (inpainting by overwriting), and the
official "guidance" ε̂ = (1 + w) ε_θ(x_t, t, J_c) − w ε_θ(x_t, t, J_u), used in training as well as sampling.

DDIM has two grids (``ddim_grid``). ``"trailing"`` (default) is diffusers' ``timestep_spacing="trailing"`` with
``set_alpha_to_one=True``: for T = 100 and 10 steps the timesteps are 99, 89, …, 9 and the last step returns x̂_0.
``"official"`` is the official code's: the transitions between ``linspace(T − 1, 0, steps + 1).long()`` (99, 89, …,
9, 0), so the last step lands on t = 0 and returns √ᾱ_0 x̂_0 + √(1 − ᾱ_0) ε̂ = 0.99995 x̂_0 + 0.01 ε̂, not x̂_0. In
scaled units that last term is up to a few hundredths of the range: tens of metres on a 10 km city. It is written
here because diffusers' DDIM steps on a fixed stride T // steps, which misses the truncated linspace for step counts
that do not divide T.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from diffusers import DDIMScheduler, DDPMScheduler
from torch import Tensor

__all__ = ["EndpointDiffusion", "hold_endpoints"]

Sampler = Literal["ddpm", "ddim"]
DDIMGrid = Literal["trailing", "official"]
# ε̂(x_t, t) for a batch at one timestep (the condition is bound by the caller).
Eps = Callable[[Tensor, Tensor], Tensor]


def hold_endpoints(x: Tensor, ends: Tensor) -> Tensor:
    """``x`` [B, C, k] with its first and last points replaced by those of ``ends`` (same shape).

    Example:
        >>> hold_endpoints(torch.zeros(1, 1, 4), torch.arange(4.0).view(1, 1, 4))
        tensor([[[0., 0., 0., 3.]]])
    """
    x = x.clone()
    x[..., 0], x[..., -1] = ends[..., 0], ends[..., -1]
    return x


class EndpointDiffusion:
    """Linear-β ε-prediction diffusion of [B, 3, k] windows whose two endpoints stay clean.

    Args:
        num_timesteps: T (500 in the paper, 100 in the card's CPU reproduction).
        beta_start: β_1.
        beta_end: β_T (0.05 for T = 500; 0.25 for T = 100 keeps T·mean(β) ≈ 12.5 so that ᾱ_T ≈ 0).

    Example:
        >>> diffusion = EndpointDiffusion(100, beta_end=0.25)
        >>> x0 = torch.rand(2, 3, 6)
        >>> xt = diffusion.q_sample(x0, torch.tensor([10, 99]), torch.randn(2, 3, 6))
        >>> bool((xt[..., 0] == x0[..., 0]).all() and (xt[..., -1] == x0[..., -1]).all())
        True
        >>> out = diffusion.sample(lambda x, t: torch.zeros_like(x), x0, steps=5)
        >>> bool((out[..., [0, -1]] == x0[..., [0, -1]]).all())
        True
    """

    def __init__(self, num_timesteps: int = 100, beta_start: float = 1e-4, beta_end: float = 0.25) -> None:
        self.num_timesteps = num_timesteps
        common = {"num_train_timesteps": num_timesteps, "beta_start": beta_start, "beta_end": beta_end,
                  "beta_schedule": "linear", "clip_sample": False, "prediction_type": "epsilon"}  # fmt: skip
        self.ddpm = DDPMScheduler(variance_type="fixed_small_log", **common)
        self.ddim = DDIMScheduler(timestep_spacing="trailing", set_alpha_to_one=True, **common)
        self.alphas_cumprod = self.ddpm.alphas_cumprod

    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = √ᾱ_t x_0 + √(1 − ᾱ_t) ε on the interior; the endpoints stay x_0's."""
        ab = self.alphas_cumprod.to(x0.device)[t].to(x0.dtype).view(-1, 1, 1)
        return hold_endpoints(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, x0)

    @torch.no_grad()
    def sample(self, eps: Eps, ends: Tensor, sampler: Sampler = "ddim", steps: int | None = 25, eta: float = 0.0,
               generator: torch.Generator | None = None, progress: bool = False,
               ddim_grid: DDIMGrid = "trailing") -> Tensor:  # fmt: skip
        """Impute the interior of ``ends`` [B, 3, k] (only its first and last points are read).

        Starts from x_T ~ N(0, I) with the endpoints overwritten and overwrites them again after every step.
        ``sampler="ddpm"`` runs all T steps (``steps`` is ignored); ``"ddim"`` runs ``steps`` (1 to T) with noise scale
        ``eta`` on ``ddim_grid`` (see the module's docstring).
        """
        if sampler not in ("ddpm", "ddim"):
            raise ValueError(f"sampler must be 'ddpm' or 'ddim', got {sampler!r}")
        if ddim_grid not in ("trailing", "official"):
            raise ValueError(f"ddim_grid must be 'trailing' or 'official', got {ddim_grid!r}")
        if not 0 <= eta <= 1:  # also refuses NaN; above 1 diffusers' DDIM step returns NaN
            raise ValueError(f"eta (the DDIM noise scale) must be in [0, 1], got {eta}")
        steps = self.num_timesteps if sampler == "ddpm" or steps is None else steps
        if not 1 <= steps <= self.num_timesteps:
            raise ValueError(f"steps must be in [1, {self.num_timesteps}] (the training timesteps T), got {steps}")
        noise = torch.randn(ends.shape, generator=generator, device=generator.device if generator else "cpu")
        x = hold_endpoints(noise.to(ends.device, ends.dtype), ends)
        if sampler == "ddim" and ddim_grid == "official":
            grid = torch.linspace(self.num_timesteps - 1, 0, steps + 1).long()  # .long() truncates, as the official
            pairs = list(zip(grid[:-1], grid[1:]))
        else:
            scheduler = self.ddpm if sampler == "ddpm" else self.ddim
            scheduler.set_timesteps(steps)
            pairs = [(t, None) for t in scheduler.timesteps]
        if progress:
            from rich.progress import track

            pairs = track(pairs, description=f"{sampler} sampling")
        for t, t_prev in pairs:
            e = eps(x, t.to(ends.device).expand(len(x)))
            if t_prev is None:
                kwargs = {"eta": eta} if sampler == "ddim" else {}
                x = scheduler.step(e, t, x, generator=generator, **kwargs).prev_sample
            else:
                x = self._official_ddim_step(x, e, int(t), int(t_prev), ends, eta, generator)
            x = hold_endpoints(x, ends)
        return x

    def _official_ddim_step(self, x: Tensor, e: Tensor, t: int, t_prev: int, ends: Tensor, eta: float,
                            generator: torch.Generator | None) -> Tensor:  # fmt: skip
        """One official DDIM step t → t_prev: x̂_0 with the endpoints held, then √ᾱ_prev x̂_0 + √(1 − ᾱ_prev − σ²) ε̂
        + σ z, with σ = η √((1 − ᾱ_prev) / (1 − ᾱ_t) · (1 − ᾱ_t / ᾱ_prev)); at t_prev = 0, ᾱ_0 = 1 − β_0."""
        ab, ab_prev = (float(self.alphas_cumprod[i]) for i in (t, t_prev))
        x0 = hold_endpoints((x - (1 - ab) ** 0.5 * e) / ab**0.5, ends)
        sigma = eta * ((1 - ab_prev) / (1 - ab) * (1 - ab / ab_prev)) ** 0.5
        out = ab_prev**0.5 * x0 + max(1 - ab_prev - sigma**2, 0.0) ** 0.5 * e
        if sigma > 0:
            z = torch.randn(x.shape, generator=generator, device=generator.device if generator else "cpu")
            out = out + sigma * z.to(x)
        return out
