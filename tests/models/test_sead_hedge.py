"""SEAD's pure parts: Hedge with fixed share, the SEAD++ sampler and the quantile normaliser (card §2.2–2.5, §9)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from zoo.models.sead.hedge import Hedge, SEADPlusPlusSampler
from zoo.models.sead.normalize import QuantileNormalizer

# ---------------------------------------------------------------------------------------------------------- Hedge


def _numpy_fixed_share(losses: np.ndarray, eta: float, share: float, prior: np.ndarray) -> np.ndarray:
    """Linear-space float64 reference: exp-weights, renormalise, then mix with the prior."""
    w = prior / prior.sum()
    pi = w.copy()
    out = []
    for loss in losses:
        w = w * np.exp(-eta * loss)
        w = w / w.sum()
        w = (1 - share) * w + share * pi
        out.append(w.copy())
    return np.stack(out)


def test_hedge_matches_numpy_reference() -> None:
    """Check that Hedge's log-space update equals a float64 numpy exp-weights + fixed-share over 200 steps."""
    rng = np.random.default_rng(0)
    prior = rng.uniform(0.5, 2.0, size=5)
    losses = rng.uniform(0.0, 1.0, size=(200, 5))
    ref = _numpy_fixed_share(losses, eta=0.7, share=1e-3, prior=prior)
    hedge = Hedge(5, eta=0.7, share=1e-3, prior=prior.tolist())
    for t, loss in enumerate(losses):
        hedge.update(torch.from_numpy(loss))
        np.testing.assert_allclose(hedge.log_w.exp().numpy(), ref[t], rtol=1e-10, atol=1e-14)


def test_hedge_weights_stay_above_share_floor_over_long_stream() -> None:
    """Check that 100,000 steps of loss 1 on one detector keep its weight >= share·π_i, sums at 1, and no NaN."""
    hedge = Hedge(4, eta=1.0, share=1e-6)
    loss = torch.tensor([1.0, 0.0, 0.0, 0.0])
    for _ in range(100_000):
        hedge.update(loss)
    w64 = hedge.log_w.exp()
    assert torch.isfinite(hedge.log_w).all()
    assert float(w64[0]) >= 1e-6 * 0.25 * (1 - 1e-9)
    assert float(w64[0]) < 1e-6  # it did fall to the floor, not stay high
    w = hedge.weights()
    assert w.dtype == torch.float32 and not torch.isnan(w).any()
    assert abs(float(w.sum()) - 1.0) < 1e-6


def _steps_to_recover(share: float, max_steps: int) -> int | None:
    """Detector 1 loses for 1000 steps, then wins; return steps until its weight passes 0.5 (None: never)."""
    hedge = Hedge(2, eta=1.0, share=share)
    for _ in range(1000):
        hedge.update(torch.tensor([0.0, 1.0]))
    for step in range(1, max_steps + 1):
        hedge.update(torch.tensor([1.0, 0.0]))
        if float(hedge.weights()[1]) > 0.5:
            return step
    return None


def test_hedge_share_lets_a_bad_detector_recover_after_drift() -> None:
    """Check that with share 1e-6 a long-bad detector wins within ~ln(Mλ)/(ηΔ) steps, and with share 0 it cannot."""
    bound = math.log(2 * 1e6) / (1.0 * 1.0)  # M = 2, λ = 1e6, η = 1, Δ = 1: 14.5 steps
    steps = _steps_to_recover(1e-6, max_steps=200)
    assert steps is not None and steps <= bound + 2  # measured: 15
    assert _steps_to_recover(0.0, max_steps=50) is None  # pure Hedge must first repay a 1000-step lead


