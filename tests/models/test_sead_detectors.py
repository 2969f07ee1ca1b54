"""The SEAD detector pool: outliers score high, prequential order, exact state round trips, errors, throughput."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import torch

from zoo.models.sead.detectors import (
    DETECTORS,
    LODA,
    RandomScorer,
    RSHash,
    WindowKNN,
    build_detector,
    build_pool,
    default_pool,
    paper_pool,
    score_learn_many,
)

DIM = 4
# Small but representative settings per detector (HST needs a full window before it scores).
CONFIGS = {
    "knn": {"k": 5, "window": 128},
    "random": {},
    "loda": {"num_projections": 20, "bins": 10},
    "rshash": {"num_components": 20, "sample_size": 128, "hashes": 3},
    "hst": {"num_trees": 15, "depth": 6, "window": 100},
    "mad": {"window": 128},
}


def _stream(n: int = 300, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed))


def _warm(name: str, n: int = 300, seed: int = 0) -> tuple:
    det = build_detector({"name": name, "params": CONFIGS[name]}, dim=DIM, seed=seed)
    scores = torch.stack([det.score_learn(x) for x in _stream(n, seed)])
    return det, scores


def test_detector_table_covers_every_detector() -> None:
    """Check that the test settings cover every registered detector."""
    assert set(CONFIGS) == set(DETECTORS)


@pytest.mark.parametrize("name", sorted(set(DETECTORS) - {"random"}))
def test_detector_scores_clear_outlier_above_inlier_median(name: str) -> None:
    """Check that 8·ones after 300 N(0, I) points scores above the median score of fresh inliers."""
    det, _ = _warm(name)
    inliers = torch.stack([det.score(x) for x in _stream(100, seed=1)])
    assert det.score(8 * torch.ones(DIM)) > inliers.median()


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_detector_state_dict_round_trip_gives_identical_scores(name: str) -> None:
    """Check that build_detector(config) + load_state_dict(original) continues with the same scores."""
    det, _ = _warm(name, n=50)  # before HST's first window ends, so its trees are still to be built from the seed
    copy = build_detector(det.config, dim=DIM, seed=123)  # the seed is part of the state, too
    copy.load_state_dict(det.state_dict())
    for x in _stream(250, seed=2):
        assert torch.equal(det.score_learn(x), copy.score_learn(x))


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_detector_score_twice_without_learning_is_identical(name: str) -> None:
    """Check that score() does not change state: scoring the same point twice gives the same value."""
    det, _ = _warm(name, n=150)
    x = torch.randn(DIM)
    before = {k: v.clone() for k, v in det.state_dict().items()}
    assert torch.equal(det.score(x), det.score(x))
    assert all(torch.equal(before[k], v) for k, v in det.state_dict().items())


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_detector_config_is_json_and_rebuilds(name: str) -> None:
    """Check that config is JSON-serialisable and rebuilds a detector with the same config."""
    det = build_detector({"name": name, "params": CONFIGS[name]}, dim=DIM)
    config = json.loads(json.dumps(det.config))
    assert build_detector(config, dim=DIM).config == det.config


@pytest.mark.parametrize("config", [{"name": n, "params": p} for n, p in CONFIGS.items()] + paper_pool(DIM))
def test_chunked_scores_equal_point_by_point_scores(config: dict) -> None:
    """Check that score_learn_chunk over uneven chunks gives the scores and final state of score_learn, bit for bit.

    The stream triples its spread half-way, so LODA extends its ranges, RS-Hash's window and HST's windows roll over
    inside chunks, and chunks longer than a window or than max_chunk are split.
    """
    X = _stream(1500, seed=5)
    X[700:] *= 3
    a = build_detector(config, dim=DIM, seed=1)
    b = build_detector(config, dim=DIM, seed=1)
    expected = torch.stack([a.score_learn(x) for x in X])
    sizes, chunks, i = [1, 7, 64, 300, 33, 1, 2, 600, 492], [], 0
    for size in sizes:
        chunks.append(b.score_learn_chunk(X[i : i + size]))
        i += size
    assert i == len(X)
    assert torch.equal(torch.cat(chunks), expected)
    for (key, u), v in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(u.nan_to_num(-7.0), v.nan_to_num(-7.0)), key


def test_stacked_families_equal_each_setting_run_alone() -> None:
    """Check that score_learn_many (each family's settings in one stack) equals every detector run on its own.

    paper_pool stacks four LODA (bins 10-30), four RS-Hash (windows 128-512, 2-6 hashes) and four HST settings; the
    drifting stream makes the LODA histograms extend inside chunks, and chunks longer than RS-Hash's windows take
    departures from the chunk itself. Scores and final states must match bit for bit.
    """
    X = _stream(1500, seed=6)
    X[800:] = X[800:] * 4 + 2
    stacked, alone = build_pool(paper_pool(DIM), DIM, seed=3), build_pool(paper_pool(DIM), DIM, seed=3)
    got = torch.cat([score_learn_many(stacked, X[i : i + n]) for i, n in ((0, 700), (700, 1), (701, 799))])
    expected = torch.stack([det.score_learn_chunk(X) for det in alone], 1)
    assert torch.equal(got, expected)
    assert all(torch.equal(a, b) for a, b in zip(stacked.state_dict().values(), alone.state_dict().values()))


def test_score_learn_many_refuses_a_bad_chunk_or_mixed_widths() -> None:
    """Check that a NaN row or a width mismatch is refused before any detector of the pool changes."""
    pool = build_pool(paper_pool(DIM), DIM)
    before = {k: v.clone() for k, v in pool.state_dict().items()}
    X = _stream(20)
    X[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"row 5"):
        score_learn_many(pool, X)
    with pytest.raises(ValueError, match="one width"):
        score_learn_many([RSHash(DIM), RSHash(DIM + 1)], _stream(3))
    assert all(torch.equal(before[k].nan_to_num(-7.0), v.nan_to_num(-7.0)) for k, v in pool.state_dict().items())


def test_rshash_slots_equal_the_plain_int64_hash_for_small_and_large_tables() -> None:
    """Check the modular hash (cell mod T times A mod T, int32 where it fits) against (Σ cell·A + B) mod T in int64."""
    for table_size in (1024, 2**16):  # 4 · 2**32 > 2**31: the int64 branch
        det = RSHash(DIM, seed=2, num_components=30, sample_size=64, hashes=3, table_size=table_size)
        X = _stream(200, seed=8) * 50  # far cells, some clamped at ±2**20
        X[0] = 1e9
        slots, *_ = det._slots(X)
        n = torch.arange(len(X)).unsqueeze(1).double()
        Xd = X.double()
        s1, s2 = (Xd - Xd[0]).cumsum(0), ((Xd - Xd[0]) ** 2).cumsum(0)
        s1, s2 = torch.cat([torch.zeros(1, DIM), s1[:-1]]).double(), torch.cat([torch.zeros(1, DIM), s2[:-1]]).double()
        mean = s1 / n.clamp_min(1)
        std = ((s2 - s1 * mean) / (n - 1).clamp_min(1)).clamp_min(0).sqrt()
        std = torch.where(n >= 2, std.clamp_min(1e-6), torch.ones_like(std))
        u = torch.where(n > 0, Xd - Xd[0] - mean, Xd) / (4.0 * std) + 0.5
        cell = ((u.unsqueeze(1) + det.alpha) / det.f).floor().clamp(-(2**20), 2**20).long() * det.mask
        h = torch.remainder((cell.unsqueeze(1) * det.A).sum(-1) + det.B, table_size)
        assert torch.equal(slots, (h + det.offset).flatten(1))


def test_chunk_with_a_bad_row_is_refused_before_any_state_changes() -> None:
    """Check that a NaN in row 3 of a chunk names the row and leaves the detector as it was."""
    det, _ = _warm("rshash", n=50)
    before = {k: v.clone() for k, v in det.state_dict().items()}
    X = _stream(10, seed=9)
    X[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"score_learn_chunk \(row 3\) got NaN/inf at features \[1\]"):
        det.score_learn_chunk(X)
    with pytest.raises(ValueError, match=rf"shape \(B, {DIM}\), got \(10, 5\)"):
        det.score_learn_chunk(torch.zeros(10, 5))
    assert all(torch.equal(before[k], v) for k, v in det.state_dict().items())


def test_loda_histograms_count_every_point_and_cover_its_range() -> None:
    """Check PySAD's LODA invariants: each histogram holds n points (no forgetting) and its bins span every value."""
    det = LODA(DIM, num_projections=30, bins=8)
    X = _stream(400, seed=6)
    X[200:] *= 5  # forces range extensions (width doubling with bin merges)
    det.score_learn_chunk(X)
    assert torch.equal(det.hist.sum(1), torch.full((30,), 400.0, dtype=torch.float64))
    Z = X.double() @ det.W.T
    assert bool((Z.amin(0) >= det.low).all() and (Z.amax(0) < det.low + det.bins * det.width).all())
    counts = torch.stack(
        [
            torch.histc(Z[:, p], bins=8, min=float(det.low[p]), max=float(det.low[p] + 8 * det.width[p]))
            for p in range(30)
        ]
    )
    assert torch.equal(counts.double(), det.hist)


def test_knn_matches_brute_force_cdist_reference() -> None:
    """Check that WindowKNN's score is the k-th smallest cdist to the last `window` points (on its dims)."""
    k, window, dims = 3, 16, [1, 3]
    det = WindowKNN(DIM, k=k, window=window, dims=dims)
    X = _stream(60, seed=3)
    for t, x in enumerate(X):
        past = X[max(0, t - window) : t][:, dims]
        expected = torch.cdist(x[dims][None], past)[0].sort().values[k - 1] if t >= k else torch.tensor(0.0)
        torch.testing.assert_close(det.score_learn(x), expected, atol=1e-5, rtol=1e-5)


def test_knn_learning_a_point_changes_its_next_score() -> None:
    """Check that the score is computed before learning: after learning x, x has a smaller k-NN distance (k=1 → 0)."""
    det = WindowKNN(DIM, k=1, window=32)
    for x in _stream(20):
        det.learn(x)
    x = 5 * torch.ones(DIM)
    before = det.score(x)
    det.learn(x)
    assert before > 0 and det.score(x) == 0


def test_random_scorer_is_reproducible_and_uniform() -> None:
    """Check that RandomScorer repeats its scores for a seed, differs across seeds and is ~Uniform(0, 1)."""
    X = torch.zeros(2000, DIM)
    first, again, other = RandomScorer(DIM, seed=5), RandomScorer(DIM, seed=5), RandomScorer(DIM, seed=6)
    s = torch.stack([first.score_learn(x) for x in X])
    a = torch.stack([again.score_learn(x) for x in X[:10]])
    other = torch.stack([other.score_learn(x) for x in X[:10]])
    assert torch.equal(a, s[:10]) and not torch.equal(a, other)
    assert 0 <= s.min() and s.max() < 1
    assert abs(float(s.mean()) - 0.5) < 0.03 and abs(float(s.var()) - 1 / 12) < 0.01
    # Kolmogorov-Smirnov distance to U(0, 1); the 1% critical value for n = 2000 is about 0.036.
    ecdf = torch.arange(1, 2001) / 2000
    assert (s.sort().values - ecdf).abs().max() < 0.036


@pytest.mark.parametrize("name", sorted(DETECTORS))
@pytest.mark.parametrize("method", ["score", "learn", "score_learn"])
def test_detector_bad_row_raises_and_leaves_state_unchanged(name: str, method: str) -> None:
    """Check that a wrong-width or NaN/inf row raises ValueError naming the width and changes no buffer."""
    det, _ = _warm(name, n=120)
    before = {k: v.clone() for k, v in det.state_dict().items()}
    with pytest.raises(ValueError, match=rf"shape \({DIM},\), got \(5,\)"):
        getattr(det, method)(torch.zeros(5))
    bad = torch.zeros(DIM)
    bad[2] = float("nan")
    bad[3] = float("inf")
    with pytest.raises(ValueError, match=rf"NaN/inf at features \[2, 3\] of a row of width {DIM}"):
        getattr(det, method)(bad)
    for k, v in det.state_dict().items():
        assert torch.equal(before[k], v) or (v.isnan().any() and torch.equal(before[k].nan_to_num(), v.nan_to_num()))


def test_build_detector_unknown_name_lists_close_matches() -> None:
    """Check that an unknown detector name names the close match and every known detector."""
    with pytest.raises(ValueError, match=r"Unknown detector 'knnn'. Did you mean 'knn'\?.*hst, knn, loda"):
        build_detector({"name": "knnn"}, dim=DIM)
    with pytest.raises(ValueError, match=r"unknown params \['kk'\]"):
        build_detector({"name": "knn", "params": {"kk": 3}}, dim=DIM)


def test_build_pool_seeds_detectors_in_order_and_rejects_empty_pool() -> None:
    """Check that detector i gets seed + i and that an empty pool raises."""
    pool = build_pool(default_pool(DIM), dim=DIM, seed=10)
    assert [d.seed for d in pool] == list(range(10, 17))
    with pytest.raises(ValueError, match="empty pool"):
        build_pool([], dim=DIM)


def test_pools_have_the_card_shapes() -> None:
    """Check that default_pool(4) is 3 kNN + 4 random and paper_pool is 4 LODA + 4 RS-Hash + 4 HST + MAD."""
    assert [c["name"] for c in default_pool(4)] == ["knn"] * 3 + ["random"] * 4
    assert [c["params"]["dims"] for c in default_pool(4)[:3]] == [[0, 1], [2, 3], None]
    names = [c["name"] for c in paper_pool(4)]
    assert [names.count(n) for n in ("loda", "rshash", "hst", "mad")] == [4, 4, 4, 1]


@pytest.mark.parametrize("pool_fn", [default_pool, paper_pool])
def test_pool_throughput(pool_fn: Callable[[int], list[dict]], capsys: pytest.CaptureFixture) -> None:
    """Check that a pool scores 2000 points in chunks at a sane speed (prints points/s; only a loose sanity bound)."""
    pool = build_pool(pool_fn(DIM), dim=DIM)
    X = _stream(2000, seed=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per-point ops are tiny: intra-op threads only add contention noise
    try:
        start = time.perf_counter()
        with torch.no_grad():
            score_learn_many(pool, X)
        rate = len(X) / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    with capsys.disabled():
        print(f"\n{pool_fn.__name__}({DIM}): {len(pool)} detectors, {rate:.0f} points/s")
    assert rate > (2000 if pool_fn is default_pool else 500)
