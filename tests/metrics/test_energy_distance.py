"""``energy_distance`` / ``EnergyDistance``: unbiasedness, the 1-D Gaussian closed form, accumulation, errors."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.metrics import EnergyDistance, energy_distance


def _closed_form_1d(mu: float) -> float:
    """ED(N(0, 1), N(μ, 1)) = 2E|X−Y| − E|X−X'| − E|Y−Y'| with X−Y ~ N(−μ, 2) and X−X' ~ N(0, 2).

    E|N(m, s²)| = s·√(2/π)·e^{−m²/2s²} + m·(1 − 2Φ(−m/s)) = s·√(2/π)·e^{−m²/2s²} + m·erf(m/(s√2)); with s = √2 this
    gives E|X−Y| = (2/√π)e^{−μ²/4} + μ·erf(μ/2) and E|X−X'| = 2/√π, so ED = (4/√π)(e^{−μ²/4} − 1) + 2μ·erf(μ/2).
    """
    return 4 / math.sqrt(math.pi) * (math.exp(-(mu**2) / 4) - 1) + 2 * mu * math.erf(mu / 2)


def test_energy_distance_is_unbiased_for_equal_distributions() -> None:
    """Check that the U-statistic averages to 0 over 50 pairs of n=50 samples, where the V-statistic would not.

    The V-statistic (zero diagonal kept in the within-sample means) is biased by about 2·E‖X−X'‖/n ≈ 0.07 here,
    about 14 standard errors, so the test can tell the two apart.
    """
    g = torch.Generator().manual_seed(0)
    u_stats, v_stats = [], []
    for _ in range(50):
        x, y = torch.randn(50, 2, generator=g), torch.randn(50, 2, generator=g)
        u_stats.append(float(energy_distance(x, y)))
        v_stats.append(float(2 * torch.cdist(x, y).mean() - torch.cdist(x, x).mean() - torch.cdist(y, y).mean()))
    u, v = torch.tensor(u_stats, dtype=torch.float64), torch.tensor(v_stats, dtype=torch.float64)
    se = float(u.std() / math.sqrt(len(u)))
    assert abs(float(u.mean())) < 3 * se
    assert float(v.mean()) > 5 * se


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_energy_distance_matches_gaussian_closed_form(mu: float) -> None:
    """Check that ED(N(0,1), N(μ,1)) averaged over 10 pairs of 2000 samples is within 0.06 of the closed form.

    Measured: the standard deviation of such a 10-pair mean is 0.006-0.014 for these μ (10 seeds each).
    """
    g = torch.Generator().manual_seed(int(10 * mu))
    values = [
        float(energy_distance(torch.randn(2000, 1, generator=g), torch.randn(2000, 1, generator=g) + mu))
        for _ in range(10)
    ]
    assert sum(values) / len(values) == pytest.approx(_closed_form_1d(mu), abs=0.06)


def test_energy_distance_exact_small_example() -> None:
    """Check the formula on points where every distance is known, symmetry, and flattening of (n, ...) inputs."""
    x = torch.tensor([[0.0], [1.0]])
    y = torch.tensor([[3.0], [5.0], [6.0]])
    # 2·mean(3, 5, 6, 2, 4, 5) − mean over ordered pairs i ≠ j of |0−1| (= 1) and of |3−5|, |3−6|, |5−6| (= 2)
    expected = 2 * 25 / 6 - 1 - 2
    assert float(energy_distance(x, y)) == pytest.approx(expected, abs=1e-6)
    assert float(energy_distance(y, x)) == pytest.approx(expected, abs=1e-6)
    images = torch.randn(6, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        energy_distance(images[:3], images[3:]), energy_distance(images[:3].flatten(1), images[3:].flatten(1))
    )


def test_metric_over_updates_equals_functional_on_concatenation() -> None:
    """Check that EnergyDistance after several uneven updates equals energy_distance on the concatenated samples."""
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, 3, generator=g) for n in (10, 25, 7)]
    ys = [torch.randn(n, 3, generator=g) + 0.5 for n in (30, 4, 12)]
    metric = EnergyDistance()
    for x, y in zip(xs, ys):
        metric.update(x, y)
    expected = energy_distance(torch.cat(xs), torch.cat(ys)).float()
    torch.testing.assert_close(metric.compute(), expected)
    metric.reset()
    metric.update(xs[0], ys[0])
    torch.testing.assert_close(metric.compute(), energy_distance(xs[0], ys[0]).float())


def test_energy_distance_bad_inputs_raise() -> None:
    """Check that samples of different dimension and samples of fewer than two points raise ValueError."""
    with pytest.raises(ValueError, match="different dimension"):
        energy_distance(torch.randn(5, 2), torch.randn(5, 3))
    with pytest.raises(ValueError, match="at least two points"):
        energy_distance(torch.randn(1, 2), torch.randn(5, 2))
    metric = EnergyDistance()
    metric.update(torch.randn(4, 2), torch.randn(4, 3))
    with pytest.raises(ValueError, match="different dimension"):
        metric.compute()


def test_energy_distance_is_translation_invariant_far_from_the_origin() -> None:
    """Check that shifting both samples by 1e4 leaves the distance unchanged (float32 inputs at 1e4 carry 1e-3 rounding; the old float32 cdist was off by 0.09)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g) + 0.5
    assert float(energy_distance(x + 1e4, y + 1e4)) == pytest.approx(float(energy_distance(x, y)), abs=1e-4)
