"""Trajectory metrics: haversine values, TC@τ on hand-built offsets, point errors, flow correlation, input checks."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.functional import pearson_corrcoef

from zoo.metrics import FlowCorrelation, TrajectoryCoverage, TrajectoryError, haversine, trajectory_correlation

R = 6_371_000.0
DEG = R * math.pi / 180  # metres per degree of latitude


def _windows(offsets_deg: list[list[float]], lat0: float = 31.5, lon0: float = 120.3) -> tuple[torch.Tensor, ...]:
    """(preds, target) ``(B, 3, k)`` float64: target at (lat0, lon0) with t = 0..k-1 hours, preds shifted in
    latitude by ``offsets_deg[b][i]`` at point i (endpoints should get 0)."""
    off = torch.tensor(offsets_deg, dtype=torch.float64)
    B, k = off.shape
    target = torch.empty(B, 3, k, dtype=torch.float64)
    target[:, 0] = torch.arange(k, dtype=torch.float64)
    target[:, 1], target[:, 2] = lat0, lon0
    preds = target.clone()
    preds[:, 1] += off
    return preds, target


def _reference_haversine(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """The textbook atan2 form, in Python floats."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * R * math.atan2(math.sqrt(a), math.sqrt(1 - a))


def test_haversine_known_distances() -> None:
    """Check 1° of latitude (111,195 m), 1° of longitude on the equator and at 60° N, antipodes, and 10 m."""
    assert float(haversine(0.0, 0.0, 1.0, 0.0)) == pytest.approx(DEG, abs=1e-6)
    assert float(haversine(0.0, 10.0, 0.0, 11.0)) == pytest.approx(DEG, abs=1e-6)
    assert float(haversine(60.0, 0.0, 60.0, 0.001)) == pytest.approx(0.001 * DEG / 2, rel=1e-6)  # cos 60° = 1/2
    assert float(haversine(0.0, 0.0, 0.0, 180.0)) == pytest.approx(math.pi * R, rel=1e-12)
    assert float(haversine(31.5, 120.3, 31.5 + 1e-4, 120.3)) == pytest.approx(1e-4 * DEG, abs=1e-6)  # ≈ 11.1 m
    assert haversine(torch.tensor(0.0), 0.0, 1.0, 0.0).dtype == torch.float64


def test_haversine_matches_reference_and_is_symmetric() -> None:
    """Check random pairs against the atan2 form, and that swapping the two points leaves every distance alone."""
    g = torch.Generator().manual_seed(0)
    lat1, lat2 = (torch.rand(50, generator=g, dtype=torch.float64) * 170 - 85 for _ in range(2))
    lon1, lon2 = (torch.rand(50, generator=g, dtype=torch.float64) * 360 - 180 for _ in range(2))
    d = haversine(lat1, lon1, lat2, lon2)
    ref = [_reference_haversine(*map(float, p)) for p in zip(lat1, lon1, lat2, lon2)]
    assert d.tolist() == pytest.approx(ref, rel=1e-9, abs=1e-6)
    assert torch.equal(d, haversine(lat2, lon2, lat1, lon1))


def test_trajectory_coverage_on_hand_built_offsets() -> None:
    """Check TC@τ with interior offsets of 0.001° (111 m) and 0.01° (1112 m), interior only and with endpoints."""
    preds, target = _windows([[0, 0.001, 0.001, 0.001, 0], [0, 0.001, 0.01, 0.01, 0]])  # k = 5
    m = TrajectoryCoverage(thresholds=(100, 500, 2000))
    m.update(preds, target)
    tc = {key: float(v) for key, v in m.compute().items()}
    assert list(tc) == ["tc@100m", "tc@500m", "tc@2000m"]
    # window 0: 3/3 within 500 m; window 1: 1/3; mean over windows
    assert tc == pytest.approx({"tc@100m": 0.0, "tc@500m": (1 + 1 / 3) / 2, "tc@2000m": 1.0}, abs=1e-6)
    m = TrajectoryCoverage(thresholds=(100, 500, 2000), interior_only=False)
    m.update(preds, target)
    tc = {key: float(v) for key, v in m.compute().items()}
    assert tc == pytest.approx({"tc@100m": 2 / 5, "tc@500m": (5 / 5 + 3 / 5) / 2, "tc@2000m": 1.0}, abs=1e-6)


