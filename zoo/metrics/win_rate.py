"""Win rate from human and synthetic feedback: Control Variates Evaluation (Zhou, Song, Zanette, ICML 2025).

The win rate of LLM A against a reference B is ``p = E[z]``, with ``z ∈ {1, 0.5, 0}`` the human verdict (A wins,
tie, B wins). All N response pairs carry a cheap synthetic score ``ẑ ∈ [0, 1]`` (the probability that A wins, e.g.
``sigmoid(r_A - r_B)`` of a reward model); a uniformly random subset H of n of them also carries a human label.

- human:     ``p̂_H = z̄_H``, unbiased, ``Var = σ_z² / n``;
- synthetic: ``p̂_S = ẑ̄_N``, low variance but biased by ``E[ẑ] - E[z]``, which no amount of data removes;
- control variates (the paper): ``p̂_CV = z̄_H - α (ẑ̄_H - ẑ̄_N)``, unbiased for every fixed α since
  ``E[ẑ̄_H - ẑ̄_N] = 0``, with ``α̂ = cov(z_H, ẑ_H) / var(ẑ_H)`` and, at α*,
  ``Var = (σ_z² / n) (1 - ρ² (1 - n/N))``: the human-annotation saving is ``ρ² (1 - n/N)``, about ``ρ²``;
- PPI (prediction-powered inference) mean: ``α = 1``, i.e. ``ẑ̄_N + (z̄_H - ẑ̄_H)``.

Departures from, and choices beyond, the official ``ControlVariatesEvaluatorV4``:

- ``alpha_ddof="official"`` divides ``np.cov`` (ddof 1) by ``np.var`` (ddof 0) as the official code does, which
  inflates α̂ by ``n / (n - 1)``; ``"exact"`` uses ddof 1 in both.
- ``var(ẑ_H) = 0`` (a discrete judge, small n) gives ``α = 0`` and ``ρ = 0``: the estimate falls back to the
  human mean instead of dividing by zero.
- The standard error is the card's ``sqrt((1 - ρ² (1 - n/N)) s_z² / n)``, the error against the expected win rate
  of the population the N pairs were drawn from, with labels drawn without replacement from the N pairs.
  For a fixed ``alpha`` it is the fixed-α variance ``(s_z² - (1 - n/N)(2α s_zẑ - α² s_ẑ²)) / n`` (ddof 1),
  which equals the card's formula at ``α = s_zẑ / s_ẑ²``. ``finite_population=False`` drops the ``(1 - n/N)``
  (labels drawn with replacement, or the control mean known exactly, as in the official bootstrap).

All estimators are computed from nine sums (n, Σz_H, Σz_H², Σẑ_H, Σẑ_H², Σz_Hẑ_H, N, Σẑ_N, Σẑ_N²), in float64,
by the same private helpers in the functions, the Metrics and ``bootstrap_mse``. Raw sums lose precision only when
a variance is below ~1e-12 of the mean square, far below anything that matters for scores in ``[0, 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import Metric

from zoo.arguments import check_choice, check_range

__all__ = [
    "ControlVariatesWinRate",
    "HumanWinRate",
    "SyntheticWinRate",
    "WinRateEstimate",
    "bootstrap_mse",
    "subset_estimates",
    "control_variates_win_rate",
    "human_win_rate",
    "ppi_win_rate",
    "synthetic_win_rate",
]

_NUM_SUMS = 9  # n, Σz_H, Σz_H², Σẑ_H, Σẑ_H², Σz_Hẑ_H over the labelled pairs H; N, Σẑ_N, Σẑ_N² over all pairs
_DEGENERATE = 1e-12  # a centred sum below this fraction of its raw sum is rounding error: the variance is 0
_METHODS = ("human", "synthetic", "cv", "ppi")
_KEYS = ("estimate", "se", "alpha", "rho", "predicted_saving")
MIN_LABELS_FOR_INTERVAL = 30  # below this the normal interval of a mean of {0, 0.5, 1} labels under-covers


@dataclass(frozen=True)
class WinRateEstimate:
    """A win-rate estimate with its standard error and the control-variates diagnostics.

    Attributes:
        estimate: the estimated win rate of A against B, ``p̂``.
        se: its standard error.
        alpha: the control-variates coefficient used (0 for human, NaN for synthetic).
        rho: Pearson correlation of ``z`` and ``ẑ`` on the labelled pairs (NaN where not computed).
        predicted_saving: the share of human labels saved against human-only evaluation, ``ρ² (1 - n/N)``.
        n: number of human-labelled pairs.
        N: number of pairs with a synthetic score (all pairs).

    Example:
        >>> WinRateEstimate(0.6, 0.05, 0.0, float("nan"), 0.0, 100, 100).interval(0.95)
        (0.502..., 0.697...)
        >>> WinRateEstimate(0.95, 0.05, 0.0, float("nan"), 0.0, 100, 100).interval(0.95)  # clipped to [0, 1]
        (0.852..., 1.0)
    """

    estimate: float
    se: float
    alpha: float
    rho: float
    predicted_saving: float
    n: int
    N: int

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Normal confidence interval ``estimate ± z_{(1+level)/2} · se``, clipped to ``[0, 1]`` (a win rate's range).

        The normal approximation needs enough labels: :attr:`interval_warning` says when it does not hold.
        """
        if not isinstance(level, (int, float)) or isinstance(level, bool) or not 0.0 < level < 1.0:
            raise ValueError(f"Expected argument `level` to be a float in (0, 1) but got {level!r}.")
        half = NormalDist().inv_cdf(0.5 + level / 2.0) * self.se
        return max(0.0, self.estimate - half), min(1.0, self.estimate + half)

    @property
    def interval_warning(self) -> str | None:
        """Why the normal interval cannot be trusted here (``None`` when nothing is known to be wrong).

        Example:
            >>> WinRateEstimate(1.0, 0.0, 0.0, float("nan"), 0.0, 3, 3).interval_warning
            'all 3 human labels are equal, so the standard error is 0 and the interval has no width: ...'
        """
        if self.se == 0.0:
            return (f"all {self.n} human labels are equal, so the standard error is 0 and the interval has no width: "
                    "it says nothing about the win rate. Label more pairs.")  # fmt: skip
        if self.n < MIN_LABELS_FOR_INTERVAL:
            return (f"only {self.n} human labels: the normal interval needs about {MIN_LABELS_FOR_INTERVAL} to cover "
                    "at its level (it was clipped to [0, 1]). Label more pairs.")  # fmt: skip
        return None


