"""iCEM (Pinneri et al. 2020) as the ZILOT code configures mbrl-lib's ``ICEMOptimizer``: coloured-noise populations,
elites shifted between environment steps, momentum on mean and variance, the best sample returned.

Neither iCEM nor its coloured-noise sampler is in a maintained package the zoo can use (mbrl-lib pins old gym and
torch), so both are written here (the card: "iCEM is about 60 lines").

Example:
    >>> target = torch.tensor([0.5, -0.5, 0.25])
    >>> icem = ICEM(horizon=3, action_dim=1, population=64, iterations=4, elites=6)
    >>> best = icem.plan(lambda a: -((a[..., 0] - target) ** 2).sum(-1), generator=torch.Generator().manual_seed(0))
    >>> bool(((best[:, 0] - target) ** 2).sum() < 0.05)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["ICEM", "coloured_noise"]


def coloured_noise(beta: float, shape: tuple[int, ...], generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> Tensor:  # fmt: skip
    """Gaussian noise ``[*shape]`` with power spectrum ∝ 1 / f^β along the last axis, unit variance at every step.

    β = 0 is white noise (the real FFT of i.i.d. normals is drawn directly), β = 2 is Brownian-like (the iCEM
    default). Frequencies below 1 / T are raised to 1 / T, as the ``colorednoise`` package does.
    """
    n = shape[-1]
    if n == 1:  # a single step has no spectrum
        return torch.randn(shape, generator=generator, device=device)
    freq = torch.fft.rfftfreq(n, device=device).clamp_min(1.0 / n)
    scale = freq ** (-beta / 2.0)
    re = torch.randn((*shape[:-1], len(freq)), generator=generator, device=device)
    im = torch.randn((*shape[:-1], len(freq)), generator=generator, device=device)
    # The DC term (and the Nyquist term for even n) is real: its real part carries the variance of both parts.
    real_only = torch.zeros(len(freq), dtype=torch.bool, device=device)
    real_only[0] = True
    if n % 2 == 0:
        real_only[-1] = True
    re = torch.where(real_only, re * math.sqrt(2.0), re)
    im = torch.where(real_only, torch.zeros_like(im), im)
    spectrum = torch.complex(re * scale, im * scale)
    # Var(y_t) = (1 / n²) Σ_k w_k s_k² with w = 2 for the real-only terms and 4 for the rest.
    weight = torch.where(real_only, 2.0, 4.0)
    std = torch.sqrt((weight * scale**2).sum()) / n
    return torch.fft.irfft(spectrum, n=n) / std


class ICEM:
    """Improved cross-entropy planning over action sequences ``[H, A]`` in a box, for one episode at a time.

    Per call of :meth:`plan` (one environment step): the mean starts at 0 and the variance at (ub − lb)² / 16. Each of
    ``iterations`` iterations samples ``population`` sequences of coloured noise (exponent ``beta`` along time),
    clipped to the box, and adds the elites of the previous environment step shifted by one step (iteration 0), the
    previous iteration's elites (later iterations, ``keep_elites``) and the mean (last iteration). The ``elites`` best
    by the objective update mean and variance with momentum ``alpha`` (μ ← α μ + (1 − α) μ_elite). Returns the best
    sequence seen, not the mean. Call :meth:`reset` at every episode start.

    Args:
        horizon / action_dim: the sequence shape.
        population / iterations / elites: the card's 512 / 4 / ceil(512 · 0.01) = 6 (toy: 128 / 3 / 6).
        beta / alpha: the coloured-noise exponent and the momentum (2 / 0.1).
        lower / upper: the action box.
    """

    def __init__(self, horizon: int, action_dim: int, population: int = 512, iterations: int = 4, elites: int = 6,
                 beta: float = 2.0, alpha: float = 0.1, keep_elites: bool = True, lower: float = -1.0,
                 upper: float = 1.0) -> None:  # fmt: skip
        if not 0 < elites <= population:
            raise ValueError(f"iCEM: elites must be in 1..population, got {elites} of {population}")
        if horizon < 1 or iterations < 1:
            raise ValueError(f"iCEM: horizon and iterations must be ≥ 1, got {horizon} and {iterations}")
        self.horizon, self.action_dim, self.population, self.iterations = horizon, action_dim, population, iterations
        self.n_elites, self.beta, self.alpha, self.keep_elites = elites, beta, alpha, keep_elites
        self.lower, self.upper = lower, upper
        self._shifted: Tensor | None = None

    def reset(self) -> None:
        """Forget the elites (a new episode)."""
        self._shifted = None

    def _sample(self, mean: Tensor, var: Tensor, generator: torch.Generator | None) -> Tensor:
        noise = coloured_noise(self.beta, (self.population, self.action_dim, self.horizon), generator, mean.device)
        return (mean + noise.transpose(1, 2) * var.sqrt()).clamp(self.lower, self.upper)

    def plan(self, objective: Callable[[Tensor], Tensor], generator: torch.Generator | None = None,
             device: torch.device | str | None = None) -> Tensor:  # fmt: skip
        """The best action sequence ``[H, A]`` found for ``objective(actions [P, H, A]) -> scores [P]`` (higher is
        better)."""
        shape = (self.horizon, self.action_dim)
        mean = torch.zeros(shape, device=device)
        var = torch.full(shape, (self.upper - self.lower) ** 2 / 16.0, device=device)
        best, best_score, elites = mean, -math.inf, None
        for i in range(self.iterations):
            population = self._sample(mean, var, generator)
            extra = []
            if i == 0 and self._shifted is not None:
                extra.append(self._shifted)
            elif i > 0 and self.keep_elites and elites is not None:
                extra.append(elites)
            if i == self.iterations - 1:
                extra.append(mean[None])
            population = torch.cat([population, *extra]) if extra else population
            scores = objective(population)
            if scores.shape != (len(population),):
                raise ValueError(f"iCEM: the objective must return one score per sequence [{len(population)}], got "
                                 f"{tuple(scores.shape)}")  # fmt: skip
            top = scores.topk(self.n_elites).indices
            elites = population[top]
            if float(scores[top[0]]) > best_score:
                best, best_score = population[top[0]], float(scores[top[0]])
            mean = self.alpha * mean + (1 - self.alpha) * elites.mean(0)
            var = self.alpha * var + (1 - self.alpha) * elites.var(0, unbiased=False)
        # the next step's candidates: these elites one step on, with a fresh last action
        fresh = self._sample(mean, var, generator)[: self.n_elites, -1:]
        self._shifted = torch.cat([elites[:, 1:], fresh], dim=1)
        return best
