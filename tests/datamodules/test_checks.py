"""Bad user data (NaN or inf) stops ``setup`` with one line naming the file and the first bad row: every reader kind,
each on a small file written here; and ``check_finite`` itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo.datamodules.activations import ActivationsDataModule
from zoo.datamodules.checks import check_finite
from zoo.datamodules.features import FeatureClusteringDataModule
from zoo.datamodules.pairs import ToyPairDataModule
from zoo.datamodules.preferences import PreferenceDataModule
from zoo.datamodules.streams import StreamDataModule
from zoo.models.dual.pruning import load_record


def _bad(n: int = 20, d: int = 4, row: int = 7, col: int = 2, value: float = np.nan) -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)
    x[row, col] = value
    x[row + 3, 0] = np.inf  # a second bad row: the message names the first and counts both
    return x


def _expect(file: Path | str, where: str, label: str = "") -> str:
    """A pattern for the message's head: the file (and which of its arrays), then where the first bad value is."""
    return "^" + re.escape(f"{file}{label}: ") + where


def test_check_finite_names_first_row_column_and_count() -> None:
    """Check the message (row, value, column, count) for numpy, memory-mapped style slices and tensors alike, and that
    integer data and clean data pass."""
    with pytest.raises(ValueError, match=r"^x\.npy: row 7 has NaN \(column 2\); 2 of 20 rows hold NaN or inf\. Impute"):
        check_finite(_bad(), "x.npy")
    with pytest.raises(ValueError, match=r"^t\.pth: row 1 has -inf; 1 of 3 rows"):
        check_finite(torch.tensor([0.0, float("-inf"), 1.0], dtype=torch.bfloat16), "t.pth")
    with pytest.raises(ValueError, match=r"row 70000 has inf \(column 0\)"):  # past the first chunk of rows
        check_finite(np.where(np.arange(80000)[:, None] == 70000, np.inf, 0.0), "big.npy", chunk_rows=65536)
    check_finite(np.arange(10), "labels.npy")
    check_finite(np.ones((3, 2), np.float16), "ok.npy")


def test_activations_npy_with_nan_fails_at_setup(tmp_path: Path) -> None:
    """Check that ActivationsDataModule(source='npy') refuses a train.npy with a NaN at setup (not in k-means)."""
    np.save(tmp_path / "train.npy", _bad())
    np.save(tmp_path / "test.npy", _bad()[:5] * 0)
    dm = ActivationsDataModule(source="npy", data_dir=str(tmp_path), dim=4)
    with pytest.raises(ValueError, match=_expect(tmp_path / "train.npy", r"row 7 has NaN \(column 2\)")):
        dm.setup("fit")


def test_activations_npy_test_file_with_inf_fails_at_setup(tmp_path: Path) -> None:
    """Check that the test.npy of an npy source is checked too."""
    np.save(tmp_path / "train.npy", np.zeros((20, 4), np.float32))
    np.save(tmp_path / "test.npy", _bad(value=np.inf))
    with pytest.raises(ValueError, match=_expect(tmp_path / "test.npy", r"row 7 has inf \(column 2\)")):
        ActivationsDataModule(source="npy", data_dir=str(tmp_path), dim=4).setup("fit")


def test_activation_cache_shard_with_inf_fails_at_setup(tmp_path: Path) -> None:
    """Check that a cache shard holding inf (a float16 overflow) is named with its row."""
    shards = [np.zeros((10, 4), np.float16), _bad(n=12).astype(np.float16)]
    for i, shard in enumerate(shards):
        np.save(tmp_path / f"acts_{i:05d}.npy", shard)
    meta = {
        "backbone": "toy",
        "library": "timm",
        "pretrained": False,
        "tokens": "all",
        "dim": 4,
        "count": 22,
        "dtype": "float16",
        "shards": ["acts_00000.npy", "acts_00001.npy"],
        "images": 2,
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=_expect(tmp_path / "acts_00001.npy", r"row 7 has NaN \(column 2\)")):
        ActivationsDataModule(source="cache", data_dir=str(tmp_path), dim=4).setup("fit")


