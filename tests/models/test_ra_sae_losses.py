"""RA-SAE losses and codes on known values: AuxK trains for every dictionary kind, fits the residual, TopK keeps k."""

from __future__ import annotations

import pytest
import torch

from zoo.models.ra_sae import RASAE, TopKEncoder, sae_loss


@pytest.mark.parametrize("dictionary", ["free", "ra", "a"])
def test_aux_k_loss_trains_a_few_steps_for_every_dictionary_kind(dictionary: str) -> None:
    """Check that AuxK (official 0.1) backpropagates and steps for each dictionary kind.

    The free dictionary used to fail at the first backward ("modified by an inplace operation"): the loss called
    get_dictionary() a second time, re-normalising V in place after autograd had saved it.
    """
    torch.manual_seed(0)
    model = RASAE(dim=8, num_atoms=16, top_k=2, dictionary=dictionary, num_candidates=16, aux_k_penalty=0.1)
    model.set_candidates(torch.randn(16, 8))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(5):
        loss, _, _ = model._loss(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_aux_k_term_fits_the_residual_with_the_unkept_codes() -> None:
    """Check the AuxK term by hand: the k//2 largest unkept ReLU pre-codes decode the residual x − x̂, not x."""
    x = torch.tensor([[1.0, 2.0]])
    D = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.0]])
    pre = torch.tensor([[3.0, -1.0, 2.0, 0.5]])
    codes = torch.tensor([[3.0, 0.0, 0.0, 0.0]])  # TopK with k = 1 kept atom 0
    x_hat = codes @ D  # (3, 0)
    residual = x - x_hat  # (-2, 2)
    # Unkept ReLU pre-codes: (0, 0, 2, 0.5); the num_atoms // 2 = 2 largest: atoms 2 (2.0) and 3 (0.5).
    aux = torch.tensor([[0.0, 0.0, 2.0, 0.5]]) @ D  # (2.25, 2)
    expected = residual.square().mean() + 0.1 * (aux - residual).square().mean()
    got = sae_loss(x, x_hat, pre, codes, D, aux_k_penalty=0.1)
    torch.testing.assert_close(got, expected)
    # Fitting x instead of the residual would give another value on these numbers.
    assert not torch.isclose(got, residual.square().mean() + 0.1 * (aux - x).square().mean())


def test_topk_encoder_keeps_exactly_the_k_largest_relu_pre_codes() -> None:
    """Check on known pre-codes that TopK keeps k codes (not k − 1), the largest ones, with their values."""
    enc = TopKEncoder(dim=4, num_atoms=6, top_k=3)
    with torch.no_grad():
        enc.linear.weight.zero_()
        enc.linear.bias.copy_(torch.tensor([0.5, -2.0, 3.0, 1.0, 0.7, 2.0]))
    pre, codes = enc(torch.zeros(2, 4))
    torch.testing.assert_close(codes, torch.tensor([[0.0, 0.0, 3.0, 1.0, 0.0, 2.0]] * 2))
    assert int((codes[0] > 0).sum()) == 3