# ---------------------------------------------------------------------------------------------------------- checks


def _check_tensor(x: Any, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"Expected `{name}` to be a tensor, but got {type(x).__name__}.")


def _check_shapes(z: Tensor, z_hat: Tensor) -> None:
    if z.ndim != 1 or z_hat.ndim != 1 or z.shape != z_hat.shape:
        raise ValueError(
            f"Expected `z` and `z_hat` to be 1-D of the same length (N,), got {tuple(z.shape)} and "
            f"{tuple(z_hat.shape)}. Pass one entry per response pair, with NaN in `z` where there is no human label."
        )


def _check_labels(z: Tensor) -> None:
    z = z.detach().double()
    bad = ~(torch.isnan(z) | (z == 0.0) | (z == 0.5) | (z == 1.0))
    if bad.any():
        values = torch.unique(z[bad])[:5].tolist()
        raise ValueError(
            f"Expected `z` to hold human labels 0 (B wins), 0.5 (tie), 1 (A wins) or NaN (unlabelled), but got "
            f"{values} at {int(bad.sum())} positions."
        )


def _check_scores(z_hat: Tensor) -> None:
    h = z_hat.detach().double()
    finite = torch.isfinite(h)
    if not finite.all():
        raise ValueError(
            f"Expected `z_hat` to be finite, but got NaN or inf at {int((~finite).sum())} positions. Every pair needs "
            "a synthetic score; NaN marks missing labels in `z` only."
        )
    if h.numel() and (h.min() < 0.0 or h.max() > 1.0):
        raise ValueError(
            f"Expected `z_hat` in [0, 1] (the probability that A wins), but got values in [{float(h.min()):.4g}, "
            f"{float(h.max()):.4g}]. Map reward differences with sigmoid(r_A - r_B)."
        )


