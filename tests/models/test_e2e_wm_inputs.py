"""e2e-wm: MGDA, gradient isolation, exact p-values, FPR by length and input checks, each against an independent
reference (hand-derived numbers, closed forms, exact binomial sums or scipy), never a value of the code under test."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from scipy import stats
from torch import nn

from zoo.datamodules.synlang import SynLang
from zoo.models.e2e_wm import E2EWatermark, KGWWatermark, PerturbationEncoder, UnigramWatermark
from zoo.models.e2e_wm.detect import detect, report
from zoo.models.e2e_wm.generation import differentiable_generate
from zoo.models.e2e_wm.lm import GRULM
from zoo.models.e2e_wm.mgda import mgda_combine, mgda_two_task
from zoo.models.e2e_wm.watermarks import EXPWatermark, green_lists, keyed_uniforms

# ------------------------------------------------------------------------------------------------ MGDA


@pytest.mark.parametrize(
    ("g_d", "g_s", "cap", "alpha", "combined"),
    [
        # interior: α = ((g_s − g_d)·g_s)/‖g_s − g_d‖² = (4 − 0)/(1 + 4) = 4/5; 0.8·(1, 0) + 0.2·(0, 2) = (0.8, 0.4)
        ((1.0, 0.0), (0.0, 2.0), None, 0.8, (0.8, 0.4)),
        ((1.0, 0.0), (0.0, 2.0), 1.0, 0.8, (0.8, 0.4)),  # cap 1 is plain MGDA
        # the official cap: α = min(4/5, 0.01); 0.01·(1, 0) + 0.99·(0, 2) = (0.01, 1.98)
        ((1.0, 0.0), (0.0, 2.0), 0.01, 0.01, (0.01, 1.98)),
        # g_d·g_s = 2 ≥ g_d·g_d = 1: the segment's min-norm point is g_d itself (α = 1): (1, 0)
        ((1.0, 0.0), (2.0, 0.0), None, 1.0, (1.0, 0.0)),
        # g_d·g_s = 2 ≥ g_s·g_s = 1 (and < g_d·g_d = 5): the min-norm point is g_s itself (α = 0): (1, 0)
        ((2.0, 1.0), (1.0, 0.0), None, 0.0, (1.0, 0.0)),
        ((2.0, 1.0), (1.0, 0.0), 0.01, 0.0, (1.0, 0.0)),  # the cap never raises α
    ],
)
def test_mgda_hand_cases(g_d, g_s, cap, alpha, combined):
    g_d, g_s = torch.tensor(g_d), torch.tensor(g_s)
    assert float(mgda_two_task(g_d, g_s, cap=cap)) == pytest.approx(alpha, abs=1e-6)
    g, a = mgda_combine(g_d, g_s, cap)
    assert float(a) == pytest.approx(alpha, abs=1e-6)
    assert g.tolist() == pytest.approx(list(combined), abs=1e-6)  # (1 − α)·g_d + α·g_s would differ in every case


def _enc_grads(model: E2EWatermark, loss: torch.Tensor) -> torch.Tensor:
    params = list(model.encoder.parameters())
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for p, g in zip(params, grads)])


class _Recorder:
    """Stands in for an optimiser: zero_grad clears, step records the gradients it would apply."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in self.params])


