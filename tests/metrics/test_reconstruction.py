import numpy as np
import pytest
import torch

from zoo.metrics import ReconstructionR2


def _reference_r2(x: np.ndarray, x_hat: np.ndarray) -> float:
    # official r2_score, in numpy: per-entry means, one scalar mean of x, eps 1e-6 on the variance
    return 1.0 - np.mean((x - x_hat) ** 2) / (np.mean((x - x.mean()) ** 2) + 1e-6)


def test_reconstruction_r2_matches_one_shot_formula_over_batches():
    """Check that R² accumulated over 3 batches equals the numpy one-shot formula with a scalar mean."""
    rng = np.random.default_rng(0)
    offsets = rng.normal(scale=5.0, size=6)  # per-column offsets: a per-column mean would differ
    x = rng.normal(size=(90, 6)) + offsets
    x_hat = x + rng.normal(scale=0.5, size=x.shape)
    m = ReconstructionR2()
    for rows in np.array_split(np.arange(90), 3):
        m.update(torch.tensor(x_hat[rows], dtype=torch.float32), torch.tensor(x[rows], dtype=torch.float32))
    expected = _reference_r2(x.astype(np.float32).astype(np.float64), x_hat.astype(np.float32).astype(np.float64))
    assert float(m.compute()) == pytest.approx(expected, abs=1e-5)


def test_reconstruction_r2_merges_like_ddp():
    """Check that summing the states of two metrics (the DDP sync) equals one metric fed all batches."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 4, generator=g), torch.randn(16, 4, generator=g) + 2.0) for _ in range(2)]
    a, b, both = ReconstructionR2(), ReconstructionR2(), ReconstructionR2()
    a.update(*batches[0])
    b.update(*batches[1])
    for batch in batches:
        both.update(*batch)
    a.merge_state(b)
    assert float(a.compute()) == pytest.approx(float(both.compute()), abs=1e-6)


def test_reconstruction_r2_is_one_for_perfect_reconstruction():
    """Check that x_hat == x gives R² = 1."""
    x = torch.randn(20, 5, generator=torch.Generator().manual_seed(2))
    m = ReconstructionR2()
    m.update(x.clone(), x)
    assert float(m.compute()) == pytest.approx(1.0, abs=1e-6)


def test_reconstruction_r2_is_zero_for_the_scalar_mean():
    """Check that predicting the scalar mean of all entries gives R² ≈ 0."""
    x = torch.randn(50, 5, generator=torch.Generator().manual_seed(3)) + torch.arange(5.0)
    m = ReconstructionR2()
    m.update(torch.full_like(x, float(x.mean())), x)
    assert float(m.compute()) == pytest.approx(0.0, abs=1e-5)


def test_reconstruction_r2_raises_on_shape_mismatch():
    """Check that different or non-2-D shapes raise a ValueError naming both shapes."""
    with pytest.raises(ValueError, match=r"got \(4, 3\) and \(4, 5\)"):
        ReconstructionR2().update(torch.zeros(4, 3), torch.zeros(4, 5))
    with pytest.raises(ValueError, match=r"got \(4,\) and \(4,\)"):
        ReconstructionR2().update(torch.zeros(4), torch.zeros(4))