def _check_count(count: float, what: str) -> None:
    if count < 2:
        raise ValueError(
            f"Expected at least 2 {what}, but got {int(count)}. The variance, alpha and rho need two or more."
        )


def _check_alpha(alpha: float | None, alpha_ddof: str, finite_population: bool) -> None:
    check_range("alpha", alpha, optional=True)
    check_choice("alpha_ddof", alpha_ddof, ("official", "exact"))
    check_choice("finite_population", finite_population, (True, False))


# ------------------------------------------------------------------------------------------------------------ maths


def _labelled_sums(z: Tensor, z_hat: Tensor) -> Tensor:
    """n, Σz, Σz², Σẑ, Σẑ², Σzẑ over the entries where ``z`` is not NaN, on the last dim: ``(..., m) -> (..., 6)``"""
    z, h = z.detach().double(), z_hat.detach().double()
    labelled = ~torch.isnan(z)
    z0, h0 = torch.where(labelled, z, 0.0), torch.where(labelled, h, 0.0)
    sums = (z0, z0.square(), h0, h0.square(), z0 * h0)
    return torch.stack([labelled.sum(-1).double(), *(s.sum(-1) for s in sums)], dim=-1)


def _pool_sums(z_hat: Tensor) -> Tensor:
    """N, Σẑ, Σẑ² along the last dim: ``(..., N) -> (..., 3)``."""
    h = z_hat.detach().double()
    return torch.stack([torch.full_like(h[..., 0], h.shape[-1]), h.sum(-1), h.square().sum(-1)], dim=-1)


def _win_rate_sums(z: Tensor | None, z_hat: Tensor | None) -> Tensor:
    """Check the inputs and return their nine sums ``(9,)``; a missing ``z`` or ``z_hat`` adds zeros (bar N)."""
    if z is not None:
        _check_tensor(z, "z")
    if z_hat is not None:
        _check_tensor(z_hat, "z_hat")
    if z is not None and z_hat is not None:
        _check_shapes(z, z_hat)
    for x, name in ((z, "z"), (z_hat, "z_hat")):
        if x is not None and x.ndim != 1:
            raise ValueError(f"Expected `{name}` to be 1-D (N,), got {tuple(x.shape)}.")
    if z is not None:
        _check_labels(z)
    if z_hat is not None:
        _check_scores(z_hat)
    device = (z if z is not None else z_hat).device
    if z is None:
        labelled = torch.zeros(6, dtype=torch.float64, device=device)
    else:
        labelled = _labelled_sums(z, z_hat if z_hat is not None else torch.zeros_like(z, dtype=torch.float64))
    if z_hat is None:  # no scores: only N, the number of pairs, is known
        pool = torch.tensor([z.shape[0], 0.0, 0.0], dtype=torch.float64, device=device)
    else:
        pool = _pool_sums(z_hat)
    return torch.cat([labelled, pool])


def _centred(raw2: Tensor, raw_a: Tensor, raw_b: Tensor, n: Tensor) -> Tensor:
    """Co-moment ``Σ(a - ā)(b - b̄) = Σab - Σa Σb / n``."""
    return raw2 - raw_a * raw_b / n


def _spread(raw2: Tensor, raw: Tensor, n: Tensor) -> Tensor:
    """``Σ(a - ā)²``, set to exactly 0 where it is rounding error (all values equal)."""
    c = _centred(raw2, raw, raw, n).clamp_min(0.0)
    return torch.where(c > _DEGENERATE * raw2.abs(), c, 0.0)


