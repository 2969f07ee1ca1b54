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
    dm = MultiViewDataModule(source="synthetic", n_per=60, n_clusters=3, noise_dim=30)
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
    # the 30-d noise view gets the smallest weight (equal view energies: near 1/3, not the 0.1 of SMVSC's scaling)
    assert abs(float(model.alpha.sum()) - 1) < 1e-10 and float(model.alpha[2]) == float(model.alpha.min())


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
        dm = MultiViewDataModule(source="synthetic", n_per=30, n_clusters=3, noise_dim=30)
        trainer.fit(model, dm, ckpt_path=ckpt)
        return model

    whole = fit(tmp_path / "whole", 12)
    fit(tmp_path / "part", 6)
    resumed = fit(tmp_path / "part", 12, str(tmp_path / "part" / "last.ckpt"))
    assert resumed.rounds == whole.rounds == 12
    assert resumed.history == whole.history
    torch.testing.assert_close(resumed.state.Z, whole.state.Z)


def test_zoo_fit_takes_view_widths_and_cluster_count_from_a_mat_file(tmp_path) -> None:
    """Check the real path the issue found broken: `zoo fit -c conf/rcsc.yaml` with only the data flags of a .mat file
    of 4 clusters and views of 6 and 9 features builds the model from the file (no Lightning hparams clash), fits a
    few rounds and forward works; a model flag the file contradicts is replaced."""
    import numpy as np
    import scipy.io

    from zoo.lightning_cli import ZooCLI
    from zoo.registry import conf_path

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 30)
    means = rng.normal(size=(4, 6)) * 3
    a, b = means[y] + rng.normal(size=(120, 6)), rng.normal(size=(120, 9))
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0], cell[0, 1] = a, b
    scipy.io.savemat(tmp_path / "tiny.mat", {"X": cell, "Y": y.reshape(-1, 1) + 1})
    cli = ZooCLI(args=["-c", str(conf_path("rcsc")), "--data.init_args.source", "mat", "--data.init_args.data_dir",
                       str(tmp_path), "--data.init_args.name", "tiny", "--model.init_args.n_clusters", "7",
                       "--model.init_args.n_anchors", "12", "--trainer.max_epochs", "12", "--trainer.logger", "false",
                       "--trainer.enable_progress_bar", "false",
                       "--trainer.default_root_dir", str(tmp_path)], run=False)  # fmt: skip
    assert cli.model.hparams.view_dims == [6, 9] and cli.model.hparams.n_clusters == 4
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    labels = cli.model([torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)])
    assert labels.shape == (120,) and len(set(labels.tolist())) == 4


def test_forward_before_fit_is_refused() -> None:
    """Check that an unfitted model refuses to label samples (its centroids are zeros: every label would be 0)."""
    model = RCSCModule(view_dims=[10, 15, 30], n_clusters=3, n_anchors=9)
    views = [torch.randn(20, d) for d in (10, 15, 30)]
    with pytest.raises(RuntimeError, match="has not been fitted"):
        model(views)
