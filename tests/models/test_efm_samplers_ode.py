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


# Hand-solvable fields: the expected end points below are derived in closed form, so they pin which z the Euler slope
# is read at, that the slope is f_x / f_z (not f_x), its broadcast over image rows, the step count and the direction.
def _recording(f_x, f_z, seen: list[float]):
    """A field ``(f_x(x, z), f_z(x, z))`` that also records the (one) height z it is evaluated at."""

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(float(z[0]))
        return f_x(x, z), f_z(x, z)

    return field


@pytest.mark.parametrize(("z0", "z1", "steps"), [(0.5, 3.0, 5), (3.0, 0.5, 5), (-1.0, 2.0, 12)])
def test_euler_reads_the_slope_at_the_start_of_each_step(z0: float, z1: float, steps: int) -> None:
    """Check Euler on dx/dz = z (f = (z, 1)) against its closed form, in both directions.

    With dz = (z1 − z0)/N the k-th step reads the slope at z_k = z0 + k·dz, so
        x_N = x0 + dz·Σ_{k=0}^{N−1} (z0 + k·dz) = x0 + N·dz·z0 + dz²·N(N−1)/2.
    Reading it at z_{k+1} instead gives dz²·N(N+1)/2 in the last term, off by dz²·N (1.25 for (0.5, 3, 5), 0.75 for
    (−1, 2, 12)); the exact line, x0 + (z1² − z0²)/2, is off by dz²·N/2, so Euler is not just accurate by chance.
    """
    x0 = torch.tensor([[0.0, 1.0], [-2.0, 0.25], [3.0, -1.5]], dtype=torch.float64)
    seen: list[float] = []
    field = _recording(lambda x, z: z[:, None].expand_as(x).clone(), lambda x, z: torch.ones_like(z), seen)
    out = transport(field, x0, z0, z1, steps=steps)
    dz = (z1 - z0) / steps
    expected = x0 + steps * dz * z0 + dz**2 * steps * (steps - 1) / 2
    torch.testing.assert_close(out.x, expected, atol=1e-6, rtol=0)
    assert seen == pytest.approx([z0 + k * dz for k in range(steps)], abs=1e-12)  # z_0 … z_{N−1}, never z_N
    assert out.nfe == steps and out.clamped_fraction == 0.0


