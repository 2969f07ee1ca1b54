"""Tests of reward-refine: the chain's exact likelihood, the motif reward, the guided unmasking step (per-candidate
positions, argmax-completion values), the samplers' budgets, resampling, the bad-input errors, and the real path on
small files (FASTA / CSV sequences, a trained activity oracle as the reward)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from zoo.datamodules.dna import MarkovDNA, MarkovDNADataModule, decode, encode, read_sequences
from zoo.models.reward_refine import (
    ActivityOracle,
    CountedReward,
    MaskedDiffusion,
    MotifReward,
    best_of_n,
    diversity,
    guided_unmask,
    motif_counts,
    pseudo_log_likelihood,
    refine,
    refine_budget,
    remask,
    resample,
    rounds_for_budget,
    svdd,
    unguided,
)
from zoo.models.reward_refine.reproduce import ARMS, CHECKS, CLAIMS, _rises


class FixedLogits(nn.Module):
    """A "denoiser" whose logits do not depend on the input: one distribution ``p`` at every position."""

    def __init__(self, p: list[float], length: int = 6) -> None:
        super().__init__()
        self.length, self.mask_id = length, len(p)
        self.logits = nn.Parameter(torch.tensor(p).log(), requires_grad=False)
        self.inputs: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        self.inputs.append(x.clone())
        return self.logits.expand(len(x), self.length, -1)


def test_chain_probabilities_sum_to_one_over_every_sequence() -> None:
    """Check that exp(log p) over all 4^4 sequences of length 4 sums to 1 and sampling matches it."""
    chain = MarkovDNA(length=4, seed=3)
    every = torch.tensor(list(itertools.product(range(4), repeat=4)))
    p = chain.log_prob(every).exp()
    assert abs(float(p.sum()) - 1) < 1e-9
    x = chain.sample(40000, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount((x * torch.tensor([64, 16, 4, 1])).sum(1), minlength=256).double() / len(x)
    assert float((freq - p).abs().max()) < 0.01


def test_encode_decode_and_clear_errors() -> None:
    """Check the round trip and the errors for foreign letters and unequal lengths."""
    assert decode(encode(["ACGT", "gatc"])) == ["ACGT", "GATC"]
    with pytest.raises(ValueError, match=r"outside the DNA alphabet ACGT: \['N'\] \(at position 2\)"):
        encode(["ACNT"])
    with pytest.raises(ValueError, match="one length"):
        encode(["ACG", "ACGT"])
    with pytest.raises(ValueError, match="unmask every position"):
        decode(torch.tensor([[0, 4]]))


def test_motif_reward_matches_a_string_implementation() -> None:
    """Check the vectorised motif counts and reward against overlapping string counts on random sequences."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, (300, 32), generator=g)
    x[:50, 3:7] = torch.tensor([2, 0, 3, 0])  # plant some motifs
    x[50:100, 10:14] = torch.tensor([3, 3, 2, 1])

    def count(s: str, m: str) -> int:
        return sum(s[i : i + 4] == m for i in range(len(s) - 3))

    expected = []
    for s in decode(x):
        a = count(s, "GATA") + count(s, "CCAT")
        b = count(s, "GATA") + count(s, "TTGC")
        gc = (s.count("G") + s.count("C")) / len(s)
        expected.append(a - 2 * max(0, b - 1) - 0.5 * abs(gc - 0.5))
    torch.testing.assert_close(MotifReward()(x), torch.tensor(expected))
    assert motif_counts(encode(["GATATA"]), [0, 3, 0]).item() == 2  # overlapping: ATA twice


