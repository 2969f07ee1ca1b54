"""MultiViewDataModule: synthetic default, digits views, the real .mat path (written small), bad input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import torch

from zoo.datamodules.multiview import MultiViewDataModule, load_mat_views


def _write(path, views, y):
    cell = np.empty((1, len(views)), dtype=object)
    for i, v in enumerate(views):
        cell[0, i] = v
    scipy.io.savemat(path, {"X": cell, "Y": y.reshape(-1, 1)})


def test_mat_round_trip_with_orientation(tmp_path):
    rng = np.random.default_rng(0)
    y = np.repeat([1, 2, 3], 10)
    a, b = rng.normal(size=(30, 4)), rng.normal(size=(6, 30))  # the second stored d_v x n, as many files do
    _write(tmp_path / "tiny.mat", [a, b], y)
    dm = MultiViewDataModule(source="mat", data_dir=str(tmp_path), name="tiny")
    dm.setup()
    views, labels = next(iter(dm.train_dataloader()))
    assert [tuple(v.shape) for v in views] == [(30, 4), (30, 6)]
    assert torch.allclose(views[0], torch.as_tensor(a, dtype=torch.float32))
    assert torch.allclose(views[1], torch.as_tensor(b.T, dtype=torch.float32))
    assert labels.tolist() == (y - 1).tolist() and dm.n_clusters == 3


def test_mat_nan_and_bad_layout(tmp_path):
    y = np.repeat([0, 1], 5)
    a = np.ones((10, 3))
    a[4, 2] = np.nan
    _write(tmp_path / "nan.mat", [a], y)
    with pytest.raises(ValueError, match="row 4 has NaN"):
        load_mat_views(tmp_path / "nan.mat")
    _write(tmp_path / "short.mat", [np.ones((9, 3))], y)
    with pytest.raises(ValueError, match="neither side matches"):
        load_mat_views(tmp_path / "short.mat")
    scipy.io.savemat(tmp_path / "nox.mat", {"data": np.ones(3)})
    with pytest.raises(ValueError, match="expected variables X"):
        load_mat_views(tmp_path / "nox.mat")


def test_digits_three_views():
    dm = MultiViewDataModule(source="digits")
    dm.setup()
    views, y = dm.train_set.views, dm.train_set.labels
    assert [v.shape[1] for v in views] == [64, 32, 200] and len(y) == 1797 and dm.n_clusters == 10
    assert all(torch.isfinite(v).all() for v in views)
