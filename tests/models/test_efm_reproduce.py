"""Tests of the EFM reproduction's claim set and its non-learned stand-ins (the run itself is the contract test's):
every arm a claim names is run, the restated mode claim separates a transport onto Q from the identity map, and the
affine and assignment maps match hand-derived cases."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.claims import TaskCheck
from zoo.datamodules.pairs import toy_distribution
from zoo.metrics import energy_distance
from zoo.models.efm.alternatives import assign, gaussian_ot_map
from zoo.models.efm.experiment import ARMS, MODES, score, toy_nd
from zoo.models.efm.reproduce import CHECKS, CLAIMS, HEADLINES


def test_every_claim_names_arms_the_reproduction_runs() -> None:
    """Check that each claim's method and stand-ins (by kind) are two-mode arms, run in --quick too, and that every
    headline names claims that exist."""
    for claim in CLAIMS:
        assert claim.method in ARMS, claim.name
        assert claim.classified and set(claim.all_stand_ins) <= set(ARMS), claim.name
    task = [c for c in CHECKS if isinstance(c, TaskCheck)]
    assert len(task) == 1 and set(task[0].heuristics) <= set(ARMS)
    names = [c.name for c in CLAIMS] + [c.name for c in CHECKS]
    assert len(names) == len(set(names))
    for headline in HEADLINES:
        assert set(headline.claims) | set(headline.contradicted_by) <= set(names), headline.name


def test_mode_cover_fails_the_identity_map_that_mode_balance_passes() -> None:
    """Check that P itself is balanced (x₁ > 0 for about half) yet covers neither mode, while samples of Q cover both."""
    g = torch.Generator().manual_seed(0)
    p, q, q_other = (toy_distribution(name, 2000, g) for name in ("gaussian", "two_modes", "two_modes"))
    identity, target = score(p, q, MODES["two_modes"]), score(q_other, q, MODES["two_modes"])
    assert 0.45 < identity["balance"] < 0.55 and identity["mode_min"] < 0.01
    assert target["mode_min"] > 0.45 and target["off_modes"] < 0.03 and target["ed"] < 0.02
    collapsed = score(q_other[q_other[:, 0] > 0], q, MODES["two_modes"])  # every sample on one mode
    assert collapsed["mode_min"] == 0.0


def _whitened(n: int, dim: int, seed: int) -> torch.Tensor:
    """``n`` points with mean exactly 0 and sample covariance exactly I (float64)."""
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = x - x.mean(0)
    return x @ torch.linalg.inv(torch.linalg.cholesky(torch.cov(x.T))).T


def test_gaussian_ot_map_is_the_symmetric_root_from_a_standard_gaussian() -> None:
    """From N(0, I) to N(0, Σ) the Monge map is x ↦ Σ^{1/2} x. For Σ = [[2, 1], [1, 2]] (eigenvalues 3 and 1 on
    (1, 1)/√2 and (1, −1)/√2) the symmetric root is ½[[√3 + 1, √3 − 1], [√3 − 1, √3 + 1]], derived by hand; a
    Cholesky factor would also push N(0, I) onto N(0, Σ) but is not the optimal map."""
    s3 = math.sqrt(3.0)
    root = 0.5 * torch.tensor([[s3 + 1, s3 - 1], [s3 - 1, s3 + 1]], dtype=torch.float64)
    p = _whitened(500, 2, 0)
    q = _whitened(500, 2, 1) @ root.T + torch.tensor([1.0, -2.0], dtype=torch.float64)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]], dtype=torch.float64)
    expected = torch.tensor([1.0, -2.0], dtype=torch.float64) + x @ root.T
    torch.testing.assert_close(gaussian_ot_map(x, p, q), expected, atol=1e-9, rtol=0)


def test_gaussian_ot_map_between_axis_aligned_gaussians_scales_each_axis() -> None:
    """Σ_P = diag(4, 1) → Σ_Q = diag(1, 9): A = Σ_Q^{1/2} Σ_P^{-1/2} = diag(1/2, 3) when the two commute; with means
    μ_P = (3, −1) and μ_Q = (−2, 5), T(x) = μ_Q + A(x − μ_P)."""
    mu_p, mu_q = torch.tensor([3.0, -1.0], dtype=torch.float64), torch.tensor([-2.0, 5.0], dtype=torch.float64)
    p = _whitened(400, 2, 2) * torch.tensor([2.0, 1.0], dtype=torch.float64) + mu_p
    q = _whitened(400, 2, 3) * torch.tensor([1.0, 3.0], dtype=torch.float64) + mu_q
    x = torch.tensor([[2.0, 1.0], [-4.0, 0.5]], dtype=torch.float64)
    expected = mu_q + (x - mu_p) * torch.tensor([0.5, 3.0], dtype=torch.float64)
    torch.testing.assert_close(gaussian_ot_map(x, p, q), expected)


def test_assign_minimises_the_total_squared_distance_not_each_nearest() -> None:
    """x = 0 and 2 against q = 1 and 3.5 (on a line): both have q = 1 nearest, so a nearest-neighbour rule sends both
    there; the assignment pairs 0 ↔ 1 and 2 ↔ 3.5 (cost 1 + 2.25 = 3.25 against 12.25 + 1 the other way)."""
    x = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    q = torch.tensor([[1.0, 0.0], [3.5, 0.0]])
    torch.testing.assert_close(assign(x, q), torch.tensor([[3.5, 0.0], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="as many rows"):
        assign(x, q[:1])


def test_assign_uses_squared_distances() -> None:
    """x = (0, 0), (0, 1) against q = (0, 2), (3, 3): pairing in order costs 4 + 13 = 17 squared (2 + √13 = 5.61 in
    plain distance), crossed 18 + 1 = 19 squared (√18 + 1 = 5.24): the squared cost pairs in order, the plain one
    would cross."""
    x = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    q = torch.tensor([[0.0, 2.0], [3.0, 3.0]])
    torch.testing.assert_close(assign(x, q), q)


def test_score_counts_diverged_outputs_and_holds_them_at_the_box() -> None:
    """An inf row and a row at 100 are diverged (2 of 4) and weigh as points at the box's edge (20), so the energy
    distance stays finite and equals the one of the clamped samples."""
    q = torch.tensor([[4.0, 0.0], [-4.0, 0.0], [4.0, 0.5], [-4.0, -0.5]])
    x = torch.tensor([[float("inf"), 0.0], [100.0, 0.0], [4.0, 0.0], [-4.0, 0.0]])
    m = score(x, q)
    clamped = torch.tensor([[20.0, 0.0], [20.0, 0.0], [4.0, 0.0], [-4.0, 0.0]])
    assert m["diverged"] == 0.5
    assert m["ed"] == pytest.approx(float(energy_distance(clamped, q)))
    assert score(q, q)["diverged"] == 0.0


def test_toy_nd_keeps_the_modes_and_spreads_the_noise() -> None:
    """D = 8: the modes stay at ±4 on the first axis, the noise has std 0.5 on every axis, P is N(0, I)."""
    g = torch.Generator().manual_seed(0)
    q, p = toy_nd("two_modes", 20_000, g, dim=8), toy_nd("gaussian", 20_000, g, dim=8)
    assert q.shape == (20_000, 8)
    assert abs(float(q[:, 0].abs().mean()) - 4.0) < 0.02 and abs(float((q[:, 0] > 0).float().mean()) - 0.5) < 0.02
    assert torch.allclose(q[:, 1:].std(0), torch.full((7,), 0.5), atol=0.02)
    assert torch.allclose(p.std(0), torch.ones(8), atol=0.03)
    with pytest.raises(ValueError, match="eight_gaussians"):
        toy_nd("eight_gaussians", 10, g, dim=8)


def test_gaussian_ot_map_is_symmetric_and_pushes_the_covariance_in_general_position() -> None:
    """For non-commuting Σ_P and Σ_Q the map's matrix A must satisfy A Σ_P A = Σ_Q and be symmetric positive definite
    (the Monge map is the gradient of a convex function); Σ_Q^{1/2} Σ_P^{-1/2}, the commuting case's shortcut, meets
    the first and not the second."""
    cov_p = torch.tensor([[3.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    cov_q = torch.tensor([[1.0, -0.8], [-0.8, 2.0]], dtype=torch.float64)
    p = _whitened(300, 2, 4) @ torch.linalg.cholesky(cov_p).T
    q = _whitened(300, 2, 5) @ torch.linalg.cholesky(cov_q).T
    a = gaussian_ot_map(torch.eye(2, dtype=torch.float64), p, q) - gaussian_ot_map(torch.zeros(1, 2, dtype=torch.float64), p, q)
    a = a.T  # rows were A e_i
    torch.testing.assert_close(a, a.T, atol=1e-9, rtol=0)
    assert bool((torch.linalg.eigvalsh(a) > 0).all())
    torch.testing.assert_close(a @ cov_p @ a.T, cov_q, atol=1e-9, rtol=0)
