"""CLUDI's diffusion over assignment embeddings: the "sqrt" schedule, rescaled noise, min-SNR weights, DDIM sampling.

The schedule and the DDIM update come from diffusers' :class:`~diffusers.DDIMScheduler` (``trained_betas`` from
the official ``betas_for_alpha_bar`` discretisation of ᾱ(s) = 1 − √(s + 1e-4), ``prediction_type="sample"``,
``timestep_spacing="trailing"``, which for R dividing T is the official grid ``reversed(linspace(−1, T−1, R+1))``).
What diffusers has no option for is written here: the noise rescale r (z_t = √ᾱ z_0 + √(1−ᾱ) r ε, and r ξ in each
η = 1 DDIM step), the clamp of ẑ_0 *before* ε̂ is derived from it, self-conditioning, and the min-SNR weights
divided by r.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from diffusers import DDIMScheduler
from torch import Tensor

__all__ = ["ClusterDiffusion", "sqrt_schedule_betas"]

Denoiser = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def sqrt_schedule_betas(steps: int = 1000, shift: float = 1e-4, max_beta: float = 0.999) -> list[float]:
    """β_i = min(1 − ᾱ((i+1)/T) / ᾱ(i/T), 0.999) for ᾱ(s) = 1 − √(s + shift), the official "sqrt" schedule.

    Near s = 1, ᾱ(s) turns negative; the cap at 0.999 is what keeps the last ᾱ_t just above zero.

    Example:
        >>> betas = sqrt_schedule_betas(1000)
        >>> len(betas), round(betas[0], 5), betas[-1]
        (1000, 0.0234, 0.999)
    """

    def alpha_bar(s: float) -> float:
        return 1 - math.sqrt(s + shift)

    return [min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), max_beta) for i in range(steps)]


class ClusterDiffusion:
    """The forward process, loss weights and η = 1 DDIM sampler of CLUDI (x0-prediction).

    Args:
        num_timesteps: T (1000).
        rescale: noise scale r (49): the embeddings have norm √E, so the signal is drowned except at small t.
        min_snr: γ of the min-SNR loss weight min(SNR_t, γ) / r.
        clamp: clamp ẑ_0 to [−1, 1] while sampling (the official code does; the embeddings' coordinates have RMS 1).

    Example:
        >>> from zoo.models.cludi import AssignmentDenoiser
        >>> net = AssignmentDenoiser(feat_dim=8, num_clusters=3, emb_dim=4, assign_dim=8).eval()
        >>> diffusion = ClusterDiffusion()
        >>> logits = diffusion.sample(net, torch.randn(2, 5, 8), steps=10, generator=torch.Generator().manual_seed(0))
        >>> logits.shape
        torch.Size([2, 5, 3])
    """

    def __init__(self, num_timesteps: int = 1000, rescale: float = 49.0, min_snr: float = 5.0, clamp: bool = True):
        self.num_timesteps, self.rescale, self.clamp = num_timesteps, rescale, clamp
        self.scheduler = DDIMScheduler(
            num_train_timesteps=num_timesteps,
            trained_betas=sqrt_schedule_betas(num_timesteps),
            prediction_type="sample",
            clip_sample=False,  # the clamp is applied before ε̂ is derived, see `sample`
            set_alpha_to_one=True,
            timestep_spacing="trailing",
        )
        alpha_bar = self.scheduler.alphas_cumprod
        self.loss_weight = (alpha_bar / (1 - alpha_bar)).clamp(max=min_snr) / rescale

    def q_sample(self, z0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """z_t = √ᾱ_t z_0 + √(1 − ᾱ_t) · r · noise, with one ``t`` per copy (``z0`` ``(S, B, E)``, ``t`` ``(S,)``)."""
        return self.scheduler.add_noise(z0, self.rescale * noise, t)

    def weights(self, t: Tensor) -> Tensor:
        """min(SNR_t, γ) / r for each timestep in ``t``."""
        return self.loss_weight.to(t.device)[t]

    def sample(
        self,
        net: Denoiser,
        x: Tensor,
        steps: int,
        head: Callable[[Tensor], Tensor] | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Cluster logits ``(S, B, K)`` from one η = 1 DDIM chain of ``steps`` steps per copy of ``x`` ``(S, B, F)``.

        Runs under the caller's grad mode: the official teacher back-propagates through the whole chain. ``head``
        defaults to ``net.head``; the chain starts at z ~ N(0, r² I) with z_sc = 0, and every step feeds ẑ_0 back
        as the self-conditioning input.
        """
        if steps < 1 or self.num_timesteps % steps:
            raise ValueError(
                f"sampling steps must divide T={self.num_timesteps} (so the grid is the official one), got {steps}"
            )
        head = head or net.head
        self.scheduler.set_timesteps(steps, device="cpu")
        shape = (*x.shape[:-1], net.emb_dim)
        z = self.rescale * torch.randn(shape, generator=generator, device=x.device if generator is None else "cpu")
        z = z.to(x.device)
        z_sc = torch.zeros_like(z)
        z0 = z
        for t in self.scheduler.timesteps.tolist():
            z0 = net(z, x, torch.full((x.shape[0],), t, device=x.device, dtype=torch.long), z_sc)
            if self.clamp:
                z0 = z0.clamp(-1.0, 1.0)
            noise = self.rescale * torch.randn(shape, generator=generator, device="cpu" if generator else x.device)
            z = self.scheduler.step(z0, t, z, eta=1.0, variance_noise=noise.to(x.device)).prev_sample
            z_sc = z0
        return head(z0)
