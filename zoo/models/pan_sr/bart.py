"""The BART backend of the PAN screen: split counts per variable over a chain, on ``stochtree``.

The official code fits bartMachine (R/Java), which is not on PyPI. Of the maintained BART packages on the
registry, ``stochtree`` was chosen on speed for this size of problem, measured here (n = 1,000, p = 153, 20 trees,
300 + 300 draws, one chain, one thread, repeated calls in one process): stochtree 0.29 s a chain; bartz 0.13-0.15 s
a chain after 8.5 s of JAX compilation on its first call (again for every new data shape and every process);
pymc-bart 4.2 s. A screen fits R = 20 chains of one shape, about 6 s with stochtree against 11 s with bartz once its
compilation is counted, and pymc-bart would take 85 s. At the official 10k + 10k chains bartz's per-chain speed
would win (about 100 s against 190 s for the 20 chains); it is not wired in, as it brings JAX. stochtree also
exposes the split counts of every retained draw (``ForestContainer.get_overall_split_counts``), which is what
bartMachine's ``get_var_props_over_chain(type = "splits")`` sums, and lets every prior be set.

bartMachine's priors are set explicitly rather than left to stochtree's defaults (card §1): y is rescaled to
[-0.5, 0.5]; the leaf prior is N(0, σ_μ²) with σ_μ = 0.5 / (k √m), fixed (not sampled); the tree prior
α = 0.95, β = 2; σ² ~ inverse gamma with ν = 3 and the scale set so that P(σ < σ̂) = q = 0.9, σ̂ the residual sd
of an OLS fit (the sd of y when p ≥ n - 1). What differs: stochtree's MCMC proposes grow and prune moves only
(bartMachine also a change move, 4/9 of proposals), and cut-points come from a grid of at most 100 quantiles per
variable (bartMachine draws among the node's distinct values).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2

__all__ = ["StochtreeBART", "sigma_prior"]


def sigma_prior(X: np.ndarray, y: np.ndarray, nu: float = 3.0, q: float = 0.9) -> tuple[float, float]:
    """Inverse-gamma ``(shape, scale)`` of σ² as bartMachine calibrates it: σ² ~ νλ/χ²_ν with P(σ < σ̂) = q."""
    n, p = X.shape
    if p < n - 1:
        design = np.column_stack([np.ones(n), X])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        sigma_hat2 = float(np.sum((y - design @ coef) ** 2) / (n - p - 1))
    else:
        sigma_hat2 = float(np.var(y, ddof=1))
    sigma_hat2 = max(sigma_hat2, 1e-12)  # an exact linear fit leaves no residual
    lam = sigma_hat2 * chi2.ppf(1.0 - q, nu) / nu
    return nu / 2.0, nu * lam / 2.0


@dataclass
class StochtreeBART:
    """One BART chain with bartMachine's priors; ``split_counts(X, y, seed)`` -> the splits on each variable,
    summed over all trees of all retained draws.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(size=(200, 6))
        >>> counts = StochtreeBART(num_trees=10, burnin=50, draws=50).split_counts(X, 4 * X[:, 2], seed=0)
        >>> counts.shape, int(counts.argmax())
        ((6,), 2)
    """

    num_trees: int = 20
    burnin: int = 10_000
    draws: int = 10_000
    alpha: float = 0.95
    beta: float = 2.0
    k: float = 2.0
    nu: float = 3.0
    q: float = 0.9

    def split_counts(self, X: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
        from stochtree import BARTModel

        X = np.ascontiguousarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        low, high = float(y.min()), float(y.max())
        y01 = (y - low) / (high - low) - 0.5  # bartMachine's rescaling to [-0.5, 0.5]
        shape, scale = sigma_prior(X, y01, self.nu, self.q)
        model = BARTModel()
        model.sample(
            X_train=X,
            y_train=y01,
            num_gfr=0,  # plain MCMC from the root, as bartMachine (no grow-from-root warm start)
            num_burnin=self.burnin,
            num_mcmc=self.draws,
            general_params={
                "standardize": False,
                "random_seed": int(seed),
                "sigma2_global_shape": shape,
                "sigma2_global_scale": scale,
            },
            mean_forest_params={
                "num_trees": self.num_trees,
                "alpha": self.alpha,
                "beta": self.beta,
                "sample_sigma2_leaf": False,
                "sigma2_leaf_init": (0.5 / (self.k * np.sqrt(self.num_trees))) ** 2,
            },
        )
        return np.asarray(model.forest_container_mean.get_overall_split_counts(X.shape[1]), dtype=np.float64)
