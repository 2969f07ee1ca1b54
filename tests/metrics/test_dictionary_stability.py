import itertools

import numpy as np
import pytest
import torch

from zoo.metrics import (
    DictionaryStability,
    dictionary_stability,
    matched_permutation,
    stability_floor_gaussian,
    stability_floor_points,
)


def _brute_force(D: np.ndarray, D_ref: np.ndarray) -> float:
    A = D / np.linalg.norm(D, axis=1, keepdims=True)
    B = D_ref / np.linalg.norm(D_ref, axis=1, keepdims=True)
    cos = A @ B.T
    k = len(A)
    return max(np.mean(cos[np.arange(k), list(p)]) for p in itertools.permutations(range(k)))


def test_dictionary_stability_recovers_known_permutation():
    """Check that a permuted copy has stability 1 and matched_permutation inverts the permutation."""
    g = torch.Generator().manual_seed(0)
    D = torch.randn(32, 16, generator=g)
    perm = torch.randperm(32, generator=g)
    assert float(dictionary_stability(D, D[perm])) == pytest.approx(1.0, abs=1e-6)
    index = matched_permutation(D, D[perm])
    assert index.dtype == torch.long
    assert torch.equal(perm[index], torch.arange(32))
    assert torch.equal(D[perm][index], D)


def test_dictionary_stability_is_signed():
    """Check that the cosine is signed: a negated dictionary of aligned atoms gives -1, not 1."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(8, generator=g)
    D = torch.rand(5, 1, generator=g).add(0.5) * v  # positive multiples of one direction
    assert float(dictionary_stability(D, -D)) == pytest.approx(-1.0, abs=1e-6)
    D = torch.randn(6, 8, generator=g)
    assert float(dictionary_stability(D, -D)) < 0.5


def test_dictionary_stability_is_scale_invariant():
    """Check that positive rescaling of atoms does not change stability."""
    g = torch.Generator().manual_seed(1)
    D, D_ref = torch.randn(10, 6, generator=g), torch.randn(10, 6, generator=g)
    scale = torch.rand(10, 1, generator=g) * 100 + 0.01
    expected = float(dictionary_stability(D, D_ref))
    assert float(dictionary_stability(scale * D, D_ref)) == pytest.approx(expected, abs=1e-6)
    assert float(dictionary_stability(D, 7.0 * D_ref)) == pytest.approx(expected, abs=1e-6)


def test_dictionary_stability_matches_brute_force():
    """Check that the Hungarian result equals the best of all 5! assignments."""
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        D, D_ref = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
        expected = _brute_force(D.double().numpy(), D_ref.double().numpy())
        # abs=1e-7: eps shifts every norm by ~1e-8, which the brute force leaves out
        assert float(dictionary_stability(D.double(), D_ref.double())) == pytest.approx(expected, abs=1e-7)


def test_dictionary_stability_matches_min_k_pairs_when_sizes_differ():
    """Check that k != k' matches min(k, k') pairs and unmatched rows get -1."""
    g = torch.Generator().manual_seed(3)
    D = torch.randn(4, 5, generator=g)
    D_big = torch.cat([D, torch.randn(3, 5, generator=g)])
    assert float(dictionary_stability(D, D_big)) == pytest.approx(1.0, abs=1e-6)
    assert float(dictionary_stability(D_big, D)) == pytest.approx(1.0, abs=1e-6)
    index = matched_permutation(D_big, D)
    assert torch.equal(index[:4], torch.arange(4)) and torch.equal(index[4:], torch.full((3,), -1))


def test_dictionary_stability_restricts_to_alive_atoms():
    """Check that alive masks drop rows before matching and average over the matched alive pairs."""
    g = torch.Generator().manual_seed(4)
    D = torch.randn(6, 4, generator=g)
    D_ref = D.clone()
    D_ref[4:] = -D_ref[4:]  # the two dead atoms would pull the score down
    alive = torch.tensor([True, True, True, True, False, False])
    assert float(dictionary_stability(D, D_ref)) < 0.99
    assert float(dictionary_stability(D, D_ref, alive=alive, alive_ref=alive)) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match=r"bool tensor of shape \(6,\)"):
        dictionary_stability(D, D_ref, alive=alive[:5])


def test_dictionary_stability_metric_averages_pairs():
    """Check that the Metric averages matched cosines over several pairs, weighted by pair count."""
    g = torch.Generator().manual_seed(5)
    pairs = [(torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)) for _ in range(2)]
    m = DictionaryStability()
    for D, D_ref in pairs:
        m.update(D, D_ref)
    expected = np.mean([float(dictionary_stability(D, D_ref)) for D, D_ref in pairs])
    assert float(m.compute()) == pytest.approx(expected, abs=1e-6)
    assert int(m.num_pairs) == 16
    m.reset()
    m.update(pairs[0][0], pairs[0][0])
    assert float(m.compute()) == pytest.approx(1.0, abs=1e-6)


def test_dictionary_stability_metric_merges_like_ddp():
    """Check that summing the states of two metrics (what the DDP sync does) equals one metric fed both pairs."""
    g = torch.Generator().manual_seed(6)
    pairs = [(torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)) for _ in range(2)]
    a, b, both = DictionaryStability(), DictionaryStability(), DictionaryStability()
    a.update(*pairs[0])
    b.update(*pairs[1])
    for pair in pairs:
        both.update(*pair)
    a.merge_state(b)
    assert float(a.compute()) == pytest.approx(float(both.compute()), abs=1e-6)


def test_dictionary_stability_handles_zero_rows():
    """Check that all-zero atoms give cosine 0 instead of NaN."""
    D = torch.eye(4)
    D_ref = torch.eye(4)
    D_ref[3] = 0.0
    value = dictionary_stability(D, D_ref)
    assert torch.isfinite(value)
    assert float(value) == pytest.approx(0.75, abs=1e-6)


def test_dictionary_stability_raises_on_shape_mismatch():
    """Check that different widths or non-2-D inputs raise a ValueError that prints both shapes."""
    with pytest.raises(ValueError, match=r"\(4, 3\) and \(4, 5\)"):
        dictionary_stability(torch.randn(4, 3), torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"\(12,\) and \(4, 3\)"):
        DictionaryStability().update(torch.randn(12), torch.randn(4, 3))
    with pytest.raises(ValueError, match="Expected argument `eps`"):
        DictionaryStability(eps=0.0)


def test_dictionary_stability_gaussian_floor_is_low():
    """Check that two Gaussian dictionaries (k=64, d=32) score well below 0.6 and above 0, reproducibly."""
    floor = float(stability_floor_gaussian(64, 32, torch.Generator().manual_seed(0)))
    assert 0.0 < floor < 0.5
    assert floor == float(stability_floor_gaussian(64, 32, torch.Generator().manual_seed(0)))


def test_dictionary_stability_points_floor_needs_2k_rows():
    """Check that the points floor draws disjoint rows and refuses fewer than 2k rows."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 8, generator=g)
    assert -1.0 <= float(stability_floor_points(x, 20, g)) <= 1.0
    with pytest.raises(ValueError, match=r"n >= 2k = 42 rows, got \(40, 8\)"):
        stability_floor_points(x, 21, g)
