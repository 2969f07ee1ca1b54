"""The BatchTopK and JumpReLU encoders: their codes and pseudo-gradients on known values, and each one training,
publishing and reloading from a hub folder inside RASAE."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning import Trainer

import zoo
from zoo import hub
from zoo.datamodules.activations import ActivationsDataModule
from zoo.models.ra_sae import RASAE, BatchTopKEncoder, JumpReLUEncoder


def test_batchtopk_keeps_the_batch_top_k_times_b_codes_then_thresholds_at_eval() -> None:
    """Check that training keeps exactly the k·B largest ReLU pre-codes of the batch (rows get unequal counts), that
    θ tracks the smallest kept value, and that eval keeps the pre-codes above θ, whatever the batch."""
    enc = BatchTopKEncoder(dim=4, num_atoms=6, top_k=2)
    with torch.no_grad():
        enc.linear.weight.copy_(torch.eye(6, 4))
        enc.linear.bias.zero_()
    x = torch.tensor([[5.0, 4.0, 3.0, 2.0], [0.5, 0.4, 0.3, 0.2]])
    _, codes = enc.train()(x)
    # The 4 = k·B largest pre-codes all sit in row 0; row 1 keeps none.
    torch.testing.assert_close(codes, torch.tensor([[5.0, 4.0, 3.0, 2.0, 0, 0], [0, 0, 0, 0, 0, 0]]))
    assert float(enc.threshold) == 2.0
    enc(torch.tensor([[1.0, 3.0, 0.0, 0.0]]))  # kept: 3 and 1; θ ← 0.99·2 + 0.01·1
    assert float(enc.threshold) == pytest.approx(1.99)
    _, eval_codes = enc.eval()(x)
    torch.testing.assert_close(eval_codes, torch.tensor([[5.0, 4.0, 3.0, 2.0, 0, 0], [0, 0, 0, 0, 0, 0]]))
    _, one = enc(x[:1])
    torch.testing.assert_close(one, eval_codes[:1])  # eval codes do not depend on the batch


def test_jumprelu_codes_and_pseudo_gradients_by_hand() -> None:
    """Check codes = p·H(p − θ), dθ = −(θ/ε)·Σ grad where |p − θ| < ε/2, the L0 term's dθ = −(λ/ε)·(count)/rows, and
    the ordinary gradient for the pre-codes."""
    enc = JumpReLUEncoder(dim=3, num_atoms=3, top_k=1, l0_penalty=0.5, eps=0.2)
    with torch.no_grad():
        enc.linear.weight.copy_(torch.eye(3))
        enc.linear.bias.zero_()
        enc.log_theta.copy_(torch.log(torch.tensor([1.0, 1.0, 2.0])))
    x = torch.tensor([[1.05, 0.5, 3.0], [0.95, 1.5, 2.05]], requires_grad=True)
    pre, codes = enc(x)
    torch.testing.assert_close(codes, torch.tensor([[1.05, 0.0, 3.0], [0.0, 1.5, 2.05]]))
    codes.sum().backward()
    theta = enc.theta.detach()
    # Within the window (|p − θ| < 0.1): atom 0 at rows 0 and 1, atom 2 at row 1.
    expected_dtheta = -(theta / 0.2) * torch.tensor([2.0, 0.0, 1.0])
    torch.testing.assert_close(enc.log_theta.grad, expected_dtheta * theta)  # chain rule through θ = exp(log θ)
    torch.testing.assert_close(x.grad, (codes > 0).float())
    enc.zero_grad()
    l0 = enc.sparsity_loss(enc.linear(x.detach()))
    assert float(l0) == pytest.approx(0.5 * 4 / 2)  # 4 active codes over 2 rows
    l0.backward()
    torch.testing.assert_close(enc.log_theta.grad, -(0.5 / 0.2) * torch.tensor([2.0, 0.0, 1.0]) / 2 * theta)


@pytest.mark.parametrize("encoder", ["batchtopk", "jumprelu"])
def test_each_encoder_trains_publishes_and_reloads_from_the_hub(encoder: str, tmp_path: Path) -> None:
    """Check a short Lightning fit of RA-SAE with each encoder (loss falls, every code finite), then a hub entry
    written from it reloads through zoo.load to identical codes."""
    torch.manual_seed(0)
    # The free dictionary: RA-SAE's tied k-means start gives codes ~100x their final size for the first ~100 steps,
    # which BatchTopK's slow θ average (momentum 0.99, as sae-lens) remembers for hundreds of steps more.
    model = RASAE(dim=32, num_atoms=64, top_k=3, dictionary="free", encoder=encoder, l0_penalty=1e-3)
    dm = ActivationsDataModule(n_samples=8000, batch_size=256)
    trainer = Trainer(
        max_steps=400,
        gradient_clip_val=1.0,  # as conf/ra-sae.yaml (the official loop)
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(model, dm)
    dm.setup("test")
    x = next(iter(dm.test_dataloader()))
    model.eval()
    before = model(x)
    assert torch.isfinite(before).all() and bool((before > 0).any())
    metrics = trainer.test(model, dm, verbose=False)[0]
    assert metrics["test/r2"] > 0.3 and metrics["test/l0"] > 0.5, metrics
    folder = hub.write_entry(model, tmp_path / f"sae-{encoder}", zoo_meta={"name": "ra-sae"}, card_text="# test\n")
    again = zoo.load(folder)
    assert again.hparams.encoder == encoder
    torch.testing.assert_close(again(x), before, rtol=0, atol=0)
