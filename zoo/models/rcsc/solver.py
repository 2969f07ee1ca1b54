"""RCSC's alternating solver in torch: view projections, consensus anchors, simplex anchor graph, partition, weights.

No official code exists. The objective is the card's marked reconstruction (P), SMVSC's model (official code read)
plus a one-pass partition term::

    min  sum_v alpha_v^2 ||X_v - W_v A Z||_F^2 + lam ||Z||_F^2 + beta ||Z - C G^T||_F^2
    s.t. W_v^T W_v = I, A A^T = I, Z >= 0, 1^T Z = 1^T, G one-hot, alpha on the simplex.

Under ``beta = 0`` this is SMVSC's objective (solved with our solver, not its code's quirks). Views are ``[n, d_v]``
tensors; internally ``X_v`` is ``d_v x n`` as in the card. Pure linear algebra, no autograd.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.cluster import KMeans
from torch import Tensor

from zoo.arguments import check_choice, check_range

__all__ = ["RCSC", "RCSCState", "objective", "project_simplex", "spectral_labels", "standardize"]


def project_simplex(v: Tensor) -> Tensor:
    """Euclidean projection of every column of ``v`` ([m, n]) onto the probability simplex.

    Written by hand (no torch/scipy routine): the sort-based algorithm of Duchi et al. (2008), vectorised over columns.

    Example:
        >>> z = project_simplex(torch.tensor([[2.0, 0.2], [0.0, 0.3]]))
        >>> z.sum(0).tolist(), bool((z >= 0).all())
        ([1.0, 1.0], True)
    """
    m = v.shape[0]
    u, _ = torch.sort(v, dim=0, descending=True, stable=True)
    css = u.cumsum(0) - 1.0
    k = torch.arange(1, m + 1, dtype=v.dtype, device=v.device).unsqueeze(1)
    cond = u - css / k > 0
    rho = cond.to(v.dtype).cumsum(0).argmax(0, keepdim=True)  # last index where cond holds
    theta = css.gather(0, rho) / (rho + 1).to(v.dtype)
    return (v - theta).clamp_min(0.0)


def standardize(x: Tensor, eps: float = 1e-12) -> Tensor:
    """Standardise each feature (column of ``[n, d]``) over samples, SMVSC's ``mapstd``; constant features become 0."""
    mu = x.mean(0, keepdim=True)
    sd = x.std(0, keepdim=True)
    return (x - mu) / sd.clamp_min(eps)


def informative_features(x: Tensor, eps: float = 1e-12) -> int:
    """How many features of ``[n, d]`` vary over the samples (the rest are constant and standardise to 0)."""
    return int((x.std(0) > eps * x.abs().amax(0).clamp_min(1.0)).sum())


@dataclass
class RCSCState:
    """The blocks of the alternating optimisation (``X_v`` is ``d_v x n``; ``Z`` is ``m x n``)."""

    W: list[Tensor]
    A: Tensor
    Z: Tensor
    alpha: Tensor
    C: Tensor | None = None
    G: Tensor | None = None  # labels [n] (the one-hot G stored as indices)
    history: list[float] = field(default_factory=list)


def residuals(X: list[Tensor], W: list[Tensor], A: Tensor, Z: Tensor) -> Tensor:
    """``R_v = ||X_v - W_v A Z||_F^2`` per view."""
    AZ = A @ Z
    return torch.stack([((x - w @ AZ) ** 2).sum() for x, w in zip(X, W)])


def objective(X: list[Tensor], s: RCSCState, lam: float, beta: float) -> float:
    """The card's objective at state ``s`` (the partition term only when ``beta > 0`` and ``G`` is set)."""
    obj = (s.alpha**2 * residuals(X, s.W, s.A, s.Z)).sum() + lam * (s.Z**2).sum()
    if beta > 0 and s.G is not None:
        obj = obj + beta * ((s.Z - s.C[:, s.G]) ** 2).sum()
    return float(obj)


