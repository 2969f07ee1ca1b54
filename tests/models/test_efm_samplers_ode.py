"""EFM field-point samplers (segment, uniform, uniform_mixing, mesh) and the z-clock transport (Euler, RK45)."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.models.efm.ode import transport
from zoo.models.efm.samplers import PlatePointSampler


# ------------------------------------------------------------------------------------------------ samplers
def test_segment_sampler_inner_and_outer_points() -> None:
    """Check that segment points have z in [ε, L−ε], round(fraction·n) outer points lie in the outer box."""
    torch.manual_seed(0)
    L, eps, box, margin = 6.0, 0.2, 3.0, 1.0
    sampler = PlatePointSampler(
        "segment", L=L, eps=eps, noise=0.0, outer_fraction=0.15, outer_margin=margin, outer_box=box
    )
    zeros = torch.zeros(8, 2)  # both plates at x = 0: without noise every inner point has x == 0 exactly
    points = sampler(zeros, zeros, num_points=1001)
    assert points.shape == (1001, 3)
    outer = (points[:, :2] != 0).any(dim=1)
    assert int(outer.sum()) == round(0.15 * 1001)
    inner_z = points[~outer, 2]
    assert bool((inner_z >= eps).all() and (inner_z <= L - eps).all())
    assert abs(float(inner_z.mean()) - L / 2) < 0.2  # z ~ U(ε, L − ε)
    assert bool((points[outer, :2].abs() <= box).all())
    assert bool((points[outer, 2] >= -margin).all() and (points[outer, 2] <= L + margin).all())
    assert bool((points[outer, 2] < 0).any() and (points[outer, 2] > L).any())  # the outer points leave the plates


def test_segment_sampler_adds_isotropic_noise() -> None:
    """Check that the segment sampler's inner x are the segment point plus noise of the requested scale."""
    torch.manual_seed(0)
    sampler = PlatePointSampler("segment", L=6.0, noise=0.5, outer_fraction=0.0)
    points = sampler(torch.zeros(4, 2), torch.zeros(4, 2), num_points=4000)
    assert abs(float(points[:, :2].std()) - 0.5) < 0.02
    assert abs(float(points[:, :2].mean())) < 0.03


def test_uniform_sampler_points_lie_on_the_segment() -> None:
    """Check that 'uniform' points are exactly x = (1 − z/L)x⁺ + (z/L)x⁻ with z in [ε, L−ε], without outer points."""
    torch.manual_seed(0)
    L, eps = 4.0, 0.3
    x_plus, x_minus = torch.tensor([[1.0, -2.0, 0.5]]), torch.tensor([[-3.0, 2.0, 4.0]])
    points = PlatePointSampler("uniform", L=L, eps=eps)(x_plus, x_minus, num_points=500)
    assert points.shape == (500, 4)
    z = points[:, -1:]
    torch.testing.assert_close(points[:, :-1], (1 - z / L) * x_plus + (z / L) * x_minus)
    assert bool((z >= eps).all() and (z <= L - eps).all())


def test_uniform_mixing_extrapolates_past_the_target_plate() -> None:
    """Check that 'uniform_mixing' gives z ≥ 0 with many z > L, and x on the extended line through x⁺ and x⁻."""
    torch.manual_seed(0)
    L = 6.0
    x_plus, x_minus = torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, -1.0]])
    points = PlatePointSampler("uniform_mixing", L=L)(x_plus, x_minus, num_points=2000)
    z = points[:, -1:]
    assert bool((z >= 0).all())
    assert int((z > L).sum()) > 100
    assert bool((z < L).any())
    torch.testing.assert_close(points[:, :-1], (1 - z / L) * x_plus + (z / L) * x_minus, rtol=1e-5, atol=1e-3)


def test_mesh_sampler_is_a_fixed_grid() -> None:
    """Check that 'mesh' gives mesh_size^(D+1) points on the box, the same every call, and refuses D > 3."""
    sampler = PlatePointSampler("mesh", L=6.0, mesh_size=5, outer_box=8.0, outer_margin=2.0)
    points = sampler(torch.randn(10, 2), torch.randn(10, 2), num_points=3)
    assert points.shape == (5**3, 3)
    assert torch.equal(points, sampler(torch.randn(7, 2), torch.randn(7, 2), num_points=3))
    assert points[:, :2].min() == -8.0 and points[:, :2].max() == 8.0
    assert points[:, 2].min() == pytest.approx(1e-5) and points[:, 2].max() == pytest.approx(8.0)
    assert len(points.unique(dim=0)) == 5**3
    with pytest.raises(ValueError, match="mesh"):
        sampler(torch.randn(10, 4), torch.randn(10, 4), num_points=3)


def test_sampler_flattens_images() -> None:
    """Check that image batches (n, C, H, W) give points of dimension C·H·W + 1."""
    points = PlatePointSampler("segment")(torch.randn(6, 1, 4, 4), torch.randn(5, 1, 4, 4), num_points=20)
    assert points.shape == (20, 17)


@pytest.mark.parametrize("kind", ["segment", "uniform", "uniform_mixing"])
def test_sampler_generator_makes_the_draw_reproducible(kind: str) -> None:
    """Check that equal generator seeds give identical points and different seeds different ones."""
    source, target = torch.randn(32, 2), torch.randn(32, 2) + 3
    sampler = PlatePointSampler(kind, L=6.0)

    def draw(seed: int) -> torch.Tensor:
        return sampler(source, target, num_points=64, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))


