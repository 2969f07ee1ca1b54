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


def test_mat_v73_hdf5_file_is_read(tmp_path):
    """Check a v7.3 (HDF5) .mat file, as MATLAB writes it (every matrix transposed, a cell array of references)."""
    import h5py

    rng = np.random.default_rng(1)
    y = np.repeat([1, 2], 6)
    a, b = rng.normal(size=(12, 3)), rng.normal(size=(12, 4))
    with h5py.File(tmp_path / "v73.mat", "w") as f:
        refs = []
        for i, v in enumerate((a, b)):
            refs.append(f.create_dataset(f"#refs#/v{i}", data=v.T).ref)  # MATLAB stores column-major: d_v x n
        f.create_dataset("X", data=np.array(refs, dtype=h5py.ref_dtype).reshape(2, 1))
        f.create_dataset("Y", data=y.reshape(1, -1).astype(float))
    views, labels = load_mat_views(tmp_path / "v73.mat")
    np.testing.assert_allclose(views[0].numpy(), a, rtol=1e-6)
    np.testing.assert_allclose(views[1].numpy(), b, rtol=1e-6)
    assert labels.tolist() == [0] * 6 + [1] * 6


def test_empty_mat_and_a_cluster_count_that_contradicts_the_labels_are_refused(tmp_path):
    """Check one-line errors for a 0-byte file, a file that is not MATLAB's, and data.n_clusters against a file's
    labels."""
    (tmp_path / "empty.mat").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.mat is empty"):
        load_mat_views(tmp_path / "empty.mat")
    (tmp_path / "junk.mat").write_bytes(b"not a mat file at all, just some bytes" * 10)
    with pytest.raises(ValueError, match="junk.mat is not a readable .mat file"):
        load_mat_views(tmp_path / "junk.mat")
    _write(tmp_path / "two.mat", [np.random.default_rng(0).normal(size=(10, 3))], np.repeat([0, 1], 5))
    dm = MultiViewDataModule(source="mat", data_dir=str(tmp_path), name="two", n_clusters=5)
    with pytest.raises(ValueError, match="n_clusters=5, but the labels .* have 2 values"):
        dm.setup()


def test_unequal_views_need_more_than_one_view():
    """Check the reproduction's task: k-means on the best single view is well below k-means on the informative views
    together, and the 1,000-d noise view sinks the per-feature concatenation (measured, seed 0: ACC 0.80, 0.95,
    0.24)."""
    from sklearn.cluster import KMeans
    from torchmetrics.functional.clustering import cluster_accuracy

    from zoo.datamodules.multiview import unequal_views
    from zoo.models.rcsc.solver import standardize

    views, y = unequal_views(seed=0)
    acc = lambda vs: float(cluster_accuracy(torch.as_tensor(KMeans(5, n_init=5, random_state=0).fit_predict(  # noqa: E731
        torch.cat([standardize(v.double()) for v in vs], 1).numpy())), y, num_classes=5))  # fmt: skip
    best_single = max(acc([v]) for v in views[:3])
    assert acc(views[:3]) > best_single + 0.05 and acc(views) < 0.5