def _human_compute(sums: Tensor) -> dict[str, Tensor]:
    n, sz, szz = sums[..., 0], sums[..., 1], sums[..., 2]
    var_z = _spread(szz, sz, n) / (n - 1)
    zero = torch.zeros_like(n)
    return {
        "estimate": sz / n,
        "se": (var_z / n).sqrt(),
        "alpha": zero,
        "rho": zero + float("nan"),
        "predicted_saving": zero,
    }


def _rho(sums: Tensor) -> Tensor:
    """Pearson correlation of ``z_H`` and ``ẑ_H``; 0 where either has no spread (nothing to exploit)."""
    n, sz, szz, sh, shh, szh = sums.unbind(-1)[:6]
    czz, chh = _spread(szz, sz, n), _spread(shh, sh, n)
    denominator = (czz * chh).sqrt()
    ok = denominator > 0
    return torch.where(ok, _centred(szh, sz, sh, n) / torch.where(ok, denominator, 1.0), 0.0)


def _synthetic_compute(sums: Tensor) -> dict[str, Tensor]:
    N, s, ss = sums[..., 6], sums[..., 7], sums[..., 8]
    var = _spread(ss, s, N) / (N - 1)
    nan = torch.full_like(N, float("nan"))
    rho = torch.where(sums[..., 0] >= 2, _rho(sums), nan)
    return {
        "estimate": s / N,
        "se": (var / N).sqrt(),
        "alpha": nan,
        "rho": rho,
        "predicted_saving": torch.zeros_like(N),
    }


def _cv_compute(
    sums: Tensor, alpha: float | None, alpha_ddof: Literal["official", "exact"], finite_population: bool
) -> dict[str, Tensor]:
    """Control-variates estimate and diagnostics from the nine sums, batched over any leading dims."""
    n, sz, szz, sh, shh, szh, N, s_N, _ = sums.unbind(-1)
    czz, chh, czh = _spread(szz, sz, n), _spread(shh, sh, n), _centred(szh, sz, sh, n)
    has_spread = chh > 0
    safe_chh = torch.where(has_spread, chh, 1.0)
    # α̂ = cov(z_H, ẑ_H) / var(ẑ_H); cov has ddof 1, var ddof 0 ("official", np.cov / np.var) or ddof 1 ("exact").
    var_divisor = n if alpha_ddof == "official" else n - 1
    alpha_hat = torch.where(has_spread, (czh / (n - 1)) / (safe_chh / var_divisor), 0.0)
    alpha_used = alpha_hat if alpha is None else torch.full_like(n, float(alpha))
    estimate = sz / n - alpha_used * (sh / n - s_N / N)
    # The standard error is that of the fixed-α estimator at α_se: the variance-optimal s_zẑ / s_ẑ² when α is
    # estimated (which gives the card's (1 - ρ²(1 - n/N)) s_z² / n exactly), the given α otherwise.
    alpha_se = torch.where(has_spread, czh / safe_chh, 0.0) if alpha is None else alpha_used
    f = 1.0 - n / N if finite_population else torch.ones_like(n)
    reduction = f * (2.0 * alpha_se * czh - alpha_se.square() * chh)  # Σ-scale variance removed by the control
    se = ((czz - reduction).clamp_min(0.0) / ((n - 1) * n)).sqrt()
    saving = torch.where(czz > 0, reduction / torch.where(czz > 0, czz, 1.0), 0.0)
    return {"estimate": estimate, "se": se, "alpha": alpha_used, "rho": _rho(sums), "predicted_saving": saving}


def _to_estimate(values: dict[str, Tensor], sums: Tensor) -> WinRateEstimate:
    return WinRateEstimate(**{k: float(values[k]) for k in _KEYS}, n=int(sums[0]), N=int(sums[6]))


# ------------------------------------------------------------------------------------------------------- functions