def test_sampler_keeps_the_samples_dtype() -> None:
    """Check that float64 samples give float64 points, with z on the same segment formula."""
    source, target = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    points = PlatePointSampler("uniform", L=2.0)(source, target, num_points=50)
    assert points.dtype == torch.float64
    torch.testing.assert_close(points[:, 0], points[:, 2] / 2.0)


def test_sampler_bad_arguments_raise() -> None:
    """Check that an unknown kind, L <= 0 and an outer fraction outside [0, 1) raise ValueError."""
    with pytest.raises(ValueError, match="unknown sampler"):
        PlatePointSampler("gaussian_mixing")
    for L in (0.0, -1.0):
        with pytest.raises(ValueError, match="L must be > 0"):
            PlatePointSampler("segment", L=L)
    with pytest.raises(ValueError, match="outer_fraction"):
        PlatePointSampler("segment", outer_fraction=1.0)


# ------------------------------------------------------------------------------------------------ transport
def _constant(a: torch.Tensor):
    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a.expand_as(x), torch.ones_like(z)

    return field


@pytest.mark.parametrize("method", ["euler", "rk45"])
@pytest.mark.parametrize(("z_start", "z_end"), [(0.5, 3.0), (3.0, 0.5)])
def test_transport_constant_field_moves_by_slope_times_dz(method: str, z_start: float, z_end: float) -> None:
    """Check that f = (a, 1) moves x by a·(z_end − z_start), in both directions, with no clamped steps."""
    a = torch.tensor([0.5, -2.0])
    x0 = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    out = transport(_constant(a), x0, z_start, z_end, steps=7, method=method)
    torch.testing.assert_close(out.x, x0 + a * (z_end - z_start), atol=1e-5, rtol=1e-5)
    assert (out.clamped_fraction, out.lines_clamped) == (0.0, 0.0)
    if method == "euler":
        assert out.nfe == 7


def test_transport_keeps_image_shapes() -> None:
    """Check that image-shaped x (n, C, H, W) with f_z of shape (n,) is transported and keeps its shape."""
    x0 = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    out = transport(_constant(torch.tensor(2.0)), x0, 0.0, 1.0, steps=4)
    assert out.x.shape == x0.shape
    torch.testing.assert_close(out.x, x0 + 2.0)


def test_rk45_beats_euler_on_a_linear_field() -> None:
    """Check that on dx/dz = −x RK45 is much closer to x₀·e^{−Δz} than 10 Euler steps, and Euler is (1 − Δz/10)^10."""
    x0 = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return -x, torch.ones_like(z)

    exact = x0 * math.exp(-2.0)
    euler = transport(field, x0, 0.0, 2.0, steps=10)
    torch.testing.assert_close(euler.x, x0 * 0.8**10)
    rk45 = transport(field, x0, 0.0, 2.0, method="rk45", rtol=1e-6, atol=1e-8)
    euler_err, rk45_err = float((euler.x - exact).abs().max()), float((rk45.x - exact).abs().max())
    assert rk45_err < 1e-5
    assert euler_err > 1e-2
    assert rk45_err < euler_err / 100
    assert rk45.x.dtype == torch.float64


def test_transport_counts_clamped_steps() -> None:
    """Check that f_z = −1 clamps every step of every line, and f_z < min_fz on half the lines gives 0.5."""
    x0 = torch.zeros(4, 2)

    def backwards(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones_like(x), -torch.ones_like(z)

    out = transport(backwards, x0, 0.0, 1.0, steps=5, min_fz=0.1)
    assert (out.clamped_fraction, out.lines_clamped) == (1.0, 1.0)
    torch.testing.assert_close(out.x, x0 + 1.0 / 0.1)  # the step used f_x / min_fz

    def half(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros_like(x), torch.tensor([1.0, 1.0, 1e-4, 1e-4])

    out = transport(half, x0, 0.0, 1.0, steps=5)
    assert (out.clamped_fraction, out.lines_clamped) == (0.5, 0.5)


def test_transport_bad_arguments_raise() -> None:
    """Check that steps < 1 and an unknown method raise ValueError."""
    field = _constant(torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="steps"):
        transport(field, torch.zeros(2, 2), 0.0, 1.0, steps=0)
    with pytest.raises(ValueError, match="unknown method"):
        transport(field, torch.zeros(2, 2), 0.0, 1.0, method="dopri5")


def test_behind_plate_continuation_follows_a_loop_back_to_the_plane() -> None:
    """Check that a line pushed through the plane z = L is followed around a loop and lands where it comes back.

    The field f = (z − L, −x) turns about (x, z) = (0, L): a line crossing the plane at x = −1 circles over the plane
    and comes back down at x = +1; one crossing at x = +1 is already heading back (f_z < 0) and is left where it is.
    """
    L = 2.0

    def loop(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (z - L)[:, None].expand_as(x).clone(), -x[:, 0]

    x = torch.tensor([[-1.0], [1.0]])
    out = transport(loop, x, L - 1e-4, L, steps=1, behind_steps=500, behind_step=0.01, probe=0.01)
    assert out.lines_behind == 0.5 and out.lines_lost == 0.0
    assert abs(float(out.x[0, 0]) - 1.0) < 0.02
    assert float(out.x[1, 0]) == pytest.approx(1.0, abs=1e-3)
    stuck = transport(loop, x, L - 1e-4, L, steps=1, behind_steps=10, behind_step=0.01, probe=0.01)
    assert stuck.lines_lost == 0.5  # 10 steps of 0.01 cannot close a loop of length π
