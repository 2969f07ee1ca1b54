"""DUAL's pruning scores and subset selections (card §2): loop references, hand-computed cases, and selection rules."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import beta as beta_dist

from zoo.models.dual.scores import (
    aum_score,
    beta_select,
    ccs_select,
    dual_score,
    dyn_unc_score,
    el2n_score,
    entropy_score,
    forgetting_score,
    keep_count,
    random_select,
    tdds_score,
    topk_select,
)

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture
def sampled_weights(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The weights of every ``torch.multinomial`` call (a spy that then calls the real one): the sampling weights."""
    seen: list[torch.Tensor] = []
    multinomial = torch.multinomial

    def spy(weight: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(weight.clone())
        return multinomial(weight, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    return seen


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _alternating(centre: float, half: float, epochs: int) -> torch.Tensor:
    """centre + half, centre − half, … over ``epochs`` epochs (float64)."""
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(epochs // 2)
    return centre + half * sign


def _window_reference(p: torch.Tensor, epochs: int, window: int, difficulty: bool) -> torch.Tensor:
    """Per-sample, per-window Python loop: mean_k 10·σ_k·(1 − μ_k) (DUAL) or mean_k 10·σ_k (Dyn-Unc)."""
    out = torch.zeros(p.shape[1], dtype=torch.float64)
    for n in range(p.shape[1]):
        terms = []
        for k in range(epochs - window + 1):
            vals = [float(p[j, n]) for j in range(k, k + window)]
            mu = sum(vals) / window
            sigma = math.sqrt(sum((v - mu) ** 2 for v in vals) / (window - 1))
            terms.append(10 * sigma * ((1 - mu) if difficulty else 1.0))
        out[n] = sum(terms) / len(terms)
    return out


def test_dual_and_dyn_unc_equal_a_per_window_loop() -> None:
    """Check that dual_score (first T epochs) and dyn_unc_score (all epochs) equal a naive per-window loop to 1e-12."""
    p = torch.rand(35, 50, generator=_gen(0), dtype=torch.float64)
    torch.testing.assert_close(dual_score(p, epochs=30, window=10), _window_reference(p, 30, 10, True), **TIGHT)
    torch.testing.assert_close(dual_score(p), _window_reference(p, 30, 10, True), **TIGHT)  # defaults T=30, J=10
    torch.testing.assert_close(dyn_unc_score(p, window=10), _window_reference(p, 35, 10, False), **TIGHT)


def test_dual_and_dyn_unc_on_constant_and_fluctuating_samples() -> None:
    """Check that constant samples score 0 under both, and DUAL ranks a fluctuating hard sample above an easy one."""
    e = 30
    constant_mid = torch.full((e,), 0.4, dtype=torch.float64)
    always_right = torch.ones(e, dtype=torch.float64)
    easy, hard = _alternating(0.9, 0.05, e), _alternating(0.3, 0.05, e)
    p = torch.stack([constant_mid, always_right, easy, hard], dim=1)
    dual, dyn = dual_score(p, epochs=e, window=10), dyn_unc_score(p, window=10)
    zero = torch.zeros(2, dtype=torch.float64)
    torch.testing.assert_close(dual[:2], zero, **TIGHT)
    torch.testing.assert_close(dyn[:2], zero, **TIGHT)
    # Every 10-epoch window of an alternating ±0.05 series has σ = 0.05·√(10/9) and μ = the centre.
    sigma = 0.05 * math.sqrt(10 / 9)
    torch.testing.assert_close(dyn[2:], torch.full((2,), 10 * sigma, dtype=torch.float64), **TIGHT)
    torch.testing.assert_close(
        dual[2:],
        torch.tensor([10 * sigma * 0.1, 10 * sigma * 0.7], dtype=torch.float64),
    )
    assert dual[3] > dual[2] > 0


def test_dual_rejects_bad_shapes_and_windows() -> None:
    """Check that too few epochs, a window out of range, or a non-2-D record raise ValueError."""
    p = torch.rand(20, 5, generator=_gen(1))
    with pytest.raises(ValueError, match="recorded epochs"):
        dual_score(p, epochs=30)
    with pytest.raises(ValueError, match="window"):
        dual_score(p, epochs=20, window=21)
    with pytest.raises(ValueError, match="window"):
        dyn_unc_score(p, window=1)
    with pytest.raises(ValueError, match="epochs, samples"):
        dual_score(p[None])


def _tdds_reference(probs: torch.Tensor, epochs: int, window: int) -> torch.Tensor:
    """Intended TDDS as a loop: per-epoch KL-style change, window deviation L2 norm, weights 0.9·0.1^{T−J−k}."""
    _, n_samples, n_classes = probs.shape
    out = torch.zeros(n_samples, dtype=torch.float64)
    for n in range(n_samples):
        d = []
        for t in range(epochs - 1):
            total = 0.0
            for c in range(n_classes):
                q, p = float(probs[t + 1, n, c]), float(probs[t, n, c])
                total += abs(q * (math.log(q + 1e-8) - math.log(p + 1e-8)))
            d.append(total)
        score = 0.0
        for k in range(epochs - window + 1):
            win = d[k : k + window - 1]
            mean = sum(win) / len(win)
            spread = math.sqrt(sum((v - mean) ** 2 for v in win))
            score += 0.9 * 0.1 ** (epochs - window - k) * spread
        out[n] = score
    return out


def test_tdds_equals_the_intended_loop_reference() -> None:
    """Check that tdds_score equals a loop over shifted windows of probability changes (not the repo's logit quirk)."""
    probs = torch.randn(25, 20, 4, generator=_gen(2), dtype=torch.float64).mul(2).softmax(dim=-1)
    torch.testing.assert_close(tdds_score(probs, epochs=20, window=5), _tdds_reference(probs, 20, 5), **TIGHT)
    # Only the first T epochs count: changing epoch 20 onwards leaves the score unchanged.
    later = probs.clone()
    later[20:] = later[20:].flip(-1)
    torch.testing.assert_close(tdds_score(later, epochs=20, window=5), tdds_score(probs, epochs=20, window=5))
    with pytest.raises(ValueError):
        tdds_score(probs[:, :, 0], epochs=20, window=5)


def test_el2n_and_entropy_on_hand_computed_cases() -> None:
    """Check EL2N = ‖p − onehot(y)‖₂ and entropy (uniform → log C, one-hot → 0) on hand-computed rows."""
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 2])
    expected = torch.tensor([0.14, 1.14, 6 / 9], dtype=torch.float64).sqrt()
    torch.testing.assert_close(el2n_score(probs, labels), expected, **TIGHT)
    ent = entropy_score(
        torch.tensor(
            [[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.7, 0.2, 0.1]],
            dtype=torch.float64,
        )
    )
    by_hand = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    torch.testing.assert_close(ent, torch.tensor([math.log(3), 0.0, math.log(2), by_hand], dtype=torch.float64))
    torch.testing.assert_close(
        entropy_score(torch.full((2, 5), 0.2)),
        torch.full((2,), math.log(5), dtype=torch.float64),
    )


def test_forgetting_counts_only_correct_to_incorrect_transitions() -> None:
    """Check that forgetting counts correct→incorrect argmax flips only (c,w,c,w → 2; w,c,c,c → 0; c,c,w,w → 1)."""
    right, wrong = (
        [0.8, 0.1, 0.1],
        [0.1, 0.8, 0.1],
    )  # label 0: argmax 0 is right, argmax 1 is wrong
    patterns = [
        [right, wrong, right, wrong],
        [wrong, right, right, right],
        [right, right, wrong, wrong],
    ]
    probs = torch.tensor(patterns).transpose(0, 1)  # (E=4, N=3, C=3)
    torch.testing.assert_close(forgetting_score(probs, torch.zeros(3)), torch.tensor([2.0, 0.0, 1.0]).double())


def test_aum_is_the_negated_mean_margin_over_epochs() -> None:
    """Check that AUM = −mean_t(p_y − max_{c≠y} p_c) over all epochs, not only the last (the repo's quirk)."""
    probs = torch.tensor(
        [
            [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]],
            [[0.6, 0.3, 0.1], [0.2, 0.1, 0.7]],
            [[0.3, 0.6, 0.1], [0.1, 0.3, 0.6]],
        ],
        dtype=torch.float64,
    )  # (E=3, N=2, C=3); margins: sample 0 → 0.2, 0.3, −0.3; sample 1 (label 2) → 0.7, 0.5, 0.3
    score = aum_score(probs, torch.tensor([0, 2]))
    torch.testing.assert_close(score, torch.tensor([-(0.2 / 3), -0.5], dtype=torch.float64), **TIGHT)


