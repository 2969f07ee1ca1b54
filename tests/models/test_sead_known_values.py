"""SEAD's tree and hashing detectors against values worked out independently of their vectorised code."""

from __future__ import annotations

import math

import torch

from zoo.models.sead.detectors import HalfSpaceTrees, RSHash


def _path(det: HalfSpaceTrees, tree: int, x: list[float]) -> list[int]:
    """Heap-order nodes of ``x``'s path in one tree, by plain Python over the stored splits."""
    node, path = 0, [0]
    for _ in range(det.depth):
        q, v = int(det.split_dim[tree, node]), float(det.split_val[tree, node])
        node = 2 * node + 1 + (1 if x[q] > v else 0)
        path.append(node)
    return path


def test_half_space_trees_score_is_mass_times_two_to_the_level_by_hand() -> None:
    """Check HST's score, −Σ_trees mass(node)·2^level(node) at the first node of the path whose reference mass is at
    most size_limit (else the leaf), against a Python traversal that counts the reference window itself. Dropping
    the 2^level weight, or stopping at the wrong node, changes these numbers."""
    window = 40
    det = HalfSpaceTrees(dim=2, seed=3, num_trees=6, depth=4, window=window, size_limit=3.0)
    g = torch.Generator().manual_seed(0)
    reference = torch.rand(window, 2, generator=g)
    det.score_learn_chunk(reference)  # the first window builds the trees and becomes the reference profile
    probes = torch.cat([torch.rand(20, 2, generator=g), torch.tensor([[0.5, 0.5], [3.0, -2.0], [0.01, 0.99]])])
    got = torch.stack([det.score(x) for x in probes])
    levels_used, unweighted_differs = set(), False
    for p, x in enumerate(probes.tolist()):
        expected = unweighted = 0.0
        for tree in range(det.num_trees):
            mass: dict[int, int] = {}
            for r in reference.tolist():
                for node in _path(det, tree, r):
                    mass[node] = mass.get(node, 0) + 1
            path = _path(det, tree, x)
            level = next((lvl for lvl, node in enumerate(path) if mass.get(node, 0) <= 3.0), det.depth)
            levels_used.add(level)
            expected -= mass.get(path[level], 0) * 2**level
            unweighted -= mass.get(path[level], 0)
        assert math.isclose(float(got[p]), expected, abs_tol=1e-4), (p, float(got[p]), expected)
        unweighted_differs |= not math.isclose(float(got[p]), unweighted, abs_tol=1e-4)
    assert len(levels_used) > 2 and unweighted_differs  # the 2^level weight is exercised at several levels


def test_rshash_score_counts_the_points_of_the_window_in_each_cell() -> None:
    """Check RS-Hash's score, −mean_r log(1 + min_h count), where the counts are known: copies of one point (zero
    spread, so their standardised cell never moves) score −log(1 + m) after m of them; and once more than a window of
    points went by, every count-min table holds exactly the s points of the window (departures were decremented)."""
    s = 16
    det = RSHash(dim=3, seed=1, num_components=8, sample_size=s, hashes=4, table_size=4096)
    a = torch.zeros(3)  # the first point is read unstandardised (no statistics yet): 0 keeps it in the same cell
    for m in range(1, 6):
        det.learn(a)
        assert math.isclose(float(det.score(a)), -math.log1p(m), rel_tol=1e-6), m
    g = torch.Generator().manual_seed(0)
    det.score_learn_chunk(torch.randn(s + 7, 3, generator=g))
    for _ in range(3):
        det.learn(torch.randn(3, generator=g))
    assert float(det.counts.sum()) == s * 8 * 4  # s points × R components × H hashes
    assert float(det.counts.min()) >= 0