def human_win_rate(z: Tensor) -> WinRateEstimate:
    """Human-only win rate: the mean of the labelled ``z``, with ``se = sd(z_H, ddof=1) / sqrt(n)``.

    Args:
        z: ``(N,)`` human labels in ``{0, 0.5, 1}``, NaN where unlabelled; at least 2 labels.

    Returns:
        :class:`WinRateEstimate` with ``alpha = 0``, ``rho = nan``, ``predicted_saving = 0``.

    Raises:
        ValueError: ``z`` is not 1-D, holds another value, or has fewer than 2 labels.

    Example:
        >>> human_win_rate(torch.tensor([1.0, 0.0, 1.0, float("nan")])).estimate
        0.666...
    """
    sums = _win_rate_sums(z, None)
    _check_count(float(sums[0]), "human labels (non-NaN entries of `z`)")
    return _to_estimate(_human_compute(sums), sums)


def synthetic_win_rate(z_hat: Tensor, z: Tensor | None = None) -> WinRateEstimate:
    """Synthetic-only win rate: the mean of all ``z_hat``, with ``se = sd(z_hat, ddof=1) / sqrt(N)``.

    This estimator is biased by ``E[ẑ] - E[z]``; the standard error ignores the bias, so its interval does not
    cover the human win rate however large N is.

    Args:
        z_hat: ``(N,)`` synthetic scores in ``[0, 1]``, at least 2.
        z: optional ``(N,)`` human labels (NaN where unlabelled); only used for ``n`` and, with 2 or more labels,
            ``rho``.

    Returns:
        :class:`WinRateEstimate` with ``alpha = nan`` and ``predicted_saving = 0``.

    Raises:
        ValueError: bad shapes or values (see :func:`control_variates_win_rate`), or fewer than 2 scores.

    Example:
        >>> synthetic_win_rate(torch.tensor([0.9, 0.7, 0.8, 0.6])).estimate
        0.75
    """
    sums = _win_rate_sums(z, z_hat)
    _check_count(float(sums[6]), "synthetic scores in `z_hat`")
    return _to_estimate(_synthetic_compute(sums), sums)


def control_variates_win_rate(
    z: Tensor,
    z_hat: Tensor,
    alpha: float | None = None,
    alpha_ddof: Literal["official", "exact"] = "official",
    finite_population: bool = True,
) -> WinRateEstimate:
    """Control Variates Evaluation (Zhou et al., ICML 2025): ``p̂_CV = z̄_H - α (ẑ̄_H - ẑ̄_N)``.

    ``α̂ = cov(z_H, ẑ_H) / var(ẑ_H)`` on the labelled pairs (the official ``cv4``); ``rho`` is the Pearson
    correlation of ``z_H`` and ``ẑ_H``; ``predicted_saving = ρ² (1 - n/N)`` (``ρ²`` without the finite-population
    factor) and ``se = sqrt((1 - predicted_saving) s_z² / n)``. See the module docstring for fixed ``alpha``.

    Args:
        z: ``(N,)`` human labels in ``{0, 0.5, 1}``, NaN where unlabelled; the labelled pairs must be a uniformly
            random subset, at least 2.
        z_hat: ``(N,)`` synthetic scores in ``[0, 1]`` for all N pairs, oriented like ``z`` (probability A wins).
        alpha: fixed coefficient; None estimates α̂ from the labelled pairs (``alpha=1`` is PPI).
        alpha_ddof: ``"official"`` divides the ddof-1 covariance by the ddof-0 variance, as the official code;
            ``"exact"`` uses ddof 1 in both. Only used when ``alpha`` is None.
        finite_population: apply the ``(1 - n/N)`` factor (labels drawn without replacement from the N pairs).

    Returns:
        :class:`WinRateEstimate`. ``var(ẑ_H) = 0`` gives ``alpha = 0``, ``rho = 0``: the human mean.

    Raises:
        ValueError: ``z``/``z_hat`` not 1-D of equal length, ``z`` not in ``{0, 0.5, 1, NaN}``, fewer than 2 labels,
            ``z_hat`` not finite or outside ``[0, 1]``, or a bad ``alpha``/``alpha_ddof``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z_hat = torch.rand(1000, generator=g)
        >>> z = (torch.rand(1000, generator=g) < z_hat).float()  # humans agree with the scores on average
        >>> z[200:] = float("nan")                               # only 200 labelled
        >>> cv, h = control_variates_win_rate(z, z_hat), human_win_rate(z)
        >>> round(cv.estimate, 3), round(cv.rho, 2), cv.n, cv.N, cv.se < h.se
        (0.526, 0.54, 200, 1000, True)
    """
    _check_alpha(alpha, alpha_ddof, finite_population)
    _check_tensor(z, "z")
    _check_tensor(z_hat, "z_hat")
    sums = _win_rate_sums(z, z_hat)
    _check_count(float(sums[0]), "human labels (non-NaN entries of `z`)")
    return _to_estimate(_cv_compute(sums, alpha, alpha_ddof, finite_population), sums)