@pytest.mark.parametrize(
    ("n", "ratio", "expected"),
    [
        (100, 0.3, 70),
        (10, 0.7, 3),
        (10, 0.9, 1),
        (1000, 0.9, 100),
        (7, 0.5, 3),
        (3, 0.9, 1),
        (1, 0.5, 1),
    ],
)
def test_keep_count_is_the_floor_of_the_kept_fraction(n: int, ratio: float, expected: int) -> None:
    """Check that keep_count = ⌊(1 − r)·N⌋ (not fooled by 0.1·1000 = 99.999…), and at least 1."""
    assert keep_count(n, ratio) == expected


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.1, 1.5])
def test_keep_count_rejects_ratios_outside_the_open_unit_interval(ratio: float) -> None:
    """Check that a pruning ratio outside (0, 1) raises ValueError naming the pruning ratio."""
    with pytest.raises(ValueError, match="pruning ratio"):
        keep_count(100, ratio)
    with pytest.raises(ValueError, match="pruning ratio"):
        topk_select(torch.rand(10), ratio)


def test_topk_select_keeps_the_largest_scores() -> None:
    """Check that topk_select returns the ⌊(1 − r)N⌋ indices of the largest scores, as a descending sort does."""
    score = torch.randn(103, generator=_gen(3), dtype=torch.float64)
    for ratio in (0.3, 0.5, 0.9):
        idx = topk_select(score, ratio)
        k = math.floor((1 - ratio) * 103)
        assert len(idx) == k
        assert set(idx.tolist()) == set(sorted(range(103), key=lambda i: -float(score[i]))[:k])
        rest = torch.ones(103, dtype=torch.bool)
        rest[idx] = False
        assert score[idx].min() > score[rest].max()