@pytest.mark.parametrize("eta", [None, 1.0])
def test_hedge_regret_is_within_standard_bound(eta: float | None) -> None:
    """Check that Hedge's regret against the best fixed detector is <= ln M / η + η T / 8 on [0, 1] losses."""
    M, T = 8, 2000
    eta = math.sqrt(8 * math.log(M) / T) if eta is None else eta
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        offsets = torch.linspace(0.0, 0.3, M)  # a detector that is best on average, plus noise
        losses = (torch.rand(T, M, generator=g, dtype=torch.float64) * 0.7 + offsets).clamp(0, 1)
        hedge = Hedge(M, eta=eta, share=0.0)
        total = 0.0
        for loss in losses:
            total += float((hedge.log_w.exp() * loss).sum())
            hedge.update(loss)
        regret = total - float(losses.sum(0).min())
        assert regret <= math.log(M) / eta + eta * T / 8


def test_hedge_rejects_non_finite_loss_without_changing_state() -> None:
    """Check that a NaN loss raises ValueError and leaves log_w untouched."""
    hedge = Hedge(3)
    hedge.update(torch.tensor([0.2, 0.5, 0.9]))
    before = hedge.log_w.clone()
    with pytest.raises(ValueError, match="non-finite loss"):
        hedge.update(torch.tensor([0.1, float("nan"), 0.3]))
    assert torch.equal(hedge.log_w, before)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        hedge.update(torch.zeros(4))
    with pytest.raises(ValueError, match="share"):
        Hedge(3, share=1.0)


# -------------------------------------------------------------------------------------------------------- SEAD++


def _run_draws(sampler: SEADPlusPlusSampler, w: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    masks, incl = zip(*(sampler.draw(w) for _ in range(n)))
    return torch.stack(masks), torch.stack(incl)


def test_sampler_inclusion_frequencies_match_min_one_kp() -> None:
    """Check that over 20,000 draws each detector is drawn with frequency min(1, k p_i) (± 0.01)."""
    w = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.01, 0.01])
    sampler = SEADPlusPlusSampler(k=2, gamma=0.05, seed=3)
    masks, incl = _run_draws(sampler, w, 20_000)
    p = sampler.probabilities(w)
    expected = (2 * p).clamp(max=1.0)
    assert torch.allclose(incl[0].double(), expected, atol=1e-6)
    # a forced draw (none picked) adds P(none) to the argmax: the documented, tiny bias
    expected[p.argmax()] += torch.prod(1 - expected)
    assert (masks.double().mean(0) - expected).abs().max() < 0.01
    assert masks.any(dim=1).all()


def test_sampler_importance_loss_is_unbiased_when_uncapped() -> None:
    """Check that the mean of ŝ·1[drawn]/P(i) over many draws equals ŝ when no loss reaches the 1/γ cap."""
    w = torch.tensor([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])  # k p_0 >= 1: never a forced draw
    s_hat = torch.tensor([0.9, 0.1, 0.5, 1.0, 0.3, 0.7])
    sampler = SEADPlusPlusSampler(k=3, gamma=0.05, seed=1)
    losses = []
    for _ in range(20_000):
        mask, incl = sampler.draw(w)
        losses.append(sampler.importance_loss(s_hat, mask, incl))
    losses_t = torch.stack(losses)
    assert float(losses_t.max()) < 1 / 0.05  # uncapped regime
    assert (losses_t.mean(0) - s_hat).abs().max() < 0.05
    capped = sampler.importance_loss(s_hat, torch.ones(6, dtype=torch.bool), torch.full((6,), 0.01), cap=1.0)
    assert float(capped.max()) == 1.0


def test_sampler_combine_renormalises_over_drawn_set() -> None:
    """Check that combine is the w-weighted mean of the drawn detectors only (NaN elsewhere is ignored)."""
    sampler = SEADPlusPlusSampler(k=1)
    s_hat = torch.tensor([0.2, float("nan"), 0.8])
    out = sampler.combine(s_hat, torch.tensor([True, False, True]), torch.tensor([0.25, 0.5, 0.25]))
    assert float(out) == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------------- normaliser


