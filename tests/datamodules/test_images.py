"""Tests of ``datamodules.images.ImageDataModule`` (split out of ``PrunableImageDataModule``): batch layouts, the
hparams the hub rebuilds from, and clear errors for missing files and unknown datasets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.datamodules.images import ImageDataModule
from zoo.models.dual.data import PrunableImageDataModule


def test_default_batches_are_images_and_labels() -> None:
    """Check that default training and test batches are (x, y) with x of shape (B, 1, 8, 8) in [0, 1]."""
    dm = ImageDataModule(batch_size=32)
    dm.setup("fit")
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        batch = next(iter(loader))
        assert len(batch) == 2
        x, y = batch
        assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.shape == (32,)
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and int(y.max()) < 10
    assert dm.in_shape == [1, 8, 8] and dm.num_classes == 10
    assert len(dm.train_set) == 1297 and len(dm.val_set) == len(dm.test_set) == 500
    assert torch.equal(dm.val_set.x, dm.test_set.x)  # the validation loader serves the test split


def test_with_index_gives_full_set_indices() -> None:
    """Check that with_index=True training batches are (x, y, index) and index points at that sample's row."""
    dm = ImageDataModule(batch_size=16, with_index=True)
    dm.setup("fit")
    x, y, index = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 1, 8, 8) and index.shape == (16,)
    assert torch.equal(dm.train_set.x[index], x) and torch.equal(dm.train_set.y[index], y)
    assert len(next(iter(dm.test_dataloader()))) == 2  # evaluation batches stay (x, y)


def test_prunable_hparams_rebuild_the_datamodule() -> None:
    """Check that PrunableImageDataModule's hparams hold neither augment nor with_index and rebuild an equal module."""
    dm = PrunableImageDataModule(batch_size=32, label_noise=0.1)
    assert "augment" not in dm.hparams and "with_index" not in dm.hparams
    rebuilt = PrunableImageDataModule(**dm.hparams)
    assert dict(rebuilt.hparams) == dict(dm.hparams)
    rebuilt.setup("fit")
    assert len(next(iter(rebuilt.train_dataloader()))) == 3  # still indexed training batches
    plain = ImageDataModule(batch_size=8, with_index=True)
    assert ImageDataModule(**plain.hparams).with_index is True


def test_missing_files_and_unknown_datasets_raise(tmp_path) -> None:
    """Check that CIFAR-10 without its files raises FileNotFoundError and an unknown dataset a ValueError."""
    with pytest.raises(FileNotFoundError, match="CIFAR10"):
        ImageDataModule(dataset="cifar10", data_dir=str(tmp_path)).setup()
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        ImageDataModule(dataset="mnist")


def test_validation_hold_out_is_disjoint_and_seeded() -> None:
    """Check that val_size holds that many training images out, disjoint from training, the same for the same seed."""
    dm = ImageDataModule(val_size=200, seed=3)
    dm.setup("fit")
    train, val = set(dm.train_set.rows.tolist()), set(dm.val_set.rows.tolist())
    assert len(val) == 200 and len(train) == 1097 and not train & val and len(dm.test_set) == 500
    again = ImageDataModule(val_size=200, seed=3)
    again.setup("fit")
    assert torch.equal(again.val_set.rows, dm.val_set.rows)
    with pytest.raises(ValueError, match="leaves no training images"):
        ImageDataModule(val_size=1297).setup("fit")
    with pytest.raises(ValueError, match="val_size"):
        ImageDataModule(val_size=-1)


def _write_cifar10(root, n: int = 4) -> None:
    """A tiny CIFAR-10 in torchvision's own format: pickled batches under cifar-10-batches-py/."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": list(rng.integers(0, 10, n))}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def test_cifar_files_serve_standardised_or_unit_range_images(tmp_path, monkeypatch) -> None:
    """Check the CIFAR path on torchvision-format files: standardised by default, in [0, 1] with normalize=False."""
    import torchvision

    _write_cifar10(tmp_path)
    # the files are real-format but tiny, so torchvision's md5 check of the full download cannot pass
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)
    raw = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path), normalize=False, augment=False, batch_size=8)
    raw.setup("fit")
    x, y = next(iter(raw.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and y.shape == (8,) and len(raw.train_set) == 20 and len(raw.test_set) == 4
    assert 0 <= float(x.min()) and float(x.max()) <= 1
    std = ImageDataModule(dataset="cifar10", data_dir=str(tmp_path), augment=False, batch_size=8)
    std.setup("fit")
    z, _ = next(iter(std.train_dataloader()))
    assert float(z.min()) < 0  # (x - mean) / std


def test_photo_patches_are_disjoint_tiles_of_the_seven_photographs_split_stratified() -> None:
    """The tiles are cut from each photograph's grid of non-overlapping 8×8 tiles (checked here against the
    photograph itself), one class per photograph, and the split is stratified and seeded."""
    import skimage.data
    from zoo.datamodules.images import PHOTOS, photo_patches

    x, y = photo_patches(per_class=5, seed=1)
    assert x.shape == (35, 3, 8, 8) and torch.equal(torch.bincount(y), torch.full((7,), 5))
    astronaut = torch.from_numpy(skimage.data.astronaut()).float().permute(2, 0, 1) / 255  # (3, 512, 512)
    tiles = astronaut.unfold(1, 8, 8).unfold(2, 8, 8).permute(1, 2, 0, 3, 4).reshape(-1, 3, 8, 8)
    for tile in x[y == PHOTOS.index("astronaut")]:
        assert bool(((tiles - tile).abs().flatten(1).max(1).values == 0).any())  # a tile of the grid, exactly
    dm = ImageDataModule(dataset="photo-patches", batch_size=50)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.test_set), dm.num_classes, dm.in_shape) == (5100, 500, 7, [3, 8, 8])
    xb, _ = next(iter(dm.train_dataloader()))
    assert xb.shape == (50, 3, 8, 8) and 0 <= float(xb.min()) and float(xb.max()) <= 1  # no augmentation, no scaling
    with pytest.raises(ValueError, match="per_class=5000: astronaut has only 4096 tiles"):
        photo_patches(per_class=5000)
