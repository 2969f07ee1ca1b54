"""RCSCModule: one round per step, monotone logged objective within phases, hub round trip, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch
from lightning import Trainer

from zoo import hub
from zoo.datamodules.multiview import MultiViewDataModule
from zoo.models.rcsc.module import RCSCModule


def _trainer(epochs: int) -> Trainer:
    return Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)


@pytest.fixture(scope="module")
def fitted():
    dm = MultiViewDataModule(n_per=60, n_clusters=3, noise_dim=30)
    model = RCSCModule(view_dims=[10, 15, 30], n_clusters=3, n_anchors=9, warmup=3, max_iter=15)
    trainer = _trainer(15)
    trainer.fit(model, dm)
    return model, dm, trainer


def test_one_round_per_step_and_monotone(fitted):
    model, _, _ = fitted
    h = model.history
    assert len(h) == model.rounds + 1 and model.rounds >= model.hparams.warmup + 1
    w = model.hparams.warmup
    for seg in (h[: w + 1], h[w + 1:]):
        assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(seg)), seg
    assert torch.allclose(model.A @ model.A.T, torch.eye(3, dtype=torch.float64), atol=1e-8)
    assert abs(float(model.alpha.sum()) - 1) < 1e-10 and float(model.alpha[2]) < 0.2  # the 30-d noise view


def test_hub_round_trip_same_labels(fitted, tmp_path):
    model, dm, _ = fitted
    hub.write_entry(model, tmp_path / "rcsc", zoo_meta={}, card_text="test")
    again = RCSCModule.from_pretrained(str(tmp_path / "rcsc"))
    views, _y = dm.train_set.views, dm.train_set.labels
    a, b = model.cluster(views), again.cluster(views)
    assert torch.equal(a, b)
    m = _trainer(1).test(again, dm, verbose=False)[0]
    assert m["test/accuracy"] > 0.8


def test_wrong_view_dims(fitted):
    model, dm, _ = fitted
    with pytest.raises(ValueError, match="model was built for"):
        model.cluster([v[:, :5] for v in dm.train_set.views])


def test_a_resumed_fit_continues_the_alternating_optimisation_exactly(tmp_path) -> None:
    """``--ckpt_path last`` restores Z, G, C, W, A, α and the round: the resumed fit ends where the whole one does."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(root, epochs: int, ckpt: str | None = None) -> RCSCModule:
        model = RCSCModule(view_dims=[10, 15, 30], n_clusters=3, n_anchors=9, warmup=3, max_iter=12, tol=0.0)
        trainer = Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                          limit_val_batches=0, callbacks=[ModelCheckpoint(dirpath=root, save_last=True)])  # fmt: skip
        trainer.fit(model, MultiViewDataModule(n_per=30, n_clusters=3, noise_dim=30), ckpt_path=ckpt)
        return model

    whole = fit(tmp_path / "whole", 12)
    fit(tmp_path / "part", 6)
    resumed = fit(tmp_path / "part", 12, str(tmp_path / "part" / "last.ckpt"))
    assert resumed.rounds == whole.rounds == 12
    assert resumed.history == whole.history
    torch.testing.assert_close(resumed.state.Z, whole.state.Z)