@pytest.mark.parametrize("cap", [None, 0.01])
def test_training_step_applies_alpha_g_d_plus_one_minus_alpha_g_s(cap, monkeypatch):
    """The encoder's gradient that the training step hands its optimiser is α·g_D + (1 − α)·g_S, with g_D, g_S and α
    recomputed here by autograd on the card's losses (own BCE, own class-histogram cosine, own min-norm α), under the
    same seed. (Independent recomputation, not a spy on mgda_combine.) Plain MGDA's min-norm point does not depend on
    the order of the two gradients, so only the capped case (the official 0.01) can tell g_D from g_S."""
    torch.manual_seed(0)
    model = E2EWatermark(lm="e2e-wm-lm", gen_len=5, mapper_hidden=8, mapper_layers=2, sharpness=1.0,
                         decoder_hidden=8, semantic_from=3, noise="none", mgda_cap=cap)  # fmt: skip
    rec_e, rec_d = _Recorder(model.encoder.parameters()), _Recorder(model.decoder.parameters())
    monkeypatch.setattr(model, "optimizers", lambda: (rec_e, rec_d))
    monkeypatch.setattr(model, "manual_backward", lambda loss, **kw: loss.backward(**kw))
    monkeypatch.setattr(model, "log", lambda *a, **k: None)
    lang: SynLang = model.codec
    batch = (lang.sample(6, 10, torch.Generator().manual_seed(1))[:, 1:],)
    E, C = model.generator.embedding, lang.membership()

    def reference():
        x_w, x_n = model._branches(batch[0][:, :4])  # the same draws as the step's (same seed, same order)
        logits = model.decoder(torch.cat([x_w, x_n]) @ E)
        target = torch.tensor([1.0] * 6 + [0.0] * 6)
        loss_d = 10.0 * nn.functional.binary_cross_entropy_with_logits(logits, target)
        hist = lambda x: nn.functional.normalize((x @ C).sum(1), dim=-1)  # the card's sem(x)
        loss_s = -(hist(x_w) * hist(x_n)).sum(-1).mean()
        return _enc_grads(model, loss_d), _enc_grads(model, loss_s)

    # stage 1 (step < semantic_from): the encoder follows g_D alone
    model.train_steps = 2
    torch.manual_seed(5)
    model.training_step(batch, 0)
    torch.manual_seed(5)
    g_d, _ = reference()
    assert float(g_d.norm()) > 0 and torch.allclose(rec_e.grads, g_d, rtol=1e-4, atol=1e-7)

    # stage 2: MGDA
    model.train_steps = 3
    torch.manual_seed(7)
    model.training_step(batch, 0)
    torch.manual_seed(7)
    g_d, g_s = reference()
    alpha = float(((g_s - g_d) @ g_s) / (g_s - g_d).pow(2).sum())  # the segment's min-norm point, unclipped
    alpha = min(max(alpha, 0.0), 1.0)
    alpha = alpha if cap is None else min(alpha, cap)
    expected, swapped = alpha * g_d + (1 - alpha) * g_s, (1 - alpha) * g_d + alpha * g_s
    # the check can tell the orientations apart: α is away from ½ and the two gradients differ
    assert abs(alpha - 0.5) > 0.1 and float((expected - swapped).norm()) > 0.1 * float(expected.norm())
    assert torch.allclose(rec_e.grads, expected, rtol=1e-3, atol=1e-4 * float(expected.abs().max()))
    assert rec_d.grads is not None and float(rec_d.grads.norm()) > 0  # the decoder still learns from L_D


# ------------------------------------------------------------------------------------------------ gradient isolation


def _generate_capturing(context: str):
    torch.manual_seed(0)
    lm = GRULM(12, embed_dim=6, hidden=8).eval()
    for p in lm.parameters():
        p.requires_grad_(False)
    enc = PerturbationEncoder(dim=6, window=3, top_k=4, delta=1.0, hidden=8, mapper_layers=2, sharpness=1.0)
    outs = []

    def perturb(logits, ctx):
        out = enc(logits, ctx, lm.embedding)
        outs.append(out)
        return out

    prompts = lm.embedding[torch.randint(0, 12, (3, 4))]
    mixes = differentiable_generate(lm, prompts, 4, perturb, window=3, tau=0.5, context=context,
                                    rng=torch.Generator().manual_seed(1))  # fmt: skip
    y = (mixes[:, 3] * torch.randn(3, 12, generator=torch.Generator().manual_seed(2))).sum()  # a function of step 3
    grads = torch.autograd.grad(y, outs, allow_unused=True, retain_graph=True)
    norm = [0.0 if g is None else float(g.abs().sum()) for g in grads]
    enc_grad = torch.autograd.grad(y, list(enc.parameters()), allow_unused=True)
    return norm, sum(0.0 if g is None else float(g.abs().sum()) for g in enc_grad)


