"""SCAN's clustering step (CLUDI's deep-clustering baseline) and the sampling measures of ``zoo reproduce cludi``,
against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.models.cludi.baselines import SCANHead, TEMIHead, mine_neighbours, scan_loss, temi_loss
from zoo.models.cludi.reproduce import agreement


def test_scan_loss_of_uniform_predictions_is_minus_four_log_two() -> None:
    # p = q = (1/2, 1/2): consistency −log(1/4 + 1/4) = log 2, entropy of the mean log 2, so log 2 − 5 log 2.
    logits = torch.zeros(3, 2)
    assert float(scan_loss(logits, logits)) == pytest.approx(-4 * math.log(2), abs=1e-6)


def test_scan_loss_matches_a_hand_computed_pair() -> None:
    # p = (3/4, 1/4), q = (1/4, 3/4): ⟨p, q⟩ = 3/8; the mean prediction is p itself, with entropy
    # −(3/4 log 3/4 + 1/4 log 1/4) = 0.562335; loss = −log 3/8 − 5 · 0.562335 = 0.980829 − 2.811675.
    anchor = torch.tensor([[math.log(3.0), 0.0]])
    assert float(scan_loss(anchor, anchor.flip(-1))) == pytest.approx(0.980829 - 2.811675, abs=1e-5)
    assert float(scan_loss(anchor, anchor, entropy_weight=0.0)) == pytest.approx(-math.log(10 / 16), abs=1e-6)


def test_mine_neighbours_ranks_by_cosine_and_excludes_each_row_itself() -> None:
    angles = torch.tensor([0.0, 10.0, 25.0, 90.0, 95.0]) * math.pi / 180
    x = torch.stack([angles.cos(), angles.sin()], dim=1) * torch.tensor([[1.0], [5.0], [0.2], [3.0], [1.0]])
    assert mine_neighbours(x, 2).tolist() == [[1, 2], [0, 2], [1, 0], [4, 2], [3, 2]]
    with pytest.raises(ValueError, match="k must be in"):
        mine_neighbours(x, 5)


def test_scan_head_recovers_well_separated_blobs() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.eye(5).repeat_interleave(40, 0) * 4 + 0.5 * torch.randn(200, 5, generator=g)
    labels = SCANHead(5, 5, hidden=32, neighbours=5).fit(x, epochs=100, batch_size=64, seed=0).cluster(x)
    # each blob goes to a cluster of its own (distinct majorities), holding at least 36 of its 40 points
    table = torch.zeros(5, 5).index_put_((torch.arange(200) // 40, labels), torch.ones(200), accumulate=True)
    assert len(set(table.argmax(1).tolist())) == 5 and float(table.max(1).values.min()) >= 36


def test_scan_head_fit_is_reproducible_per_seed() -> None:
    x = torch.randn(120, 6, generator=torch.Generator().manual_seed(0))
    a, b = (SCANHead(6, 3, hidden=16).fit(x, epochs=3, seed=4) for _ in range(2))
    assert torch.equal(a(x), b(x))


def test_agreement_of_chains_by_hand() -> None:
    # Chains [0,1,2] and [0,1,1] against the mean labels [0,1,2]: 5 of 6 labels agree; the one pass [0,0,2] agrees
    # on 2 of 3; the two chains differ on 1 of 3 points, counted for both ordered pairs over 2·1 pairs.
    out = agreement(
        {
            "chains": torch.tensor([[0, 1, 2], [0, 1, 1]]),
            "mean": torch.tensor([0, 1, 2]),
            "one_pass": torch.tensor([0, 0, 2]),
        }
    )
    assert out == pytest.approx(
        {"single_chain_agreement": 5 / 6, "one_pass_agreement": 2 / 3, "chain_disagreement": 1 / 3}
    )


def test_temi_loss_matches_a_hand_computed_case() -> None:
    # β = 1, one head, one point. Student views (0.8, 0.2) and (0.6, 0.4); teacher views (0.7, 0.3) and (0.5, 0.5);
    # π = (0.4, 0.6). The pair weight is 0.7·0.5 + 0.3·0.5 = 0.5. Student view 0 against teacher view 1:
    # 0.8·0.5/0.4 + 0.2·0.5/0.6 = 7/6; student view 1 against teacher view 0: 0.6·0.7/0.4 + 0.4·0.3/0.6 = 5/4.
    student = torch.tensor([[[[0.8, 0.2]]], [[[0.6, 0.4]]]])
    teacher = torch.tensor([[[[0.7, 0.3]]], [[[0.5, 0.5]]]])
    loss = temi_loss(student, teacher, torch.tensor([[0.4, 0.6]]), beta=1.0)
    assert loss.tolist() == pytest.approx([-0.5 * (0.5 * math.log(7 / 6) + 0.5 * math.log(5 / 4))], abs=1e-6)


def test_temi_teacher_follows_the_cosine_momentum_schedule() -> None:
    head = TEMIHead(4, 2, hidden=3, heads=2, momentum=0.9)
    with torch.no_grad():
        for s, t in zip(head.net.parameters(), head.teacher.parameters(), strict=True):
            s.fill_(1.0)
            t.fill_(0.0)
    head._after_step(0.0)  # m = 1 − 0.1 · (cos 0 + 1)/2 = 0.9: the teacher moves 0.1 of the way
    assert all(torch.allclose(t, torch.full_like(t, 0.1)) for t in head.teacher.parameters())
    head._after_step(0.5)  # m = 1 − 0.1 · (cos π/2 + 1)/2 = 0.95: 0.1 + 0.05 · 0.9
    assert all(torch.allclose(t, torch.full_like(t, 0.145)) for t in head.teacher.parameters())
    head._after_step(1.0)  # m = 1 at the end: frozen
    assert all(torch.allclose(t, torch.full_like(t, 0.145)) for t in head.teacher.parameters())


def test_temi_labels_with_the_lowest_loss_head(monkeypatch: pytest.MonkeyPatch) -> None:
    head = TEMIHead(4, 3, hidden=5, heads=3)
    monkeypatch.setattr(head, "_head_losses", lambda *args, **kwargs: torch.tensor([0.5, 0.1, 0.3]))
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(0))
    head._select(x, torch.zeros(7, 1, dtype=torch.long))
    all_heads = head.net(torch.nn.functional.normalize(x, dim=-1)).reshape(7, 3, 3)
    assert head.head == 1 and torch.equal(head(x), all_heads[:, 1])


def test_temi_prior_is_the_ema_of_the_teachers_mean_prediction() -> None:
    head = TEMIHead(4, 2, hidden=3, heads=1, prior_momentum=0.9)
    with torch.no_grad():  # zero layers and unit directions: every logit equals its gain g, here (0, 0.1·log 3),
        net = head.teacher  # so at temperature 0.1 the teacher predicts (1/4, 3/4) for every row
        net.w1.zero_(), net.b1.zero_(), net.w2.zero_(), net.b2.fill_(1.0), net.v.fill_(1.0)
        net.g.copy_(torch.tensor([[[0.0, math.log(3.0) * head.temperature]]]))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    head._head_losses(x, x)
    assert head.prior[0].tolist() == pytest.approx([0.9 * 0.5 + 0.1 * 0.25, 0.9 * 0.5 + 0.1 * 0.75], abs=1e-6)


def test_scan_entropy_is_taken_over_the_anchors_mean_prediction() -> None:
    # Two anchors predicting (3/4, 1/4) and neighbours predicting (1, 0)-ish: the anchors' mean is (3/4, 1/4), the
    # neighbours' (≈1, ≈0). With the consistency term alone equal for both variants, only the anchors' entropy
    # H(3/4, 1/4) = 0.562335 gives this value; the neighbours' entropy would be ≈ 0.
    anchor = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    neighbour = torch.tensor([[30.0, 0.0], [30.0, 0.0]])
    consistency = -math.log(0.75)
    assert float(scan_loss(anchor, neighbour)) == pytest.approx(consistency - 5 * 0.562335, abs=1e-5)


def test_temi_pair_weight_is_averaged_over_the_heads() -> None:
    # Two heads, one point, β = 1, π = (1/4, 3/4), students at (1/2, 1/2). Teacher agreement: head 0 (1, 0)·(1, 0) = 1,
    # head 1 (1/2, 1/2)·(1/2, 1/2) = 1/2, so the shared weight is 3/4 (a per-head weight would give 1 and 1/2).
    # Head 0: Σ_k p_s p_t / π = (1/2)/(1/4) = 2 → −(3/4) log 2 for both view pairs; head 1: (1/4)/(1/4) + (1/4)/(3/4)
    # = 4/3 → −(3/4) log 4/3.
    student = torch.full((2, 1, 2, 2), 0.5)
    teacher = torch.tensor([[1.0, 0.0], [0.5, 0.5]]).expand(2, 1, 2, 2)
    prior = torch.tensor([[0.25, 0.75], [0.25, 0.75]])
    loss = temi_loss(student, teacher, prior, beta=1.0)
    assert loss.tolist() == pytest.approx([-0.75 * math.log(2.0), -0.75 * math.log(4 / 3)], abs=1e-6)


def test_temi_loss_uses_the_prior_updated_with_this_batch() -> None:
    # The official loss updates π with the batch's teacher mean before computing the PMI: start from uniform, a
    # teacher at (1/4, 3/4) moves π to 0.9·(1/2, 1/2) + 0.1·(1/4, 3/4) = (0.475, 0.525), and the loss must use it.
    head = TEMIHead(4, 2, hidden=3, heads=1, prior_momentum=0.9)
    with torch.no_grad():  # teacher and student logits (0, 0.1·log 3) for every row: probabilities (1/4, 3/4)
        for net in (head.net, head.teacher):
            net.w1.zero_(), net.b1.zero_(), net.w2.zero_(), net.b2.fill_(1.0), net.v.fill_(1.0)
            net.g.copy_(torch.tensor([[[0.0, math.log(3.0) * head.temperature]]]))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    loss = head._head_losses(x, x)
    pmi = 0.25**1.2 / 0.475 + 0.75**1.2 / 0.525  # Σ_k (p_k · p_k)^β / π_k with β = 0.6
    weight = 0.25**2 + 0.75**2
    assert loss.tolist() == pytest.approx([-weight * math.log(pmi)], abs=1e-5)


def test_temi_heads_are_independent_and_their_last_layer_weight_normalised() -> None:
    head = TEMIHead(6, 3, hidden=8, heads=4, bottleneck=5)
    x = torch.randn(9, 6, generator=torch.Generator().manual_seed(0))
    before = head._logits(head.net, x)
    assert before.shape == (9, 4, 3)
    with torch.no_grad():
        head.net.w1[2].mul_(-3.0)  # another head's first layer
        head.net.v.mul_(7.0)  # every head's last-layer directions rescaled: weight normalisation ignores it
    after = head._logits(head.net, x)
    keep = [0, 1, 3]
    torch.testing.assert_close(after[:, keep], before[:, keep])
    assert not torch.allclose(after[:, 2], before[:, 2])
    # a bottleneck of norm 1 against unit-norm directions with gains g = 1: every logit is a cosine
    assert float(before.abs().max()) <= 1.0 + 1e-6
