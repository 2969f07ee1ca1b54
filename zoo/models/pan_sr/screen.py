"""The PAN screen: BART variable inclusion proportions over replicates, and the selection rules (card §1).

* ``vip_rank_hclust`` (the paper's rule, the code's ``idx_hclst``): rank the variables by decreasing VIP within each
  replicate (ties take the average rank, R's default), average the ranks over replicates, cut an average-linkage
  hierarchical clustering of the 1-D mean ranks into two clusters, keep the cluster of smaller mean rank.
* ``local`` / ``gmax`` / ``gse`` (``BART_perm.R``, Bleich et al. 2014): the observed VIP averaged over runs against
  a null from B fits on permuted y, at level α.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.stats import rankdata
from sklearn.base import BaseEstimator
from sklearn.feature_selection import SelectorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from zoo.models.pan_sr.bart import StochtreeBART

__all__ = ["PanScreen", "gse_constant", "permutation_select", "rank_cluster_select", "vip"]

Rule = Literal["vip_rank_hclust", "local", "gmax", "gse"]
RULES = ("vip_rank_hclust", "local", "gmax", "gse")


def vip(split_counts: np.ndarray) -> np.ndarray:
    """Variable inclusion proportions: each row of split counts ``[..., p]`` divided by its total (rows sum to 1;
    a chain that never split gives zeros)."""
    counts = np.asarray(split_counts, dtype=np.float64)
    total = counts.sum(-1, keepdims=True)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def rank_cluster_select(vips: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paper's rule on VIPs ``[R, p]``: returns ``(selected indices, mean ranks [p])``.

    Example:
        >>> vips = np.array([[0.5, 0.3, 0.1, 0.05, 0.05], [0.4, 0.4, 0.1, 0.1, 0.0]])
        >>> rank_cluster_select(vips)[0]
        array([0, 1])
    """
    vips = np.atleast_2d(vips)
    mean_rank = rankdata(-vips, method="average", axis=1).mean(0)
    if np.ptp(mean_rank) == 0:  # every variable tied: nothing stands out
        return np.array([], dtype=np.int64), mean_rank
    labels = fcluster(linkage(mean_rank[:, None], method="average", metric="euclidean"), 2, criterion="maxclust")
    means = [mean_rank[labels == c].mean() for c in (1, 2)]
    keep = 1 + int(np.argmin(means))
    return np.flatnonzero(labels == keep), mean_rank


def gse_constant(null: np.ndarray, alpha: float = 0.05, low: float = 1.0, high: float = 20.0,
                 tol: float = 0.01) -> float:  # fmt: skip
    """The smallest C in ``[low, high]`` (bisection, ``tol``) such that a share ≥ 1 - α of the permutation rows
    satisfy ``null[b, j] <= m_j + C s_j`` for every j at once (``BART_perm.R``'s global SE rule)."""
    m, s = null.mean(0), null.std(0, ddof=1)

    def covered(c: float) -> float:
        return float(np.mean(np.all(null <= m + c * s, axis=1)))

    if covered(low) >= 1 - alpha:
        return low
    while high - low > tol:
        mid = (low + high) / 2
        low, high = (low, mid) if covered(mid) >= 1 - alpha else (mid, high)
    return high


def permutation_select(observed: np.ndarray, null: np.ndarray, rule: str = "local", alpha: float = 0.05,
                       faithful_quirks: bool = False) -> np.ndarray:  # fmt: skip
    """The permutation-null rules on the observed mean VIP ``[p]`` and the null VIPs ``[B, p]``.

    Every rule also requires ``observed > 0``. ``faithful_quirks`` copies the official wrapper's turning a
    one-variable selection into none (card review: it drops a correct selection when p_0 = 1).

    Example:
        >>> null = np.random.default_rng(0).uniform(0, 0.1, (50, 4))
        >>> permutation_select(np.array([0.6, 0.05, 0.3, 0.05]), null, "gmax")
        array([0, 2])
    """
    observed, null = np.asarray(observed, dtype=np.float64), np.atleast_2d(null)
    if rule == "local":
        keep = observed > np.quantile(null, 1 - alpha, axis=0)
    elif rule == "gmax":
        keep = observed >= np.quantile(null.max(1), 1 - alpha)
    elif rule == "gse":
        c = gse_constant(null, alpha)
        keep = observed >= null.mean(0) + c * null.std(0, ddof=1)
    else:
        raise ValueError(f"unknown permutation rule {rule!r}; the rules are 'local', 'gmax', 'gse'")
    selected = np.flatnonzero(keep & (observed > 0))
    if faithful_quirks and len(selected) == 1:
        return np.array([], dtype=np.int64)
    return selected