def test_hard_context_isolates_each_step_soft_context_chains_them():
    """Hand reasoning: with context="hard" step t's perturbed logits are enc(LM logits under no_grad, detached argmax
    embeddings), so step 3's mixture depends on no earlier step's perturbed logits (exactly zero gradient); with
    "soft" the context holds the last two mixtures times the table, so steps 1 and 2 reach step 3 directly (and step 0
    only through step 1's context, a product of small factors). Either way step 3 depends on its own logits and on
    the encoder's parameters."""
    hard, hard_enc = _generate_capturing("hard")
    assert hard[:3] == [0.0, 0.0, 0.0] and hard[3] > 0 and hard_enc > 0
    soft, soft_enc = _generate_capturing("soft")
    assert soft[1] > 1e-6 and soft[2] > 1e-6 and soft[3] > 0 and soft_enc > 0
    with pytest.raises(ValueError, match="context"):
        differentiable_generate(GRULM(12, 6, 8), torch.zeros(1, 4, 6), 2, None, window=3, context="mixed")


# ------------------------------------------------------------------------------------------------ exact p-values


def _binom_tail(n: int, k: int, gamma: Fraction) -> float:
    """P(Binomial(n, γ) ≥ k), summed exactly."""
    return float(sum(math.comb(n, j) * gamma**j * (1 - gamma) ** (n - j) for j in range(k, n + 1)))


