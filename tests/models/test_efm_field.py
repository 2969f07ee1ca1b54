"""EFM field: the dipole, log-space vs naive sums (both targets), high-D stability, chunking, memory, mirror symmetry."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from zoo.models.efm.field import FieldTarget, coulomb_field, lift, plate_sums
from zoo.models.efm.ode import transport


def _naive_paper(points: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """The card's MC field (1/N)Σ(x̃−x̃_i⁺)/r^{D+1} − (1/M)Σ(x̃−x̃_j⁻)/r^{D+1}, computed directly, then normalised."""
    power = points.shape[1]
    diff_p = points[:, None] - pos[None]  # (n, N, D+1)
    diff_n = points[:, None] - neg[None]
    e = (diff_p / diff_p.norm(dim=-1, keepdim=True) ** power).mean(1)
    e = e - (diff_n / diff_n.norm(dim=-1, keepdim=True) ** power).mean(1)
    return e / e.norm(dim=1, keepdim=True)


def _naive_code(points: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, gamma: float) -> torch.Tensor:
    """The official code's target from the card: per-plate weights w ∝ r^{-(D+1)} summing to one, two unit fields."""
    power = points.shape[1]
    diff_p = points[:, None] - pos[None]
    diff_n = neg[None] - points[:, None]
    w_p = diff_p.norm(dim=-1) ** -power
    w_n = diff_n.norm(dim=-1) ** -power
    d_p = ((w_p / w_p.sum(1, keepdim=True))[..., None] * diff_p).sum(1)
    d_n = ((w_n / w_n.sum(1, keepdim=True))[..., None] * diff_n).sum(1)
    return power**0.5 * (d_p / (d_p.norm(dim=1, keepdim=True) + gamma) + d_n / (d_n.norm(dim=1, keepdim=True) + gamma))


