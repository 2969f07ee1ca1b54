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
