"""RA-SAE's identifiability and plausibility benchmarks against scikit-learn and planted answers."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import roc_auc_score

from zoo.models.ra_sae.benchmarks import best_atom_auroc, identifiability, plausibility, probe_directions


def test_best_atom_auroc_matches_sklearn_with_ties() -> None:
    """Check every (atom, concept) AUROC behind the best-atom maximum against sklearn, on sparse codes full of ties."""
    g = torch.Generator().manual_seed(0)
    presence = torch.rand(300, 5, generator=g) < 0.3
    codes = torch.relu(torch.randn(300, 7, generator=g) + presence.float() @ torch.randn(5, 7, generator=g))
    codes[codes < 0.5] = 0.0  # many exact zeros: ties
    got = best_atom_auroc(codes, presence)
    expected = torch.tensor(
        [max(roc_auc_score(presence[:, j].numpy(), codes[:, i].numpy()) for i in range(7)) for j in range(5)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, expected)


def test_identifiability_separates_a_recovering_dictionary_from_a_random_one() -> None:
    """Check matched cosine and AUROC: 1 for atoms equal to the true concepts firing with them, lower for random."""
    g = torch.Generator().manual_seed(1)
    true = torch.nn.functional.normalize(torch.rand(6, 8, generator=g), dim=1)
    presence = torch.rand(400, 6, generator=g) < 0.25
    good = identifiability(true, presence.float(), true, presence)
    rand_atoms = torch.randn(6, 8, generator=g)
    bad = identifiability(rand_atoms, torch.rand(400, 6, generator=g), true, presence)
    assert good == {"matched_cosine": pytest.approx(1.0), "auroc": pytest.approx(1.0)}
    assert bad["matched_cosine"] < 0.8 and abs(bad["auroc"] - 0.5) < 0.15


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


def test_probe_directions_find_a_planted_class_direction() -> None:
    """Check that the logistic-regression probe's class directions are unit rows along the planted class offsets."""
    g = torch.Generator().manual_seed(2)
    offsets = torch.nn.functional.normalize(torch.randn(3, 10, generator=g), dim=1) * 3
    labels = torch.randint(0, 3, (600,), generator=g)
    x = torch.randn(600, 10, generator=g) + offsets[labels]
    w = probe_directions(x, labels)
    assert w.shape == (3, 10) and torch.allclose(w.norm(dim=1), torch.ones(3), atol=1e-5)
    centred = torch.nn.functional.normalize(offsets - offsets.mean(0), dim=1)
    assert bool(((w * centred).sum(1) > 0.9).all())
