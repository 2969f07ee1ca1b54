import pytest
import torch

from zoo.metrics import DeadAtomFraction


def test_dead_atom_fraction_counts_atoms_never_fired():
    """Check that the fraction and the alive mask follow firing over several batches."""
    m = DeadAtomFraction(num_atoms=5)
    m.update(torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.0, 0.0, 0.0]]))
    m.update(torch.tensor([[0.0, 0.0, 0.0, 3.0, 0.0]]))
    assert float(m.compute()) == pytest.approx(0.6)
    assert m.alive().tolist() == [False, True, False, True, False]
    m.reset()
    assert not m.alive().any()


def test_dead_atom_fraction_ignores_negative_codes():
    """Check that only positive codes count as firing."""
    m = DeadAtomFraction(num_atoms=2)
    m.update(torch.tensor([[-1.0, 2.0]]))
    assert m.alive().tolist() == [False, True]


def test_dead_atom_fraction_raises_on_bad_input():
    """Check that a wrong code width and a bad num_atoms raise ValueErrors with the values."""
    with pytest.raises(ValueError, match=r"shape \(N, 4\), got \(3, 8\)"):
        DeadAtomFraction(num_atoms=4).update(torch.zeros(3, 8))
    with pytest.raises(ValueError, match="Expected argument `num_atoms` to be a positive int but got 0"):
        DeadAtomFraction(num_atoms=0)