def procrustes(B: Tensor) -> Tensor:
    """``argmax_{Q^T Q = I} Tr(Q^T B)`` (or ``Q Q^T = I`` for wide ``B``): ``U V^T`` from the thin SVD of ``B``."""
    U, _, Vh = torch.linalg.svd(B, full_matrices=False)
    return U @ Vh


def update_W(X: list[Tensor], s: RCSCState) -> None:
    """W_v = UV^T of svd(X_v Z^T A^T): the exact block minimiser (||W_v A Z|| does not depend on W_v)."""
    ZA = s.Z.T @ s.A.T
    s.W = [procrustes(x @ ZA) for x in X]


def update_A(X: list[Tensor], s: RCSCState, lam: float, beta: float) -> None:
    """A = UV^T of svd(sum_v alpha_v^2 W_v^T X_v Z^T), SMVSC's step.

    With m > d it ignores the A-dependent term Tr(A Z Z^T A^T), so it is not an exact block minimiser; the step is
    kept only if the objective did not rise (otherwise the old A stays), which makes the round monotone.
    """
    M = sum(a**2 * (w.T @ x) for a, w, x in zip(s.alpha, s.W, X)) @ s.Z.T
    before, old = objective(X, s, lam, beta), s.A
    s.A = procrustes(M)
    if objective(X, s, lam, beta) > before:
        s.A = old


def update_Z(X: list[Tensor], s: RCSCState, lam: float, beta: float, inner: int = 20) -> None:
    """Column-wise simplex QP by FISTA, all n columns at once, step 1/lambda_max(H); monotone by keeping the old Z.

    H = 2[(sum alpha^2) A^T A + (lam + beta) I] (exact, A^T A != I when m > d); b_i = 2[sum alpha^2 A^T W_v^T x_vi
    + beta C g_i]. lambda_max(A^T A) = 1 since A A^T = I.
    """
    a2 = float((s.alpha**2).sum())
    b_eff = beta if s.G is not None else 0.0
    AtA = s.A.T @ s.A
    B = s.A.T @ sum(a**2 * (w.T @ x) for a, w, x in zip(s.alpha, s.W, X))
    if b_eff > 0:
        B = B + b_eff * s.C[:, s.G]
    H_scale = a2 + lam + b_eff  # lambda_max(H) / 2

    def grad(z: Tensor) -> Tensor:  # gradient of the QP / 2
        return a2 * (AtA @ z) + (lam + b_eff) * z - B

    before, old = objective(X, s, lam, beta), s.Z
    z, y, t = s.Z, s.Z, 1.0
    for _ in range(inner):
        z_new = project_simplex(y - grad(y) / H_scale)
        t_new = (1 + (1 + 4 * t * t) ** 0.5) / 2
        y = z_new + ((t - 1) / t_new) * (z_new - z)
        z, t = z_new, t_new
    s.Z = z
    if objective(X, s, lam, beta) > before:  # FISTA is not monotone; keep the old Z if the objective rose
        s.Z = old


def update_Z_unconstrained(X: list[Tensor], s: RCSCState, lam: float, beta: float) -> None:
    """The Z step without Z ≥ 0 and 1ᵀZ = 1ᵀ (an ablation): the ridge solution
    Z = (Σα² AᵀA + (λ + β) I)⁻¹ (Σα² Aᵀ W_vᵀ X_v + β C G), the exact block minimiser."""
    a2 = float((s.alpha**2).sum())
    b_eff = beta if s.G is not None else 0.0
    B = s.A.T @ sum(a**2 * (w.T @ x) for a, w, x in zip(s.alpha, s.W, X))
    if b_eff > 0:
        B = B + b_eff * s.C[:, s.G]
    H = a2 * (s.A.T @ s.A) + (lam + b_eff) * torch.eye(s.A.shape[1], dtype=s.A.dtype, device=s.A.device)
    s.Z = torch.linalg.solve(H, B)