def test_trajectory_coverage_has_floor_two_over_k_when_endpoints_are_included() -> None:
    """Check that interiors 1° off score 0 interior-only but exactly 2/k with the (exact) endpoints, the official TC."""
    k = 8
    preds, target = _windows([[0.0] + [1.0] * (k - 2) + [0.0]] * 3)
    inner, official = (
        TrajectoryCoverage(thresholds=(2000,)),
        TrajectoryCoverage(thresholds=(2000,), interior_only=False),
    )
    inner.update(preds, target)
    official.update(preds, target)
    assert float(inner.compute()["tc@2000m"]) == 0.0
    assert float(official.compute()["tc@2000m"]) == pytest.approx(2 / k, abs=1e-7)


def test_trajectory_coverage_over_two_batches_equals_one_batch() -> None:
    """Check that two updates, and two metrics merged like a DDP sync, equal one update with all windows."""
    g = torch.Generator().manual_seed(1)
    target = torch.rand(10, 3, 6, generator=g, dtype=torch.float64) * 0.05 + 30
    preds = target + torch.randn(10, 3, 6, generator=g, dtype=torch.float64) * 0.005
    one, two, a, b = (TrajectoryCoverage(thresholds=(250, 500, 1000)) for _ in range(4))
    one.update(preds, target)
    two.update(preds[:4], target[:4])
    two.update(preds[4:], target[4:])
    a.update(preds[:4], target[:4])
    b.update(preds[4:], target[4:])
    a.merge_state(b)
    expected = one.compute()
    assert 0 < float(expected["tc@500m"]) < 1
    for other in (two.compute(), a.compute()):
        assert {key: float(v) for key, v in other.items()} == pytest.approx(
            {key: float(v) for key, v in expected.items()}
        )


def test_trajectory_coverage_averages_per_window_when_k_differs() -> None:
    """Check the per-window mean: a k=3 window with its one point hit and a k=5 window with none give 1/2, not 1/4."""
    m = TrajectoryCoverage(thresholds=(500,))
    m.update(*_windows([[0, 0.0, 0]]))
    m.update(*_windows([[0, 1.0, 1.0, 1.0, 0]]))
    assert float(m.compute()["tc@500m"]) == pytest.approx(0.5)


def test_trajectory_coverage_keys_and_bad_thresholds() -> None:
    """Check the key format, and that empty, non-positive, duplicate or string thresholds are refused."""
    assert TrajectoryCoverage(thresholds=[2000, 0.5, 1e4]).keys == ["tc@2000m", "tc@0.5m", "tc@10000m"]
    for bad in ((), (0, 100), (-5,), (100, 100.0), (float("nan"),)):
        with pytest.raises(ValueError, match="thresholds"):
            TrajectoryCoverage(thresholds=bad)
    for bad in ("500", 500, (True,)):
        with pytest.raises(TypeError, match="thresholds"):
            TrajectoryCoverage(thresholds=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="interior_only"):
        TrajectoryCoverage(interior_only=1)  # type: ignore[arg-type]