def test_random_select_count_uniqueness_and_seed() -> None:
    """Check that random_select draws ⌊(1 − r)n⌋ distinct in-range indices, identical for identical seeds."""
    idx = random_select(500, 0.7, generator=_gen(4))
    assert len(idx) == 150 and len(set(idx.tolist())) == 150
    assert 0 <= int(idx.min()) and int(idx.max()) < 500
    torch.testing.assert_close(idx, random_select(500, 0.7, generator=_gen(4)))
    assert not torch.equal(idx, random_select(500, 0.7, generator=_gen(5)))


def _spread_dynamics(n: int = 2000, epochs: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    """Target probabilities with mean m(n) spread uniformly over [0.02, 0.98] and ±0.01 alternating noise."""
    m = torch.linspace(0.02, 0.98, n, dtype=torch.float64)
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(epochs // 2)
    return m, m[None] + 0.01 * sign[:, None]


def test_beta_select_count_uniqueness_seed_and_zero_scores() -> None:
    """Check that beta_select draws k distinct indices, reproducibly, and never one whose score is zero."""
    g = _gen(6)
    p = torch.rand(30, 300, generator=g, dtype=torch.float64)
    score = dual_score(p)
    score[::3] = 0.0
    for ratio in (0.5, 0.8):
        idx = beta_select(score, p, ratio, generator=_gen(7))
        assert len(idx) == keep_count(300, ratio) and len(set(idx.tolist())) == len(idx)
        assert bool((score[idx] > 0).all())
        torch.testing.assert_close(idx, beta_select(score, p, ratio, generator=_gen(7)))


def test_beta_select_weights_follow_the_ratio_adaptive_beta_formula(sampled_weights: list[torch.Tensor]) -> None:
    """Check that the sampling weights are ∝ BetaPDF(m; 16 − β, β)·score with β = 15(1 − a)(1 − r⁴)."""
    m, p = _spread_dynamics()
    score = dual_score(p)
    a = float(m[:10].mean())  # DUAL = 10σ(1 − m) with equal σ: the 10 top scores are the 10 lowest m
    for ratio in (0.3, 0.9):
        beta_select(score, p, ratio, generator=_gen(8))
        b = 15 * (1 - a) * (1 - ratio**4)
        expected = torch.from_numpy(beta_dist.pdf(m.numpy(), 16 - b, b)) * score
        torch.testing.assert_close(
            sampled_weights[-1] / sampled_weights[-1].sum(), expected / expected.sum(), rtol=1e-9, atol=1e-15
        )


def test_beta_select_moves_to_easy_samples_as_the_ratio_grows() -> None:
    """Check that the kept samples' mean target probability is higher at r = 0.9 (mode ≈ 0.71) than at r = 0.3."""
    m, p = _spread_dynamics()
    score = dual_score(p)
    assert bool((score > 0).all())
    a = float(m[score.argsort(descending=True)[:10]].mean())
    means = {}
    for ratio in (0.3, 0.9):
        b = 15 * (1 - a) * (1 - ratio**4)
        mode = (15 - b) / 14
        means[ratio] = float(m[beta_select(score, p, ratio, generator=_gen(9))].mean())
        assert (mode < 0.1) if ratio == 0.3 else (mode > 0.6)
    # Measured (seed 9): ≈ 0.36 at r = 0.3 (k = 1400 of 2000 exhausts the hard end), ≈ 0.64 at r = 0.9.
    assert means[0.9] > means[0.3] + 0.15, means
    assert means[0.9] > 0.55 and means[0.3] < 0.45, means


def test_beta_select_rejects_a_wrong_target_probs_shape() -> None:
    """Check that a target_probs that is not (epochs, N) raises ValueError."""
    p = torch.rand(30, 100, generator=_gen(10), dtype=torch.float64)
    score = dual_score(p)
    with pytest.raises(ValueError, match="must be"):
        beta_select(score, p[:, :99], 0.5)
    with pytest.raises(ValueError, match="must be"):
        beta_select(score, p[0], 0.5)


def test_beta_select_fills_by_score_rank_when_too_few_weights_are_non_zero() -> None:
    """Check that with fewer non-zero weights than k, all of them are kept and the rest follow the score rank."""
    p = torch.rand(30, 100, generator=_gen(10), dtype=torch.float64)
    score = -torch.rand(100, generator=_gen(11), dtype=torch.float64)  # negative: zero weight
    score[10:15] = 1.0  # the only 5 positive weights; k = 10 at r = 0.9
    idx = beta_select(score, p, 0.9, generator=_gen(12))
    assert len(idx) == 10 and len(set(idx.tolist())) == 10
    assert set(idx[:5].tolist()) == set(range(10, 15))
    # The 10 highest scores are the 5 positive ones and the 5 least negative ones.
    assert set(idx.tolist()) == set(score.argsort(descending=True)[:10].tolist())


def test_beta_select_clamps_beta_when_the_anchor_is_certain(sampled_weights: list[torch.Tensor]) -> None:
    """Check that an anchor mean a = 1 (β = 0 unclamped, a NaN density) still gives finite weights and k indices."""
    p = torch.rand(30, 100, generator=_gen(13), dtype=torch.float64)
    p[:, :10] = 1.0
    score = torch.rand(100, generator=_gen(14), dtype=torch.float64)
    score[:10] += 1.0  # the anchor: the 10 samples always at p = 1
    idx = beta_select(score, p, 0.5, generator=_gen(15))
    assert len(idx) == 50 and len(set(idx.tolist())) == 50
    assert bool(torch.isfinite(sampled_weights[-1]).all()) and bool((sampled_weights[-1] >= 0).all())


def _integer_strata_score() -> tuple[torch.Tensor, torch.Tensor]:
    """1600 scores on the integers 0 … 49 (one per stratum, exponentially skewed sizes) plus 400 of 1000 and above."""
    sizes = [max(1, int(150 * math.exp(-j / 6))) for j in range(50)]
    sizes[0] += 1600 - sum(sizes)
    strata = torch.repeat_interleave(torch.arange(50, dtype=torch.float64), torch.tensor(sizes))
    cut = 1000 + torch.arange(400, dtype=torch.float64)  # the 20 % hardest (highest), which CCS drops first
    perm = torch.randperm(2000, generator=_gen(11))
    return torch.cat([strata, cut])[perm], torch.tensor(sizes)


@pytest.mark.parametrize("ratio", [0.9, 0.5])
def test_ccs_spreads_the_budget_evenly_capped_by_stratum_size(ratio: float) -> None:
    """Check that CCS skips the hardest 20 % (the highest scores here, the lowest margins in the CCS code), keeps k
    distinct indices, and fills strata evenly (±1) unless exhausted."""
    score, sizes = _integer_strata_score()
    idx = ccs_select(score, ratio, generator=_gen(12))
    k = keep_count(2000, ratio)
    assert len(idx) == k and len(set(idx.tolist())) == k
    assert bool((score[idx] < 1000).all())  # none of the 400 = 20 % hardest
    counts = torch.bincount(score[idx].long(), minlength=50)
    assert bool((counts <= sizes).all()) and bool((counts > 0).all())
    open_bins = counts < sizes
    assert open_bins.any()
    assert int(counts[open_bins].max() - counts[open_bins].min()) <= 1, counts.tolist()
    # A stratum is exhausted only when it is no larger than what the open strata get.
    assert max(sizes[~open_bins].tolist(), default=0) <= int(counts[open_bins].max()), (
        counts.tolist(),
        sizes.tolist(),
    )
    torch.testing.assert_close(idx, ccs_select(score, ratio, generator=_gen(12)))
    assert set(idx.tolist()) != set(ccs_select(score, ratio, generator=_gen(13)).tolist())


def test_ccs_covers_every_stratum_of_a_skewed_score() -> None:
    """Check that on a skewed (Exp³) score CCS hits every non-empty stratum of the kept range, more than random does."""
    score = torch.empty(2000, dtype=torch.float64).exponential_(generator=_gen(14)) ** 3
    idx = ccs_select(score, 0.9, generator=_gen(15))
    assert len(idx) == 200 and len(set(idx.tolist())) == 200
    order = score.argsort()
    kept, cut = order[:1600], order[1600:]  # the hardest 20 % are dropped
    assert not set(idx.tolist()) & set(cut.tolist())
    low, high = float(score[kept].min()), float(score[kept].max())

    def strata(i: torch.Tensor) -> set[int]:
        return set(((score[i] - low) / (high - low) * 50).long().clamp(0, 49).tolist())

    random_subset = kept[torch.randperm(1600, generator=_gen(16))[:200]]
    assert strata(idx) == strata(kept)
    assert len(strata(idx)) > len(strata(random_subset)), (
        len(strata(idx)),
        len(strata(random_subset)),
    )


def test_ccs_strata_do_not_depend_on_a_score_offset() -> None:
    """Check that adding a constant to the score (negative or large scores) leaves the CCS selection unchanged."""
    score, _ = _integer_strata_score()
    base = ccs_select(score, 0.9, generator=_gen(17))
    for offset in (-1000.0, 1e5):
        torch.testing.assert_close(ccs_select(score + offset, 0.9, generator=_gen(17)), base)


def test_ccs_cuts_the_hardest_end_of_a_separate_cut_score() -> None:
    """Check, by hand, that with ``cut_by`` the hard cut follows that score (CCS cuts by AUM's lowest margins) while
    the strata follow ``score``, and that cutting nothing keeps one sample per stratum of an evenly spread score."""
    n = 100
    score = torch.arange(n, dtype=torch.float64)  # one sample per unit: 2 per stratum of 50
    cut_by = torch.zeros(n, dtype=torch.float64)
    cut_by[::10] = 1.0  # the 10 samples 0, 10, …, 90 are the hardest by the cut score
    idx = ccs_select(score, 0.5, hard_cut=0.1, cut_by=cut_by, generator=_gen(18))
    assert len(idx) == 50 and not set(idx.tolist()) & set(range(0, n, 10))
    whole = ccs_select(score, 0.5, hard_cut=0.0, generator=_gen(18))
    # 50 strata of width 99.0099…/50 ≈ 1.98 over 0 … 99 hold 2 samples each: an even budget keeps one of each.
    assert torch.bincount((score[whole] / (99.0099 / 50)).long(), minlength=50).tolist() == [1] * 50
    with pytest.raises(ValueError, match="hard_cut"):
        ccs_select(score, 0.5, hard_cut=1.0)
    with pytest.raises(ValueError, match="cut_by"):
        ccs_select(score, 0.5, cut_by=cut_by[:50])


def test_ccs_over_aum_drops_the_mislabelled_samples_a_low_cut_would_keep() -> None:
    """Check the direction on a labelled case: samples whose given label never wins (margin < 0, as mislabelled
    ones) are the hardest by AUM, and CCS's hard cut removes them; cutting the other end would keep all of them."""
    n = 200
    labels = torch.zeros(n, dtype=torch.long)
    probs = torch.tensor([0.8, 0.1, 0.1], dtype=torch.float64).repeat(5, n, 1)  # (E, N, C): label 0 wins
    probs[:, :20] = torch.tensor([0.1, 0.8, 0.1], dtype=torch.float64)  # 20 "mislabelled": class 1 wins
    probs[:, 20:, 0] -= torch.linspace(0, 0.3, n - 20, dtype=torch.float64)  # spread the clean margins
    probs[:, 20:, 2] += torch.linspace(0, 0.3, n - 20, dtype=torch.float64)
    aum = aum_score(probs, labels)
    assert bool((aum[:20] > aum[20:].max()).all())  # negated margin 0.7 > any clean one (≤ −0.1)
    kept = ccs_select(aum, 0.5, hard_cut=0.1, cut_by=aum, generator=_gen(19))
    assert not set(kept.tolist()) & set(range(20)) and len(kept) == 100
    assert not set(aum.argsort()[: n // 10].tolist()) & set(range(20))  # a cut at the low end spares all 20


def test_beta_select_reads_m_from_the_first_T_epochs_only(sampled_weights: list[torch.Tensor]) -> None:
    """Check on a 40-epoch record that m(n) and the anchor use epochs 0 … 29 only: epochs 30+ set to 1 − p change
    nothing, and the weights equal the hand formula with m from the first 30 epochs."""
    m, p30 = _spread_dynamics()
    p = torch.cat([p30, 1 - p30[:10]])  # 40 epochs; the last 10 would move every m(n) towards 1 − m(n)
    score = dual_score(p)
    idx = beta_select(score, p, 0.9, generator=_gen(20))
    torch.testing.assert_close(idx, beta_select(score, p30, 0.9, generator=_gen(20)))
    a = float(m[:10].mean())
    b = 15 * (1 - a) * (1 - 0.9**4)
    expected = torch.from_numpy(beta_dist.pdf(m.numpy(), 16 - b, b)) * score
    torch.testing.assert_close(
        sampled_weights[0] / sampled_weights[0].sum(), expected / expected.sum(), rtol=1e-9, atol=1e-15
    )
    with pytest.raises(ValueError, match="needs 30 recorded epochs, the record has 12"):
        beta_select(score, p[:12], 0.9)


def test_scores_refuse_logits_in_place_of_probabilities() -> None:
    """Check that DUAL, Dyn-Unc and the Beta sampling refuse values outside [0, 1] or NaN, naming the argument."""
    logits = torch.randn(30, 50, generator=_gen(21), dtype=torch.float64) * 5
    with pytest.raises(ValueError, match=r"target_probs must hold probabilities in \[0, 1\]"):
        dual_score(logits)
    with pytest.raises(ValueError, match="probabilities"):
        dyn_unc_score(logits)
    p = torch.rand(30, 50, generator=_gen(22), dtype=torch.float64)
    p[3, 7] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        beta_select(torch.rand(50, dtype=torch.float64), p, 0.5)


def test_dual_score_and_beta_weights_equal_the_official_code(reference, sampled_weights: list[torch.Tensor]) -> None:
    """Check DUAL (T = 30 and 20) and the Beta sampling's weights at r = 0.5 / 0.9 against the official functions on
    a 40-epoch record (behaapyy/dual-pruning 4ab525d, ``dual`` and ``beta_sampling``; the official code is float32)."""
    ref = reference("dual", "official_core")
    tp = torch.from_numpy(ref["target_probs"]).double()
    score = dual_score(tp, epochs=30, window=10)
    torch.testing.assert_close(score, torch.from_numpy(ref["dual_score_T30"]), rtol=0, atol=1e-6)
    torch.testing.assert_close(dual_score(tp, epochs=20), torch.from_numpy(ref["dual_score_T20"]), rtol=0, atol=1e-6)
    for ratio, key in ((0.5, "beta_p_r05"), (0.9, "beta_p_r09")):
        kept = beta_select(score, tp, ratio, c_d=4.0, epochs=30, generator=_gen(0))
        assert len(kept) == len(ref[f"keep_{key[-3:]}_npseed0"])  # the official draw's size: ⌊(1 − r)·64⌋
        torch.testing.assert_close(
            sampled_weights[-1] / sampled_weights[-1].sum(), torch.from_numpy(ref[key]), rtol=0, atol=1e-6
        )