def update_CG(s: RCSCState) -> None:
    """C = cluster means of Z's columns; G = nearest centroid (empty clusters re-seeded with the farthest point); C
    recomputed for the new G. Each part is an exact block minimiser, so the round stays monotone."""
    K = s.C.shape[1]
    d2 = torch.cdist(s.Z.T, s.C.T) ** 2
    g = d2.argmin(1)
    for k in range(K):
        if not (g == k).any():
            far = d2.gather(1, g[:, None]).squeeze(1)
            counts = torch.bincount(g, minlength=K)
            far[counts[g] <= 1] = -1.0  # never empty another cluster
            g[far.argmax()] = k
    s.G = g
    s.C = cluster_means(s.Z, g, K)


def cluster_means(Z: Tensor, g: Tensor, K: int) -> Tensor:
    """``C = Z G (G^T G)^{-1}``: the mean column of Z per cluster ([m, K])."""
    onehot = torch.nn.functional.one_hot(g, K).to(Z.dtype)
    return (Z @ onehot) / onehot.sum(0).clamp_min(1.0)


def update_alpha(X: list[Tensor], s: RCSCState) -> None:
    """alpha_v = R_v^-1 / sum_u R_u^-1: the minimiser of sum alpha_v^2 R_v on the simplex (SMVSC code)."""
    inv = 1.0 / residuals(X, s.W, s.A, s.Z).clamp_min(1e-12)
    s.alpha = inv / inv.sum()


def spectral_labels(Z: Tensor, K: int, n_vectors: int | None = None, seed: int = 0, n_init: int = 10) -> np.ndarray:
    """SMVSC post-processing: thin SVD of Z^T, keep ``n_vectors`` (default all m, as ``algo_qp.m``) left singular
    vectors, row-normalise, k-means (sklearn)."""
    U, _, _ = torch.linalg.svd(Z.T.double(), full_matrices=False)
    U = U[:, : (n_vectors or U.shape[1])]
    U = U / U.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return KMeans(K, n_init=n_init, random_state=seed).fit_predict(U.cpu().numpy())