def test_trajectory_error_on_hand_built_offsets() -> None:
    """Check MAE, RMSE, max (metres) and time MAE (hours) on interior offsets of 0.001°, 0.003° and 0.01°."""
    preds, target = _windows([[0, 0.001, 0.003, 0], [0, 0.01, 0.001, 0]])
    preds[:, 0, 1:-1] += torch.tensor([[0.5, -0.5], [1.0, 0.0]], dtype=torch.float64)  # time errors, hours
    d = torch.tensor([0.001, 0.003, 0.01, 0.001], dtype=torch.float64) * DEG
    m = TrajectoryError()
    m.update(preds, target)
    out = {key: float(v) for key, v in m.compute().items()}
    assert out["mae_m"] == pytest.approx(float(d.mean()), abs=0.05)
    assert out["rmse_m"] == pytest.approx(float(d.square().mean().sqrt()), abs=0.05)
    assert out["max_m"] == pytest.approx(0.01 * DEG, abs=0.05)
    assert out["time_mae_h"] == pytest.approx(0.5, abs=1e-6)
    # the official variant adds two exact endpoints per window: means shrink by (k - 2) / k, the max stays
    m = TrajectoryError(interior_only=False)
    m.update(preds, target)
    out = {key: float(v) for key, v in m.compute().items()}
    assert out["mae_m"] == pytest.approx(float(d.mean()) * 2 / 4, abs=0.05)
    assert out["rmse_m"] == pytest.approx(float(d.square().mean().sqrt()) * math.sqrt(2 / 4), abs=0.05)
    assert out["max_m"] == pytest.approx(0.01 * DEG, abs=0.05)
    assert out["time_mae_h"] == pytest.approx(0.25, abs=1e-6)


def test_trajectory_error_over_two_batches_equals_one_batch() -> None:
    """Check that two updates and a merge (sums and the max) equal one update, with float32 inputs."""
    g = torch.Generator().manual_seed(2)
    target = torch.rand(8, 3, 7, generator=g) * 0.1 + torch.tensor([12.0, 35.6, 139.7])[:, None]
    preds = target + torch.randn(8, 3, 7, generator=g) * 0.01
    one, a, b = TrajectoryError(), TrajectoryError(), TrajectoryError()
    one.update(preds, target)
    a.update(preds[:3], target[:3])
    b.update(preds[3:], target[3:])
    a.merge_state(b)
    expected = {key: float(v) for key, v in one.compute().items()}
    assert expected["max_m"] > expected["rmse_m"] > expected["mae_m"] > 0
    assert {key: float(v) for key, v in a.compute().items()} == pytest.approx(expected, rel=1e-6)


def _dense_correlation(preds: torch.Tensor, target: torch.Tensor, grid_m: float) -> float:
    """Reference: the dense count vectors over every cell of the union box, through torchmetrics' Pearson."""
    p = preds[:, 1:, 1:-1].double().transpose(1, 2).reshape(-1, 2)
    q = target[:, 1:, 1:-1].double().transpose(1, 2).reshape(-1, 2)
    both = torch.cat([p, q])
    lo, hi = both.min(0).values, both.max(0).values
    cell = torch.stack(
        [
            torch.tensor(grid_m / DEG, dtype=torch.float64),
            grid_m / (DEG * torch.cos(torch.deg2rad((lo[0] + hi[0]) / 2))),
        ]
    )
    n_lat, n_lon = (((hi - lo) / cell).floor().long() + 1).tolist()
    counts = []
    for pts in (p, q):
        i = ((pts - lo) / cell).floor().long()
        i = torch.minimum(i, torch.tensor([n_lat - 1, n_lon - 1]))
        counts.append(torch.bincount(i[:, 0] * n_lon + i[:, 1], minlength=n_lat * n_lon).double())
    return float(pearson_corrcoef(counts[0], counts[1]))


def test_trajectory_correlation_is_one_for_identical_and_low_for_far_points() -> None:
    """Check r = 1 for identical sets, r ≤ 0.05 when preds are shuffled 20 km away, and in between for noise."""
    g = torch.Generator().manual_seed(3)
    target = torch.rand(100, 3, 6, generator=g, dtype=torch.float64) * 0.1 + torch.tensor([0.0, 31.5, 120.3])[:, None]
    assert float(trajectory_correlation(target, target)) == pytest.approx(1.0, abs=1e-6)
    far = target[torch.randperm(100, generator=g)].clone()
    far[:, 1] += 0.2
    assert float(trajectory_correlation(far, target)) <= 0.05
    noisy = target + torch.randn(100, 3, 6, generator=g, dtype=torch.float64) * 0.003
    assert 0.1 < float(trajectory_correlation(noisy, target)) < 0.99