@pytest.mark.parametrize(("z0", "z1"), [(0.0, 1.0), (1.0, 0.0)])
def test_euler_and_rk45_on_dx_dz_equals_x(z0: float, z1: float) -> None:
    """Check dx/dz = x (f = (x, 1)): Euler is x0·(1 + dz)^N exactly, RK45 is x0·e^{z1 − z0} within its tolerance.

    Each Euler step is x_{k+1} = x_k + dz·x_k = (1 + dz)·x_k, so x_N = x0·(1 + dz)^N with dz = (z1 − z0)/N
    (1.125^8 forwards, 0.875^8 backwards); the ODE's solution is x0·e^{z1 − z0}. A wrong step size or count, or a
    step taken the wrong way when z1 < z0, moves the Euler value by more than 1e-3 relative.
    """
    x0 = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.clone(), torch.ones_like(z)

    steps, dz = 8, (z1 - z0) / 8
    euler = transport(field, x0, z0, z1, steps=steps)
    torch.testing.assert_close(euler.x, x0 * (1 + dz) ** steps, atol=1e-6, rtol=0)
    rk45 = transport(field, x0, z0, z1, method="rk45", rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(rk45.x, x0 * math.exp(z1 - z0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["euler", "rk45"])
@pytest.mark.parametrize(("z0", "z1"), [(0.5, 3.0), (3.0, 0.5)])
def test_transport_uses_the_ratio_f_x_over_f_z(method: str, z0: float, z1: float) -> None:
    """Check that f = (2, 4) moves x by (2/4)·(z1 − z0) = ±1.25, not by f_x·(z1 − z0) = ±5, in both directions.

    The slope dx/dz of a field line is f_x / f_z; a constant slope is integrated exactly by Euler and RK45 alike.
    """
    x0 = torch.tensor([[0.0, 1.0], [-2.0, 0.25]], dtype=torch.float64)

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(x, 2.0), torch.full_like(z, 4.0)

    out = transport(field, x0, z0, z1, steps=5, method=method)
    torch.testing.assert_close(out.x, x0 + 0.5 * (z1 - z0), atol=1e-6, rtol=0)
    assert out.clamped_fraction == 0.0


@pytest.mark.parametrize(("z0", "z1"), [(0.0, 2.0), (2.0, 0.0)])
def test_euler_with_a_z_dependent_ratio_and_per_row_f_z_on_images(z0: float, z1: float) -> None:
    """Check f = (2z, c_i) on image rows (n, C, H, W) with a different f_z = c_i per row (n == W = 4).

    Row i has dx/dz = 2z/c_i, so Euler gives x0 + (2/c_i)·(N·dz·z0 + dz²·N(N−1)/2) (the sum of the first test);
    with N = 4: forwards 2/c_i·1.5, backwards 2/c_i·(−2.5). An f_z broadcast along W instead of along the rows,
    f_x used without dividing, or the slope read at z_{k+1} all give other numbers.
    """
    c = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    x0 = torch.arange(64, dtype=torch.float64).reshape(4, 1, 4, 4) / 10

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (2 * z).reshape(-1, 1, 1, 1).expand_as(x).clone(), c.clone()

    steps = 4
    dz = (z1 - z0) / steps
    moved = steps * dz * z0 + dz**2 * steps * (steps - 1) / 2
    assert moved == (1.5 if z1 > z0 else -2.5)
    out = transport(field, x0, z0, z1, steps=steps)
    torch.testing.assert_close(out.x, x0 + (2 / c).reshape(-1, 1, 1, 1) * moved, atol=1e-6, rtol=0)


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


@pytest.mark.parametrize("method", ["euler", "rk45"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_transport_refuses_non_finite_input(method: str, bad: float) -> None:
    """Check that a NaN/±inf row of x is refused with one line counting the bad rows, before any field evaluation."""
    calls: list[int] = []

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(1)
        return torch.ones_like(x), torch.ones_like(z)

    x = torch.zeros(5, 1, 2, 2)
    x[1, 0, 1, 0] = bad
    with pytest.raises(
        ValueError, match=r"^the input x has 1 non-finite row\(s\) \(NaN or inf\); EFM transports finite"
    ):
        transport(field, x, 0.0, 1.0, steps=3, method=method)
    x[3, 0, 0, 1] = x[4, 0, 0, 0] = bad
    with pytest.raises(ValueError, match=r"has 3 non-finite row\(s\)"):
        transport(field, x, 0.0, 1.0, steps=3, method=method)
    assert calls == []


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


def test_behind_plate_continuation_backwards_flags_the_lines_that_travel_on() -> None:
    """Going down (z_start > z_end) a line travels along −f, so it passes through the plane where f_z > 0: with the loop
    field f = (z − L, −x) the line at x = −1 (f_z = +1) goes below the plane, circles and comes back up at x = +1, and
    the line at x = +1 (f_z = −1) is already heading back. Reading the test as sign·f_z > 0 follows neither."""
    L = 2.0

    def loop(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (z - L)[:, None].expand_as(x).clone(), -x[:, 0]

    x = torch.tensor([[-1.0], [1.0]])
    out = transport(loop, x, L + 1e-4, L, steps=1, behind_steps=500, behind_step=0.01, probe=0.01)
    assert out.lines_behind == 0.5 and out.lines_lost == 0.0
    assert abs(float(out.x[0, 0]) - 1.0) < 0.02 and float(out.x[1, 0]) == pytest.approx(1.0, abs=1e-3)


def test_behind_plate_landing_is_interpolated_at_the_level() -> None:
    """Straight segments make the landing point exact. Past the plate f = (1, 1) for x < 0 and (1, −2) for x ≥ 0; the
    continuation steps s = 0.2 along f/‖f‖ from (x₀, L + p). From x₀ = −0.75 + 1e-4 (the Euler step to the plate moves
    x by 1e-4 at slope 1) six steps of (s/√2, s/√2) end at x ≥ 0, 6s/√2 above the landing level; the descent at slope
    −2 reaches that level after Δx = 3s/√2, so x = x₀ + 9s/√2, derived by hand. Taking the end of the step that crossed
    the level instead (no interpolation) lands 0.023 further on."""
    L, p, s = 2.0, 0.05, 0.2

    def kink(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones_like(x), torch.where(x[:, 0] < 0, 1.0, -2.0).to(x.dtype)

    x = torch.tensor([[-0.75]], dtype=torch.float64)
    out = transport(kink, x, L - 1e-4, L, steps=1, behind_steps=50, behind_step=s, probe=p)
    expected = -0.75 + 1e-4 + 9 * s / math.sqrt(2)
    assert out.lines_behind == 1.0 and out.lines_lost == 0.0
    assert float(out.x[0, 0]) == pytest.approx(expected, abs=1e-9)