class RCSC:
    """RCSC (card reconstruction (P)) / SMVSC (``beta=0, partition="spectral"``) by alternating optimisation.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.arange(60) % 3
        >>> views = [torch.randn(3, 4, generator=g)[y] * 4 + torch.randn(60, 4, generator=g) for _ in range(2)]
        >>> m = RCSC(n_clusters=3, n_anchors=6, seed=0).fit(views)
        >>> m.labels_.shape, bool(m.history_[-1] <= m.history_[0])
        ((60,), True)
    """

    def __init__(self, n_clusters: int, n_anchors: int | None = None, latent_dim: int | None = None,
                 lam: float = 1.0, beta: float = 1.0, max_iter: int = 50, tol: float = 1e-3, warmup: int = 10,
                 inner: int = 20, partition: str = "onepass", temperature: float = 1.0, seed: int = 0,
                 view_scale: str = "unit", constraint: str = "simplex", weights: str = "learned",
                 dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> None:  # fmt: skip
        check_range("n_clusters", n_clusters, low=2, integer=True)
        check_range("n_anchors", n_anchors, low=2, integer=True, optional=True)
        check_range("latent_dim", latent_dim, low=1, integer=True, optional=True)
        check_range("lam", lam, low=0)
        check_range("beta", beta, low=0)
        for name, value, low in (("max_iter", max_iter, 0), ("warmup", warmup, 0), ("inner", inner, 1)):
            check_range(name, value, low=low, integer=True)
        check_range("tol", tol, low=0)
        check_range("temperature", temperature, low=0, low_open=True)
        check_choice("partition", partition, ("onepass", "spectral"))
        check_choice("view_scale", view_scale, ("unit", "mapstd"))
        check_choice("constraint", constraint, ("simplex", "none"))
        check_choice("weights", weights, ("learned", "uniform"))
        self.K = n_clusters
        self.m = n_anchors or 3 * n_clusters
        self.d = latent_dim or n_clusters
        if self.K > self.m:
            raise ValueError(f"n_clusters={self.K} is larger than n_anchors={self.m}: need K <= m anchors.")
        if self.d > self.m:
            raise ValueError(f"latent_dim={self.d} > n_anchors={self.m}: A A^T = I needs d <= m.")
        self.lam, self.beta, self.max_iter, self.tol = lam, beta, max_iter, tol
        self.warmup = warmup if beta > 0 else 0
        self.inner, self.partition, self.temperature, self.seed = inner, partition, temperature, seed
        self.view_scale, self.constraint, self.weights = view_scale, constraint, weights
        self.dtype, self.device = dtype, torch.device(device)

    # --- setup -------------------------------------------------------------------------------------------------
    def prepare(self, views: list[Tensor]) -> list[Tensor]:
        """Check views, standardise each feature, scale each view (``view_scale``), return ``d_v x n`` matrices.

        ``view_scale="unit"`` (the default) gives every view the energy of one standardised feature,
        ``X_v ← X_v / sqrt(d_v')`` with ``d_v'`` its non-constant features: the card's objective on views normalised
        to equal energy. ``"mapstd"`` is SMVSC's code (standardised features only), where a view's energy is its
        number of features. Why it matters: the model's reconstruction ``W_v A z`` has norm at most 1 (orthonormal
        W_v and A, z on the simplex), so the residual R_v mostly measures the view's energy, and α_v ∝ 1/R_v weights
        views by energy, not information. Under ``"mapstd"`` a 5-d view of four constants and one noise feature took
        α = 0.9 and ACC fell from 0.95 to 0.2; with equal energies α stays near uniform and such a view costs little.
        Neither weights views by how informative they are: that needs another weighting than the objective's.

        Raises:
            ValueError: no view, a view that is not 2-D, views of different n, fewer features than ``latent_dim``,
                NaN or inf, a constant view (no feature varies: it carries no information), fewer samples than
                anchors.
        """
        if len(views) == 0:
            raise ValueError("need at least one view")
        for i, v in enumerate(views):
            if not isinstance(v, Tensor) or v.ndim != 2:
                shape = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
                raise ValueError(f"view {i} has shape {shape}; every view is an [n, d_v] tensor (a 1-D view is "
                                 "v[:, None])")  # fmt: skip
        ns = [int(v.shape[0]) for v in views]
        if len(set(ns)) != 1:
            raise ValueError(f"views have different numbers of samples: {ns}; every view must hold the same n.")
        for i, v in enumerate(views):
            if v.shape[1] < self.d:
                raise ValueError(f"view {i} has {v.shape[1]} features < latent_dim={self.d}: W_v^T W_v = I needs "
                                 "d <= d_v")  # fmt: skip
            if not torch.isfinite(v).all():
                raise ValueError(f"view {i} holds NaN or inf")
            if informative_features(v) == 0:
                raise ValueError(f"view {i} is constant (none of its {v.shape[1]} features varies over the samples): "
                                 "it carries no information about the clusters; drop it")  # fmt: skip
        if ns[0] < self.m:
            raise ValueError(f"n={ns[0]} samples < n_anchors={self.m}")
        scales = self.view_scales(views)
        return [(standardize(v.to(self.device, self.dtype)) * c).T.contiguous() for v, c in zip(views, scales)]

    def view_scales(self, views: list[Tensor]) -> list[float]:
        """The factor each standardised view is scaled by (see :meth:`prepare`): ``1 / sqrt(d_v')`` or 1."""
        if self.view_scale == "mapstd":
            return [1.0] * len(views)
        return [informative_features(v) ** -0.5 for v in views]

    def init_state(self, X: list[Tensor]) -> RCSCState:
        """Z: soft assignment to m k-means centres of the concatenated views, exp(-(D - min D)/(T std D)) per sample,
        renormalised onto the simplex; A random orthonormal rows; alpha uniform; W from its exact step."""
        cat = torch.cat(X, 0).T.cpu().numpy()
        km = KMeans(self.m, n_init=1, random_state=self.seed).fit(cat)
        D = torch.cdist(torch.cat(X, 0).T, torch.as_tensor(km.cluster_centers_, dtype=self.dtype, device=self.device))
        D = D**2
        S = torch.exp(-(D - D.min(1, keepdim=True).values) / (self.temperature * D.std(1, keepdim=True).clamp_min(1e-12)))
        Z = project_simplex((S / S.sum(1, keepdim=True)).T)
        g = torch.Generator().manual_seed(self.seed)
        Q, _ = torch.linalg.qr(torch.randn(self.m, self.d, generator=g, dtype=self.dtype))
        A = Q.T.to(self.device)
        V = len(X)
        s = RCSCState(W=[], A=A, Z=Z, alpha=torch.full((V,), 1.0 / V, dtype=self.dtype, device=self.device))
        update_W(X, s)
        return s

    # --- one round ---------------------------------------------------------------------------------------------
    def beta_at(self, it: int) -> float:
        """beta is 0 during the warm-up rounds, then the card's beta."""
        return self.beta if it >= self.warmup else 0.0

    def step(self, X: list[Tensor], s: RCSCState, it: int) -> float:
        """One full round (W, A, Z, C/G, alpha) at round index ``it``; returns the objective after it."""
        beta = self.beta_at(it)
        if beta > 0 and s.G is None:  # switch the partition on: G from the spectral embedding of the anchor graph
            s.G = torch.as_tensor(spectral_labels(s.Z, self.K, self.K, self.seed), dtype=torch.long, device=self.device)
            s.C = cluster_means(s.Z, s.G, self.K)
        update_W(X, s)
        update_A(X, s, self.lam, beta)
        if self.constraint == "simplex":
            update_Z(X, s, self.lam, beta, self.inner)
        else:
            update_Z_unconstrained(X, s, self.lam, beta)
        if beta > 0:
            update_CG(s)
        if self.weights == "learned":
            update_alpha(X, s)
        obj = objective(X, s, self.lam, beta)
        s.history.append(obj)
        return obj

    def should_stop(self, s: RCSCState, it: int) -> bool:
        """Stop after >= 10 rounds past the warm-up with relative change < tol, or at max_iter."""
        if it + 1 >= self.max_iter:
            return True
        if it + 1 < self.warmup + 10 or len(s.history) < 2:
            return False
        prev, cur = s.history[-2], s.history[-1]
        return abs(prev - cur) / max(abs(prev), 1e-12) < self.tol

    def fit(self, views: list[Tensor]) -> RCSC:
        """Fit on a list of ``[n, d_v]`` views; sets ``labels_``, ``Z_``, ``alpha_``, ``history_``, ``state_``."""
        X = self.prepare(views)
        s = self.init_state(X)
        s.history.append(objective(X, s, self.lam, 0.0))
        for it in range(self.max_iter):
            self.step(X, s, it)
            if self.should_stop(s, it):
                break
        self.state_, self.history_ = s, s.history
        self.Z_, self.alpha_ = s.Z, s.alpha
        self.labels_ = self.labels(s)
        return self

    def labels(self, s: RCSCState) -> np.ndarray:
        """One-pass labels (G) or SMVSC's spectral post-processing."""
        if self.partition == "spectral" or s.G is None:
            return spectral_labels(s.Z, self.K, None, self.seed)
        return s.G.cpu().numpy()


def encode(X: list[Tensor], W: list[Tensor], A: Tensor, alpha: Tensor, lam: float, inner: int = 50) -> Tensor:
    """Anchor-graph columns for (standardised, ``d_v x n``) samples with W, A, alpha fixed: the Z step's simplex QP
    without the partition term, from uniform columns."""
    m, n = A.shape[1], X[0].shape[1]
    s = RCSCState(W=W, A=A, Z=torch.full((m, n), 1.0 / m, dtype=A.dtype, device=A.device), alpha=alpha)
    update_Z(X, s, lam, 0.0, inner)
    return s.Z
