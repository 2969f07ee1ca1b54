"""Tests of ``datamodules.streams``: the drifting stream and the ordered StreamDataModule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.datamodules.streams import StreamDataModule, make_drifting_stream


def _batches(dm: StreamDataModule, loader: str = "test_dataloader") -> list[dict[str, torch.Tensor]]:
    dm.setup("test")
    return list(getattr(dm, loader)())


def test_drifting_stream_shapes_and_dtypes() -> None:
    """Check that the stream has the requested shapes, float32 points and 0/1 long labels."""
    x, y = make_drifting_stream(n=500, dim=6, seed=1)
    assert x.shape == (500, 6) and x.dtype == torch.float32
    assert y.shape == (500,) and y.dtype == torch.long
    assert set(y.unique().tolist()) <= {0, 1}


def test_drifting_stream_is_deterministic_per_seed() -> None:
    """Check that a seed fixes the stream and another seed changes it."""
    a, b, c = make_drifting_stream(seed=3), make_drifting_stream(seed=3), make_drifting_stream(seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_drifting_stream_anomaly_rate_is_near_two_percent() -> None:
    """Check that about 2 % of the points are anomalies."""
    _, y = make_drifting_stream(n=20000, seed=0)
    assert abs(y.float().mean().item() - 0.02) < 0.004


def test_drifting_stream_scales_dims_01_after_the_drift() -> None:
    """Check that regime-2 inliers have about 3x the std on dims 0-1 and unchanged std on dims 2-3."""
    x, y = make_drifting_stream(n=20000, drift_at=10000, seed=0)
    early, late = x[:10000][y[:10000] == 0], x[10000:][y[10000:] == 0]
    ratio = late.std(0) / early.std(0)
    assert torch.allclose(ratio[:2], torch.full((2,), 3.0), atol=0.15)
    assert torch.allclose(ratio[2:], torch.ones(2), atol=0.1)


def test_drifting_stream_anomalies_move_to_dims_23_after_the_drift() -> None:
    """Check that anomalies are shifted by 4-6 on dims 0-1 before the drift and on dims 2-3 after it."""
    x, y = make_drifting_stream(n=20000, anomaly_rate=0.05, drift_at=10000, seed=0)
    early, late = x[:10000][y[:10000] == 1], x[10000:][y[10000:] == 1]
    assert early[:, :2].abs().mean() > 3.5 and early[:, 2:4].abs().mean() < 1.5
    assert late[:, 2:4].abs().mean() > 3.5


def test_drifting_stream_raises_when_dim_is_below_four() -> None:
    """Check that dim < 4 is refused with the reason."""
    with pytest.raises(ValueError, match="dim.*>= 4"):
        make_drifting_stream(dim=3)


def test_stream_datamodule_serves_ordered_chunks_in_every_loader() -> None:
    """Check that every loader serves the whole stream in order, chunk_size rows per dict batch."""
    dm = StreamDataModule(n=230, chunk_size=50, warmup=100)
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
        batches = _batches(dm, loader)
        assert [len(b["t"]) for b in batches] == [50, 50, 50, 50, 30]
        t = torch.cat([b["t"] for b in batches])
        assert torch.equal(t, torch.arange(230))
        assert set(batches[0]) == {"x", "y", "t", "evaluate"} and batches[0]["x"].shape == (50, 4)
    x, y = make_drifting_stream(n=230)
    assert torch.equal(torch.cat([b["x"] for b in batches]), x) and torch.equal(torch.cat([b["y"] for b in batches]), y)
    assert dm.num_points == 230 and dm.dim == 4


def test_stream_datamodule_evaluate_mask_excludes_warmup() -> None:
    """Check that evaluate is False exactly on the first warmup positions."""
    batches = _batches(StreamDataModule(n=200, chunk_size=30, warmup=70))
    evaluate, t = torch.cat([b["evaluate"] for b in batches]), torch.cat([b["t"] for b in batches])
    assert evaluate.dtype == torch.bool and torch.equal(evaluate, t >= 70)


def test_stream_datamodule_describe_names_source_and_order() -> None:
    """Check that describe() gives one line naming the stream, the order and the warm-up."""
    line = StreamDataModule(n=600, order="permute", seed=2).describe()
    assert "\n" not in line and "n=600" in line and "permutation (seed 2)" in line and "warm-up 100" in line


@pytest.mark.parametrize("order", ["file", "permute"])
def test_stream_datamodule_reads_npz_in_the_given_order(tmp_path: Path, order: str) -> None:
    """Check that an ADBench .npz round-trips, in file order or one seeded permutation."""
    X = np.arange(40, dtype=np.float64).reshape(20, 2)
    y = (np.arange(20) % 7 == 0).astype(np.int64)
    np.savez(tmp_path / "set.npz", X=X, y=y)
    dm = StreamDataModule(source="npz", path=str(tmp_path / "set.npz"), order=order, warmup=5, chunk_size=8, seed=1)
    batches = _batches(dm)
    got_x, got_y = torch.cat([b["x"] for b in batches]), torch.cat([b["y"] for b in batches])
    rows = np.arange(20) if order == "file" else np.random.default_rng(1).permutation(20)
    assert np.array_equal(dm.rows, rows)
    assert np.allclose(got_x.numpy(), X[rows]) and np.array_equal(got_y.numpy(), y[rows])
    assert torch.equal(torch.cat([b["t"] for b in batches]), torch.arange(20)) and dm.dim == 2
    if order == "permute":
        assert not np.array_equal(rows, np.arange(20))


@pytest.mark.parametrize("header", [True, False])
def test_stream_datamodule_reads_csv_with_anomaly_label(tmp_path: Path, header: bool) -> None:
    """Check that a .csv round-trips with or without a header, mapping anomaly_label to 1."""
    X = np.round(np.random.default_rng(0).normal(size=(30, 3)), 3)
    labels = np.where(np.arange(30) % 5 == 0, 2.0, 7.0)
    path = tmp_path / "stream.csv"
    np.savetxt(path, np.column_stack([X, labels]), delimiter=",", header="a,b,c,cls" if header else "", comments="")
    if not header:
        path.write_text(path.read_text().lstrip("\n"))
    label_column = "cls" if header else -1
    dm = StreamDataModule(source="csv", path=str(path), label_column=label_column, anomaly_label=2, chunk_size=7)
    batches = _batches(dm)
    assert np.allclose(torch.cat([b["x"] for b in batches]).numpy(), X, atol=1e-6)
    assert np.array_equal(torch.cat([b["y"] for b in batches]).numpy(), (labels == 2).astype(np.int64))


def test_stream_datamodule_raises_when_file_is_missing(tmp_path: Path) -> None:
    """Check that a missing file raises one FileNotFoundError saying what to put there."""
    dm = StreamDataModule(source="mat", path=str(tmp_path / "wbc.mat"))
    with pytest.raises(FileNotFoundError, match=r"No stream file at .*wbc\.mat.*ODDS \.mat file with arrays X"):
        dm.setup("test")


def test_stream_datamodule_raises_on_nan_naming_the_row(tmp_path: Path) -> None:
    """Check that NaN features raise a ValueError naming the first bad row."""
    X = np.zeros((10, 2))
    X[6, 1], X[8, 0] = np.nan, np.inf
    np.savez(tmp_path / "bad.npz", X=X, y=np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match=r"bad\.npz \(array X\): row 6 has NaN \(column 1\); 2 of 10 rows"):
        StreamDataModule(source="npz", path=str(tmp_path / "bad.npz")).setup("test")


def test_stream_datamodule_raises_on_labels_that_are_not_01(tmp_path: Path) -> None:
    """Check that labels other than 0/1 without anomaly_label are refused with the fix."""
    np.savez(tmp_path / "lab.npz", X=np.zeros((4, 2)), y=np.array([0, 2, 2, 0]))
    with pytest.raises(ValueError, match="anomaly_label="):
        StreamDataModule(source="npz", path=str(tmp_path / "lab.npz")).setup("test")


def test_stream_datamodule_reads_odds_mat(tmp_path: Path) -> None:
    """Check that an ODDS-style .mat (y as a column) round-trips."""
    from scipy.io import savemat

    X, y = np.random.default_rng(0).normal(size=(12, 3)), (np.arange(12) % 4 == 0).astype(np.float64)[:, None]
    savemat(tmp_path / "odds.mat", {"X": X, "y": y})
    batches = _batches(StreamDataModule(source="mat", path=str(tmp_path / "odds.mat"), chunk_size=5))
    assert np.allclose(torch.cat([b["x"] for b in batches]).numpy(), X, atol=1e-6)
    assert torch.cat([b["y"] for b in batches]).tolist() == y[:, 0].astype(int).tolist()


def test_stream_datamodule_raises_when_path_is_missing_for_a_file_source() -> None:
    """Check that a file source without path fails in __init__ naming the format."""
    with pytest.raises(ValueError, match="needs path: an ADBench-style .npz"):
        StreamDataModule(source="npz")