def ppi_win_rate(z: Tensor, z_hat: Tensor) -> WinRateEstimate:
    """Prediction-powered inference mean: control variates with ``α = 1``, i.e. ``ẑ̄_N + (z̄_H - ẑ̄_H)``.

    Args:
        z: ``(N,)`` human labels in ``{0, 0.5, 1}``, NaN where unlabelled.
        z_hat: ``(N,)`` synthetic scores in ``[0, 1]``.

    Example:
        >>> z = torch.tensor([1.0, 0.0, float("nan"), float("nan")])
        >>> ppi_win_rate(z, torch.tensor([0.75, 0.25, 0.5, 1.0])).estimate  # 0.625 + (0.5 - 0.5)
        0.625
    """
    return control_variates_win_rate(z, z_hat, alpha=1.0)


def _method_estimate(method: str, sums: Tensor) -> Tensor:
    """Per-row estimate of one bootstrap method from a ``(reps, 9)`` table of sums (official α̂ for "cv")."""
    if method == "human":
        return _human_compute(sums)["estimate"]
    if method == "synthetic":
        return _synthetic_compute(sums)["estimate"]
    return _cv_compute(sums, None if method == "cv" else 1.0, "official", finite_population=False)["estimate"]


def bootstrap_mse(
    z: Tensor,
    z_hat: Tensor,
    n_grid: Sequence[int],
    reps: int = 1000,
    seed: int = 0,
    methods: Sequence[str] = _METHODS,
) -> dict[str, Tensor]:
    """MSE of each estimator against ``p* = mean(z)`` on one fully labelled pool, by the official bootstrap.

    For each n, ``reps`` index arrays ``(reps, n)`` are drawn with replacement from the pool; every replicate
    gives a human, CV (α̂ per replicate, official ddof) and PPI estimate, all in one batched tensor op. The control
    mean ``ẑ̄_N`` is the mean over the whole pool, known exactly, so the expected saving is ``ρ²`` of the pool
    (no ``(1 - n/N)``). "synthetic" is ``(mean ẑ - p*)²`` for every n: pure bias.

    Args:
        z: ``(N,)`` human labels in ``{0, 0.5, 1}`` for every pair of the pool (one model pair), no NaN.
        z_hat: ``(N,)`` synthetic scores in ``[0, 1]``.
        n_grid: numbers of human labels, each ``>= 2`` (may exceed N: draws are with replacement).
        reps: bootstrap replicates per n.
        seed: seed of the cpu ``torch.Generator`` that draws the indices.
        methods: any of ``"human"``, ``"synthetic"``, ``"cv"``, ``"ppi"``.

    Returns:
        ``{method: float64 tensor (len(n_grid),)}`` of MSEs to ``p*``.

    Raises:
        ValueError: bad shapes or values, NaN in ``z``, a bad ``n_grid``, ``reps`` or method name.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z_hat = torch.rand(500, generator=g)
        >>> z = (torch.rand(500, generator=g) < z_hat).float()
        >>> mse = bootstrap_mse(z, z_hat, n_grid=[50, 200], reps=200)
        >>> bool((mse["cv"] < mse["human"]).all()), mse["synthetic"].shape
        (True, torch.Size([2]))
    """
    sums = _win_rate_sums(z, z_hat)
    if int(sums[0]) != z.numel():
        raise ValueError(
            f"Expected every pair of the pool to be labelled, but `z` has {z.numel() - int(sums[0])} NaN entries. "
            "The bootstrap's truth is the mean of all human labels; drop the unlabelled pairs first."
        )
    _check_count(float(sums[0]), "pairs in the pool")
    unknown = [m for m in methods if m not in _METHODS]
    if unknown or isinstance(methods, str):
        raise ValueError(f"Expected `methods` among {list(_METHODS)} but got {list(methods)!r}.")
    check_range("reps", reps, low=1, integer=True)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in n_grid):
        raise ValueError(f"Expected `n_grid` to hold ints >= 2 (alpha needs two labels) but got {list(n_grid)!r}.")

    z64, h64 = z.detach().double(), z_hat.detach().double()
    p_star = sums[1] / sums[0]
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, list[Tensor]] = {m: [] for m in methods}
    for n in n_grid:
        index = torch.randint(z.numel(), (reps, n), generator=generator).to(z.device)
        estimates = subset_estimates(z64[index], h64[index], h64, methods)
        for m in methods:
            out[m].append((estimates[m] - p_star).square().mean())
    return {m: torch.stack(v) for m, v in out.items()}


