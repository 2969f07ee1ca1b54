"""Unit tests of RCSC's maths: simplex, orthonormality, weights, per-block descent, monotone rounds, SMVSC, errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from zoo.datamodules.multiview import synthetic_views
from zoo.models.rcsc import solver as S


@pytest.fixture(scope="module")
def small():
    views, y = synthetic_views(n_per=40, n_clusters=3, dims=(6, 8), noise_dim=30, seed=0)
    return views, y


def _model(**kw):
    return S.RCSC(n_clusters=3, n_anchors=9, warmup=3, max_iter=12, seed=0, **kw)


def test_project_simplex_matches_definition():
    torch.manual_seed(0)
    v = torch.randn(7, 50, dtype=torch.float64) * 3
    z = S.project_simplex(v)
    assert (z >= 0).all() and torch.allclose(z.sum(0), torch.ones(50, dtype=torch.float64))
    # KKT of the projection: z = max(v - theta, 0) with a single theta per column; any simplex point is farther
    other = S.project_simplex(torch.rand(7, 50, dtype=torch.float64))
    assert ((z - v).pow(2).sum(0) <= (other - v).pow(2).sum(0) + 1e-12).all()


def test_fit_constraints_and_monotone(small):
    views, _ = small
    m = _model().fit(views)
    s = m.state_
    assert s.Z.min() >= -1e-7 and (s.Z.sum(0) - 1).abs().max() <= 1e-5
    eye = torch.eye(m.d, dtype=torch.float64)
    assert torch.allclose(s.A @ s.A.T, eye, atol=1e-8)
    for w in s.W:
        assert torch.allclose(w.T @ w, eye, atol=1e-8)
    assert (s.alpha >= 0).all() and abs(float(s.alpha.sum()) - 1) < 1e-10
    h = m.history_
    warm, joint = h[: m.warmup + 1], h[m.warmup + 1:]  # the partition term switches on after the warm-up
    for seg in (warm, joint):
        assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(seg)), seg
    assert h[m.warmup] < h[0]


def test_each_block_update_decreases(small):
    views, _ = small
    m = _model()
    X = m.prepare(views)
    s = m.init_state(X)
    for it in range(5):  # reach the joint phase, then test each block alone
        m.step(X, s, it)
    beta = m.beta_at(5)
    for update in (lambda: S.update_W(X, s), lambda: S.update_A(X, s, m.lam, beta),
                   lambda: S.update_Z(X, s, m.lam, beta), lambda: S.update_CG(s), lambda: S.update_alpha(X, s)):
        before = S.objective(X, s, m.lam, beta)
        update()
        assert S.objective(X, s, m.lam, beta) <= before * (1 + 1e-12)


def test_alpha_is_the_simplex_minimiser(small):
    views, _ = small
    m = _model()
    X = m.prepare(views)
    s = m.init_state(X)
    S.update_alpha(X, s)
    R = S.residuals(X, s.W, s.A, s.Z)
    best = float((s.alpha**2 * R).sum())
    for _ in range(20):
        a = torch.rand(len(X), dtype=torch.float64)
        a = a / a.sum()
        assert float((a**2 * R).sum()) >= best - 1e-9


def test_smvsc_is_beta_zero_with_spectral(small):
    views, _ = small
    m = _model(beta=0.0, partition="spectral").fit(views)
    assert m.warmup == 0 and m.state_.G is None  # no partition term, ever
    assert (m.labels_ == S.spectral_labels(m.Z_, 3, None, 0)).all()
    h = m.history_
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(h))


def test_bad_inputs(small):
    views, _ = small
    with pytest.raises(ValueError, match="different numbers of samples"):
        _model().fit([views[0], views[1][:-1]])
    with pytest.raises(ValueError, match="larger than n_anchors"):
        S.RCSC(n_clusters=10, n_anchors=5)
    bad = views[0].clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        _model().fit([bad, views[1]])


# --- each block pinned to its closed-form optimum on a small case (not to the code under test) ---------------------


def _state(m: int = 4, d: int = 4, n: int = 6, V: int = 2, seed: int = 0):
    """Views (d_v x n), an orthogonal A (m = d, so AᵀA = I and the Z step's QP is a projection), orthonormal W_v."""
    g = torch.Generator().manual_seed(seed)
    X = [torch.randn(5 + v, n, generator=g, dtype=torch.float64) for v in range(V)]
    A = torch.linalg.qr(torch.randn(m, d, generator=g, dtype=torch.float64))[0].T  # d x m, orthonormal rows
    W = [torch.linalg.qr(torch.randn(x.shape[0], d, generator=g, dtype=torch.float64))[0] for x in X]
    Z = S.project_simplex(torch.rand(m, n, generator=g, dtype=torch.float64))
    alpha = torch.tensor([0.8, 0.2][:V], dtype=torch.float64)
    return X, S.RCSCState(W=W, A=A, Z=Z, alpha=alpha)


def test_z_step_is_the_projection_its_closed_form_gives_when_a_is_orthogonal() -> None:
    """Check the Z step against its closed form. With AᵀA = I the QP ½zᵀHz − bᵢᵀz, H = 2(Σα² + λ + β)I and
    bᵢ = 2(Σ_v α_v² Aᵀ W_vᵀ x_vi + β C gᵢ), has the solution Π_simplex(bᵢ / (2(Σα² + λ + β))): derived by hand from
    the objective Σ α_v² ||x_v − W_v A z||² + λ||z||² + β||z − c_g||² (W_vᵀW_v = I). Dropping the α_v² from the
    linear term (SMVSC code's quirk) or the β from the FISTA step size moves the result."""
    X, s = _state()
    lam = 0.3
    a2 = float((s.alpha**2).sum())
    target = s.A.T @ sum(a**2 * (w.T @ x) for a, w, x in zip(s.alpha, s.W, X))
    S.update_Z(X, s, lam, 0.0, inner=50)
    torch.testing.assert_close(s.Z, S.project_simplex(target / (a2 + lam)), atol=1e-9, rtol=0)
    # with the partition term, β = 5: the centroid of each column's cluster pulls it
    X, s = _state(seed=1)
    s.G = torch.tensor([0, 1, 0, 1, 1, 0])
    s.C = S.project_simplex(torch.rand(4, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    beta = 5.0
    target = s.A.T @ sum(a**2 * (w.T @ x) for a, w, x in zip(s.alpha, s.W, X)) + beta * s.C[:, s.G]
    S.update_Z(X, s, lam, beta, inner=50)
    torch.testing.assert_close(s.Z, S.project_simplex(target / (a2 + lam + beta)), atol=1e-9, rtol=0)


def test_alpha_step_on_a_hand_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check α on residuals set by hand: R = (1, 2, 4) gives α ∝ 1/R = (4, 2, 1)/7, the minimiser of Σα²R on the
    simplex (Lagrange: 2α_v R_v = μ)."""
    s = S.RCSCState(W=[], A=torch.zeros(1, 1), Z=torch.zeros(1, 1), alpha=torch.ones(3) / 3)
    monkeypatch.setattr(S, "residuals", lambda *args: torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64))
    S.update_alpha([], s)
    torch.testing.assert_close(s.alpha, torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64) / 7)


def test_w_and_a_steps_are_procrustes_solutions() -> None:
    """Check W_v = UVᵀ of svd(X_v Zᵀ Aᵀ) against the definition: no orthonormal matrix gives a larger Tr(Wᵀ X_v Zᵀ
    Aᵀ) (500 random ones), and A likewise for Tr(Aᵀ Σ α² W_vᵀ X_v Zᵀ)."""
    X, s = _state(m=6, d=3)
    S.update_W(X, s)
    g = torch.Generator().manual_seed(3)
    for x, w in zip(X, s.W):
        B = x @ s.Z.T @ s.A.T
        best = float(torch.trace(w.T @ B))
        others = [torch.linalg.qr(torch.randn(*w.shape, generator=g, dtype=torch.float64))[0] for _ in range(500)]
        assert all(float(torch.trace(o.T @ B)) <= best + 1e-9 for o in others)
    M = sum(a**2 * (w.T @ x) for a, w, x in zip(s.alpha, s.W, X)) @ s.Z.T
    A = S.procrustes(M)
    best = float(torch.trace(A.T @ M))
    for _ in range(500):
        o = torch.linalg.qr(torch.randn(6, 3, generator=g, dtype=torch.float64))[0].T
        assert float(torch.trace(o.T @ M)) <= best + 1e-9


def test_unconstrained_z_step_is_the_ridge_solution() -> None:
    """Check the no-constraint ablation's Z against the normal equations solved with numpy."""
    import numpy as np

    X, s = _state(m=6, d=3)
    lam = 0.5
    S.update_Z_unconstrained(X, s, lam, 0.0)
    a = s.alpha.numpy()
    A, Ws, Xs = s.A.numpy(), [w.numpy() for w in s.W], [x.numpy() for x in X]
    H = (a**2).sum() * A.T @ A + lam * np.eye(6)
    B = A.T @ sum(ai**2 * w.T @ x for ai, w, x in zip(a, Ws, Xs))
    np.testing.assert_allclose(s.Z.numpy(), np.linalg.solve(H, B), atol=1e-10)


# --- views weighted by information ------------------------------------------------------------------------------------


def test_unit_view_scale_gives_each_view_the_energy_of_one_feature() -> None:
    """Check the view scaling by hand: a 5-d view with 4 constant features and 1 varying one is scaled by 1/√1, a
    10-d view by 1/√10, so each carries the energy of one standardised feature, (n − 1) (std with ddof 1); "mapstd"
    leaves them."""
    g = torch.Generator().manual_seed(0)
    odd = torch.cat([torch.ones(50, 4), torch.randn(50, 1, generator=g)], 1)
    full = torch.randn(50, 10, generator=g)
    m = S.RCSC(n_clusters=5, n_anchors=15, latent_dim=5)
    assert m.view_scales([odd, full]) == pytest.approx([1.0, 0.1**0.5])
    X = m.prepare([odd, full])
    assert [float((x**2).sum()) for x in X] == pytest.approx([49.0, 49.0])
    assert S.RCSC(n_clusters=5, n_anchors=15, view_scale="mapstd").view_scales([odd, full]) == [1.0, 1.0]


def test_uninformative_low_dimensional_view_gets_little_weight_and_does_not_take_over() -> None:
    """Check the failure the issue reported, fixed: a 5-d view of 4 constants and 1 noise feature took α > 0.8 and
    dropped ACC below 0.5 under SMVSC's scaling; with equal view energies it takes the smallest α, near 1/V, and ACC
    stays within 0.1 of the fit without it."""
    from torchmetrics.functional.clustering import cluster_accuracy

    views, y = synthetic_views(n_per=100, n_clusters=5, noise_dim=0, seed=0)
    g = torch.Generator().manual_seed(1)
    odd = torch.cat([torch.ones(len(y), 4), torch.randn(len(y), 1, generator=g)], 1)
    unit = S.RCSC(n_clusters=5, seed=0).fit([*views, odd])
    raw = S.RCSC(n_clusters=5, seed=0, view_scale="mapstd").fit([*views, odd])
    without = S.RCSC(n_clusters=5, seed=0).fit(views)
    acc = lambda labels: float(cluster_accuracy(torch.as_tensor(labels), y, num_classes=5))  # noqa: E731
    assert float(raw.alpha_[-1]) > 0.8 and acc(raw.labels_) < 0.5  # the reported failure, kept as an option
    assert float(unit.alpha_[-1]) == float(unit.alpha_.min()) and float(unit.alpha_[-1]) > 0.3
    assert acc(unit.labels_) > acc(without.labels_) - 0.1 > 0.75  # measured: 0.912 against 0.968


def test_constant_view_and_impossible_arguments_are_refused() -> None:
    """Check the one-line refusals: a constant view, a 1-D view, negative β or λ, an unknown option."""
    views, _ = synthetic_views(n_per=20, n_clusters=3, noise_dim=0, seed=0)
    with pytest.raises(ValueError, match="view 2 is constant .* drop it"):
        S.RCSC(n_clusters=3, n_anchors=9).fit([*views, torch.ones(60, 5)])
    with pytest.raises(ValueError, match=r"view 1 has shape \(60,\); every view is an \[n, d_v\] tensor"):
        S.RCSC(n_clusters=3, n_anchors=9).fit([views[0], views[1][:, 0]])
    with pytest.raises(ValueError, match="`beta` to be a finite float >= 0, but got -1"):
        S.RCSC(n_clusters=3, beta=-1.0)
    with pytest.raises(ValueError, match="`lam` to be a finite float >= 0, but got -5"):
        S.RCSC(n_clusters=3, lam=-5.0)
    with pytest.raises(ValueError, match="`view_scale` to be one of 'unit', 'mapstd'"):
        S.RCSC(n_clusters=3, view_scale="std")