def _plates(seed: int, dim: int, n: int, m: int, L: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 charges: x⁺ ~ N(0, I_D) lifted to z = 0 and x⁻ ~ N(1, I_D) lifted to z = L."""
    g = torch.Generator().manual_seed(seed)
    return lift(torch.randn(n, dim, generator=g), 0.0), lift(torch.randn(m, dim, generator=g) + 1.0, L)


def _points(seed: int, dim: int, n: int, L: float = 2.0) -> torch.Tensor:
    """Float32 field points with x ~ N(0, I_D) and z ~ U(0.2, L − 0.2), away from every charge."""
    g = torch.Generator().manual_seed(seed)
    return lift(torch.randn(n, dim, generator=g), 0.2 + (L - 0.4) * torch.rand(n, generator=g))


# ------------------------------------------------------------------------------------------------ exact formulas
def test_lift_appends_z_as_last_coordinate() -> None:
    """Check that lift flattens each sample and appends z (a scalar or one per sample) as the last coordinate."""
    x = torch.arange(12.0).reshape(2, 2, 3)
    assert torch.equal(lift(x, 5.0), torch.tensor([[0.0, 1, 2, 3, 4, 5, 5], [6, 7, 8, 9, 10, 11, 5]]))
    assert torch.equal(lift(x, torch.tensor([1.0, 2.0]))[:, -1], torch.tensor([1.0, 2.0]))


def test_dipole_field_direction_matches_analytic() -> None:
    """Check that one + charge at z=0 and one − charge at z=L give the analytic dipole direction in D+1 = 3."""
    L = 1.0
    a, b = torch.tensor([[0.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, L]])
    g = torch.Generator().manual_seed(0)
    points = torch.cat([torch.randn(50, 2, generator=g), -1.0 + 3.0 * torch.rand(50, 1, generator=g)], dim=1)
    p64 = points.double()
    ra, rb = p64 - a.double(), p64 - b.double()
    analytic = ra / ra.norm(dim=1, keepdim=True) ** 3 - rb / rb.norm(dim=1, keepdim=True) ** 3
    unit = analytic / analytic.norm(dim=1, keepdim=True)
    field = coulomb_field(points, a, b)
    torch.testing.assert_close(field / field.norm(dim=1, keepdim=True), unit.float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(FieldTarget("paper")(points, a, b), unit.float(), atol=1e-5, rtol=0)
    # On the axis between the charges the field points from + to −.
    mid = FieldTarget("paper")(torch.tensor([[0.0, 0.0, 0.5]]), a, b)
    torch.testing.assert_close(mid, torch.tensor([[0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("dim", [2, 4])
def test_log_space_matches_naive_formulas(dim: int) -> None:
    """Check that both log-space targets equal the card's naive float64 formulas (D+1 = 3 and 5) within 1e-5."""
    pos, neg = _plates(seed=dim, dim=dim, n=300, m=200)
    points = _points(seed=10 + dim, dim=dim, n=64)
    p64, q64, n64 = points.double(), pos.double(), neg.double()
    paper = FieldTarget("paper")(points, pos, neg)
    assert paper.dtype == torch.float32
    torch.testing.assert_close(paper, _naive_paper(p64, q64, n64).float(), atol=1e-5, rtol=0)
    for gamma in (1e-7, 5.0):
        code = FieldTarget("code_per_plate", gamma=gamma)(points, pos, neg)
        torch.testing.assert_close(code, _naive_code(p64, q64, n64, gamma).float(), atol=1e-5, rtol=0)
    # The two targets differ in general (the per-plate normalisation drops each plate's magnitude).
    code = FieldTarget("code_per_plate")(points, pos, neg)
    cosine = (code * paper).sum(1) / code.norm(dim=1)
    assert float(cosine.min()) < 0.99


def test_float64_inputs_stay_float64() -> None:
    """Check that float64 inputs are computed in float64, match the naive formula to 1e-10 and carry no gradient."""
    pos, neg = _plates(seed=0, dim=2, n=100, m=100)
    points = _points(seed=1, dim=2, n=16).double().requires_grad_()
    out = FieldTarget("paper")(points, pos.double(), neg.double())
    assert out.dtype == torch.float64 and not out.requires_grad
    points = points.detach()
    torch.testing.assert_close(out, _naive_paper(points, pos.double(), neg.double()), atol=1e-10, rtol=0)


def test_half_precision_inputs_are_computed_in_float32() -> None:
    """Check that float16 inputs are promoted to float32 (r^{-(D+1)} needs the range) and give the float32 result."""
    pos, neg = _plates(seed=0, dim=2, n=50, m=50)
    points = _points(seed=1, dim=2, n=8)
    half = FieldTarget("paper")(points.half(), pos.half(), neg.half())
    assert half.dtype == torch.float32
    full = FieldTarget("paper")(points.half().float(), pos.half().float(), neg.half().float())
    torch.testing.assert_close(half, full)


def test_high_dimension_is_finite_where_naive_underflows() -> None:
    """Check that D+1 = 3073 gives finite unit-norm targets matching a float64 log-space reference; naive fp32 fails."""
    dim, L = 3072, 10.0
    g = torch.Generator().manual_seed(0)
    pos = lift(torch.randn(64, dim, generator=g), 0.0)
    neg = lift(torch.randn(64, dim, generator=g) + 0.5, L)
    points = lift(torch.randn(8, dim, generator=g) + 0.25, torch.linspace(1.0, L - 1.0, 8))
    # Naive float32: r ≈ 80, r^{-3073} underflows to 0 and the normalised field is 0/0.
    naive = _naive_paper(points, pos, neg)
    assert not bool(torch.isfinite(naive).all()) or bool((naive == 0).all())
    paper = FieldTarget("paper")(points, pos, neg)
    assert bool(torch.isfinite(paper).all())
    torch.testing.assert_close(paper.norm(dim=1), torch.ones(8), atol=1e-5, rtol=0)
    # Independent float64 reference: log-weights with one shared max-shift.
    p64, q64, n64 = points.double(), pos.double(), neg.double()
    lw_p = -(dim + 1) * torch.cdist(p64, q64).log() - torch.log(torch.tensor(64.0, dtype=torch.float64))
    lw_n = -(dim + 1) * torch.cdist(p64, n64).log() - torch.log(torch.tensor(64.0, dtype=torch.float64))
    shift = torch.maximum(lw_p.amax(1), lw_n.amax(1))[:, None]
    e = ((lw_p - shift).exp()[..., None] * (p64[:, None] - q64[None])).sum(1)
    e = e - ((lw_n - shift).exp()[..., None] * (p64[:, None] - n64[None])).sum(1)
    reference = e / e.norm(dim=1, keepdim=True)
    torch.testing.assert_close(paper, reference.float(), atol=5e-4, rtol=0)  # measured 5.4e-5
    code = FieldTarget("code_per_plate", gamma=5.0)(points, pos, neg)
    assert bool(torch.isfinite(code).all())


@pytest.mark.parametrize("kind", ["paper", "code_per_plate"])
def test_chunking_does_not_change_the_target(kind: str) -> None:
    """Check that chunk_size=7 (many chunks, ragged last) equals one chunk of all charges within 1e-5."""
    pos, neg = _plates(seed=3, dim=2, n=300, m=200)
    points = _points(seed=4, dim=2, n=40)
    small = FieldTarget(kind, chunk_size=7)(points, pos, neg)
    whole = FieldTarget(kind, chunk_size=10_000)(points, pos, neg)
    torch.testing.assert_close(small, whole, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------ memory
def _peak_cpu_bytes(fn) -> int:
    """Peak of the running sum of every CPU allocation (+) and free (−) the profiler records while ``fn`` runs.

    The raw allocator events of the Kineto result are used: ``prof.events()`` folds allocations into the op that
    made them, so its "[memory]" rows only hold the stray frees and cannot give a timeline.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def test_peak_memory_helper_sees_torch_allocations() -> None:
    """Check that the profiler-based peak measures a known 4 MiB temporary (so the memory test below is honest)."""

    def make() -> None:
        a = torch.ones(1024, 1024)  # 4 MiB, freed at once
        del a
        b = torch.ones(256, 1024)  # 1 MiB
        del b

    peak = _peak_cpu_bytes(make)
    assert 4 * 2**20 <= peak < 4.2 * 2**20


def test_memory_is_flat_in_the_number_of_charges() -> None:
    """Check that with a fixed chunk the peak memory stays flat for 4x more charges, but grows ~4x unchunked."""
    points = _points(seed=0, dim=2, n=512)

    def peak(n_charges: int, chunk: int) -> int:
        pos, neg = _plates(seed=1, dim=2, n=n_charges, m=n_charges)
        return _peak_cpu_bytes(lambda: FieldTarget("paper", chunk_size=chunk)(points, pos, neg))

    small, large = peak(2048, 1024), peak(8192, 1024)
    assert small > 512 * 1024 * 4  # at least one (points x chunk) float32 matrix was seen
    assert large < 1.3 * small + 2**16
    small_whole, large_whole = peak(2048, 2048), peak(8192, 8192)
    assert large_whole > 2 * small_whole


# ------------------------------------------------------------------------------------------------ mirror symmetry
def _mirror_setup(L: float):
    """P = Q: one sample of N(0, I₂) charges on both plates; 200 particles drawn independently in the disc |x| < 0.9."""
    g = torch.Generator().manual_seed(0)
    charges = torch.randn(1024, 2, generator=g)
    pos, neg = lift(charges, 0.0), lift(charges, L)
    radius = 0.9 * torch.rand(200, generator=g).sqrt()
    angle = 2 * torch.pi * torch.rand(200, generator=g)
    x0 = torch.stack([radius * angle.cos(), radius * angle.sin()], dim=1)
    target = FieldTarget("paper")

    def field(x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = target(torch.cat([x, z[:, None]], dim=1), pos, neg)
        return f[:, :-1], f[:, -1]

    return field, x0


def test_mirror_symmetry_makes_oracle_transport_the_identity() -> None:
    """Check that for P = Q the oracle field lines from z=ε end at their start x at z=L−ε, with f_z > 0 throughout.

    Measured over 6 seeds: Euler (200 steps) max error 0.11-0.13 and median 0.023-0.028 (first order: 400 steps
    halve it); RK45 max 0.018-0.031; the lines move a median 0.18-0.25 by the mid-plane, so the identity is no
    accident of a vanishing x-field.
    """
    L, eps = 2.0, 1e-3
    field, x0 = _mirror_setup(L)
    euler = transport(field, x0, eps, L - eps, steps=200)
    err = (euler.x - x0).abs()
    assert float(err.max()) < 0.25
    assert float(err.median()) < 0.05
    assert euler.clamped_fraction == 0.0 and euler.lines_clamped == 0.0
    rk45 = transport(field, x0, eps, L - eps, method="rk45")
    assert float((rk45.x - x0).abs().max()) < 0.06
    assert rk45.clamped_fraction == 0.0
    half = transport(field, x0, eps, L / 2, steps=100)
    assert float((half.x - x0).norm(dim=1).median()) > 0.1


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise() -> None:
    """Check that mismatched dimensions, a non-matrix, chunk_size < 1 and an unknown target kind raise ValueError."""
    with pytest.raises(ValueError, match="must be"):
        plate_sums(torch.randn(4, 3), torch.randn(5, 4))
    with pytest.raises(ValueError, match="must be"):
        plate_sums(torch.randn(4, 3, 1), torch.randn(5, 3))
    with pytest.raises(ValueError, match="chunk_size"):
        plate_sums(torch.randn(4, 3), torch.randn(5, 3), chunk_size=0)
    with pytest.raises(ValueError, match="unknown target kind"):
        FieldTarget("bogus")
    with pytest.raises(ValueError, match="must be"):
        FieldTarget()(torch.randn(4, 3), torch.randn(5, 3), torch.randn(5, 2))