def subset_estimates(
    z_sub: Tensor, z_hat_sub: Tensor, z_hat_pool: Tensor, methods: Sequence[str] = ("human", "cv")
) -> dict[str, Tensor]:
    """Estimates for many labelled subsets at once (bootstraps, simulations): one batched op, no loop over subsets.

    Args:
        z_sub: ``(reps, n)`` human labels of each subset.
        z_hat_sub: ``(reps, n)`` synthetic scores of the same pairs.
        z_hat_pool: ``(N,)`` synthetic scores of every pair: the control mean ``ẑ̄_N``.
        methods: any of ``"human"``, ``"synthetic"``, ``"cv"`` (α̂ per subset, official ddof), ``"ppi"``.

    Returns:
        ``{method: (reps,) float64}``.

    Example:
        >>> z_hat = torch.tensor([0.9, 0.2, 0.7, 0.4])
        >>> est = subset_estimates(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.9, 0.2], [0.9, 0.7]]), z_hat)
        >>> est["human"].tolist()
        [0.5, 1.0]
    """
    # One (reps, 9) table of sums: the labelled part per subset, the pool part shared by all.
    pool = _pool_sums(z_hat_pool)
    sums = torch.cat([_labelled_sums(z_sub, z_hat_sub), pool.expand(*z_sub.shape[:-1], 3)], dim=-1)
    return {m: _method_estimate(m, sums) for m in methods}


# --------------------------------------------------------------------------------------------------------- metrics


