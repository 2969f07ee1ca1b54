"""The anchor-graph methods RCSC is compared with, as their official code runs them: SMVSC and LMVSC.

* **SMVSC** (Sun et al., ACM MM 2021; ``Jeaninezpp/SMVSC`` at 30885d6, ``algo_qp.m``): unified anchors A, view
  projections W_v and one anchor graph Z, with the code's own choices, which differ from RCSC's β = 0 objective
  solved by :class:`~zoo.models.rcsc.solver.RCSC`: A = 0, W_v = 0 and Z = [I, 0] at the start (the first n − m
  columns of Z are zero, off the simplex); the Z step's quadratic term is 2(Σα² + λ) I, not 2(Σα² AᵀA + λ I), and its
  linear term has no α_v²; each column is a ``quadprog`` on the simplex. With a quadratic term proportional to I that
  QP is the Euclidean projection of Σ_v Aᵀ W_vᵀ x_v / (Σα² + λ) onto the simplex, which :func:`smvsc` computes
  exactly. It stops after ≥ 10 rounds when the objective changes by < 1e-3 relative, or after 51, and returns all m
  left singular vectors of Zᵀ; ``myNMIACCwithmean.m`` row-normalises them and runs k-means 50 times, reporting the
  best of each metric (we report the mean and, separately, that maximum).
* **LMVSC** (Kang et al., AAAI 2020; ``sckangz/LMVSC`` at 71311ed, ``lmv.m`` / ``runlmv.m``): m anchors per view by
  k-means (10 replicates), a per-view anchor graph Z_v = argmin ||x − H_vᵀ z||² + α||z||² over the simplex (the
  code's ``quadprog``; solved here by accelerated projected gradient to 1e-10), the views' graphs stacked with weight
  1/√V, the top-K left singular vectors of the stack, k-means (10 replicates).

Every arm of ``zoo reproduce rcsc`` sees the same views, standardised per feature (SMVSC's ``mapstd``; LMVSC's code
takes its datasets' features as they come, which the card's generator makes comparable).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from sklearn.cluster import KMeans
from torch import Tensor

from zoo.arguments import check_range
from zoo.models.rcsc.solver import procrustes, project_simplex, standardize

__all__ = ["SMVSCResult", "lmvsc", "simplex_qp", "smvsc", "spectral_restarts"]


def simplex_qp(H: Tensor, B: Tensor, iters: int = 500, tol: float = 1e-10) -> Tensor:
    """Solve ``min_z ½ zᵀ H z − bᵀ z`` over the probability simplex for every column b of ``B`` ([m, n]).

    Accelerated projected gradient (FISTA) with step 1/λ_max(H) from uniform columns, stopped when no column moves
    by more than ``tol``; exact for ``H ∝ I`` after one step. Written by hand: no maintained batched simplex QP exists
    in torch or scipy (scipy's solvers take one problem at a time).

    Example:
        >>> z = simplex_qp(torch.eye(2, dtype=torch.float64) * 2, torch.tensor([[2.0], [0.0]], dtype=torch.float64))
        >>> z.flatten().tolist()  # the projection of (1, 0) onto the simplex
        [1.0, 0.0]
    """
    L = float(torch.linalg.eigvalsh(H).max())
    z = torch.full_like(B, 1.0 / B.shape[0])
    y, t = z, 1.0
    for _ in range(iters):
        z_new = project_simplex(y - (H @ y - B) / L)
        t_new = (1 + (1 + 4 * t * t) ** 0.5) / 2
        y = z_new + ((t - 1) / t_new) * (z_new - z)
        moved = float((z_new - z).abs().max())
        z, t = z_new, t_new
        if moved < tol:
            break
    return z


@dataclass
class SMVSCResult:
    """SMVSC's outputs: the embedding ``U`` (n × m, all left singular vectors of Zᵀ), Z, α, rounds, objectives."""

    U: Tensor
    Z: Tensor
    alpha: Tensor
    rounds: int
    objective: list[float]


def smvsc(
    views: list[Tensor],
    n_anchors: int,
    latent_dim: int,
    lam: float = 1.0,
    max_iter: int = 50,
    rounds: int | None = None,
) -> SMVSCResult:
    """SMVSC as ``algo_qp.m`` runs it (see the module docstring), on ``[n, d_v]`` views; ``rounds`` stops after that
    many rounds whatever the stop rule says (for tests).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.arange(60) % 3
        >>> views = [torch.randn(3, 4, generator=g)[y] * 4 + torch.randn(60, 4, generator=g) for _ in range(2)]
        >>> out = smvsc(views, n_anchors=6, latent_dim=3)
        >>> out.U.shape, bool(torch.allclose(out.Z.sum(0), torch.ones(60, dtype=torch.float64)))
        (torch.Size([60, 6]), True)
    """
    check_range("n_anchors", n_anchors, low=1, integer=True)
    check_range("latent_dim", latent_dim, low=1, high=n_anchors, integer=True)
    check_range("lam", lam, low=0)
    X = [standardize(v.double()).T.contiguous() for v in views]  # mapstd(X{i}') : d_i × n
    n, m, d, V = X[0].shape[1], n_anchors, latent_dim, len(X)
    W = [torch.zeros(x.shape[0], d, dtype=torch.float64) for x in X]
    A = torch.zeros(d, m, dtype=torch.float64)
    Z = torch.zeros(m, n, dtype=torch.float64)
    Z[:, :m] = torch.eye(m, dtype=torch.float64)
    alpha = torch.full((V,), 1.0 / V, dtype=torch.float64)
    objective: list[float] = []
    it = 0
    while True:
        it += 1
        AZ = A @ Z
        for i, x in enumerate(X):
            C = x @ AZ.T
            # MATLAB's svd of the all-zero first-round C returns identity factors: W = [I; 0]
            W[i] = torch.eye(*C.shape, dtype=torch.float64) if not C.any() else procrustes(C)
        a2 = alpha**2
        A = procrustes(sum(a * (w.T @ x) for a, w, x in zip(a2, W, X)) @ Z.T)
        # H = 2(Σα² + λ) I and f = −2 Σ_j x_jᵀ W_j A (no α²): the QP is the projection of −f / (2(Σα² + λ))
        Z = project_simplex(A.T @ sum(w.T @ x for w, x in zip(W, X)) / (float(a2.sum()) + lam))
        R = torch.stack([((x - w @ A @ Z) ** 2).sum() for w, x in zip(W, X)])
        alpha = (1 / R) / (1 / R).sum()
        objective.append(float((alpha**2 * R).sum() + lam * (Z**2).sum()))
        change = abs(objective[-2] - objective[-1]) / objective[-2] if it > 1 else np.inf
        if it > 9 and (change < 1e-3 or it > max_iter or objective[-1] < 1e-10) or it == rounds:
            break
    U, _, _ = torch.linalg.svd(Z.T, full_matrices=False)
    return SMVSCResult(U=U, Z=Z, alpha=alpha, rounds=it, objective=objective)


def spectral_restarts(U: Tensor, n_clusters: int, restarts: int, seed: int) -> list[np.ndarray]:
    """``myNMIACCwithmean.m``: rows of U normalised to unit length, then ``restarts`` single k-means runs (random
    samples as the starting centres, as ``litekmeans``); one labelling per run."""
    Un = (U / U.norm(dim=1, keepdim=True).clamp_min(1e-12)).numpy()
    return [KMeans(n_clusters, init="random", n_init=1, max_iter=100, random_state=seed * 1000 + r).fit_predict(Un)
            for r in range(restarts)]  # fmt: skip


def lmvsc(views: list[Tensor], n_clusters: int, n_anchors: int, alpha: float = 1.0, seed: int = 0) -> np.ndarray:
    """LMVSC as ``lmv.m`` runs it (see the module docstring) on standardised ``[n, d_v]`` views; returns labels.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.arange(90) % 3
        >>> views = [torch.randn(3, 4, generator=g)[y] * 4 + torch.randn(90, 4, generator=g) for _ in range(2)]
        >>> labels = lmvsc(views, n_clusters=3, n_anchors=6)
        >>> labels.shape, len(set(labels.tolist()))
        ((90,), 3)
    """
    check_range("n_anchors", n_anchors, low=n_clusters, integer=True)
    check_range("alpha", alpha, low=0, low_open=True)
    stacks = []
    for v in views:
        x = standardize(v.double())
        H = torch.as_tensor(KMeans(n_anchors, n_init=10, random_state=seed).fit(x.numpy()).cluster_centers_)
        # min ||x − Hᵀ z||² + α ||z||² on the simplex: ½ zᵀ (2αI + 2HHᵀ) z − (2 H x)ᵀ z, as lmv.m's quadprog
        Hq = 2 * alpha * torch.eye(n_anchors, dtype=torch.float64) + 2 * H @ H.T
        stacks.append(simplex_qp(Hq, 2 * H @ x.T) / len(views) ** 0.5)
    U, _, _ = torch.linalg.svd(torch.cat(stacks, 0).T, full_matrices=False)
    return KMeans(n_clusters, n_init=10, random_state=seed).fit_predict(U[:, :n_clusters].numpy())
