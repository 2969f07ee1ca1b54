"""Pair DataModules for transport models: toy 2-D pairs, ``.npy`` vectors, images (noise, digits, MNIST, folders)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from zoo.datamodules.pairs import (
    TOY_DISTRIBUTIONS,
    ImagePairDataModule,
    PairDataset,
    ToyPairDataModule,
    toy_distribution,
)


# ------------------------------------------------------------------------------------------------ toy pairs
@pytest.mark.parametrize("name", TOY_DISTRIBUTIONS)
def test_toy_distributions_have_shape_and_repeat_per_seed(name: str) -> None:
    """Check that every named toy distribution gives (n, 2) float32 samples, equal for equal generator seeds."""
    a = toy_distribution(name, 300, torch.Generator().manual_seed(0))
    b = toy_distribution(name, 300, torch.Generator().manual_seed(0))
    c = toy_distribution(name, 300, torch.Generator().manual_seed(1))
    assert a.shape == (300, 2) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_two_modes_is_the_cards_target() -> None:
    """Check that 'two_modes' has modes at (±4, 0) with std 0.5 and a 50/50 balance."""
    x = toy_distribution("two_modes", 20_000, torch.Generator().manual_seed(0))
    right = x[:, 0] > 0
    assert 0.48 < float(right.float().mean()) < 0.52
    torch.testing.assert_close(x[right].mean(0), torch.tensor([4.0, 0.0]), atol=0.02, rtol=0)
    torch.testing.assert_close(x[~right].std(0), torch.tensor([0.5, 0.5]), atol=0.02, rtol=0)


def test_toy_datamodule_batches_are_pairs_of_vectors() -> None:
    """Check that the loaders give (source, target) tuples of (B, 2) tensors and the splits have the asked sizes."""
    dm = ToyPairDataModule(n_train=1000, n_val=100, n_test=200, batch_size=64)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, tuple) and len(batch) == 2
    assert batch[0].shape == batch[1].shape == (64, 2)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (1000, 100, 200)
    source, target = next(iter(dm.test_dataloader()))
    assert source.shape == target.shape == (64, 2)
    assert float(target[:, 0].abs().mean()) > 3  # the two-mode target, not the Gaussian source
    assert dm.sample_shape == (2,)


def test_toy_datamodule_seeds() -> None:
    """Check that the same seed gives the same pools and another seed different ones, on both sides."""

    def pools(seed: int) -> list[torch.Tensor]:
        dm = ToyPairDataModule(n_train=256, n_val=32, n_test=32, seed=seed)
        dm.setup("fit")
        return [dm.train_set.source, dm.train_set.target, dm.test_set.source, dm.test_set.target]

    same, other = pools(0), pools(1)
    assert all(torch.equal(a, b) for a, b in zip(pools(0), same))
    assert not any(torch.equal(a, b) for a, b in zip(same, other))
    assert not torch.equal(same[0], same[2])  # train and test samples differ


def test_toy_datamodule_reads_npy_files(tmp_path) -> None:
    """Check that .npy paths of shape (n, D) are split into train/val/test of the asked sizes, without loss."""
    g = np.random.default_rng(0)
    src, tgt = tmp_path / "p.npy", tmp_path / "q.npy"
    np.save(src, g.normal(size=(120, 3)))
    np.save(tgt, g.normal(size=(80, 3)) + 5)
    dm = ToyPairDataModule(source=str(src), target=str(tgt), n_val=10, n_test=20, batch_size=16)
    dm.setup("fit")
    assert dm.sample_shape == (3,)
    assert (len(dm.train_set.source), len(dm.val_set.source), len(dm.test_set.source)) == (90, 10, 20)
    assert (len(dm.train_set.target), len(dm.val_set.target), len(dm.test_set.target)) == (50, 10, 20)
    everything = torch.cat([dm.train_set.source, dm.val_set.source, dm.test_set.source])
    assert everything.dtype == torch.float32
    torch.testing.assert_close(everything.sort(dim=0).values, torch.from_numpy(np.load(src)).float().sort(dim=0).values)
    p, q = next(iter(dm.train_dataloader()))
    assert p.shape == q.shape == (16, 3)


@pytest.mark.parametrize(("rows", "split"), [(500, (250, 125, 125)), (50, (26, 12, 12)), (10, (6, 2, 2))])
def test_toy_datamodule_splits_a_small_npy_file_with_the_default_counts(tmp_path, rows: int, split: tuple) -> None:
    """Check that a file with fewer rows than n_val + n_test (default 2000 each) loads and splits, losing no row.

    Each of val and test is capped at a quarter of the file (500 rows: 125/125, 250 to train; 50: 12/12/26; the
    10-row minimum: 2/2/6). These files used to fail with "500 samples are too few ... fractions (4.0, 4.0)".
    """
    data = np.random.default_rng(0).normal(size=(rows, 2))
    np.save(tmp_path / "p.npy", data)
    dm = ToyPairDataModule(source=str(tmp_path / "p.npy"), batch_size=8)
    dm.setup("fit")
    sides = (dm.train_set.source, dm.val_set.source, dm.test_set.source)
    assert tuple(len(x) for x in sides) == split
    torch.testing.assert_close(torch.cat(sides).sort(dim=0).values, torch.from_numpy(data).float().sort(dim=0).values)
    p, q = next(iter(dm.train_dataloader()))
    assert p.shape == q.shape == (8, 2)
    assert len(dm.test_set.target) == 2000  # the made-in-code target keeps its asked count


def test_toy_datamodule_asked_counts_hold_on_a_large_enough_file(tmp_path) -> None:
    """Check that counts are counts, not fractions: n_val = 40, n_test = 60 of 250 rows give 40/60/150 (no cap)."""
    np.save(tmp_path / "p.npy", np.zeros((250, 2)))
    dm = ToyPairDataModule(source=str(tmp_path / "p.npy"), target=str(tmp_path / "p.npy"), n_val=40, n_test=60)
    dm.setup("fit")
    assert (len(dm.train_set.source), len(dm.val_set.source), len(dm.test_set.source)) == (150, 40, 60)


def test_toy_datamodule_refuses_a_file_too_small_to_split(tmp_path) -> None:
    """Check that a 3-row (and a 9-row) .npy file raises one line naming the file, its row count and the minimum."""
    for rows in (3, 9):
        np.save(tmp_path / f"tiny{rows}.npy", np.zeros((rows, 2)))
        file = tmp_path / f"tiny{rows}.npy"
        dm = ToyPairDataModule(target=str(file))
        with pytest.raises(ValueError, match=rf"^{re.escape(str(file))} has {rows} row\(s\); .* at least 10 to split"):
            dm.setup("fit")


def test_toy_datamodule_bad_specs_raise(tmp_path) -> None:
    """Check unknown names (ValueError), a missing .npy (helpful FileNotFoundError) and mismatched dimensions."""
    with pytest.raises(ValueError, match="unknown toy distribution 'moons'"):
        ToyPairDataModule(source="moons")
    with pytest.raises(ValueError, match="unknown toy distribution"):
        ToyPairDataModule(target="data.csv")
    missing = ToyPairDataModule(source=str(tmp_path / "nowhere.npy"))
    with pytest.raises(FileNotFoundError, match=r"No file at .*nowhere\.npy.*\.npy file of shape \(n, D\)"):
        missing.setup("fit")
    np.save(tmp_path / "d2.npy", np.zeros((50, 2)))
    np.save(tmp_path / "d3.npy", np.zeros((50, 3)))
    mismatched = ToyPairDataModule(source=str(tmp_path / "d2.npy"), target=str(tmp_path / "d3.npy"), n_val=5, n_test=5)
    with pytest.raises(ValueError, match="both plates must live in one space"):
        mismatched.setup("fit")
    np.save(tmp_path / "cube.npy", np.zeros((50, 2, 2)))
    with pytest.raises(ValueError, match="expected \\(n, D\\)"):
        ToyPairDataModule(source=str(tmp_path / "cube.npy"), n_val=5, n_test=5).setup("fit")
    with pytest.raises(ValueError, match=r"^n_val = 1 is too few for .*d2\.npy: .* at least 2 rows each"):
        ToyPairDataModule(source=str(tmp_path / "d2.npy"), target=str(tmp_path / "d2.npy"), n_val=1).setup("fit")


def test_pair_dataset_cycles_the_shorter_side() -> None:
    """Check that PairDataset has length max(n_s, n_t), cycles the shorter pool and rejects mismatched shapes."""
    ds = PairDataset(torch.arange(3.0)[:, None], torch.arange(5.0)[:, None] + 10)
    assert len(ds) == 5
    s, t = ds.__getitems__([0, 3, 4])
    assert s.flatten().tolist() == [0.0, 0.0, 1.0] and t.flatten().tolist() == [10.0, 13.0, 14.0]
    assert [float(v) for v in ds[4]] == [1.0, 14.0]
    with pytest.raises(ValueError, match="same shape"):
        PairDataset(torch.zeros(3, 2), torch.zeros(3, 3))


# ------------------------------------------------------------------------------------------------ image pairs
def test_image_datamodule_default_is_noise_to_digits() -> None:
    """Check that the default gives (B, 1, 8, 8) Gaussian noise and digits in [−1, 1]."""
    dm = ImagePairDataModule(batch_size=32, n_noise=512)
    dm.setup("fit")
    noise, digits = next(iter(dm.train_dataloader()))
    assert noise.shape == digits.shape == (32, 1, 8, 8)
    assert float(digits.min()) >= -1.0 and float(digits.max()) <= 1.0
    assert float(dm.train_set.target.min()) == -1.0 and float(dm.train_set.target.max()) == 1.0
    pool = dm.train_set.source
    assert len(pool) == 512 and abs(float(pool.mean())) < 0.05 and abs(float(pool.std()) - 1) < 0.05
    assert len(dm.test_set.source) == len(dm.test_set.target)  # val/test noise match the digits' sizes
    assert dm.sample_shape == (1, 8, 8)


def test_image_datamodule_digit_translation_and_resize() -> None:
    """Check 'digits:3' → 'digits:2' (two different classes) and that image_size=16 resizes."""
    dm = ImagePairDataModule(source="digits:3", target="digits:2", batch_size=16)
    dm.setup("fit")
    threes, twos = next(iter(dm.train_dataloader()))
    assert threes.shape == twos.shape == (16, 1, 8, 8)
    total = sum(len(s.source) for s in (dm.train_set, dm.val_set, dm.test_set))
    assert 150 < total < 200  # about 180 threes among scikit-learn's 1797 digits
    assert not torch.allclose(dm.train_set.source.mean(0), dm.train_set.target.mean(0), atol=0.1)
    big = ImagePairDataModule(source="noise", target="digits:0", image_size=16, n_noise=64, batch_size=8)
    big.setup("fit")
    noise, zeros = next(iter(big.train_dataloader()))
    assert noise.shape == zeros.shape == (8, 1, 16, 16)
    assert float(zeros.min()) >= -1.0 and float(zeros.max()) <= 1.0
    rgb = ImagePairDataModule(source="digits:1", target="digits:7", channels=3, batch_size=4)
    assert rgb.sample_shape == (3, 8, 8)


def test_image_datamodule_reads_an_image_folder(tmp_path) -> None:
    """Check that 'folder:PATH' reads an ImageFolder tree, resizes it and converts RGB to grey."""
    from PIL import Image

    g = np.random.default_rng(0)
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(15):
            Image.fromarray(g.integers(0, 255, (10, 12, 3), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    dm = ImagePairDataModule(source=f"folder:{tmp_path}", target="noise", batch_size=4)
    dm.setup("fit")
    images, noise = next(iter(dm.train_dataloader()))
    assert images.shape == noise.shape == (4, 1, 8, 8)
    assert float(images.min()) >= -1.0 and float(images.max()) <= 1.0
    assert sum(len(s.source) for s in (dm.train_set, dm.val_set, dm.test_set)) == 30


def test_image_datamodule_bad_specs_raise(tmp_path) -> None:
    """Check unknown sources, noise → noise, bad channels, MNIST without data_dir and with an empty data_dir."""
    with pytest.raises(ValueError, match="unknown image source 'imagenet'"):
        ImagePairDataModule(source="imagenet")
    with pytest.raises(ValueError, match="both 'noise'"):
        ImagePairDataModule(source="noise", target="noise")
    with pytest.raises(ValueError, match="channels"):
        ImagePairDataModule(channels=2)
    with pytest.raises(ValueError, match="needs data_dir"):
        ImagePairDataModule(target="mnist").setup("fit")
    with pytest.raises(FileNotFoundError, match=f"MNIST is not in {tmp_path}.*download"):
        ImagePairDataModule(target="mnist:3", data_dir=str(tmp_path), download=False).setup("fit")
    with pytest.raises(FileNotFoundError, match="No image folder"):
        ImagePairDataModule(source=f"folder:{tmp_path / 'none'}").setup("fit")
    with pytest.raises(ValueError, match="no images of class 10"):
        ImagePairDataModule(target="digits:10").setup("fit")
    with pytest.raises(ValueError, match="must be a class index"):
        ImagePairDataModule(target="digits:abc").setup("fit")