def _unigram_text(wm: UnigramWatermark, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """n token ids, the first k green and the rest red, in a random order."""
    green = wm.green()
    g_ids, r_ids = green.nonzero()[:, 0], (~green).nonzero()[:, 0]
    ids = torch.cat([g_ids[torch.randint(len(g_ids), (k,), generator=gen)],
                     r_ids[torch.randint(len(r_ids), (n - k,), generator=gen)]])  # fmt: skip
    return ids[torch.randperm(n, generator=gen)]


def _kgw_text(wm: KGWWatermark, n_scored: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """n_scored + 1 ids whose tokens 2… are green in their predecessor's list exactly k times."""
    colours = torch.tensor([True] * k + [False] * (n_scored - k))[torch.randperm(n_scored, generator=gen)]
    ids = [int(torch.randint(wm.vocab_size, (1,), generator=gen))]
    for want_green in colours.tolist():
        g = green_lists(wm.key, torch.tensor([ids[-1]]), wm.vocab_size, wm.gamma)[0]
        pool = (g if want_green else ~g).nonzero()[:, 0]
        ids.append(int(pool[torch.randint(len(pool), (1,), generator=gen)]))
    return torch.tensor(ids)


def test_keyed_p_values_are_exact_binomial_tails():
    # hand: 4 scored tokens, all green, γ = ½: P = (½)⁴ = 1/16
    uni, kgw = UnigramWatermark(50, gamma=0.5, key=3), KGWWatermark(50, gamma=0.5, key=3)
    gen = torch.Generator().manual_seed(0)
    ids = _unigram_text(uni, 4, 4, gen)[None]
    assert float(uni.p_value(uni.score(ids), torch.tensor([4]))) == pytest.approx(1 / 16, rel=1e-6)
    ids = _kgw_text(kgw, 4, 4, gen)[None]  # 5 tokens, 4 scored
    assert ids.shape == (1, 5) and float(kgw.p_value(kgw.score(ids), torch.tensor([5]))) == pytest.approx(1 / 16)
    # (n scored, k green, γ): exact sums of C(n, j)·γʲ·(1 − γ)ⁿ⁻ʲ, and scipy's binom.sf(k − 1, n, γ)
    for gamma in (Fraction(1, 2), Fraction(1, 4)):
        uni, kgw = UnigramWatermark(40, gamma=float(gamma), key=9), KGWWatermark(40, gamma=float(gamma), key=9)
        for n, k in ((1, 1), (1, 0), (5, 2), (10, 7), (20, 3), (33, 20), (40, 40)):
            ref = _binom_tail(n, k, gamma)
            assert ref == pytest.approx(stats.binom.sf(k - 1, n, float(gamma)), rel=1e-9)
            u = _unigram_text(uni, n, k, gen)[None]
            assert float(uni.p_value(uni.score(u), torch.tensor([n]))) == pytest.approx(ref, rel=1e-5), (gamma, n, k)
            w = _kgw_text(kgw, n, k, gen)[None]
            assert float(kgw.p_value(kgw.score(w), torch.tensor([n + 1]))) == pytest.approx(ref, rel=1e-5)
    # right padding: lengths decide what is counted (4 green tokens, then 6 red ones that are padding)
    uni = UnigramWatermark(50, key=3)
    red = int((~uni.green()).nonzero()[0, 0])
    row = torch.cat([_unigram_text(uni, 4, 4, gen), torch.full((6,), red)])[None]
    assert float(uni.p_value(uni.score(row, torch.tensor([4])), torch.tensor([4]))) == pytest.approx(1 / 16)
    assert float(uni.p_value(uni.score(row), torch.tensor([10]))) == pytest.approx(_binom_tail(10, 4, Fraction(1, 2)))


def _aaronson(key: int, ids: list[int], vocab: int) -> tuple[float, int]:
    """S = Σ −log(1 − r_{x_t}) over the tokens whose context (the previous token) occurs nowhere earlier, and n."""
    total, seen = 0.0, set()
    for prev, tok in itertools.pairwise(ids):
        if prev not in seen:
            total -= math.log1p(-float(keyed_uniforms(key, torch.tensor([prev]), vocab)[0, tok]))
        seen.add(prev)
    return total, len(seen)


def test_exp_p_value_is_the_gamma_tail():
    """EXP's p-value is P(Gamma(n, 1) ≥ S) over the n tokens with a fresh context: by hand e^{−S}·Σ_{j<n} S^j / j! for
    n ≤ 3 (n = 1: e^{−S} = 1 − r, the token's own keyed uniform), scipy's gamma.sf(S, n) beyond."""
    wm = EXPWatermark(30, key=5)
    p = lambda ids, lengths=None: float(wm.p_value(wm.score(torch.tensor([ids]), lengths)))
    r = keyed_uniforms(5, torch.tensor([7]), 30)[0]
    for tok in (0, 11, 29):
        assert p([7, tok]) == pytest.approx(1 - float(r[tok]), rel=1e-4)
    for ids, n in (([7, 3, 9], 2), ([7, 3, 7, 5, 2], 3), ([4, 4, 4, 4, 4, 8], 1)):  # contexts 7, 3, 7 (again), 5: n = 3
        s, n_fresh = _aaronson(5, ids, 30)
        assert n_fresh == n
        hand = math.exp(-s) * sum(s**j / math.factorial(j) for j in range(n))
        assert p(ids) == pytest.approx(hand, rel=1e-4), ids
    gen = torch.Generator().manual_seed(0)
    for length in (12, 40):
        ids = torch.randint(0, 30, (length,), generator=gen).tolist()
        s, n = _aaronson(5, ids, 30)
        assert p(ids) == pytest.approx(stats.gamma.sf(s, a=n), rel=1e-4)
        # right padding: only the first 6 tokens count
        s6, n6 = _aaronson(5, ids[:6], 30)
        assert p(ids, torch.tensor([6])) == pytest.approx(stats.gamma.sf(s6, a=n6), rel=1e-4)
    # a step whose context occurred before is not watermarked (the logits pass through)
    logits = torch.randn(1, 30)
    assert torch.equal(wm(torch.tensor([[4, 2, 4]]), logits), logits)
    assert int(torch.isfinite(wm(torch.tensor([[4, 2, 5]]), logits)).sum()) == 1


def test_exp_sampling_is_distortion_free():
    """Over 20,000 keys (previous token fixed) the first token sampled from p = (0.5, 0.3, 0.2) has frequencies p:
    each within 3.5 binomial standard deviations, and Pearson's χ² (2 d.o.f.) below its 0.999 quantile, 13.8."""
    n, p = 20_000, torch.tensor([0.5, 0.3, 0.2])
    logits, prev = p.log()[None], torch.tensor([[1]])
    counts = torch.zeros(3)
    for key in range(n):
        counts[int(EXPWatermark(3, key=key)(prev, logits).argmax())] += 1
    freq = counts / n
    assert bool(((freq - p).abs() <= 3.5 * (p * (1 - p) / n).sqrt()).all()), freq
    assert float(((counts - n * p) ** 2 / (n * p)).sum()) < stats.chi2.ppf(0.999, 2)


def test_keyed_baselines_hold_their_fpr_at_every_length():
    """On i.i.d. uniform ids the null holds exactly: for KGW and Unigram with any key (every list holds exactly γ·V
    tokens, so a uniform token is green with probability γ), for EXP over keys (r of a uniform token under a random
    key ~ U(0, 1); one fixed key on a 20-token vocabulary has only 400 values of r, and its own FPR can be off by
    a point or two). With N = 20,000 rows (EXP: 200 keys × 100 rows) the share of p ≤ 0.05 is at most
    0.05 + 3·√(0.05·0.95/N) ≈ 0.0546 (the exact binomial tests are conservative: KGW on 4 tokens cannot go below
    1/8); EXP's p-value is continuous, so its share is also at least 0.05 − 0.0046."""
    n, fpr = 20_000, 0.05
    slack = 3 * math.sqrt(fpr * (1 - fpr) / n)
    gen = torch.Generator().manual_seed(0)
    for length in (4, 8, 16, 32):
        ids = torch.randint(0, 20, (n, length), generator=gen)
        lengths = torch.full((n,), length)
        for wm in (KGWWatermark(20, key=11), UnigramWatermark(20, key=11)):
            share = float((wm.p_value(wm.score(ids), lengths) <= fpr).float().mean())
            assert share <= fpr + slack, (type(wm).__name__, length, share)
        p = []
        for key in range(200):
            exp, rows = EXPWatermark(20, key=key), ids[key * 100 : (key + 1) * 100]
            p.append(exp.p_value(exp.score(rows), lengths[:100]))
        share = float((torch.cat(p) <= fpr).float().mean())
        assert fpr - slack <= share <= fpr + slack, ("EXPWatermark", length, share)


# ------------------------------------------------------------------------------------------------ E2E per-length null


def _accumulating_decoder(model: E2EWatermark) -> None:
    """Make the decoder a running sum of per-token evidence, as a trained one is: hidden 1, input/forget/output gates
    open, c_t = c_{t−1} + tanh(w·x_t), score = tanh(c_t). Human text's scores then drift with its length (mean ∝ l,
    spread ∝ √l): a single null for all lengths would be badly off at 4 tokens."""
    lstm, head = model.decoder.lstm, model.decoder.head
    w = torch.randn(lstm.weight_ih_l0.shape[1], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.zero_()
        lstm.bias_ih_l0[[0, 1, 3]] = 30.0  # gates i, f, o (PyTorch's order i, f, g, o)
        lstm.weight_ih_l0[2] = 0.3 * w / w.norm() * model.generator.embedding.norm(dim=1).mean().reciprocal()
        lstm.bias_ih_l0[2] = 0.05  # a drift in the mean, as a decoder's bias gives
        head[0].weight.fill_(1.0), head[0].bias.fill_(1.0), head[2].weight.fill_(1.0), head[2].bias.fill_(-1.0)


def test_e2e_per_length_null_holds_its_fpr():
    """Calibrate on m = 4,000 SynLang texts, then score N = 4,000 fresh ones (another seed) per length, right-padded
    with junk. With 512 quantiles, p = (1 + #{q_j ≥ s})/513 ≤ 0.05 iff s > q_487, the null's 487/511 = 0.953 quantile:
    the conditional FPR is ≈ 1 − 0.953 = 0.047, and it varies with the calibration draw (sd √(α(1 − α)/m)) as well as
    with the fresh draw (sd √(α(1 − α)/N)). So the share flagged lies within 0.047 ± 3·√(0.047·0.953·(1/m + 1/N))
    = 0.047 ± 0.014. (With m = 400 the calibration term alone has sd 0.011: a bound of nominal + 3·√(α(1 − α)/N) +
    1/m would fail for honest calibrations; we take m large instead.)"""
    model = E2EWatermark(lm="e2e-wm-lm", eval_len=24, decoder_hidden=1)
    _accumulating_decoder(model)
    lang: SynLang = model.codec
    m, n, alpha = 4000, 4000, 1 - 487 / 511
    model.calibrate(lang.sample(m, 25, torch.Generator().manual_seed(1))[:, 1:])
    slack = 3 * math.sqrt(alpha * (1 - alpha) * (1 / m + 1 / n))
    lengths_tested = (4, 8, 16, 24)
    fresh = lang.sample(n * len(lengths_tested), 25, torch.Generator().manual_seed(2))[:, 1:]
    lengths = torch.tensor(lengths_tested).repeat_interleave(n)
    junk = torch.randint(2, 98, fresh.shape, generator=torch.Generator().manual_seed(3))
    ids = torch.where(torch.arange(24)[None] < lengths[:, None], fresh, junk)
    scores = model.score(ids, lengths).detach()
    p = model.p_value(scores, lengths)
    means = []
    for i, length in enumerate(lengths_tested):
        block = slice(i * n, (i + 1) * n)
        share = float((p[block] <= 0.05).float().mean())
        assert abs(share - alpha) <= slack, (length, share)
        means.append(float(scores[block].mean()))
    # the test can see a single null: the scores' distribution moves with length by more than its spread at 4 tokens
    assert means[-1] - means[0] > 3 * float(scores[:n].std())
    out = model.detect([lang.to_text(torch.cat([torch.tensor([1]), row[:5]])) for row in fresh[:3]], fpr=0.05)
    assert out["length"].tolist() == [5, 5, 5]
    assert torch.allclose(out["p_value"], model.p_value(model.score(fresh[:3, :5]), torch.full((3,), 5)))


def test_e2e_p_value_by_hand():
    """A hand-set null: row l − 1 (texts of l tokens) holds 1000·(l − 1) + 0, 1, …, 511. p = (1 + #{q ≥ s}) / 513,
    from the row of the text's own length (the last row beyond eval_len = 3)."""
    model = E2EWatermark(lm="e2e-wm-lm", eval_len=3, decoder_hidden=8)
    model.null_scores.copy_(torch.arange(512.0)[None] + 1000.0 * torch.arange(3.0)[:, None])
    cases = [  # (length, score, #{q ≥ s})
        (1, 511.5, 0), (1, 255.0, 257), (1, -1.0, 512), (2, 1500.0, 12), (2, 255.0, 512), (3, 2511.5, 0),
        (7, 2487.0, 25), (7, 2487.5, 24),
    ]  # fmt: skip
    lengths = torch.tensor([c[0] for c in cases])
    scores = torch.tensor([c[1] for c in cases])
    expected = [(1 + c[2]) / 513 for c in cases]
    assert model.p_value(scores, lengths).tolist() == pytest.approx(expected, rel=1e-6)
    # at fpr 0.05 the threshold is the 488th of the 512 quantiles: 25/513 ≤ 0.05 < 26/513
    assert (model.p_value(scores, lengths) <= 0.05).tolist() == [True, False, False, True, False, True, False, True]
    with pytest.raises(ValueError, match="NaN"):
        model.p_value(torch.tensor([float("nan")]), torch.tensor([2]))


# ------------------------------------------------------------------------------------------------ input checks


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise": "paraphras"}, r"noise.*did you mean 'paraphrase'"),
        ({"encoder_context": "x"}, "encoder_context"),
        ({"noise_prob": 1.5}, "noise_prob"),
        ({"mgda_cap": 2}, "mgda_cap"),
        ({"mgda_cap": -0.1}, "mgda_cap"),
        ({"delta": 0.0}, "delta"),
        ({"gumbel_tau": -1.0}, "gumbel_tau"),
        ({"temperature": 0.0}, "temperature"),
        ({"lr": 0.0}, "lr"),
        ({"hard_weight": 1.2}, "hard_weight"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        E2EWatermark(lm="e2e-wm-lm", **kwargs)


@pytest.fixture(scope="module")
def calibrated() -> E2EWatermark:
    model = E2EWatermark(lm="e2e-wm-lm", eval_len=8, decoder_hidden=8)
    model.calibrate(torch.randint(2, 98, (100, 8), generator=torch.Generator().manual_seed(0)))
    return model


def test_bad_detection_inputs(calibrated):
    model = calibrated
    for fpr in (0, 0.0, 1, 1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="fpr"):
            model.detect(["w00a w01b w02c"], fpr=fpr)
        with pytest.raises(ValueError, match="fpr"):
            detect(["w00a w01b w02c"], scheme="kgw", fpr=fpr)
    with pytest.raises(ValueError, match="torch.long"):
        model.calibrate(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="torch.long"):
        model.calibrate(torch.rand(200, 8))
    with pytest.raises(ValueError, match="at least 100"):
        model.calibrate(torch.randint(2, 98, (99, 8)))
    with pytest.raises(ValueError, match="eval_len = 8"):
        model.calibrate(torch.randint(2, 98, (100, 7)))
    ids = torch.randint(2, 98, (2, 5))
    with pytest.raises(ValueError, match=r"lengths must be in \[1, 5\]"):
        model.score(ids, torch.tensor([5, 6]))
    with pytest.raises(ValueError, match=r"lengths must be in \[1, 5\]"):
        model.score(ids, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"lengths must be \(2,\)"):
        model.score(ids, torch.tensor([5]))
    with pytest.raises(ValueError, match=r"lengths must be \(2,\)"):
        model.score(ids, torch.tensor([[5, 5]]))
    for shape in ((0, 5), (2, 0)):
        with pytest.raises(ValueError, match="no text"):
            model.score(torch.zeros(shape, dtype=torch.long))
    with pytest.raises(ValueError, match="torch.long"):
        model.score(ids.float())
    for wm in (KGWWatermark(50), UnigramWatermark(50), EXPWatermark(50)):
        for bad in (torch.tensor([[3, 50]]), torch.tensor([[3, -1]])):
            with pytest.raises(ValueError, match="another tokenizer"):
                wm.score(bad)
        with pytest.raises(ValueError, match="another LM"):
            wm(torch.tensor([[3]]), torch.zeros(1, 51))


def test_report_prints_tokens_and_short_text_warnings(tmp_path):
    """Hand: at fpr 0.01 and γ = ½ the smallest p-value of n scored tokens is ½ⁿ, and ½⁶ = 0.0156 > 0.01 ≥ ½⁷ =
    0.0078: Unigram needs 7 tokens, KGW (which scores all but the first) 8."""
    lang = SynLang()
    rows = lang.sample(2, 9, torch.Generator().manual_seed(0))
    seven, eight = lang.to_text(rows[0, :8]), lang.to_text(rows[1])  # BOS dropped: 7 and 8 words
    f = tmp_path / "texts.txt"
    f.write_text(f"{seven}\n{eight}\n")
    lines = report(f, scheme="kgw").splitlines()
    assert lines[1].split("\t") == ["text", "tokens", "score", "p_value", "watermarked"]
    assert lines[2].split("\t")[:2] == ["0", "7"] and lines[3].split("\t")[:2] == ["1", "8"]
    assert "# warning: 1 text(s) shorter than 8 tokens: no kgw p-value can reach 0.01 there" in lines
    out = report(f, scheme="unigram")
    assert "shorter than" not in out  # 7 tokens suffice for Unigram
    f.write_text(f"{lang.to_text(rows[0, :7])}\n{seven}\n")
    assert (
        "# warning: 1 text(s) shorter than 7 tokens: no unigram p-value can reach 0.01 there"
        in report(f, scheme="unigram").splitlines()
    )
    assert "shorter than" not in report(f, scheme="exp")  # EXP's continuous p-value has no floor


def test_detect_warns_when_fpr_is_below_the_smallest_e2e_p_value() -> None:
    """Check that an fpr below 1/513 (512 null quantiles: the smallest empirical p-value) is warned of, by hand."""
    from zoo.models.e2e_wm.detect import detect

    text = ["w00a w03b w11c w05a w07d w02b w00c w09a"]
    assert any("below the smallest E2E p-value" in w for w in detect(text, fpr=0.001)["warnings"])
    assert not any("below the smallest" in w for w in detect(text, fpr=1 / 513)["warnings"])