class _WinRateMetric(Metric):
    """Accumulates the nine sums; subclasses choose the estimator and which of ``z``/``z_hat`` they need."""

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    _needs: tuple[str, ...] = ("z", "z_hat")
    sums: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # One fixed-size float64 vector: the DDP sync is a single 9-element all-reduce and merging is exact.
        self.add_state("sums", default=torch.zeros(_NUM_SUMS, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, z: Tensor | None = None, z_hat: Tensor | None = None) -> None:
        """Add a batch: labels ``z (B,)`` (NaN where unlabelled) and synthetic scores ``z_hat (B,)``."""
        given = {"z": z, "z_hat": z_hat}
        missing = [name for name in self._needs if given[name] is None]
        if missing:
            raise TypeError(f"{type(self).__name__}.update needs `{'`, `'.join(missing)}`, got None.")
        self.sums += _win_rate_sums(z, z_hat).to(self.sums.device)


class ControlVariatesWinRate(_WinRateMetric):
    """Control-variates win rate (:func:`control_variates_win_rate`) accumulated over batches.

    ``update(z, z_hat)`` takes ``(B,)`` labels with NaN where unlabelled and ``(B,)`` scores for every pair of the
    batch; ``compute()`` returns a dict of 0-d float64 tensors ``estimate``, ``se``, ``alpha``, ``rho`` and
    ``predicted_saving``, equal to the function on the concatenated batches (log it with ``self.log_dict``).
    The state is the nine float64 sums, so results are exact across batches and DDP (float64 is not available on
    MPS; keep this metric on cpu or cuda there).

    Args:
        alpha: fixed coefficient, or None to estimate α̂ at ``compute()``.
        alpha_ddof: ``"official"`` (cov ddof 1 / var ddof 0, as the official code) or ``"exact"`` (ddof 1 both).
        finite_population: apply the ``(1 - n/N)`` factor to ``se`` and ``predicted_saving``.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        ValueError: a bad argument; bad inputs in ``update``; fewer than 2 labels at ``compute()``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> m = ControlVariatesWinRate()
        >>> for _ in range(3):  # batches of 100 pairs, half of them labelled
        ...     z_hat = torch.rand(100, generator=g)
        ...     z = (torch.rand(100, generator=g) < z_hat).float()
        ...     z[50:] = float("nan")
        ...     m.update(z, z_hat)
        >>> {k: round(float(v), 2) for k, v in m.compute().items()}
        {'estimate': 0.46, 'se': 0.04, 'alpha': 1.07, 'rho': 0.61, 'predicted_saving': 0.18}
    """

    def __init__(
        self,
        alpha: float | None = None,
        alpha_ddof: Literal["official", "exact"] = "official",
        finite_population: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_alpha(alpha, alpha_ddof, finite_population)
        self.alpha, self.alpha_ddof, self.finite_population = alpha, alpha_ddof, finite_population

    def compute(self) -> dict[str, Tensor]:
        """Estimate, standard error, α, ρ and predicted saving, as 0-d float64 tensors."""
        _check_count(float(self.sums[0]), "human labels (non-NaN entries of `z`)")
        return _cv_compute(self.sums, self.alpha, self.alpha_ddof, self.finite_population)


class HumanWinRate(_WinRateMetric):
    """Human-only win rate (:func:`human_win_rate`) over batches; ``update(z, z_hat=None)``.

    Example:
        >>> m = HumanWinRate()
        >>> m.update(torch.tensor([1.0, 0.5, float("nan")]))
        >>> m.update(torch.tensor([0.0, 1.0]))
        >>> round(float(m.compute()["estimate"]), 3)
        0.625
    """

    _needs = ("z",)

    def compute(self) -> dict[str, Tensor]:
        """Mean of the labels and its standard error (``alpha = 0``, ``rho = nan``), 0-d float64 tensors."""
        _check_count(float(self.sums[0]), "human labels (non-NaN entries of `z`)")
        return _human_compute(self.sums)


class SyntheticWinRate(_WinRateMetric):
    """Synthetic-only (biased) win rate (:func:`synthetic_win_rate`) over batches; ``update(z=None, z_hat=...)``.

    Example:
        >>> m = SyntheticWinRate()
        >>> m.update(z_hat=torch.tensor([0.9, 0.7]))
        >>> m.update(z_hat=torch.tensor([0.8, 0.6]))
        >>> round(float(m.compute()["estimate"]), 3)
        0.75
    """

    _needs = ("z_hat",)

    def compute(self) -> dict[str, Tensor]:
        """Mean of the scores and its standard error (``alpha = nan``), 0-d float64 tensors."""
        _check_count(float(self.sums[6]), "synthetic scores in `z_hat`")
        return _synthetic_compute(self.sums)
