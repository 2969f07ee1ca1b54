"""RA-SAE's plausibility and identifiability benchmarks (the paper's §5.2-5.3) against hand-derived cases and a
brute-force loop, and the collage data they read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.models.ra_sae.benchmarks import digits_collages, identifiability_accuracy, plausibility, standardise


def _brute_force_accuracy(codes: np.ndarray, presence: np.ndarray) -> np.ndarray:
    """The paper's Accuracy_j = max over atoms i and thresholds λ (1st-100th percentiles of z_i) of
    P(1[z_i > λ] = y_j), one (object, atom, threshold) at a time."""
    out = np.zeros(presence.shape[1])
    for j in range(presence.shape[1]):
        for i in range(codes.shape[1]):
            for q in range(1, 101):
                lam = np.quantile(codes[:, i], q / 100)
                out[j] = max(out[j], np.mean((codes[:, i] > lam) == presence[:, j]))
    return out


def test_identifiability_accuracy_by_hand() -> None:
    """Check the score on a hand case where the best threshold is not the lowest and the best atom differs per object.

    Atom 0 = (0, 1, 2, 3) marks object 0 = (0, 0, 1, 1) exactly once λ sits between 1 and 2 (accuracy 1); atom 1 =
    (5, 0, 0, 5) marks object 1 = (1, 0, 0, 1) exactly. Thresholding atom 0 at 0 instead gives 0.75 for object 0."""
    codes = torch.tensor([[0.0, 5.0], [1.0, 0.0], [2.0, 0.0], [3.0, 5.0]])
    presence = torch.tensor([[0, 1], [0, 0], [1, 0], [1, 1]]).bool()
    torch.testing.assert_close(identifiability_accuracy(codes, presence), torch.tensor([1.0, 1.0], dtype=torch.float64))


def test_identifiability_accuracy_matches_a_brute_force_loop() -> None:
    """Check the two-matrix-product form against the loop over objects, atoms and percentiles on sparse codes."""
    g = torch.Generator().manual_seed(0)
    presence = torch.rand(120, 4, generator=g) < 0.4
    codes = torch.relu(presence.float() @ torch.randn(4, 6, generator=g) + 0.5 * torch.randn(120, 6, generator=g))
    got = identifiability_accuracy(codes, presence).numpy()
    np.testing.assert_allclose(got, _brute_force_accuracy(codes.double().numpy(), presence.numpy()), atol=1e-12)
    with pytest.raises(ValueError, match="share n"):
        identifiability_accuracy(codes[:10], presence)


def test_plausibility_is_the_mean_best_cosine_per_class() -> None:
    """Check plausibility by hand: the mean over classes of each class's best atom, not over atoms of each atom's best
    class. Class 0 matches atom 0 exactly (1); class 1 = (e₂ + e₃)/√2 is at cos 1/√2 from atoms 1 and 2. Per class:
    (1 + 1/√2)/2 ≈ 0.854; per atom (the transposed mistake) it would be (1 + 2/√2)/3 ≈ 0.805."""
    atoms = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    directions = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    assert plausibility(atoms, directions) == pytest.approx((1.0 + 0.5**0.5) / 2)
    assert plausibility(atoms, directions) != pytest.approx((1.0 + 2 * 0.5**0.5) / 3)
    with pytest.raises(ValueError, match="share d"):
        plausibility(atoms, torch.ones(2, 4))


def test_standardise_by_hand() -> None:
    """Check element-wise standardisation on hand values: the column (1, 3) has μ = 2 and unbiased σ = √2, so it
    becomes (−1/√2, 1/√2); the constant column keeps σ = 1 instead of dividing by zero."""
    x = torch.tensor([[1.0, 5.0], [3.0, 5.0]])
    z, mu, sigma = standardise(x)
    torch.testing.assert_close(mu, torch.tensor([2.0, 5.0]))
    torch.testing.assert_close(sigma, torch.tensor([2.0**0.5, 1.0]))  # unbiased std of (1, 3) is √2
    torch.testing.assert_close(z, torch.tensor([[-(0.5**0.5), 0.0], [0.5**0.5, 0.0]]))


def test_digits_collages_hold_four_distinct_digits_in_their_cells() -> None:
    """Check that each collage holds 4 distinct classes and that every filled cell is an image of a present class."""
    from zoo.datamodules.images import ImageDataModule

    images, presence = digits_collages(30, seed=3)
    assert images.shape == (30, 1, 16, 16) and bool((presence.sum(1) == 4).all())
    dm = ImageDataModule(dataset="digits", seed=0)
    dm.setup("fit")
    library = dm.train_set.x.flatten(1)
    for n in range(30):
        for r, c in ((0, 0), (0, 1), (1, 0), (1, 1)):
            cell = images[n, 0, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8].flatten()
            match = torch.nonzero((library == cell).all(1)).flatten()
            assert len(match) and bool(presence[n, dm.train_set.y[match[0]]]), f"collage {n} cell {(r, c)}"
    with pytest.raises(ValueError, match="objects"):
        digits_collages(2, objects=5)


def test_plausibility_directions_are_the_heads_map_of_the_standardised_features() -> None:
    """Check the plausibility task's class directions against the head itself: the test logits equal the standardised
    test features times the task's head weights plus a constant per class (dividing by σ instead of multiplying, or
    keeping a dead channel's weights, breaks it), and channels that never fire carry no direction."""
    from zoo.models.ra_sae.experiment import plausibility_task

    task = plausibility_task(width=16)
    offset = task["test_logits"] - task["test"] @ task["head_weight"].T
    assert float((offset - offset.mean(0)).abs().max()) < 1e-4
    dead = task["train"].abs().sum(0) == 0
    assert bool((task["directions"][:, dead] == 0).all())
    torch.testing.assert_close(task["directions"].norm(dim=1), torch.ones(10))