@pytest.mark.parametrize("kind", ["npy", "pth"])
def test_feature_files_with_nan_fail_at_setup(tmp_path: Path, kind: str) -> None:
    """Check that CLUDI's feature files, numpy or the official .pth naming, are checked once read."""
    x, y = _bad(), np.arange(20) % 3
    if kind == "npy":
        file = tmp_path / "train_features.npy"
        np.save(file, x)
        np.save(tmp_path / "train_labels.npy", y)
    else:
        file = tmp_path / "train.pth"
        torch.save(torch.from_numpy(x), file)
        torch.save(torch.from_numpy(y), tmp_path / "labels_train.pth")
    dm = FeatureClusteringDataModule(source="files", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=_expect(file, r"row 7 has NaN \(column 2\)")):
        dm.setup("fit")


def test_feature_labels_with_nan_fail_at_setup(tmp_path: Path) -> None:
    """Check that float labels holding NaN are refused before they are cast to integers (garbage classes)."""
    y = (np.arange(20) % 3).astype(np.float64)
    y[4] = np.nan
    np.save(tmp_path / "train_features.npy", np.zeros((20, 4), np.float32))
    np.save(tmp_path / "train_labels.npy", y)
    with pytest.raises(ValueError, match=_expect(tmp_path / "train_labels.npy", r"row 4 has NaN;")):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup("fit")


def test_stream_npz_with_nan_labels_fails_at_setup(tmp_path: Path) -> None:
    """Check that a stream's labels are checked as well as its points (the npz array is named)."""
    y = np.zeros(20)
    y[11] = np.nan
    np.savez(tmp_path / "s.npz", X=np.zeros((20, 4)), y=y)
    with pytest.raises(ValueError, match=_expect(tmp_path / "s.npz", r"row 11 has NaN;", " (array y)")):
        StreamDataModule(source="npz", path=str(tmp_path / "s.npz")).setup("fit")


def test_stream_csv_with_an_empty_cell_names_its_line_and_column(tmp_path: Path) -> None:
    """Check that a CSV's NaN (an empty cell reads as NaN) is named by its 1-based line, header counted, and its
    column in the file."""
    lines = ["a,b,c,label"] + [f"{i},{i + 1},{i + 2},0" for i in range(6)]
    lines[4] = "3,,5,0"  # line 5 of the file, column 1
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=_expect(tmp_path / "s.csv", r"line 5 has NaN \(column 1\); 1 of 6 lines")):
        StreamDataModule(source="csv", path=str(tmp_path / "s.csv"), label_column="label").setup("fit")


def test_stream_mat_with_inf_fails_at_setup(tmp_path: Path) -> None:
    """Check that an ODDS .mat file is checked too."""
    from scipy.io import savemat

    savemat(tmp_path / "s.mat", {"X": _bad(value=np.inf).astype(np.float64), "y": np.zeros((20, 1))})
    with pytest.raises(ValueError, match=_expect(tmp_path / "s.mat", r"row 7 has inf \(column 2\)", " (array X)")):
        StreamDataModule(source="mat", path=str(tmp_path / "s.mat")).setup("fit")


def test_toy_pair_npy_with_nan_fails_at_setup(tmp_path: Path) -> None:
    """Check that an EFM vector plate given as .npy is checked once read."""
    np.save(tmp_path / "q.npy", _bad(n=200, d=2, col=1))
    dm = ToyPairDataModule(target=str(tmp_path / "q.npy"), n_train=64, n_val=8, n_test=8)
    with pytest.raises(ValueError, match=_expect(tmp_path / "q.npy", r"row 7 has NaN \(column 1\)")):
        dm.setup("fit")


def test_dual_score_file_with_nan_fails_when_read(tmp_path: Path) -> None:
    """Check that a .npy of DUAL scores with a NaN (which pruning would rank arbitrarily) is refused, naming it."""
    scores = np.linspace(0, 1, 30)
    scores[12] = np.nan
    np.save(tmp_path / "scores.npy", scores)
    with pytest.raises(ValueError, match=_expect(tmp_path / "scores.npy", r"row 12 has NaN;")):
        load_record(tmp_path / "scores.npy", 30)


def test_preference_jsonl_with_nan_label_names_its_line(tmp_path: Path) -> None:
    """Check that a NaN label in a JSON Lines file (json reads NaN) is refused at setup, naming the file and line."""
    row = {"prompt": "p", "response_a": "a", "response_b": "b", "model_a": "m1", "model_b": "m2"}
    lines = [json.dumps({**row, "winner": "model_a"}), json.dumps({**row, "z": float("nan")})]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'p.jsonl'}, line 2: expected z to be 0, 0.5 or 1")):
        PreferenceDataModule(source="jsonl", path=str(tmp_path / "p.jsonl")).setup("fit")
