"""SEAD's evidence: exact average precision, the stand-in weight rules, the benchmark streams and ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from zoo.datamodules.streams import BENCHMARK_KINDS, make_benchmark_stream
from zoo.metrics import average_precision
from zoo.models.sead import SEADEnsemble
from zoo.models.sead.alternatives import apply_rule, discounted_weights, follow_the_leader, warmup_pick
from zoo.models.sead.benchmark import DETECTORS, KNN, benchmark_pool, rank
from zoo.models.sead.detectors import default_pool


@pytest.mark.parametrize("scale", [1.0, 1e5])
def test_average_precision_equals_scikit_learn_on_any_scale(scale: float) -> None:
    """Check scores far outside [0, 1] (HST's near −1e5, kNN distances) are ranked as given, with ties, as sklearn."""
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(500, generator=g) < 0.1).long()
    scores = (torch.randn(500, generator=g) + 1.5 * labels) * scale - 3 * scale
    scores[:50] = scores[50]  # a block of ties
    expected = average_precision_score(labels.numpy(), scores.double().numpy())
    assert math.isclose(average_precision(scores, labels), expected, rel_tol=1e-6)  # torchmetrics returns float32


def test_average_precision_hand_case_where_a_sigmoid_would_tie() -> None:
    """Check [-1e5, -2e5, 30, 40] against [1, 0, 0, 1]: ranked 40 (+), 30 (-), -1e5 (+), so AP = (1 + 2/3) / 2."""
    value = average_precision(torch.tensor([-1e5, -2e5, 30.0, 40.0]), torch.tensor([1, 0, 0, 1]))
    assert math.isclose(value, (1 + 2 / 3) / 2, rel_tol=1e-6)
    with pytest.raises(ValueError, match="one shape"):
        average_precision(torch.zeros(3), torch.zeros(4))


def test_follow_the_leader_by_hand() -> None:
    """Check window means by hand: before t = 2 with window 2 the means are (0.85, 0.15), so detector 1 leads."""
    L = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.9], [0.1, 0.3], [0.2, 0.95]], dtype=torch.float64)
    scores, weights = follow_the_leader(L, window=2, warmup=1)
    # t = 1: mean of row 0 -> detector 1; t = 2: rows 0-1 -> 1; t = 3: rows 1-2 (0.75, 0.55) -> 1; t = 4: rows 2-3
    # (0.4, 0.6) -> 0
    assert scores.tolist() == [0.5, 0.2, 0.9, 0.3, 0.2]
    assert weights[:, 0].tolist() == [0.5, 0.0, 0.0, 0.0, 1.0]


def test_discounted_weights_by_hand() -> None:
    """Check D_{t+1} = γ D_t + ℓ_t and w ∝ exp(−η D) against a two-step hand computation."""
    L = torch.tensor([[0.2, 0.6], [0.4, 0.0], [1.0, 1.0]], dtype=torch.float64)
    scores, weights = discounted_weights(L, gamma=0.5, eta=2.0, warmup=0)
    d = np.array([0.5 * 0.2 + 0.4, 0.5 * 0.6 + 0.0])  # D before t = 2
    w = np.exp(-2.0 * d) / np.exp(-2.0 * d).sum()
    np.testing.assert_allclose(weights[2].numpy(), w, rtol=1e-12)
    np.testing.assert_allclose(weights[0].numpy(), [0.5, 0.5])
    np.testing.assert_allclose(scores[2].item(), 1.0, rtol=1e-12)  # every detector's loss is 1 at t = 2
    with pytest.raises(ValueError, match="gamma"):
        discounted_weights(L, gamma=1.5)


def test_warmup_pick_and_rules_refuse_bad_input() -> None:
    L = torch.tensor([[0.5, 0.5], [0.1, 0.9], [0.3, 0.2], [0.9, 0.1]])
    raw = torch.arange(8.0).view(4, 2)
    scores, chosen = warmup_pick(L, raw, span=2, warmup=1)  # means over rows 1-2: (0.2, 0.55)
    assert chosen == 0 and scores.tolist() == [0.0, 2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="`rule`.*'ftl200'"):
        apply_rule("ftl", L, raw)
    with pytest.raises(ValueError, match="shape"):
        follow_the_leader(torch.zeros(5))
    with pytest.raises(ValueError, match="warmup"):
        warmup_pick(L, raw, warmup=10)


def test_rank_by_hand() -> None:
    assert rank(0.5, [0.9, 0.6, 0.5, 0.1]) == 3.0  # two strictly above; the tie counts in the method's favour
    assert rank(1.0, []) == 1.0


@pytest.mark.parametrize("kind", BENCHMARK_KINDS)
def test_benchmark_streams(kind: str) -> None:
    """Check each stream's shape, label rate and the property that makes its best detector differ."""
    x, y = make_benchmark_stream(kind, n=3000, seed=1)
    assert x.shape[0] == 3000 and torch.isfinite(x).all() and 0.01 < y.float().mean() < 0.03
    a, inl = x[y == 1], x[y == 0]
    if kind == "clusters":  # anomalies inside every feature's inlier range: no per-feature rule sees them
        assert ((a >= inl.min(0).values) & (a <= inl.max(0).values)).all()
    if kind in ("marginal", "wide"):  # exactly one extreme feature each
        assert ((a.abs() >= 4.5).sum(1) == 1).all() and x.shape[1] == (10 if kind == "marginal" else 40)
    if kind == "subspace":  # one correlated pair broken by 3
        gap = (a[:, 6:] - a[:, :6]).abs()
        assert ((gap - 3.0).abs() < 1e-5).sum(1).eq(1).all()
    if kind == "gradual":  # the mean moves by 12 units along dim 0
        assert inl[-200:, 0].mean() - inl[:200, 0].mean() > 10


def test_benchmark_stream_refuses_unknown_kind() -> None:
    with pytest.raises(ValueError, match="`kind`.*'clusters'"):
        make_benchmark_stream("cluster")


def test_detector_scores_do_not_depend_on_the_pool_around_them() -> None:
    """The benchmark reads every detector's APS from the pool + kNN pass: the paper pool's columns must equal the
    paper pool's own pass (scores never see the weights, and each detector's seed is its position)."""
    x, _ = make_benchmark_stream("marginal", n=400, seed=0)
    small = SEADEnsemble(benchmark_pool(10), 10, warmup=50)(x)["raw"]
    large = SEADEnsemble(benchmark_pool(10, "paper+knn"), 10, warmup=50)(x)["raw"]
    assert large.shape[1] == len(DETECTORS) + len(KNN)
    torch.testing.assert_close(large[:, : len(DETECTORS)], small)


def test_unclipped_output_keeps_the_weights() -> None:
    """``clip_output=False`` changes only the emitted score: the Hedge loss (and so the weights) stays clipped."""
    x, _ = make_benchmark_stream("drift", n=600, seed=0)
    clipped = SEADEnsemble(default_pool(4, 2), 4, warmup=50)(x)
    plain = SEADEnsemble(default_pool(4, 2), 4, warmup=50, clip_output=False)(x)
    torch.testing.assert_close(plain["weights"], clipped["weights"])
    assert (plain["score"] > 1).any() and not (clipped["score"] > 1 + 1e-6).any()
    row = SEADEnsemble(default_pool(4, 2), 4, warmup=50, clip_output=False, chunked=False)(x)  # the per-point path
    torch.testing.assert_close(row["score"], plain["score"])