def test_guided_step_gives_each_candidate_its_own_position_and_keeps_the_best_completion() -> None:
    """Check per-candidate masked positions, the argmax completion of the value forward, and the argmax choice."""
    net = FixedLogits([0.1, 0.2, 0.3, 0.4], length=8)
    reward = CountedReward(lambda t: (t == 0).sum(1).float())  # the completion fills masks with argmax = T (3)
    x = torch.full((200, 8), 4)
    masked = torch.ones(200, 8, dtype=torch.bool)
    new, new_masked = guided_unmask(net, x, masked, reward, 4, torch.Generator().manual_seed(0))
    proposal, values = net.inputs
    assert len(proposal) == 200 and len(values) == 800 and reward.calls == 800
    cands = values.view(200, 4, 8)
    filled = cands != 4
    assert bool((filled.sum(-1) == 1).all())  # each candidate fills one masked position
    positions = filled.float().argmax(-1)
    assert float((positions != positions[:, :1]).any(1).float().mean()) > 0.9  # not one shared position
    assert bool((new_masked.sum(1) == 7).all()) and bool(((new != 4) == ~new_masked).all())
    # The value of a candidate is 1 if it drew A (completions are all T): when some candidate drew A, A is kept.
    drew_a = (cands == 0).any(-1).any(-1)
    assert bool(((new == 0).any(1) == drew_a).all())