def _check_input(X: np.ndarray, y: np.ndarray) -> None:
    bad_x = ~np.isfinite(X)
    if bad_x.any():
        rows, cols = np.nonzero(bad_x)
        raise ValueError(f"X has {bad_x.sum()} NaN or infinite entries (first at row {rows[0]}, column {cols[0]}): "
                         "impute or drop them before screening")  # fmt: skip
    if not np.isfinite(y).all():
        raise ValueError(f"y has {int((~np.isfinite(y)).sum())} NaN or infinite entries; drop those rows first")
    if np.ptp(y) == 0:
        raise ValueError("y is constant: there is nothing to screen for")
    constant = np.flatnonzero(np.ptp(X, axis=0) == 0)
    if len(constant):
        raise ValueError(f"X has {len(constant)} constant column(s) (indices {constant[:10].tolist()}): a tree can "
                         "never split on them; drop them before screening")  # fmt: skip


class PanScreen(SelectorMixin, BaseEstimator):
    """The PAN screen as a scikit-learn feature selector: ``fit(X, y)``, ``get_support()``, ``transform(X)``.

    Args:
        rule: ``"vip_rank_hclust"`` (the paper's) or a permutation rule ``"local"``, ``"gmax"``, ``"gse"``.
        replicates: R independent BART chains for the rank rule (20 in the paper); the permutation rules average
            the observed VIP over ``replicates`` runs too (10 in ``BART_perm.R``).
        num_trees / burnin / draws: each chain (20 trees, 10k + 10k in ``BART_VIP.R``).
        permutations: B null fits on permuted y for the permutation rules.
        alpha: the permutation rules' level.
        max_features: keep at most this many of the selected variables (the best mean ranks or VIPs); ``None``
            keeps them all (the paper).
        faithful_quirks: copy ``BART_perm.R``'s one-variable-selection-to-none quirk.
        random_state: seed of replicate r is ``random_state + r`` (null fits follow).

    Attributes after ``fit``: ``support_`` (bool ``[p]``), ``selected_`` (indices), ``vips_`` (``[R, p]``),
    ``mean_ranks_`` (``[p]``, rank rule), ``null_`` (``[B, p]``, permutation rules).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> X = rng.uniform(1, 5, (300, 20))
        >>> screen = PanScreen(replicates=3, burnin=100, draws=100).fit(X, X[:, 3] * X[:, 7])
        >>> screen.selected_
        array([3, 7])
        >>> screen.transform(X).shape
        (300, 2)
    """

    def __init__(self, rule: Rule = "vip_rank_hclust", replicates: int = 20, num_trees: int = 20,
                 burnin: int = 10_000, draws: int = 10_000, permutations: int = 10, alpha: float = 0.05,
                 max_features: int | None = None, faithful_quirks: bool = False, random_state: int = 0) -> None:  # fmt: skip
        self.rule = rule
        self.replicates = replicates
        self.num_trees = num_trees
        self.burnin = burnin
        self.draws = draws
        self.permutations = permutations
        self.alpha = alpha
        self.max_features = max_features
        self.faithful_quirks = faithful_quirks
        self.random_state = random_state

    def _backend(self) -> StochtreeBART:
        return StochtreeBART(num_trees=self.num_trees, burnin=self.burnin, draws=self.draws)

    def fit(self, X: Any, y: Any) -> PanScreen:
        if self.rule not in RULES:
            raise ValueError(f"unknown rule {self.rule!r}; the rules are {', '.join(RULES)}")
        if self.replicates < 1:
            raise ValueError(f"replicates must be >= 1, got {self.replicates}")
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_all_finite=False, y_numeric=True)
        _check_input(X, y)
        p = X.shape[1]
        if self.max_features is not None and not 1 <= self.max_features <= p:
            raise ValueError(f"max_features={self.max_features} but X has {p} variables: ask for 1 to {p}")
        bart = self._backend()
        seed = int(self.random_state)
        self.vips_ = np.stack([vip(bart.split_counts(X, y, seed + r)) for r in range(self.replicates)])
        if self.rule == "vip_rank_hclust":
            selected, self.mean_ranks_ = rank_cluster_select(self.vips_)
            score = -self.mean_ranks_
        else:
            rng = np.random.default_rng(seed)
            self.null_ = np.stack([vip(bart.split_counts(X, rng.permutation(y), seed + self.replicates + b))
                                   for b in range(self.permutations)])  # fmt: skip
            observed = self.vips_.mean(0)
            selected = permutation_select(observed, self.null_, self.rule, self.alpha, self.faithful_quirks)
            score = observed
        if self.max_features is not None and len(selected) > self.max_features:
            selected = selected[np.argsort(-score[selected], kind="stable")[: self.max_features]]
        self.selected_ = np.sort(selected)
        self.support_ = np.zeros(p, dtype=bool)
        self.support_[self.selected_] = True
        return self

    def _get_support_mask(self) -> np.ndarray:
        check_is_fitted(self, "support_")
        return self.support_

    def selected_names(self, names: Sequence[str]) -> list[str]:
        """The names of the selected columns."""
        check_is_fitted(self, "support_")
        if len(names) != len(self.support_):
            raise ValueError(f"got {len(names)} names for {len(self.support_)} columns")
        return [names[i] for i in self.selected_]
