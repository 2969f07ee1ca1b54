"""The anchor-graph baselines as their official code runs them (SMVSC's algo_qp.m, LMVSC's lmv.m): their QPs pinned to
scipy's general solver, SMVSC's first round derived by hand, and both on the card's views."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from zoo.datamodules.multiview import synthetic_views
from zoo.models.rcsc import baselines as B
from zoo.models.rcsc.solver import standardize


def _qp_scipy(H: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ½ zᵀHz − bᵀz on the simplex with scipy's SLSQP (what quadprog solves in the official code)."""
    m = len(b)
    res = minimize(lambda z: 0.5 * z @ H @ z - b @ z, np.full(m, 1.0 / m), jac=lambda z: H @ z - b,
                   bounds=[(0, 1)] * m, constraints=[{"type": "eq", "fun": lambda z: z.sum() - 1}], method="SLSQP",
                   options={"ftol": 1e-14, "maxiter": 500})  # fmt: skip
    return res.x


def test_simplex_qp_matches_a_general_qp_solver() -> None:
    """Check the batched simplex QP (LMVSC's per-column quadprog) against scipy's SLSQP on random convex problems."""
    g = torch.Generator().manual_seed(0)
    M = torch.randn(6, 6, generator=g, dtype=torch.float64)
    H = M @ M.T + 0.1 * torch.eye(6, dtype=torch.float64)
    Bm = torch.randn(6, 5, generator=g, dtype=torch.float64) * 3
    z = B.simplex_qp(H, Bm)
    for i in range(5):
        np.testing.assert_allclose(z[:, i].numpy(), _qp_scipy(H.numpy(), Bm[:, i].numpy()), atol=1e-6)


def test_smvsc_first_round_follows_algo_qp_by_hand() -> None:
    """Check SMVSC's first round against algo_qp.m worked by hand: A = 0 makes C = X (AZ)ᵀ = 0, so W_v = [I; 0] (what
    MATLAB's svd returns); A = UVᵀ of Σ α² W_vᵀ X_v Zᵀ with Z = [I, 0]; the Z step, with H = 2(Σα² + λ)I and the
    linear term −2 Σ x_vᵀ W_v A (no α²), solved by scipy's QP for every column, equals the projection the port uses."""
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(12, 4, generator=g), torch.randn(12, 5, generator=g)]
    out = B.smvsc(views, n_anchors=4, latent_dim=2, lam=1.0, max_iter=0)
    X = [standardize(v.double()).T.numpy() for v in views]
    W = [np.eye(x.shape[0], 2) for x in X]
    Z0 = np.zeros((4, 12))
    Z0[:, :4] = np.eye(4)
    part1 = sum(0.5**2 * w.T @ x @ Z0.T for w, x in zip(W, X))
    U, _, Vt = np.linalg.svd(part1, full_matrices=False)
    A = U @ Vt
    H = 2 * (2 * 0.5**2 + 1.0) * np.eye(4)
    f = sum(-2 * (w @ A).T @ x for w, x in zip(W, X))  # 4 x 12: one linear term per column
    Z1 = np.stack([_qp_scipy(H, -f[:, j]) for j in range(12)], 1)
    # max_iter=0 still runs the code's ten rounds before its stop rule may fire; rerun one round by hand instead
    first = B.smvsc(views, n_anchors=4, latent_dim=2, lam=1.0, max_iter=0, rounds=1)
    np.testing.assert_allclose(first.Z.numpy(), Z1, atol=1e-6)
    assert out.rounds == 10 and out.U.shape == (12, 4)


def test_baselines_cluster_the_card_views() -> None:
    """Check both baselines on the card's views: SMVSC's restarts and LMVSC's labels are far above chance."""
    from torchmetrics.functional.clustering import cluster_accuracy

    views, y = synthetic_views(n_per=60, n_clusters=3, noise_dim=20, seed=0)
    out = B.smvsc(views, n_anchors=9, latent_dim=3)
    runs = B.spectral_restarts(out.U, 3, 5, 0)
    accs = [float(cluster_accuracy(torch.as_tensor(lab), y, num_classes=3)) for lab in runs]
    assert np.mean(accs) > 0.6 and float(out.alpha[-1]) < float(out.alpha[0])  # SMVSC's code is the weaker one
    lm = B.lmvsc(views, n_clusters=3, n_anchors=9, seed=0)
    assert float(cluster_accuracy(torch.as_tensor(lm), y, num_classes=3)) > 0.8
    with pytest.raises(ValueError, match="`alpha` to be a finite float > 0"):
        B.lmvsc(views, n_clusters=3, n_anchors=9, alpha=0.0)
