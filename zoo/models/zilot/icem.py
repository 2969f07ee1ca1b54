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
    >>> official = ICEM(horizon=3, action_dim=1, population=64, iterations=4, elites=6, variant="official")
    >>> best = official.plan(lambda a: -((a[..., 0] - target) ** 2).sum(-1), generator=torch.Generator().manual_seed(0))
    >>> bool(((best[:, 0] - target) ** 2).sum() < 0.05)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["ICEM", "VARIANTS", "coloured_noise"]

VARIANTS = ("zoo", "official")


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"iCEM: variant must be one of {VARIANTS}, got {variant!r}")


def coloured_noise(beta: float, shape: tuple[int, ...], generator: torch.Generator | None = None,
                   device: torch.device | str | None = None, variant: str = "zoo") -> Tensor:  # fmt: skip
    """Gaussian noise ``[*shape]`` with power spectrum ∝ 1 / f^β along the last axis.

    β = 0 is white noise (the real FFT of i.i.d. normals is drawn directly), β = 2 is Brownian-like (the iCEM
    default). Frequencies below 1 / T are raised to 1 / T, as the ``colorednoise`` package does.

    ``variant="zoo"``: unit variance at every step (the real-only DC / Nyquist terms get √2 and the exact standard
    deviation divides). ``variant="official"``: mbrl-lib's ``powerlaw_psd_gaussian`` normalisation (no √2, and the
    divisor σ = 2 √(Σ_{k≥1} w_k s_k²) / n leaves out the DC term), so Var(y_t) = 1 + s_0² / (n² σ²) > 1, e.g.
    21 / 17 for n = 4, β = 2. A single step (n = 1) is white noise in both (mbrl-lib's sampler fails there).
    """
    _check_variant(variant)
    n = shape[-1]
    if n == 1:  # a single step has no spectrum
        return torch.randn(shape, generator=generator, device=device)
    freq = torch.fft.rfftfreq(n, device=device).clamp_min(1.0 / n)
    scale = freq ** (-beta / 2.0)
    re = torch.randn((*shape[:-1], len(freq)), generator=generator, device=device)
    im = torch.randn((*shape[:-1], len(freq)), generator=generator, device=device)
    # The DC term (and the Nyquist term for even n) is real.
    real_only = torch.zeros(len(freq), dtype=torch.bool, device=device)
    real_only[0] = True
    if n % 2 == 0:
        real_only[-1] = True
    if variant == "official":
        im = torch.where(real_only, torch.zeros_like(im), im)
        w = scale[1:].clone()
        w[-1] = w[-1] * (1 + n % 2) / 2.0  # the Nyquist term counted once for even n
        sigma = 2.0 * torch.sqrt((w**2).sum()) / n
        return torch.fft.irfft(torch.complex(re * scale, im * scale), n=n) / sigma
    # zoo: the real part of a real-only term carries the variance of both parts.
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

    ``variant="official"`` follows mbrl-lib's ``ICEMOptimizer`` as ZILOT configures it (population_decay_factor 1,
    keep_elite_frac 1, colored_noise_exponent 2, alpha 0.1, keep_last_solution False), read in
    github.com/martius-lab/zilot at commit feee9af5edf61780eb945a93e8f357ca5ee586d1 (zilot/third_party/mbrl/
    trajectory_opt.py, math.py; cfg/config.yaml). Deviations of the default ``variant="zoo"``, one a line as
    "what: zoo | official (line of trajectory_opt.py) | why zoo's choice is kept as the default":

    1. last iteration: adds the last elites and the mean | only the mean, in slot 0 (:455-456) | no elite is lost.
    2. insertion: appends (P, P + E, P + E + 1) | overwrites slots 0.. of max(P, 2E) (:427-458) | no sample is lost.
    3. shifted elites' last action: from the last μ, σ² | the slot's fresh draw from μ_0, σ²_0 (:454) | refined.
    4. noise variance: 1 | 1 + s_0² / (n σ)² > 1, 1.165 at H = 16, β = 2 (math.py:349-351) | the unit both claim.
    Official also starts the mean mid-box ((lb + ub) / 2, zoo: 0) and scores NaN as −inf (:420, 471); with
    ``keep_elites=False`` it keeps no elites at all (keep_elite_frac 0), the mean still enters the last iteration.

    Args:
        horizon / action_dim: the sequence shape.
        population / iterations / elites: the card's 512 / 4 / ceil(512 · 0.01) = 6 (toy: 128 / 3 / 6).
        beta / alpha: the coloured-noise exponent and the momentum (2 / 0.1).
        lower / upper: the action box.
        variant: ``"zoo"`` (the default, above) or ``"official"``.
    """

    def __init__(self, horizon: int, action_dim: int, population: int = 512, iterations: int = 4, elites: int = 6,
                 beta: float = 2.0, alpha: float = 0.1, keep_elites: bool = True, lower: float = -1.0,
                 upper: float = 1.0, variant: str = "zoo") -> None:  # fmt: skip
        if not 0 < elites <= population:
            raise ValueError(f"iCEM: elites must be in 1..population, got {elites} of {population}")
        if horizon < 1 or iterations < 1:
            raise ValueError(f"iCEM: horizon and iterations must be ≥ 1, got {horizon} and {iterations}")
        _check_variant(variant)
        self.horizon, self.action_dim, self.population, self.iterations = horizon, action_dim, population, iterations
        self.n_elites, self.beta, self.alpha, self.keep_elites = elites, beta, alpha, keep_elites
        self.lower, self.upper, self.variant = lower, upper, variant
        self._shifted: Tensor | None = None  # zoo: the previous step's elites, already shifted
        self._elites: Tensor | None = None  # official: the last elites (of the previous iteration or step)

    def reset(self) -> None:
        """Forget the elites (a new episode)."""
        self._shifted = self._elites = None

    def _sample(self, mean: Tensor, var: Tensor, generator: torch.Generator | None, size: int | None = None) -> Tensor:
        shape = (size or self.population, self.action_dim, self.horizon)
        noise = coloured_noise(self.beta, shape, generator, mean.device, self.variant)
        return (mean + noise.transpose(1, 2) * var.sqrt()).clamp(self.lower, self.upper)

    def _scores(self, objective: Callable[[Tensor], Tensor], population: Tensor) -> Tensor:
        scores = objective(population)
        if scores.shape != (len(population),):
            raise ValueError(f"iCEM: the objective must return one score per sequence [{len(population)}], got "
                             f"{tuple(scores.shape)}")  # fmt: skip
        return scores

    def plan(self, objective: Callable[[Tensor], Tensor], generator: torch.Generator | None = None,
             device: torch.device | str | None = None) -> Tensor:  # fmt: skip
        """The best action sequence ``[H, A]`` found for ``objective(actions [P, H, A]) -> scores [P]`` (higher is
        better)."""
        if self.variant == "official":
            return self._plan_official(objective, generator, device)
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
            scores = self._scores(objective, population)
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

    def _plan_official(self, objective: Callable[[Tensor], Tensor], generator: torch.Generator | None,
                       device: torch.device | str | None) -> Tensor:  # fmt: skip
        shape = (self.horizon, self.action_dim)
        mean = torch.full(shape, (self.lower + self.upper) / 2.0, device=device)
        var = torch.full(shape, (self.upper - self.lower) ** 2 / 16.0, device=device)
        size = max(self.population, 2 * self.n_elites)  # ceil(max(P · decay^-i, 2E)) with decay 1
        keep = self.n_elites if self.keep_elites else 0  # ceil(keep_elite_frac · E)
        best, best_score = mean, -math.inf
        for i in range(self.iterations):
            population = self._sample(mean, var, generator, size)
            if self._elites is not None:
                perm = torch.randperm(self.n_elites, generator=generator)[:keep]
                kept = self._elites[perm.to(self._elites.device)]
                if i == 0:  # shifted; the last action stays this slot's fresh sample
                    population[:keep, :-1] = kept[:, 1:]
                elif i == self.iterations - 1:
                    population[0] = mean
                else:
                    population[:keep] = kept
            scores = self._scores(objective, population).nan_to_num(-math.inf)
            values, top = scores.topk(self.n_elites)
            self._elites = population[top]
            mean = self.alpha * mean + (1 - self.alpha) * self._elites.mean(0)
            var = self.alpha * var + (1 - self.alpha) * self._elites.var(0, unbiased=False)
            if float(values[0]) > best_score:
                best, best_score = population[top[0]].clone(), float(values[0])
        return best