def test_unguided_sampling_draws_from_the_denoiser() -> None:
    """Check that unguided letter frequencies follow softmax(logits) and nothing is left masked."""
    p = [0.1, 0.2, 0.3, 0.4]
    d = unguided(FixedLogits(p), 4000, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(d.sequences.flatten(), minlength=5).float() / d.sequences.numel()
    assert freq[4] == 0 and float((freq[:4] - torch.tensor(p)).abs().max()) < 0.01
    assert d.reward_calls == 0 and d.denoiser_calls == 6


def test_samplers_count_their_budgets() -> None:
    """Check the reward and denoiser calls per sequence of SVDD, best-of-N and refinement against the formulas."""
    net, reward, g = FixedLogits([0.25] * 4, 8), MotifReward(), torch.Generator().manual_seed(0)
    d = svdd(net, reward, 5, 3, generator=g)
    assert (d.reward_calls, d.denoiser_calls) == (24, 8 * (1 + 3))
    d = best_of_n(net, reward, 5, 7, generator=g, chunk=12)  # chunks of 2 samples per output
    assert (d.reward_calls, d.denoiser_calls) == (7, 56)
    assert bool((d.rewards >= best_of_n(net, reward, 5, 1, generator=g).rewards.min()).all())
    d = refine(net, reward, 6, rounds=3, positions=2, candidates=2, init_candidates=3, generator=g)
    assert d.reward_calls == refine_budget(8, 3, 3, 2, 2) == 8 * 3 + 3 * (1 + 2 * 2)
    assert d.denoiser_calls == 8 * 4 + 3 * 2 * 3 and len(d.trajectory) == 4 and len(d.ess) == 3
    ga = refine(net, reward, 6, rounds=3, positions=2, candidates=1, init_candidates=3, generator=g)
    assert ga.reward_calls == refine_budget(8, 3, 3, 2, 1) == 24 + 3


def test_budget_smaller_than_one_round_is_an_error() -> None:
    """Check rounds_for_budget: the GA's rounds at RERD's budget, and a clear error below one round."""
    assert rounds_for_budget(refine_budget(32, 4, 10, 8, 4), 32, 4, 8, 4) == 10
    with pytest.raises(ValueError, match="smaller than one round"):
        rounds_for_budget(140, 32, 4, 8, 4)
    net, g = FixedLogits([0.25] * 4, 8), torch.Generator().manual_seed(0)
    d = refine(net, MotifReward(), 4, positions=2, candidates=2, init_candidates=2, budget=40, generator=g)
    assert len(d.trajectory) == 1 + (40 - 16) // 5 and d.reward_calls <= 40
    with pytest.raises(ValueError, match="a budget of 20 reward calls per sequence is smaller than one round"):
        refine(net, MotifReward(), 4, positions=2, candidates=2, init_candidates=2, budget=20)


def test_resample_weights_ess_and_nan() -> None:
    """Check exp(r/α) weights: systematic counts follow them, NaN gets weight 0, ESS is (Σw)²/Σw²."""
    pop = torch.arange(10)[:, None]
    w = torch.arange(10.0)
    r = w.log().nan_to_num(neginf=float("nan"))  # row 0: NaN
    new, ess = resample(pop, r, 1.0, torch.Generator().manual_seed(0), "systematic")
    counts = torch.bincount(new[:, 0], minlength=10).float()
    assert counts[0] == 0 and float((counts - 10 * w / w.sum()).abs().max()) < 1
    assert abs(ess - float(w.sum() ** 2 / (w**2).sum())) < 1e-6
    many, _ = resample(pop, r, 1.0, torch.Generator().manual_seed(0), "multinomial")
    assert int((many == 0).sum()) == 0
    with pytest.raises(ValueError, match="alpha"):
        resample(pop, r, 0.0)
    with pytest.raises(ValueError, match="every reward is NaN"):
        resample(pop, torch.full((4,), float("nan")), 1.0)


def test_remask_masks_each_row_at_its_own_positions() -> None:
    """Check remask: E masks per row, positions differ across rows."""
    x, masked = remask(torch.zeros(50, 16, dtype=torch.long), 5, 4, torch.Generator().manual_seed(0))
    assert bool((masked.sum(1) == 5).all()) and bool(((x == 4) == masked).all())
    assert len({tuple(row.nonzero().flatten().tolist()) for row in masked}) > 40
    with pytest.raises(ValueError, match="re-mask between"):
        remask(x, 17, 4)


def test_reward_errors_are_clear() -> None:
    """Check CountedReward on a wrong shape, NaN, inf and a non-callable; text rewards get letters."""
    x = torch.zeros(3, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape \(3, 1\) for 3 sequences"):
        CountedReward(lambda t: torch.zeros(len(t), 1))(x)
    with pytest.raises(ValueError, match="NaN for 1 of 3 sequences"):
        CountedReward(lambda t: torch.tensor([0.0, float("nan"), 1.0]))(x)
    with pytest.raises(ValueError, match="inf"):
        CountedReward(lambda t: torch.tensor([0.0, float("inf"), 1.0]))(x)
    with pytest.raises(TypeError, match="callable"):
        CountedReward(3)
    seen = CountedReward(lambda seqs: [s.count("A") for s in seqs], on_text=True)(x)
    assert seen.tolist() == [8.0, 8.0, 8.0]
    # With allow_nan, a NaN candidate is never kept while another candidate has a finite value.
    nan_reward = CountedReward(lambda t: torch.where(t[:, 0] == 0, float("nan"), 1.0), allow_nan=True)
    net = FixedLogits([0.7, 0.1, 0.1, 0.1], 4)
    x, masked = torch.full((300, 4), 1), torch.zeros(300, 4, dtype=torch.bool)
    x[:, 0], masked[:, 0] = 4, True
    new, _ = guided_unmask(net, x, masked, nan_reward, 8, torch.Generator().manual_seed(0))
    some_finite = (net.inputs[1].view(300, 8, 4)[:, :, 0] != 0).any(1)
    assert bool(((new[:, 0] != 0) == some_finite).all()) and 0 < int((~some_finite).sum()) < 60


def test_pseudo_log_likelihood_normalises_over_the_vocabulary_and_diversity() -> None:
    """Check the PLL under fixed logits equals mean log p[x] (softmax over letters, not over positions)."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    x = torch.tensor([[0, 1, 2, 3, 3, 3]])
    torch.testing.assert_close(pseudo_log_likelihood(FixedLogits(p.tolist()), x, 4), p.log()[x].mean(1))
    assert diversity(torch.tensor([[0, 0], [0, 1], [1, 1]])) == pytest.approx((0.5 + 1 + 0.5) / 3)


def test_module_loss_masks_at_least_one_position_and_trains() -> None:
    """Check the masked-diffusion loss (both weightings) is finite, differentiable and falls over a few steps."""
    torch.manual_seed(0)
    x = MarkovDNA(16).sample(256, generator=torch.Generator().manual_seed(0))
    for weighting in ("none", "mdlm"):
        model = MaskedDiffusion(length=16, weighting=weighting, chain_seed=0)
        opt = torch.optim.Adam(model.parameters(), 3e-3)
        losses = []
        for _ in range(40):
            loss, correct = model._loss(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        assert math.isfinite(losses[0]) and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="weighting"):
        MaskedDiffusion(weighting="elbo")
    with pytest.raises(ValueError, match="unknown method 'beam'"):
        model.design(MotifReward(), "beam")


def test_refinement_improves_the_reward_with_a_trained_denoiser() -> None:
    """Check on the hub denoiser: a short RERD run beats unguided samples, and predict_step edits seed designs."""
    import zoo

    model = zoo.load("reward-refine")
    g = torch.Generator().manual_seed(0)
    base = model.design(MotifReward(), "unguided", n=32, generator=g)
    d = model.design(MotifReward(), "refine", n=32, rounds=3, generator=g)
    assert float(d.rewards.mean()) > float(base.rewards.mean()) + 0.4
    out = model.predict_step((base.sequences[:8],), 0)
    assert out.shape == (8, 32) and int(out.max()) <= 3


def test_real_path_fasta_csv_and_a_trained_oracle(tmp_path: Path) -> None:
    """Check the real path on small files: a FASTA DataModule, a CSV of measured activity fit by the oracle, and
    refinement designing for the oracle."""
    chain = MarkovDNA(16, seed=1)
    x = chain.sample(600, generator=torch.Generator().manual_seed(0))
    seqs = decode(x)
    fasta = tmp_path / "enhancers.fa"
    fasta.write_text("".join(f">seq{i}\n{s[:8]}\n{s[8:]}\n" for i, s in enumerate(seqs)))
    dm = MarkovDNADataModule(length=16, batch_size=32, path=str(fasta))
    dm.setup()
    assert len(dm.train_set) == 540 and len(dm.test_set) == 30
    assert next(iter(dm.train_dataloader()))[0].shape == (32, 16)
    with pytest.raises(ValueError, match="sequences have 16 letters, the DataModule's length is 20"):
        MarkovDNADataModule(length=20, path=str(fasta)).setup()
    with pytest.raises(FileNotFoundError, match="FASTA file"):
        MarkovDNADataModule(path=str(tmp_path / "missing.fa")).setup()

    activity = MotifReward()(x)
    table = tmp_path / "activity.csv"
    table.write_text("name,sequence,activity\n" + "".join(f"s{i},{s},{a:.4f}\n" for i, (s, a) in enumerate(zip(seqs, activity))))
    names, values = read_sequences(table)
    assert names[:2] == seqs[:2] and set(values) == {"activity"}
    oracle = ActivityOracle.from_csv(table, steps=300)
    held = chain.sample(300, generator=torch.Generator().manual_seed(1))
    corr = torch.corrcoef(torch.stack([oracle(held), MotifReward()(held)]))[0, 1]
    assert float(corr) > 0.6
    with pytest.raises(ValueError, match="no numeric 'kd' column"):
        ActivityOracle.from_csv(table, activity="kd")
    bad = tmp_path / "bad.csv"
    bad.write_text("sequence,activity\nACGTNACGTACGTACG,1.0\n")
    with pytest.raises(ValueError, match="outside the DNA alphabet"):
        ActivityOracle.from_csv(bad)

    net = MaskedDiffusion(length=16).net.eval()
    d = refine(net, oracle, 8, rounds=2, positions=4, candidates=2, init_candidates=2,
               generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert d.reward_calls == refine_budget(16, 2, 2, 4, 2) and d.sequences.shape == (8, 16)


def test_every_claim_names_arms_of_the_run() -> None:
    """Check each claim's method and stand-ins are arms; the rise share on a curve."""
    for claim in CLAIMS:
        assert claim.method in ARMS and claim.stand_ins and set(claim.stand_ins) <= set(ARMS), claim.name
    assert len({c.name for c in CLAIMS} | {c.name for c in CHECKS}) == len(CLAIMS) + len(CHECKS)
    assert _rises([1.0, 2.0, 2.0, 1.0, 3.0]) == 0.75
