"""ProDiff's diffusion over trajectory windows with the two endpoints held: the forward process, the guided ε̂ and
the DDPM / DDIM samplers.

The schedules and the reverse steps are diffusers' :class:`~diffusers.DDPMScheduler` (linear β, log-clipped
posterior variance, as the official DDPM) and :class:`~diffusers.DDIMScheduler`. What diffusers has no option for is
written here: the clean endpoints in x_t and after every reverse step (inpainting by overwriting), and the
official "guidance" ε̂ = (1 + w) ε_θ(x_t, t, J_c) − w ε_θ(x_t, t, J_u), used in training as well as sampling.

DDIM uses ``timestep_spacing="trailing"`` with ``set_alpha_to_one=True``: for T = 100 and 25 steps the grid is
99, 95, …, 3 and the last step returns x̂_0. The official grid is ``linspace(T − 1, 0, steps)`` and its last step
lands on t = 0 (ᾱ_0 = 1 − β_0), which differs from x̂_0 by a factor √(1 − 1e-4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from diffusers import DDIMScheduler, DDPMScheduler
from torch import Tensor

__all__ = ["EndpointDiffusion", "hold_endpoints"]

Sampler = Literal["ddpm", "ddim"]
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
               generator: torch.Generator | None = None, progress: bool = False) -> Tensor:  # fmt: skip
        """Impute the interior of ``ends`` [B, 3, k] (only its first and last points are read).

        Starts from x_T ~ N(0, I) with the endpoints overwritten and overwrites them again after every step.
        ``sampler="ddpm"`` runs all T steps (``steps`` is ignored); ``"ddim"`` runs ``steps`` with noise scale ``eta``.
        """
        if sampler not in ("ddpm", "ddim"):
            raise ValueError(f"sampler must be 'ddpm' or 'ddim', got {sampler!r}")
        scheduler = self.ddpm if sampler == "ddpm" else self.ddim
        scheduler.set_timesteps(self.num_timesteps if sampler == "ddpm" or steps is None else steps)
        noise = torch.randn(ends.shape, generator=generator, device=generator.device if generator else "cpu")
        x = hold_endpoints(noise.to(ends.device, ends.dtype), ends)
        kwargs = {"eta": eta} if sampler == "ddim" else {}
        timesteps = scheduler.timesteps
        if progress:
            from rich.progress import track

            timesteps = track(timesteps, description=f"{sampler} sampling")
        for t in timesteps:
            e = eps(x, t.to(ends.device).expand(len(x)))
            x = hold_endpoints(scheduler.step(e, t, x, generator=generator, **kwargs).prev_sample, ends)
        return x