def test_trajectory_correlation_matches_dense_pearson() -> None:
    """Check the sparse closed form against torchmetrics' pearson_corrcoef on the dense grid of counts."""
    g = torch.Generator().manual_seed(4)
    target = torch.rand(60, 3, 5, generator=g) * 0.05 + torch.tensor([0.0, 35.6, 139.7])[:, None]
    preds = target + torch.randn(60, 3, 5, generator=g) * 0.004
    for grid_m in (300.0, 1000.0):
        expected = _dense_correlation(preds, target, grid_m)
        assert float(trajectory_correlation(preds, target, grid_m=grid_m)) == pytest.approx(expected, abs=1e-5)


def test_flow_correlation_over_batches_equals_functional() -> None:
    """Check that the metric fed two batches equals the functional on all windows at once."""
    g = torch.Generator().manual_seed(5)
    target = torch.rand(40, 3, 6, generator=g) * 0.05 + torch.tensor([0.0, 31.5, 120.3])[:, None]
    preds = target + torch.randn(40, 3, 6, generator=g) * 0.003
    m = FlowCorrelation(grid_m=400)
    m.update(preds[:15], target[:15])
    m.update(preds[15:], target[15:])
    assert float(m.compute()) == pytest.approx(float(trajectory_correlation(preds, target, grid_m=400)), abs=1e-6)
    with pytest.raises(ValueError, match="grid_m"):
        FlowCorrelation(grid_m=0)
    with pytest.raises(TypeError, match="grid_m"):
        trajectory_correlation(preds, target, grid_m="500")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("preds_shape", "target_shape", "match"),
    [
        ((4, 3), (4, 3), r"channel-first \(B, 3, k\).*got preds \(4, 3\)"),
        ((4, 2, 6), (4, 2, 6), r"got preds \(4, 2, 6\) and target \(4, 2, 6\)"),
        ((4, 6, 3), (4, 6, 3), "channel-last"),
        ((4, 3, 6), (5, 3, 6), r"same shape, got preds \(4, 3, 6\) and target \(5, 3, 6\)"),
        ((4, 3, 2), (4, 3, 2), r"k >= 3"),
    ],
)
def test_trajectory_metrics_raise_on_bad_shapes(preds_shape: tuple, target_shape: tuple, match: str) -> None:
    """Check that every entry point refuses a non-(B, 3, k) layout and names both shapes."""
    preds, target = torch.zeros(preds_shape), torch.zeros(target_shape)
    for call in (
        TrajectoryCoverage().update,
        TrajectoryError().update,
        FlowCorrelation().update,
        trajectory_correlation,
    ):
        with pytest.raises(ValueError, match=match):
            call(preds, target)


def test_trajectory_metrics_raise_on_nan() -> None:
    """Check that NaN in preds or target is refused with the count, and a non-tensor with a TypeError."""
    preds, target = _windows([[0, 0.001, 0.001, 0]])
    bad = preds.clone()
    bad[0, 1, 1] = float("nan")
    for call in (
        TrajectoryCoverage().update,
        TrajectoryError().update,
        FlowCorrelation().update,
        trajectory_correlation,
    ):
        with pytest.raises(ValueError, match="`preds` of shape \\(1, 3, 4\\) holds 1 NaN"):
            call(bad, target)
        with pytest.raises(ValueError, match="`target` .* NaN"):
            call(preds, bad)
    with pytest.raises(TypeError, match="torch.Tensor"):
        TrajectoryError().update(preds.numpy(), target)  # type: ignore[arg-type]