def test_normalizer_quantiles_are_exact_below_capacity() -> None:
    """Check that below capacity quantiles equal torch.quantile (linear) and cdf equals the empirical CDF."""
    g = torch.Generator().manual_seed(0)
    cols = [torch.randn(500, generator=g), torch.rand(500, generator=g).exp(), torch.randn(500, generator=g) * 1e3]
    hist = torch.stack(cols, 1)
    norm = QuantileNormalizer(3, capacity=1024)
    for row in hist:
        norm.insert(row)
    h64 = hist.double()
    for q in (0.0, 0.01, 0.1, 0.37, 0.5, 0.99, 1.0):
        torch.testing.assert_close(norm.quantiles(q), torch.quantile(h64, q, dim=0), rtol=1e-12, atol=1e-12)
    cdf = QuantileNormalizer(3, mode="cdf", capacity=1024)
    cdf.load_state_dict(norm.state_dict())
    s = hist[17] + 1e-4
    torch.testing.assert_close(cdf.normalize(s), (hist <= s).float().mean(0))


@pytest.mark.parametrize("dist", ["normal", "exponential"])
def test_normalizer_sketch_rank_error_is_bounded_after_compaction(dist: str) -> None:
    """Check that after 10× capacity inserts the rank error of Q(q) stays below 0.01 (measured <= 0.004)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10_240) if dist == "normal" else rng.exponential(size=10_240)
    norm = QuantileNormalizer(1, capacity=1024)
    for v in torch.from_numpy(x).unsqueeze(1):
        norm.insert(v)
    assert int(norm.level) > 0 and int(norm.count) <= 1024 and float(norm.weight.sum()) == 10_240
    for q in (0.01, 0.1, 0.5, 0.9, 0.99):
        assert abs((x <= float(norm.quantiles(q))).mean() - q) < 0.01


def test_normalizer_returns_half_for_degenerate_and_non_finite_scores() -> None:
    """Check that NaN/inf, fewer than 2 stored values and a constant detector all give ŝ = 0.5."""
    norm = QuantileNormalizer(3)
    assert torch.equal(norm.normalize(torch.tensor([1.0, 2.0, 3.0])), torch.full((3,), 0.5))
    norm.insert(torch.tensor([1.0, 4.0, 3.0]))
    assert torch.equal(norm.normalize(torch.tensor([5.0, 5.0, 5.0])), torch.full((3,), 0.5))  # one value stored
    for v in range(10):
        norm.insert(torch.tensor([float(v), 4.0, float(v)]))
    out = norm.normalize(torch.tensor([float("nan"), 9.0, float("inf")]))
    assert torch.equal(out, torch.full((3,), 0.5))  # NaN, constant detector (q_hi == q_lo), inf
    counts = norm.count.clone()
    norm.insert(torch.tensor([float("nan"), float("-inf"), 1.0]))
    assert norm.count.tolist() == [counts[0], counts[1], counts[2] + 1]  # non-finite scores are not stored
    assert 0.0 < float(norm.normalize(torch.tensor([4.0, 4.0, 4.0]))[0]) < 1.0


def test_normalizer_normalizes_with_sketch_before_insert() -> None:
    """Check that normalize-then-insert differs from insert-then-normalize (the current point must not leak)."""
    for mode, clip, s, before, after in (("quantile_minmax", False, 8.0, 2.0, 1.0), ("cdf", True, 2.5, 0.6, 4 / 6)):
        norm = QuantileNormalizer(1, mode=mode, q_lo=0.0, q_hi=1.0)
        for v in range(5):
            norm.insert(torch.tensor([float(v)]))
        leaked = copy.deepcopy(norm)
        assert float(norm(torch.tensor([s]), clip=clip)) == pytest.approx(before)  # forward: normalise, then insert
        leaked.insert(torch.tensor([s]))
        assert float(leaked.normalize(torch.tensor([s]), clip=clip)) == pytest.approx(after)
        assert torch.equal(norm.values, leaked.values)


def test_normalizer_cdf_is_uniform_while_minmax_favours_skewed_detectors() -> None:
    """Check that cdf gives mean ŝ ≈ 0.5 for any stationary detector, while min–max gives a skewed one mean < 0.3."""
    rng = np.random.default_rng(0)
    stream = torch.from_numpy(np.stack([rng.exponential(size=2000), rng.uniform(size=2000)], 1))
    means = {}
    for mode in ("cdf", "quantile_minmax"):
        norm = QuantileNormalizer(2, mode=mode)
        out = torch.stack([norm(row) for row in stream])[200:]  # skip the warm-up
        means[mode] = out.mean(0)
    assert (means["cdf"] - 0.5).abs().max() < 0.03  # the card's argument: every detector looks alike
    assert float(means["quantile_minmax"][0]) < 0.3  # exponential (good detector shape): measured ≈ 0.21
    assert abs(float(means["quantile_minmax"][1]) - 0.5) < 0.05  # uniform (random scorer)


def test_normalizer_rejects_bad_arguments_and_shapes() -> None:
    """Check that a bad mode, capacity or score shape raises ValueError naming the expectation."""
    with pytest.raises(ValueError, match="'quantile_minmax' or 'cdf'"):
        QuantileNormalizer(2, mode="rank")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="even `capacity`"):
        QuantileNormalizer(2, capacity=7)
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(3,\)"):
        QuantileNormalizer(2).normalize(torch.zeros(3))


@pytest.mark.parametrize("mode", ["quantile_minmax", "cdf"])
@pytest.mark.parametrize("capacity", [8, 64, 1024])
def test_normalizer_forward_chunk_equals_row_by_row(mode: str, capacity: int) -> None:
    """Check that forward_chunk over uneven chunks equals forward row by row, bit for bit, through compactions,
    ties, a constant detector and NaN/inf scores."""
    g = torch.Generator().manual_seed(0)
    S = torch.randn(1500, 5, generator=g).exp()
    S[:, 2] = 1.0
    S[5:9, 1] = float("nan")
    S[100, 3] = float("inf")
    S[:, 4] = (S[:, 4] * 4).round()
    a, b = QuantileNormalizer(5, mode=mode, capacity=capacity), QuantileNormalizer(5, mode=mode, capacity=capacity)
    expected = torch.stack([a(s) for s in S])
    chunks, i = [], 0
    for size in (1, 5, 40, 100, 3, 500, 851):
        chunks.append(b.forward_chunk(S[i : i + size]))
        i += size
    assert torch.equal(torch.cat(chunks), expected)
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    if capacity == 8:
        assert int(b.level.max()) > 0


def test_hedge_update_many_equals_update_loop() -> None:
    """Check that update_many returns the weights before/after each active update, as update() called in a loop."""
    g = torch.Generator().manual_seed(1)
    losses = torch.rand(300, 6, generator=g)
    active = torch.arange(300) >= 40
    a, b = Hedge(6, share=1e-3), Hedge(6, share=1e-3)
    before, after = [], []
    for loss, on in zip(losses, active):
        before.append(a.weights())
        if on:
            a.update(loss)
        after.append(a.weights())
    got_before, got_after = b.update_many(losses, active)
    torch.testing.assert_close(got_before, torch.stack(before), rtol=0, atol=1e-7)
    torch.testing.assert_close(got_after, torch.stack(after), rtol=0, atol=1e-7)
    torch.testing.assert_close(b.log_w, a.log_w, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="non-finite"):
        b.update_many(torch.full((2, 6), float("nan")), torch.ones(2, dtype=torch.bool))


# ------------------------------------------------------------------------------------------------- checkpointing


def test_state_dict_round_trip_continues_identically() -> None:
    """Check that restoring log_w, the sketch (compacted) and the sampler's step gives the same continuation."""

    def make() -> torch.nn.ModuleDict:
        return torch.nn.ModuleDict(
            {"norm": QuantileNormalizer(4, capacity=16), "hedge": Hedge(4), "sampler": SEADPlusPlusSampler(k=2, seed=7)}
        )

    def run(parts: torch.nn.ModuleDict, raws: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for raw in raws:
            mask, incl = parts["sampler"].draw(parts["hedge"].weights())
            s_hat = parts["norm"](torch.where(mask, raw, torch.full_like(raw, float("nan"))))
            parts["hedge"].update(parts["sampler"].importance_loss(s_hat, mask, incl))
            outs += [mask, s_hat, parts["hedge"].log_w.clone()]
        return outs

    g = torch.Generator().manual_seed(0)
    raws = torch.randn(120, 4, generator=g).exp()
    first = make()
    run(first, raws[:60])
    state = copy.deepcopy(first.state_dict())
    assert int(first["norm"].level.max()) > 0  # the sketch was compacted before the checkpoint
    expected = run(first, raws[60:])
    second = make()
    second.load_state_dict(state)
    for a, b in zip(expected, run(second, raws[60:])):
        assert torch.equal(a, b)


def test_hedge_update_many_matches_numpy_reference_with_eta_and_prior() -> None:
    """Check update_many (the path the ensemble runs) against the float64 reference at η = 0.7 with a non-uniform
    prior: dropping η, or the prior in the share step, changes the weights far beyond the tolerance."""
    rng = np.random.default_rng(3)
    prior = rng.uniform(0.5, 2.0, size=5)
    losses = rng.uniform(0.0, 1.0, size=(200, 5))
    ref = _numpy_fixed_share(losses, eta=0.7, share=1e-3, prior=prior)
    hedge = Hedge(5, eta=0.7, share=1e-3, prior=prior.tolist())
    _, after = hedge.update_many(torch.from_numpy(losses), torch.ones(200, dtype=torch.bool))
    np.testing.assert_allclose(after.double().numpy(), ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hedge.log_w.exp().numpy(), ref[-1], rtol=1e-10, atol=1e-14)
    # The tolerance separates: η = 1 (η dropped) ends elsewhere.
    assert np.abs(_numpy_fixed_share(losses, eta=1.0, share=1e-3, prior=prior)[-1] - ref[-1]).max() > 1e-3


def test_normalizer_exact_history_never_compacts_and_matches_torch_quantile() -> None:
    """Check capacity=None past the first 1,024 slots: quantiles equal torch.quantile of the whole history at every
    step tested, nothing is compacted, and forward_chunk equals forward row by row (the growth is invisible)."""
    g = torch.Generator().manual_seed(0)
    S = torch.randn(2600, 3, generator=g).exp()
    S[:1300, 1] *= 3.0  # a drifting detector: the case where the bounded sketch's tail quantile drifts off
    S[40:45, 2] = float("nan")
    a, b = QuantileNormalizer(3, capacity=None), QuantileNormalizer(3, capacity=None)
    expected = []
    for t, s in enumerate(S):
        if t in (10, 1023, 1024, 1500, 2599):
            hist = S[:t].double()
            for q in (0.01, 0.99):
                ref = torch.stack([torch.quantile(hist[:, j][torch.isfinite(hist[:, j])], q) for j in range(3)])
                torch.testing.assert_close(a.quantiles(q), ref, rtol=1e-12, atol=1e-12)
        expected.append(a(s))
    got = torch.cat([b.forward_chunk(S[i : i + n]) for i, n in ((0, 7), (7, 1200), (1207, 1393))])
    assert torch.equal(got, torch.stack(expected))
    assert int(a.level.max()) == 0 and a.count.tolist() == [2600, 2600, 2595] and a.capacity >= 2600
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))


def test_normalizer_exact_history_state_dict_round_trip() -> None:
    """Check that a fresh exact normaliser takes a grown checkpoint (its width differs) and continues identically;
    a bounded one still refuses a checkpoint of another width."""
    g = torch.Generator().manual_seed(1)
    S = torch.rand(1500, 2, generator=g)
    first = QuantileNormalizer(2, capacity=None)
    first.forward_chunk(S[:1100])
    second = QuantileNormalizer(2, capacity=None)
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    assert second.capacity == first.capacity > 1024
    assert torch.equal(first.forward_chunk(S[1100:]), second.forward_chunk(S[1100:]))
    with pytest.raises(RuntimeError, match="size mismatch"):
        QuantileNormalizer(2).load_state_dict(first.state_dict())
